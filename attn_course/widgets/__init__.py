"""Interactive explorers (ipywidgets); update logic is plain Python, tested without a browser.

Every explorer follows one pattern:

* a plain object whose ``update(**state)`` computes what is shown (tensors) and draws the figure —
  this is what the tests call;
* :func:`interactive_figure` wires ipywidgets controls to a ``render(**state) -> Figure`` function
  and redraws the figure into an ``Output`` widget whenever a control changes.

Lesson 01's explorer is :class:`AttentionExplorer` (temperature, √d_k scaling, causal and padding
masks, query selector). Other lessons add ``attn_course/widgets/<topic>.py``.
"""
from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .._notebook import saved_box
from ..functional import attention
from ..masks import causal_mask, combine

__all__ = ["interactive_figure", "AttentionExplorer", "ExplorerView", "SNAPSHOT_NOTE"]


SNAPSHOT_NOTE = "Interactive explorer: run this cell to use its controls. The picture is its first state."


def interactive_figure(render: Callable[..., "object"], controls: dict, *, title: str | None = None):
    """A ``VBox`` with the ``controls`` (name -> ipywidgets control) above the figure ``render`` draws.

    ``render(**{name: control.value})`` must return a matplotlib Figure; it is called once now and
    again whenever a control's value changes, and its figure replaces the previous one. The box
    exposes ``.controls`` (the dict) and ``.redraw()`` so that code and tests can drive it. Displayed,
    it is the live widget plus a PNG snapshot of the first figure and a note (what a saved, not yet
    run notebook shows instead of the widget's text repr).
    """
    import ipywidgets as W
    import matplotlib.pyplot as plt
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.core.pylabtools import print_figure

    for c in controls.values():              # labels at their natural width, never cut to "temperat…"
        if getattr(c, "description", "") and hasattr(c, "style") and hasattr(c.style, "description_width"):
            c.style.description_width = "initial"
    out = W.Output()
    header = [W.HTML(f"<b>{title}</b>")] if title else []
    row = W.HBox(list(controls.values()), layout=W.Layout(flex_flow="row wrap"))
    box = saved_box("VBox")([*header, row, out])
    box.saved_text = f"{SNAPSHOT_NOTE} ({title})" if title else SNAPSHOT_NOTE

    def redraw(_change=None):
        try:
            fig = render(**{name: c.value for name, c in controls.items()})
        except Exception as e:               # a control moved to a bad state: say so where the figure was
            if _change is None:              # (the first draw raises: a bad explorer is the caller's bug)
                raise
            out.outputs = ({"output_type": "stream", "name": "stdout", "text": f"{type(e).__name__}: {e}\n"},)
            return
        # Set the Output's state directly (not `with out: display(...)`, which relies on a frontend
        # routing messages): works the same in JupyterLab, nbconvert, nbval and tests.
        data, metadata = InteractiveShell.instance().display_formatter.format(fig)
        if "image/png" not in data:          # no inline backend (scripts, tests): draw the PNG here
            png = print_figure(fig, "png")   # None for a figure with nothing drawn
            if png:
                data = {**data, "image/png": base64.b64encode(png).decode("ascii")}
        out.outputs = ({"output_type": "display_data", "data": data, "metadata": metadata},)
        if box.snapshot is None and "image/png" in data:
            box.snapshot = {"image/png": data["image/png"]}
        plt.close(fig)                       # shown once, inside the Output, not again at cell end

    for c in controls.values():
        c.observe(redraw, names="value")
    box.controls, box.redraw = controls, redraw
    redraw()
    return box


@dataclass
class ExplorerView:
    """What the lesson-01 explorer shows for one state.

    weights: ``(Lq, Lk)`` attention weights; mask: ``(Lq, Lk)`` bool (True = may attend);
    scale: the factor applied to Q Kᵀ; query: the selected row; row: ``weights[query]``;
    entropy: that row's entropy in nats (0 = one-hot, log(#visible keys) = uniform).
    """

    weights: torch.Tensor = field(repr=False)
    mask: torch.Tensor = field(repr=False)
    scale: float
    query: int
    row: torch.Tensor
    entropy: float
    figure: object = field(default=None, repr=False)


