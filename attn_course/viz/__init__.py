"""Attention heatmaps that teach: token labels on both axes, a colour bar, a shared scale across heads.

    plot_attention(weights)   one (Lq, Lk) map        -> Axes
    plot_heads(weights)       (H, Lq, Lk), one panel per head, ONE shared colour scale and bar -> Figure
    plot_mask(mask)           bool (True = may attend) or additive float mask -> Axes
    show_source(obj)          display a package object's source in a notebook (plain print elsewhere)
    spread(values)            mean ± sd (n, min–max) of repeated measurements, e.g. one per seed
    plot_loss_curves(runs)    mean training curve per model with its min–max band over seeds -> Axes

Rows are queries (the position that *looks*), columns are keys (the positions it looks *at*); row i of
an attention map is the distribution query i puts over the keys. Every function accepts tensors on any
device, in any floating dtype, with or without ``requires_grad`` (they are detached and copied to CPU
float32), as well as NumPy arrays. Leading singleton dimensions are dropped, so ``weights`` straight out
of ``attention()`` with B = H = 1 can be passed as is. Cross-attention maps (Lq != Lk) work unchanged.
"""
from __future__ import annotations

import inspect
import math
from typing import Sequence

import numpy as np

from .._notebook import in_kernel

__all__ = ["plot_attention", "plot_heads", "plot_mask", "show_source", "table", "spread", "Spread",
           "plot_loss_curves"]

_MAX_LABELS = 48          # above this many tokens we show every k-th label
_CMAP = "viridis"


def _to_numpy(x) -> np.ndarray:
    """Tensor (any device/dtype, maybe with grad) or array-like -> float/bool NumPy array on the CPU."""
    try:
        import torch
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu()
            return x.numpy() if x.dtype == torch.bool else x.float().numpy()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return np.asarray(x)


def _squeeze_leading(a: np.ndarray, keep: int, what: str, hint: str) -> np.ndarray:
    """Drop leading size-1 axes until ``a`` has ``keep`` dims; ValueError naming the shape otherwise."""
    shape = a.shape
    while a.ndim > keep and a.shape[0] == 1:
        a = a[0]
    if a.ndim != keep:
        raise ValueError(f"{what} must have shape {hint}, got {shape}")
    return a


def _labels(labels, n: int, name: str, size: str) -> list[str] | None:
    if labels is None:
        return None
    labels = [str(t) for t in labels]           # a plain string works too: one character per token
    if len(labels) != n:
        raise ValueError(f"{name} has {len(labels)} entries but the map has {size}={n}")
    return labels


def _fontsize(n: int) -> float:
    """10 pt for short sequences, shrinking to 6 pt at 32 tokens and 5 pt beyond."""
    return float(max(5.0, min(10.0, 200.0 / max(n, 1))))


def _set_ticks(ax, axis: str, labels: list[str] | None, n: int, show: bool = True,
               max_labels: int = _MAX_LABELS) -> None:
    """Token labels (thinned to at most ``max_labels``) or thinned integer positions when unlabelled."""
    set_ticks, set_labels = (ax.set_xticks, ax.set_xticklabels) if axis == "x" else (ax.set_yticks, ax.set_yticklabels)
    if labels is None:
        step = max(1, math.ceil(n / 16))
        idx = list(range(0, n, step))
        texts = [str(i) for i in idx]
    else:
        step = max(1, math.ceil(n / max_labels))
        idx = list(range(0, n, step))
        texts = [labels[i] for i in idx]
    set_ticks(idx)
    if not show:
        set_labels([])
        return
    fs = _fontsize(len(idx))
    if axis == "x":
        rotate = labels is not None and (max((len(t) for t in texts), default=0) > 2 or len(idx) > 12)
        set_labels(texts, fontsize=fs, rotation=90 if rotate else 0)
    else:
        set_labels(texts, fontsize=fs)


def _new_axes(lq: int, lk: int):
    import matplotlib.pyplot as plt
    w = min(9.0, max(3.5, 0.22 * lk + 2.2))
    h = min(8.0, max(3.0, 0.22 * lq + 1.2))
    fig, ax = plt.subplots(figsize=(w, h), layout="constrained")
    return ax


