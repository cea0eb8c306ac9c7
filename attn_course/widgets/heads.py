"""Lessons 02/03 explorer: pick a head and a query, see where that head looks.

    explorer = HeadExplorer(weights[0], tokens)      # weights (H, Lq, Lk) of one sample
    explorer.widget()                                # head dropdown, query dropdown, figure
    explorer.compute(head=1, query=3).top_key        # the logic, without a browser
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from . import interactive_figure

__all__ = ["HeadExplorer", "HeadView"]


@dataclass
class HeadView:
    """What the explorer shows for one (head, query): the head's ``(Lq, Lk)`` map, the query's row,
    the key it weights most (``top_key``, ``top_weight``) and the row's weights in every head
    ``(H, Lk)`` (``all_heads``), to compare heads for the same query."""
    head: int
    query: int
    weights: torch.Tensor
    row: torch.Tensor
    top_key: int
    top_weight: float
    all_heads: torch.Tensor
    figure: object = field(default=None, repr=False)


class HeadExplorer:
    """Per-head attention maps ``weights`` ``(H, Lq, Lk)`` with token labels for queries and keys.

    ``key_tokens`` defaults to ``tokens`` (self-attention).
    """

    def __init__(self, weights: torch.Tensor, tokens: Sequence, key_tokens: Sequence | None = None):
        w = weights.detach().float().cpu()
        while w.dim() > 3 and w.shape[0] == 1:
            w = w[0]
        if w.dim() != 3:
            raise ValueError(f"weights must have shape (H, Lq, Lk) (one sample), got {tuple(weights.shape)}")
        self.weights = w
        self.tokens = [str(t) for t in tokens]
        self.key_tokens = self.tokens if key_tokens is None else [str(t) for t in key_tokens]
        H, Lq, Lk = w.shape
        if len(self.tokens) != Lq or len(self.key_tokens) != Lk:
            raise ValueError(f"got {len(self.tokens)} query and {len(self.key_tokens)} key labels for "
                             f"weights of shape (H={H}, Lq={Lq}, Lk={Lk})")
        self.view: HeadView | None = None

    @property
    def num_heads(self) -> int:
        return self.weights.shape[0]

    def compute(self, *, head: int = 0, query: int = 0) -> HeadView:
        H, Lq, _ = self.weights.shape
        for name, value, n, what in (("head", head, H, "H"), ("query", query, Lq, "Lq")):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
                raise ValueError(f"{name} must be an int in [0, {what}={n}), got {value!r}")
        row = self.weights[head, query]
        top = int(row.argmax())
        return HeadView(head, query, self.weights[head], row, top, float(row[top]), self.weights[:, query])

    def describe(self, *, head: int = 0, query: int = 0) -> str:
        """One sentence: where this head's query looks most."""
        v = self.compute(head=head, query=query)
        return (f"head {head}, query {query} ({self.tokens[query]!r}) puts {v.top_weight:.0%} of its weight "
                f"on key {v.top_key} ({self.key_tokens[v.top_key]!r})")

    def update(self, **state) -> HeadView:
        """``compute(**state)`` plus its figure: the head's map with the query row outlined, and the
        query's weights in every head (the chosen one highlighted). The caller closes the figure."""
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle

        from ..viz import plot_attention

        v = self.compute(**state)
        Lk = len(self.key_tokens)
        fig, (ax_map, ax_heads) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
        plot_attention(v.weights, query_labels=self.tokens, key_labels=self.key_tokens, ax=ax_map,
                       vmin=0.0, vmax=1.0, title=f"head {v.head}")
        ax_map.add_patch(Rectangle((-0.5, v.query - 0.5), Lk, 1, fill=False, edgecolor="red", lw=2))
        ax_heads.imshow(v.all_heads.numpy(), vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax_heads.add_patch(Rectangle((-0.5, v.head - 0.5), Lk, 1, fill=False, edgecolor="red", lw=2))
        ax_heads.set_xticks(range(Lk), self.key_tokens)
        ax_heads.set_yticks(range(self.num_heads), [f"head {h}" for h in range(self.num_heads)])
        ax_heads.set_xlabel("key")
        ax_heads.set_title(f"query {v.query} ({self.tokens[v.query]!r}) in every head")
        v.figure = fig
        self.view = v
        return v

    def widget(self):
        """ipywidgets explorer: a head dropdown and a query dropdown above the figure."""
        import ipywidgets as W

        controls = {
            "head": W.Dropdown(options=[(f"head {h}", h) for h in range(self.num_heads)], value=0,
                               description="head"),
            "query": W.Dropdown(options=[(f"{i}: {t}", i) for i, t in enumerate(self.tokens)], value=0,
                                description="query"),
        }
        return interactive_figure(lambda **s: self.update(**s).figure, controls, title="Per-head attention explorer")