class AttentionExplorer:
    """Scaled dot-product attention on a small labelled example, recomputed for each control state.

    Args:
        tokens: one label per position (default: a 6-token sentence plus two ``<pad>`` tokens).
        q, k, v: ``(L, d_k)`` tensors; default: seeded projections of seeded token embeddings, so
            equal tokens get equal keys (look at the two "the"s).
        n_pad: how many trailing tokens are padding (hidden when ``padding=True``).
        seed: seed of the default q/k/v.
    """

    def __init__(self, tokens: Sequence[str] | None = None, q: torch.Tensor | None = None,
                 k: torch.Tensor | None = None, v: torch.Tensor | None = None, *, d_k: int = 16,
                 n_pad: int | None = None, seed: int = 0):
        if tokens is None:
            tokens = ["the", "cat", "sat", "on", "the", "mat", "<pad>", "<pad>"]
            n_pad = 2 if n_pad is None else n_pad
        self.tokens = [str(t) for t in tokens]
        L = len(self.tokens)
        self.n_pad = 0 if n_pad is None else n_pad
        if not 0 <= self.n_pad < L:
            raise ValueError(f"n_pad={self.n_pad} must be in [0, L={L}) (at least one real token)")
        if q is None or k is None or v is None:
            g = torch.Generator().manual_seed(seed)
            vocab = {t: i for i, t in enumerate(dict.fromkeys(self.tokens))}
            emb = torch.randn(len(vocab), d_k, generator=g)
            x = emb[[vocab[t] for t in self.tokens]]                           # (L, d_k)
            W_q, W_k, W_v = (torch.randn(d_k, d_k, generator=g) / math.sqrt(d_k) for _ in range(3))
            q, k, v = x @ W_q, x @ W_k, x @ W_v
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.dim() != 2 or t.shape[0] != L:
                raise ValueError(f"{name} must have shape (L={L}, d), got {tuple(t.shape)}")
        self.q, self.k, self.v = q.detach().float().cpu(), k.detach().float().cpu(), v.detach().float().cpu()
        self.view: ExplorerView | None = None                                   # last update

    @property
    def d_k(self) -> int:
        return self.q.shape[-1]

    def mask(self, *, causal: bool = False, padding: bool = False) -> torch.Tensor:
        """``(L, L)`` bool mask, True = may attend: causal AND (when ``padding``) not a pad key."""
        L = len(self.tokens)
        keys = torch.arange(L) < L - self.n_pad if padding else torch.ones(L, dtype=torch.bool)
        return combine(causal_mask(L) if causal else None, keys[None, :].expand(L, L))

    def compute(self, *, temperature: float = 1.0, scaled: bool = True, causal: bool = False,
                padding: bool = False, query: int = 0) -> ExplorerView:
        """The numbers for one state (no drawing): weights = softmax(Q Kᵀ · scale + mask).

        ``scale = 1 / (temperature · √d_k)`` when ``scaled``, else ``1 / temperature``.
        """
        L = len(self.tokens)
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        if isinstance(query, bool) or not isinstance(query, int) or not 0 <= query < L:
            raise ValueError(f"query must be an int in [0, L={L}), got {query!r}")
        scale = 1.0 / (temperature * (math.sqrt(self.d_k) if scaled else 1.0))
        mask = self.mask(causal=causal, padding=padding)
        _, w = attention(self.q, self.k, self.v, attn_mask=mask, scale=scale)      # (L, L)
        row = w[query]
        p = row[row > 0]
        entropy = float(-(p * p.log()).sum())
        return ExplorerView(w, mask, scale, query, row, entropy)

    def update(self, **state) -> ExplorerView:
        """``compute(**state)`` plus its figure (heatmap with the query row outlined, and that row's
        distribution as bars). The view is kept in ``self.view``; the caller closes the figure."""
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle

        from ..viz import plot_attention

        view = self.compute(**state)
        L = len(self.tokens)
        fig, (ax_map, ax_bar) = plt.subplots(1, 2, figsize=(9.5, 3.8), layout="constrained",
                                             gridspec_kw={"width_ratios": [1.25, 1]})
        plot_attention(view.weights, query_labels=self.tokens, key_labels=self.tokens, ax=ax_map,
                       vmin=0.0, vmax=1.0, title=f"weights, scale = {view.scale:.3f}")
        ax_map.add_patch(Rectangle((-0.5, view.query - 0.5), L, 1, fill=False, edgecolor="red", lw=2))
        colors = ["tab:red" if m else "lightgray" for m in view.mask[view.query].tolist()]
        ax_bar.bar(range(L), view.row.numpy(), color=colors)
        ax_bar.set_xticks(range(L), self.tokens, rotation=45, ha="right")
        ax_bar.set_ylim(0, 1)
        ax_bar.set_ylabel("weight")
        ax_bar.set_title(f"query {view.query} ({self.tokens[view.query]!r}): entropy {view.entropy:.2f} nats")
        view.figure = fig
        self.view = view
        return view

    def widget(self):
        """The ipywidgets explorer: temperature slider, √d_k toggle, causal and padding toggles, query."""
        import ipywidgets as W

        controls = {
            "temperature": W.FloatLogSlider(value=1.0, base=10, min=-1, max=1, step=0.05,
                                            description="temperature"),
            "scaled": W.Checkbox(value=True, description="divide by √d_k"),
            "causal": W.Checkbox(value=False, description="causal"),
            "padding": W.Checkbox(value=False, description=f"mask {self.n_pad} pad keys"),
            "query": W.Dropdown(options=[(f"{i}: {t}", i) for i, t in enumerate(self.tokens)], value=0,
                                description="query"),
        }
        return interactive_figure(lambda **s: self.update(**s).figure, controls,
                                  title="Scaled dot-product attention explorer")
