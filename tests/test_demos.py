"""attn_course.demos.reverse: the reversal demo learns, is deterministic, and attends anti-diagonally."""
import pytest
import torch

from attn_course.demos.reverse import (OneLayerAttention, ReversalTask, evaluate, reversal_attention,
                                       train_reversal)


@pytest.fixture(scope="module")
def trained():
    return train_reversal(progress=False)


def test_task_targets_are_reversed_inputs():
    task = ReversalTask(vocab_size=5, seq_len=6)
    x, y = task.sample(torch.Generator().manual_seed(0), 4)
    assert x.shape == y.shape == (4, 6) and x.dtype == torch.int64
    assert int(x.min()) >= 0 and int(x.max()) < 5
    for i in range(6):
        torch.testing.assert_close(y[:, i], x[:, 5 - i])
    assert task.decode(task.encode("ABCDEA")[0]) == "ABCDEA"


def test_reaches_95_percent_quickly(trained):
    model, result = trained
    assert result.accuracy >= 0.95
    assert result.seconds <= 15.0, f"training took {result.seconds:.1f}s"
    assert result.losses[-1] < 0.1 * result.losses[0]
    assert evaluate(model, ReversalTask(), seed=99) >= 0.95        # a different held-out stream


def test_untrained_model_is_at_chance():
    torch.manual_seed(0)
    model = OneLayerAttention(16, 8, 32)
    assert evaluate(model, ReversalTask()) < 0.2


def test_deterministic_under_seed(trained):
    model, result = trained
    model2, result2 = train_reversal(progress=False, steps=150)
    assert result2.losses == result.losses
    for p, p2 in zip(model.parameters(), model2.parameters()):
        torch.testing.assert_close(p, p2, rtol=0, atol=0)
    _, other = train_reversal(progress=False, steps=20, seed=1)
    assert other.losses[:20] != result.losses[:20]


def test_attention_is_anti_diagonal(trained):
    model, _ = trained
    task = ReversalTask()
    w, q_labels, k_labels = reversal_attention(model, task, "HELLOABC")
    L = task.seq_len
    assert w.shape == (L, L)
    torch.testing.assert_close(w.sum(-1), torch.ones(L))
    assert w.argmax(-1).tolist() == list(range(L - 1, -1, -1))          # query i looks at key L-1-i
    assert float(w.flip(-1).diagonal().min()) > 0.5
    assert q_labels == list("CBAOLLEH") and k_labels == list("HELLOABC")
    logits = model(task.encode("HELLOABC"))
    assert task.decode(logits.argmax(-1)[0]) == "CBAOLLEH"


def test_weights_returned_by_forward_match_attention_formula(trained):
    model, _ = trained
    x = ReversalTask().encode("ABCDEFGH")
    logits, w = model(x, need_weights=True)
    torch.testing.assert_close(logits, model(x))
    h = model.tok_emb(x) + model.pos_emb(torch.arange(8))
    s = model.q_proj(h) @ model.k_proj(h).transpose(-1, -2) / model.q_proj.out_features ** 0.5
    torch.testing.assert_close(w[:, 0], torch.softmax(s, -1))


def test_multi_head_variant_runs():
    torch.manual_seed(0)
    model = OneLayerAttention(16, 8, d_model=32, num_heads=4)
    logits, w = model(torch.zeros(2, 8, dtype=torch.long), need_weights=True)
    assert logits.shape == (2, 8, 16) and w.shape == (2, 4, 8, 8)


def test_training_restores_thread_count(three_threads):
    n = torch.get_num_threads()
    train_reversal(progress=False, steps=2)
    assert torch.get_num_threads() == n


@pytest.mark.parametrize("call, match", [
    (lambda: ReversalTask(vocab_size=27), r"vocab_size=27 exceeds the 26"),
    (lambda: ReversalTask(seq_len=0), r"seq_len must be a positive integer, got 0"),
    (lambda: ReversalTask().encode("ABC"), r"text has length 3 but the task's seq_len=8"),
    (lambda: ReversalTask(vocab_size=4).encode("ABCDEFGH"), r"symbols \['E', 'F', 'G', 'H'\] are not in"),
    (lambda: OneLayerAttention(16, 8, d_model=30, num_heads=4), r"d_model=30 is not divisible by num_heads=4"),
    (lambda: OneLayerAttention(16, 8)(torch.zeros(1, 5, dtype=torch.long)), r"length L=5 .* seq_len=8"),
])
def test_value_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_progress_in_a_kernel_is_a_widget_whose_saved_text_is_deterministic(monkeypatch):
    """In a notebook kernel ``fit`` shows an ipywidgets bar; its text/plain (what nbval compares and
    what an unrun notebook shows) names the task and the step count, not a half-drawn ``HBox(...)``."""
    import types

    import IPython
    import IPython.display

    from attn_course.demos import _train

    shown = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: types.SimpleNamespace(kernel=object()))
    monkeypatch.setattr(IPython.display, "display", shown.append)
    model = torch.nn.Linear(3, 2)
    sample = lambda g: (torch.randn(4, 3, generator=g), torch.randint(0, 2, (4,), generator=g))
    losses = _train.fit(model, sample, steps=7, desc="toy")
    (box,) = shown
    assert box._repr_mimebundle_()["text/plain"] == "toy: 7 training steps"
    bar, label = box.children
    assert bar.value == bar.max == 7 and label.value == f"7/7, loss {losses[-1]:.3f}"