def plot_attention(weights, *, query_labels: Sequence | None = None, key_labels: Sequence | None = None,
                   ax=None, title: str | None = None, cmap: str = _CMAP, vmin: float | None = None,
                   vmax: float | None = None, colorbar: bool = True, annotate: bool = False):
    """Heatmap of one attention map, rows = queries, columns = keys; returns the matplotlib ``Axes``.

    Args:
        weights: ``(Lq, Lk)`` (leading size-1 axes are dropped, e.g. ``(1, 1, Lq, Lk)``); tensor on any
            device, any float dtype, grad allowed; or a NumPy array.
        query_labels, key_labels: one label per query / key (strings or anything ``str()`` accepts; a
            string is split into characters). Long sequences show every k-th label.
        ax: draw into this Axes (e.g. a subplot); a new figure is made when ``None``.
        title: Axes title.
        vmin, vmax: colour range; default ``[0, max]`` (weights are non-negative), or ``[min, max]``
            when the map has negative entries (raw scores).
        colorbar: add a colour bar to the Axes' figure.
        annotate: write each value in its cell (sensible for maps up to ~10×10).
    """
    a = _squeeze_leading(_to_numpy(weights).astype(np.float32), 2, "weights",
                         "(Lq, Lk) (use plot_heads for (H, Lq, Lk))")
    lq, lk = a.shape
    ql = _labels(query_labels, lq, "query_labels", "Lq")
    kl = _labels(key_labels, lk, "key_labels", "Lk")
    ax = _new_axes(lq, lk) if ax is None else ax
    finite = a[np.isfinite(a)]
    lo = float(finite.min()) if finite.size else 0.0
    hi = float(finite.max()) if finite.size else 1.0
    vmin = min(0.0, lo) if vmin is None else vmin
    vmax = (hi if hi > vmin else vmin + 1.0) if vmax is None else vmax
    im = ax.imshow(a, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    _set_ticks(ax, "x", kl, lk)
    _set_ticks(ax, "y", ql, lq)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title is not None:
        ax.set_title(title)
    if annotate:
        mid = (vmin + vmax) / 2
        for i in range(lq):
            for j in range(lk):
                ax.text(j, i, f"{a[i, j]:.2f}", ha="center", va="center", fontsize=_fontsize(max(lq, lk)) * 0.8,
                        color="black" if a[i, j] > mid else "white")
    if colorbar:
        ax.figure.colorbar(im, ax=ax, label="attention weight", shrink=0.9)
    return ax


def plot_heads(weights, *, query_labels: Sequence | None = None, key_labels: Sequence | None = None,
               ncols: int | None = None, titles: Sequence[str] | None = None, suptitle: str | None = None,
               cmap: str = _CMAP, vmin: float | None = None, vmax: float | None = None,
               panel_size: float | None = None):
    """One panel per head on ONE shared colour scale with ONE colour bar; returns the ``Figure``.

    Sharing the scale matters: with a per-panel scale a nearly uniform head looks as sharp as a
    peaked one. Args as :func:`plot_attention`, plus:

        weights: ``(H, Lq, Lk)``, or ``(1, H, Lq, Lk)`` (pick a sample first: ``weights[b]``).
        ncols: panels per row (default ``min(H, 4)``).
        titles: one title per head (default ``"head h"``).
        suptitle: figure title.
        panel_size: inches per panel side (default grows with the length, 2.6 to 4).

    Key labels are drawn under the bottom row, query labels left of the first column.
    """
    import matplotlib.pyplot as plt

    a = _squeeze_leading(_to_numpy(weights).astype(np.float32), 3, "weights",
                         "(H, Lq, Lk) or (1, H, Lq, Lk); select one sample with weights[b]")
    h, lq, lk = a.shape
    ql = _labels(query_labels, lq, "query_labels", "Lq")
    kl = _labels(key_labels, lk, "key_labels", "Lk")
    if titles is not None:
        titles = [str(t) for t in titles]
        if len(titles) != h:
            raise ValueError(f"titles has {len(titles)} entries but weights has H={h} heads")
    ncols = min(h, 4) if ncols is None else ncols
    if isinstance(ncols, bool) or not isinstance(ncols, int) or ncols <= 0:
        raise ValueError(f"ncols must be a positive integer, got {ncols!r}")
    nrows = math.ceil(h / ncols)
    panel_size = max(2.6, min(4.0, 0.08 * max(lq, lk) + 1.5)) if panel_size is None else panel_size
    max_labels = max(4, int(panel_size * 8))                         # ~9 pt per label
    finite = a[np.isfinite(a)]
    lo = float(finite.min()) if finite.size else 0.0
    hi = float(finite.max()) if finite.size else 1.0
    vmin = min(0.0, lo) if vmin is None else vmin                 # one scale for every head
    vmax = (hi if hi > vmin else vmin + 1.0) if vmax is None else vmax
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel_size * ncols + 1.2, panel_size * nrows + 0.4),
                             squeeze=False, layout="constrained")
    im = None
    for idx, ax in enumerate(axes.flat):
        if idx >= h:
            ax.set_visible(False)
            continue
        r, c = divmod(idx, ncols)
        im = ax.imshow(a[idx], cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
        bottom = idx + ncols >= h                                    # no panel below this one
        _set_ticks(ax, "x", kl, lk, show=bottom, max_labels=max_labels)
        _set_ticks(ax, "y", ql, lq, show=c == 0, max_labels=max_labels)
        if bottom:
            ax.set_xlabel("key")
        if c == 0:
            ax.set_ylabel("query")
        ax.set_title(titles[idx] if titles is not None else f"head {idx}", fontsize=10)
    fig.colorbar(im, ax=axes.ravel().tolist(), label="attention weight", shrink=0.9)
    if suptitle is not None:
        fig.suptitle(suptitle)
    return fig


def plot_mask(mask, *, query_labels: Sequence | None = None, key_labels: Sequence | None = None, ax=None,
              title: str | None = None):
    """Draw a mask; returns the ``Axes``.

    Boolean masks use the course's polarity, **True = may attend** (drawn light, labelled "attend"),
    False = blocked (dark). Float masks are additive: finite values are drawn on a colour scale and
    ``-inf`` entries (blocked) in dark grey. Accepted shapes: ``(Lq, Lk)`` (leading size-1 axes are
    dropped) or a padding mask ``(B, 1, 1, Lk)``, drawn as one row per sequence.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    m = _to_numpy(mask)
    shape = m.shape
    while m.ndim > 2 and m.shape[0] == 1:
        m = m[0]
    is_padding = m.ndim == 4 and m.shape[1] == m.shape[2] == 1          # (B, 1, 1, Lk)
    if is_padding:
        m = m[:, 0, 0, :]
    if m.ndim != 2:
        raise ValueError(f"mask must have shape (Lq, Lk) or (B, 1, 1, Lk), got {shape}")
    rows, lk = m.shape
    ql = _labels(query_labels, rows, "query_labels", "B" if is_padding else "Lq")
    kl = _labels(key_labels, lk, "key_labels", "Lk")
    ax = _new_axes(rows, lk) if ax is None else ax
    if m.dtype == np.bool_:
        cmap = ListedColormap(["#30123b", "#f4e55b"])             # blocked dark, attend light
        im = ax.imshow(m.astype(np.float32), cmap=cmap, vmin=0, vmax=1, aspect="auto", interpolation="nearest")
        cb = ax.figure.colorbar(im, ax=ax, ticks=[0.25, 0.75], shrink=0.6)
        cb.ax.set_yticklabels(["blocked\n(False)", "attend\n(True)"])
    else:
        m = m.astype(np.float32)
        shown = np.ma.masked_where(~np.isfinite(m), m)
        cmap = plt.get_cmap(_CMAP).with_extremes(bad="#404040")
        im = ax.imshow(shown, cmap=cmap, aspect="auto", interpolation="nearest")
        ax.figure.colorbar(im, ax=ax, label="added to scores (grey = -inf)", shrink=0.9)
    _set_ticks(ax, "x", kl, lk)
    _set_ticks(ax, "y", ql, rows)
    ax.set_xlabel("key")
    ax.set_ylabel("sequence in batch" if is_padding else "query")
    if title is not None:
        ax.set_title(title)
    return ax


def show_source(obj, *, docstring: bool = True) -> None:
    """Display the source code of ``obj`` (function, class or module).

    In a notebook the code is rendered as a highlighted Markdown code block; elsewhere it is printed.
    ``docstring=False`` drops the leading docstring of a function or class to keep the listing short.
    The output depends only on the source file, so it is deterministic under nbval.
    """
    src = inspect.getsource(obj)
    if not docstring and (inspect.isfunction(obj) or inspect.isclass(obj)):
        doc = inspect.getdoc(obj)
        if doc:
            src = _strip_docstring(src)
    src = src.rstrip("\n")
    if in_kernel():                          # a Jupyter/Colab kernel, not a bare shell
        from IPython.display import Markdown, display
        display(Markdown(f"```python\n{src}\n```"))
    else:
        print(src)


class MarkdownTable:
    """Markdown text that a notebook renders (``text/markdown``: a real table, not raw pipes) and whose
    ``text/plain`` is the same text (what a terminal shows and what nbval compares)."""

    def __init__(self, text: str):
        self.text = text

    def _repr_markdown_(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.text


def table(text: str) -> MarkdownTable:
    """Show a Markdown table (e.g. ``bench.format_table(rows)``) as a table: ``display(viz.table(t))`` or
    make it the cell's last expression."""
    return MarkdownTable(text)


def _strip_docstring(src: str) -> str:
    """Remove the first triple-quoted string after the ``def``/``class`` line."""
    import ast
    import textwrap
    tree = ast.parse(textwrap.dedent(src))
    node = tree.body[0]
    first = node.body[0] if getattr(node, "body", None) else None
    if not (isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant)
            and isinstance(first.value.value, str)):
        return src
    lines = src.splitlines(keepends=True)
    return "".join(lines[: first.lineno - 1] + lines[first.end_lineno:])


from . import vision as _vision  # noqa: E402
from .vision import *  # noqa: F401,F403,E402  (lesson 06 figures)

__all__ += list(_vision.__all__)


from ._curves import Spread, plot_loss_curves, spread  # noqa: E402  (re-exported)
