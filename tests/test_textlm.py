"""Lesson 11's tiny LM: corpus, head scores on hand-built maps, position schemes, a short training run."""
import pytest
import torch

from attn_course.demos.textlm import (TextData, TinyLM, decode, encode, head_scores, loss_by_position, stdlib_text, train_lm,
                                      train_lm_many, unigram_loss)


def test_corpus_is_ascii_deterministic_and_large():
    a, b = stdlib_text(), stdlib_text()
    assert a == b and len(a) > 50_000 and all(ord(c) < 128 for c in a)
    assert decode(encode("Return the value.")) == "Return the value."


def _maps_for(kind, L):
    w = torch.zeros(1, 1, L, L)
    for i in range(L):
        j = {"previous": max(i - 1, 0), "first": 0, "self": i}[kind]
        w[0, 0, i, j] = 1.0
    return [w]


@pytest.mark.parametrize("kind", ["previous", "first"])
def test_head_scores_of_pure_patterns(kind):
    idx = torch.randint(0, 5, (1, 12), generator=torch.Generator().manual_seed(0))
    s = head_scores(_maps_for(kind, 12), idx)
    assert s[kind].item() == pytest.approx(1.0)
    other = "first" if kind == "previous" else "previous"
    assert s[other].item() == pytest.approx(1 / 11 if kind == "previous" else 1 / 11)   # only query 1 overlaps


def test_induction_score_counts_the_token_after_an_earlier_occurrence():
    idx = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4]])
    L = 8
    w = torch.zeros(1, 1, L, L)
    w[0, 0, :, 0] = 1.0                                                 # default: look at the first token
    for i in range(4, 8):                                               # x_i == x_{i-4}: look at position i-3
        w[0, 0, i] = 0
        w[0, 0, i, i - 3] = 1.0
    s = head_scores([w], idx)
    assert s["induction"].item() == pytest.approx(1.0)
    w2 = torch.zeros(1, 1, L, L)
    w2[0, 0, torch.arange(1, L), torch.arange(L - 1)] = 1.0             # a previous-token head is not induction
    assert head_scores([w2], idx)["induction"].item() == pytest.approx(0.0)


@pytest.mark.parametrize("position", TinyLM.POSITIONS)
def test_models_are_causal_and_maps_are_rows(position):
    torch.manual_seed(0)
    m = TinyLM(d_model=16, num_layers=2, num_heads=2, position=position, max_len=32).eval()
    x = torch.randint(0, 128, (2, 10))
    x2 = x.clone(); x2[:, 6:] = (x2[:, 6:] + 1) % 128
    with torch.no_grad():
        assert torch.allclose(m(x)[:, :6], m(x2)[:, :6], atol=1e-5)
    maps = m.attention_maps(x)
    assert len(maps) == 2 and all(w.shape == (2, 2, 10, 10) for w in maps)
    assert all(torch.allclose(w.sum(-1), torch.ones(2, 2, 10)) and (w.triu(1) == 0).all() for w in maps)


def test_learned_positions_limit_and_bad_position():
    with pytest.raises(ValueError, match="position must be one of"):
        TinyLM(position="sinus")
    m = TinyLM(d_model=16, num_heads=2, position="learned", max_len=8)
    with pytest.raises(ValueError, match="exceeds max_len=8"):
        m(torch.zeros(1, 9, dtype=torch.long))


def test_short_training_beats_the_unigram_baseline_and_records_logits():
    data = TextData(seq_len=32, batch_size=8)
    m, losses, rec = train_lm(data, steps=60, lr=5e-3, progress=False, record_every=20, d_model=32, num_heads=4)
    p = torch.bincount(data.train, minlength=128).float() / len(data.train)
    unigram = -(p[p > 0] * p[p > 0].log()).sum().item()
    assert loss_by_position(m, data, 32, batches=2).mean().item() < unigram - 0.2
    assert [r[0] for r in rec] == [0, 20, 40] and all(r[1] > 0 and r[2] > 0 for r in rec)
    assert isinstance(m.generate("The ", 10), str)


def test_unigram_loss_is_the_held_out_cross_entropy_of_add_one_training_counts():
    # independent reference: plain Python counting over the two splits' characters
    import collections
    import math
    text = "aab ba\nabc " * 30 + "zzaab ca~"
    data = TextData(text, seq_len=4, batch_size=2)
    train, val = data.train.tolist(), data.val.tolist()
    counts = collections.Counter(train)
    total = len(train) + 128
    want = -sum(math.log((counts[c] + 1) / total) for c in val) / len(val)
    assert abs(unigram_loss(data) - want) < 1e-12
    entropy = -sum(n / len(train) * math.log(n / len(train)) for n in counts.values())
    assert abs(unigram_loss(data) - entropy) > 0.05           # not the training split's own entropy


def test_word_boundary_score():
    idx = encode("ab cde fghi").view(1, -1)                   # spaces at 2 and 6
    L = idx.shape[1]
    w = torch.zeros(1, 1, L, L)
    for i in range(L):
        sep = max([j for j in (2, 6) if j < i - 1], default=None)
        w[0, 0, i, sep if sep is not None else 0] = 1.0
    s = head_scores([w], idx)
    assert s["word boundary"].item() == pytest.approx(1.0)
    assert head_scores(_maps_for("previous", L), idx)["word boundary"].item() == pytest.approx(0.0)


def test_device_argument_places_the_model_and_keeps_the_seeded_run():
    """``device=`` trains there; the weights are initialised and the batches drawn on the CPU, so an explicit
    CPU device reproduces the default run exactly, and the evaluation helpers return CPU tensors."""
    data = TextData(seq_len=16, batch_size=4)
    kw = dict(steps=4, lr=5e-3, progress=False, d_model=16, num_heads=2)
    m0, l0, _ = train_lm(data, **kw)
    m1, l1, _ = train_lm(data, device=torch.device("cpu"), **kw)
    assert l0 == l1 and m1.head.weight.device.type == "cpu"
    assert loss_by_position(m1, data, 16, batches=1).device.type == "cpu"
    assert m0.generate("a ", 5, seed=1) == m1.generate("a ", 5, seed=1)


def test_train_lm_many_equals_train_lm_per_seed_and_rate():
    data = TextData(stdlib_text()[:20000], seq_len=16, batch_size=4)
    seeds, lrs = (0, 1, 0), (3e-2, 3e-2, 1e-1)
    models, curves = train_lm_many(data, seeds=seeds, lrs=lrs, steps=6, progress=False, d_model=16, num_layers=1,
                                   num_heads=2, qk_norm=True)
    x, _ = data.sample(torch.Generator().manual_seed(3), "val")
    for s, lr, m, c in zip(seeds, lrs, models, curves):
        alone, ref, _ = train_lm(data, seed=s, lr=lr, steps=6, progress=False, d_model=16, num_layers=1, num_heads=2,
                                 qk_norm=True)
        torch.testing.assert_close(torch.tensor(c), torch.tensor(ref), rtol=1e-4, atol=1e-5)
        with torch.no_grad():
            torch.testing.assert_close(m(x), alone(x), rtol=1e-4, atol=1e-4)
