"""attn_course.widgets: the lesson-01 explorer's update logic, driven without a browser."""
import math

import matplotlib
import pytest
import torch
import torch.nn.functional as F

from attn_course.widgets import AttentionExplorer, interactive_figure

matplotlib.use("Agg")


def _sdpa_weights(q, k, scale, mask):
    """Independent reference: fp64 softmax of masked, scaled scores."""
    s = (q.double() @ k.double().T) * scale
    return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)


@pytest.fixture
def ex():
    return AttentionExplorer()


@pytest.mark.parametrize("temperature", [0.1, 1.0, 3.0])
@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("padding", [True, False])
def test_weights_match_reference(ex, temperature, scaled, causal, padding):
    v = ex.compute(temperature=temperature, scaled=scaled, causal=causal, padding=padding, query=5)
    scale = 1 / (temperature * (math.sqrt(ex.d_k) if scaled else 1))
    assert v.scale == pytest.approx(scale)
    L = len(ex.tokens)
    mask = torch.ones(L, L, dtype=torch.bool)
    if causal:
        mask = torch.ones(L, L).tril().bool()
    if padding:
        mask[:, L - ex.n_pad:] = False
    torch.testing.assert_close(v.mask, mask)
    want = _sdpa_weights(ex.q, ex.k, scale, mask)
    torch.testing.assert_close(v.weights.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(v.row, v.weights[5])
    p = want[5][want[5] > 0]
    assert v.entropy == pytest.approx(float(-(p * p.log()).sum()), abs=1e-5)


def test_temperature_limits(ex):
    cold = ex.compute(temperature=1e-3, query=2)
    assert cold.row.max() > 0.999 and cold.entropy < 1e-2           # argmax: one-hot
    assert int(cold.row.argmax()) == int((ex.q[2] @ ex.k.T).argmax())
    hot = ex.compute(temperature=1e4, padding=True, query=2)
    visible = len(ex.tokens) - ex.n_pad
    assert hot.entropy == pytest.approx(math.log(visible), abs=1e-3)  # uniform over visible keys
    assert hot.row[visible:].abs().max() == 0


def test_unscaled_is_sharper(ex):
    """Without 1/√d_k (here d_k=16) the logits are 4x larger, so the rows are more peaked on average."""
    ent = lambda v: -(v.weights * v.weights.clamp_min(1e-30).log()).sum(-1).mean()
    assert ent(ex.compute(scaled=False)) < ent(ex.compute(scaled=True))


def test_causal_rows_ignore_future(ex):
    v = ex.compute(causal=True)
    assert torch.all(v.weights.triu(1) == 0)
    torch.testing.assert_close(v.weights.sum(-1), torch.ones(len(ex.tokens)))


def test_update_draws_and_remembers(ex):
    v = ex.update(temperature=0.5, causal=True, padding=True, query=4)
    assert ex.view is v
    ax_map, ax_bar = [a for a in v.figure.axes if a.get_label() != "<colorbar>"]
    torch.testing.assert_close(torch.as_tensor(ax_map.get_images()[0].get_array().data), v.weights)
    heights = torch.tensor([p.get_height() for p in ax_bar.patches], dtype=torch.float32)
    torch.testing.assert_close(heights, v.row)
    assert "query 4 ('the')" in ax_bar.get_title()


def test_widget_controls_drive_the_update(ex):
    ui = ex.widget()
    assert set(ui.controls) == {"temperature", "scaled", "causal", "padding", "query"}
    assert ex.view.query == 0 and not torch.all(ex.view.weights.triu(1) == 0)
    ui.controls["causal"].value = True
    assert torch.all(ex.view.weights.triu(1) == 0)
    ui.controls["query"].value = 3
    ui.controls["temperature"].value = 10.0
    torch.testing.assert_close(ex.view.weights, ex.compute(temperature=10.0, causal=True, query=3).weights)
    assert ex.view.query == 3


def test_interactive_figure_calls_render_with_values():
    import ipywidgets as W
    import matplotlib.pyplot as plt
    calls = []

    def render(a, b):
        calls.append((a, b))
        return plt.figure()

    ui = interactive_figure(render, {"a": W.IntSlider(value=1), "b": W.Checkbox(value=False)}, title="T")
    ui.controls["a"].value = 5
    ui.controls["b"].value = True
    assert calls == [(1, False), (5, False), (5, True)]
    assert plt.get_fignums() == []                      # every drawn figure was closed


def test_custom_inputs():
    q = torch.randn(3, 4, requires_grad=True)
    ex = AttentionExplorer(["a", "b", "c"], q, q, q)
    v = ex.compute(query=2)
    torch.testing.assert_close(v.weights, F.softmax(q.detach() @ q.detach().T / 2, dim=-1))


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=0.0), r"temperature must be > 0, got 0.0"),
    (dict(query=8), r"query must be an int in \[0, L=8\), got 8"),
    (dict(query=-1), r"query must be an int in \[0, L=8\), got -1"),
])
def test_bad_state(ex, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ex.compute(**kwargs)


def test_bad_construction():
    with pytest.raises(ValueError, match=r"n_pad=3 must be in \[0, L=3\)"):
        AttentionExplorer(["a", "b", "c"], n_pad=3)
    with pytest.raises(ValueError, match=r"k must have shape \(L=3, d\), got \(4, 2\)"):
        AttentionExplorer(["a", "b", "c"], torch.randn(3, 2), torch.randn(4, 2), torch.randn(3, 2))


def test_widget_output_holds_exactly_one_current_figure(ex):
    ui = ex.widget()
    out = ui.children[-1]
    assert len(out.outputs) == 1 and out.outputs[0]["output_type"] == "display_data"
    ui.controls["padding"].value = True
    assert len(out.outputs) == 1                          # replaced, not appended


def test_ring_explorer_counts_the_work_of_each_rank_step_by_step():
    from attn_course import ring
    from attn_course.widgets.ring import RingExplorer
    e = RingExplorer(seq_len=16)
    for layout in ring.LAYOUTS:
        first, _ = e.update(world=4, step=0, layout=layout, causal=True)
        last, _ = e.update(world=4, step=3, layout=layout, causal=True)
        assert last == ring.work_per_rank(4, 16, layout, True)
        assert all(a <= b for a, b in zip(first, last))
    assert e.update(world=4, step=0, layout="contiguous", causal=True)[0] == [10, 10, 10, 10]   # own diagonal block
    box = e.widget()
    assert set(box.controls) == {"world", "step", "layout", "causal"}
    box.controls["step"].value = 9                  # beyond P - 1: clamped, still draws
    box.controls["layout"].value = "zigzag"
    assert len(box.children[-1].outputs) == 1


def test_displayed_explorer_carries_a_snapshot_of_its_first_figure_and_a_note(ex):
    """What a saved, never-run notebook shows in JupyterLab (untrusted outputs use safe renderers):
    the first figure as PNG and a one-line note, not ``VBox(children=(HTML(...``."""
    import base64

    from attn_course.widgets import SNAPSHOT_NOTE
    ui = ex.widget()
    first = ui.children[-1].outputs[0]["data"]["image/png"]
    ui.controls["causal"].value = True                   # the live figure changes ...
    assert ui.children[-1].outputs[0]["data"]["image/png"] != first
    bundle = ui._repr_mimebundle_()
    assert bundle["image/png"] == first                  # ... the snapshot stays the first state
    assert base64.b64decode(first)[:8] == b"\x89PNG\r\n\x1a\n"
    assert bundle["text/plain"] == f"{SNAPSHOT_NOTE} (Scaled dot-product attention explorer)"
    assert "VBox" not in bundle["text/plain"]
    assert "application/vnd.jupyter.widget-view+json" in bundle   # the live widget when the kernel runs


def test_a_control_moved_to_a_bad_state_shows_the_error_instead_of_freezing_the_figure():
    import ipywidgets as W
    import matplotlib.pyplot as plt

    def render(n):
        if n == 3:
            raise ValueError("n=3 is not allowed")
        fig, ax = plt.subplots()
        ax.plot(range(n))
        return fig

    ui = interactive_figure(render, {"n": W.IntSlider(value=2, min=1, max=5)})
    ui.controls["n"].value = 3
    (shown,) = ui.children[-1].outputs
    assert shown["output_type"] == "stream" and shown["text"] == "ValueError: n=3 is not allowed\n"
    ui.controls["n"].value = 4                               # a good state draws again
    assert "image/png" in ui.children[-1].outputs[0]["data"]


def test_ring_explorer_offers_only_world_sizes_that_split_the_sequence():
    from attn_course.widgets.ring import RingExplorer
    for L in (16, 24):
        ex = RingExplorer(seq_len=L)
        box = ex.widget()
        worlds = list(box.controls["world"].options)
        assert worlds == [P for P in range(2, 9) if L % (2 * P) == 0]
        for P in worlds:                                     # every offered P draws, in both layouts
            for layout in ("contiguous", "zigzag"):
                box.controls["layout"].value = layout
                box.controls["world"].value = P
                assert "image/png" in box.children[-1].outputs[0]["data"], (L, P, layout)
