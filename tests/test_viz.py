"""attn_course.viz: labels, colour bars, a shared scale across heads, any-device/grad inputs, 32×32 maps."""
import matplotlib
import numpy as np
import pytest
import torch

from attn_course import viz
from attn_course.functional import attention
from attn_course.masks import causal_mask, padding_mask

matplotlib.use("Agg")


def _colorbars(fig):
    return [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]


def _tick_texts(axis_ticklabels):
    return [t.get_text() for t in axis_ticklabels]


def test_plot_attention_labels_colorbar_and_data():
    w = torch.softmax(torch.randn(3, 5), dim=-1)
    ax = viz.plot_attention(w, query_labels=["a", "b", "c"], key_labels="vwxyz", title="t")
    assert _tick_texts(ax.get_yticklabels()) == ["a", "b", "c"]
    assert _tick_texts(ax.get_xticklabels()) == list("vwxyz")
    assert ax.get_title() == "t" and ax.get_xlabel() == "key" and ax.get_ylabel() == "query"
    assert len(_colorbars(ax.figure)) == 1
    img = ax.get_images()[0]
    np.testing.assert_allclose(img.get_array(), w.numpy(), rtol=0, atol=0)   # rows = queries
    assert img.get_clim() == (0.0, pytest.approx(w.max().item()))


def test_plot_attention_into_given_axes_without_colorbar():
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2)
    out = viz.plot_attention(torch.rand(4, 4), ax=a2, colorbar=False)
    assert out is a2 and len(fig.axes) == 2 and a1.get_images() == []


def test_plot_attention_negative_scores_use_their_range():
    s = torch.tensor([[-2.0, 1.0], [0.5, 3.0]])
    img = viz.plot_attention(s).get_images()[0]
    assert img.get_clim() == (-2.0, 3.0)


def test_plot_attention_annotate_writes_values():
    w = torch.tensor([[0.25, 0.75], [1.0, 0.0]])
    ax = viz.plot_attention(w, annotate=True)
    assert sorted(t.get_text() for t in ax.texts) == ["0.00", "0.25", "0.75", "1.00"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_accepts_grad_and_low_precision_tensors(dtype):
    q = torch.randn(1, 1, 4, 8, dtype=dtype, requires_grad=True)
    _, w = attention(q, q, q)                                   # (1, 1, 4, 4), part of a graph
    ax = viz.plot_attention(w)                                  # leading singletons dropped
    np.testing.assert_allclose(ax.get_images()[0].get_array(), w[0, 0].detach().float().numpy())
    viz.plot_heads(w)
    assert q.grad is None                                       # nothing was back-propagated


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else []) + (
    ["mps"] if torch.backends.mps.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_accepts_tensors_on_any_device(device):
    w = torch.rand(2, 3, 3, device=device)
    fig = viz.plot_heads(w)
    np.testing.assert_allclose(fig.axes[1].get_images()[0].get_array(), w[1].cpu().numpy())
    viz.plot_attention(w[0])
    viz.plot_mask(causal_mask(3, device=device))


def test_accepts_numpy_input():
    ax = viz.plot_attention(np.eye(3))
    np.testing.assert_array_equal(ax.get_images()[0].get_array(), np.eye(3))


def test_plot_heads_shares_one_colour_scale_and_one_colorbar():
    w = torch.stack([torch.full((4, 6), 1 / 6), torch.eye(4, 6)])   # uniform head vs peaked head
    fig = viz.plot_heads(w, query_labels=list("abcd"), key_labels=list("uvwxyz"), suptitle="S")
    panels = [ax for ax in fig.axes if ax.get_images() and ax.get_label() != "<colorbar>"]
    assert len(panels) == 2
    clims = {ax.get_images()[0].get_clim() for ax in panels}
    assert clims == {(0.0, 1.0)}                                # the uniform head is NOT stretched to 1
    assert len(_colorbars(fig)) == 1
    assert [ax.get_title() for ax in panels] == ["head 0", "head 1"]
    assert _tick_texts(panels[0].get_yticklabels()) == list("abcd")
    assert _tick_texts(panels[1].get_yticklabels()) == [""] * 4   # only the first column is labelled
    assert _tick_texts(panels[1].get_xticklabels()) == list("uvwxyz")
    assert fig._suptitle.get_text() == "S"


def test_plot_heads_grid_hides_unused_panels():
    fig = viz.plot_heads(torch.rand(1, 5, 3, 3), ncols=2, titles=[f"h{i}" for i in range(5)])
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == 6 and sum(ax.get_visible() for ax in panels) == 5
    assert [ax.get_title() for ax in panels if ax.get_visible()] == [f"h{i}" for i in range(5)]


def test_readable_at_32_tokens():
    toks = [f"tok{i}" for i in range(32)]
    ax = viz.plot_attention(torch.rand(32, 32), query_labels=toks, key_labels=toks)
    xt = ax.get_xticklabels()
    assert _tick_texts(xt) == toks                               # every token labelled at 32
    assert all(t.get_fontsize() <= 7 for t in xt) and xt[0].get_rotation() == 90
    fig = viz.plot_heads(torch.rand(4, 32, 32), query_labels=toks, key_labels=toks)
    labelled = _tick_texts(fig.axes[0].get_yticklabels())
    assert 16 <= len(labelled) <= 32 and labelled[0] == "tok0"


def test_long_sequences_thin_labels():
    toks = [str(i) for i in range(200)]
    ax = viz.plot_attention(torch.rand(200, 200), query_labels=toks, key_labels=toks)
    texts = _tick_texts(ax.get_xticklabels())
    assert 0 < len(texts) <= 48 and texts[0] == "0"
    unlabelled = viz.plot_attention(torch.rand(100, 100))
    assert len(unlabelled.get_xticks()) <= 16


def test_cross_attention_non_square():
    ax = viz.plot_attention(torch.rand(3, 7), query_labels="abc", key_labels="ABCDEFG")
    assert ax.get_images()[0].get_array().shape == (3, 7)
    fig = viz.plot_heads(torch.rand(2, 7, 3), query_labels="ABCDEFG", key_labels="abc")
    assert fig.axes[0].get_images()[0].get_array().shape == (7, 3)


def test_plot_mask_bool_polarity_and_padding():
    ax = viz.plot_mask(causal_mask(4, 6), title="causal")
    np.testing.assert_array_equal(ax.get_images()[0].get_array(), causal_mask(4, 6).float().numpy())
    cb = _colorbars(ax.figure)[0]
    assert [t.get_text() for t in cb.get_yticklabels()] == ["blocked\n(False)", "attend\n(True)"]
    ax = viz.plot_mask(padding_mask([2, 4], 5), query_labels=["s0", "s1"])
    np.testing.assert_array_equal(ax.get_images()[0].get_array(), [[1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])
    assert ax.get_ylabel() == "sequence in batch"


def test_plot_mask_float_marks_minus_inf():
    m = torch.zeros(3, 3).masked_fill(~causal_mask(3), float("-inf"))
    arr = viz.plot_mask(m).get_images()[0].get_array()
    np.testing.assert_array_equal(np.ma.getmaskarray(arr), ~causal_mask(3).numpy())


@pytest.mark.parametrize("call, match", [
    (lambda: viz.plot_attention(torch.rand(2, 3, 4)), r"\(Lq, Lk\).*\(2, 3, 4\)"),
    (lambda: viz.plot_attention(torch.rand(3, 4), query_labels="ab"), r"query_labels has 2 entries.*Lq=3"),
    (lambda: viz.plot_attention(torch.rand(3, 4), key_labels="ab"), r"key_labels has 2 entries.*Lk=4"),
    (lambda: viz.plot_heads(torch.rand(2, 2, 3, 3)), r"\(H, Lq, Lk\).*\(2, 2, 3, 3\)"),
    (lambda: viz.plot_heads(torch.rand(2, 3, 3), titles=["a"]), r"titles has 1 entries.*H=2"),
    (lambda: viz.plot_heads(torch.rand(2, 3, 3), ncols=0), r"ncols must be a positive integer, got 0"),
    (lambda: viz.plot_mask(torch.ones(2, 2, 3, 3, dtype=torch.bool)), r"\(Lq, Lk\).*\(2, 2, 3, 3\)"),
])
def test_value_errors_name_the_sizes(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_show_source_prints_outside_notebooks(capsys):
    viz.show_source(causal_mask)
    out = capsys.readouterr().out
    assert out.startswith("def causal_mask(") and ".tril()" in out
    viz.show_source(causal_mask, docstring=False)
    short = capsys.readouterr().out
    assert "top-left aligned" not in short and ".tril()" in short and len(short) < len(out)


def test_table_renders_markdown_and_keeps_its_text():
    from IPython.core.interactiveshell import InteractiveShell

    from attn_course import viz
    text = "| a | b |\n|---|---|\n| 1 | 2 |"
    data, _ = InteractiveShell.instance().display_formatter.format(viz.table(text))
    assert data["text/markdown"] == text and data["text/plain"] == text
