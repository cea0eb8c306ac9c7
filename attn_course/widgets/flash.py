"""Lesson 08 explorer: step through the key tiles of one query block and watch the online softmax.

:func:`tile_trace` runs the same recurrence as :func:`attn_course.flash.flash_attention` (it calls
:func:`~attn_course.flash.online_softmax_step`) and records, after each key tile, the running maximum
``m``, the denominator ``ℓ``, the rescale factor ``α = exp(m_old − m_new)`` applied to the earlier
tiles, and the partial output ``Õ/ℓ`` — what the output would be if the keys stopped there.
:class:`FlashTileExplorer` draws one step; :meth:`FlashTileExplorer.widget` adds the sliders.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .._validate import positive_int
from ..flash import LN2, LOG2E, online_softmax_finish, online_softmax_step

__all__ = ["TileState", "tile_trace", "FlashTileExplorer"]


@dataclass
class TileState:
    """The online-softmax state after ``step`` key tiles (``step`` ≥ 1), for every query row.

    keys: ``(k0, k1)`` the tile folded in at this step; tile_max, m, l, alpha: ``(Lq,)``; m is in
    natural-log units; partial: ``(Lq, D)`` = Õ/ℓ; weights: ``(Lq, Lk)`` the weights the algorithm
    implies so far, exp(S − m)/ℓ on the keys seen, 0 on the others (never stored by the real thing).
    """

    step: int
    keys: tuple[int, int]
    tile_max: torch.Tensor
    m: torch.Tensor
    l: torch.Tensor
    alpha: torch.Tensor
    partial: torch.Tensor
    weights: torch.Tensor = field(repr=False)


def tile_trace(S: torch.Tensor, V: torch.Tensor, block_k: int) -> list[TileState]:
    """Run the online softmax over the key tiles of scores ``S (Lq, Lk)`` (already scaled) and values
    ``V (Lk, D)``; return one :class:`TileState` per tile. The last state's ``partial`` equals
    ``softmax(S) @ V``."""
    positive_int("block_k", block_k)
    if S.dim() != 2 or V.dim() != 2 or S.shape[1] != V.shape[0]:
        raise ValueError(f"expected S (Lq, Lk) and V (Lk, D) with the same Lk, got S {tuple(S.shape)} "
                         f"and V {tuple(V.shape)}")
    S, V = S.double(), V.double()
    Lq, Lk = S.shape
    m = torch.full((1, Lq, 1), -math.inf, dtype=S.dtype)                 # one (batch·head) row block
    l, acc = torch.zeros(1, Lq, 1, dtype=S.dtype), torch.zeros(1, Lq, V.shape[1], dtype=S.dtype)
    states = []
    for step, k0 in enumerate(range(0, Lk, block_k), start=1):
        k1 = min(k0 + block_k, Lk)
        tile = S[:, k0:k1]
        m_old = m
        m, l, acc = online_softmax_step(m, l, acc.clone(), (tile * LOG2E)[None], V[None, k0:k1])
        out, _ = online_softmax_finish(m, l, acc)
        m_nat, l_row = m[0, :, 0] * LN2, l[0, :, 0]
        seen = torch.zeros_like(S)
        seen[:, :k1] = torch.exp(S[:, :k1] - m_nat[:, None]) / l_row[:, None]
        states.append(TileState(step, (k0, k1), tile.amax(-1), m_nat, l_row,
                                torch.exp2(m_old - m)[0, :, 0], out[0], seen))
    return states


class FlashTileExplorer:
    """Scores of a small labelled example, folded in key tile by key tile.

    Args:
        tokens: labels of the positions (queries = keys = tokens); default 12 letters.
        S: ``(L, L)`` scaled scores and V: ``(L, D)`` values; default: seeded random ones whose scores
           grow towards the right, so later tiles keep raising the maximum (α < 1 is visible).
        block_k: keys per tile.
    """

    def __init__(self, tokens: Sequence[str] | None = None, S: torch.Tensor | None = None,
                 V: torch.Tensor | None = None, *, block_k: int = 4, seed: int = 0):
        self.tokens = list(tokens) if tokens is not None else list("ABCDEFGHIJKL")
        L = len(self.tokens)
        g = torch.Generator().manual_seed(seed)
        self.S = S if S is not None else torch.randn(L, L, generator=g) + torch.linspace(0, 3, L)
        self.V = V if V is not None else torch.randn(L, 3, generator=g)
        if self.S.shape != (L, L):
            raise ValueError(f"S must have shape (L={L}, L={L}) for {L} tokens, got {tuple(self.S.shape)}")
        self.states = tile_trace(self.S, self.V, block_k)
        self.final = torch.softmax(self.S.double(), -1) @ self.V.double()

    def update(self, step: int = 1, query: int = 0):
        """The state after ``step`` tiles (clamped to 1…#tiles) and a figure for row ``query``."""
        state = self.states[max(1, min(step, len(self.states))) - 1]
        return state, self.render(state, query)

    def render(self, state: TileState, query: int):
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle

        fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [1.1, 1]})
        im = ax0.imshow(state.weights.numpy(), cmap="viridis", vmin=0, vmax=1)
        k0, k1 = state.keys
        ax0.add_patch(Rectangle((k0 - 0.5, -0.5), k1 - k0, len(self.tokens), fill=False, ec="red", lw=2))
        ax0.axhline(query, color="white", lw=0.8, ls=":")
        ax0.set_xticks(range(len(self.tokens)), self.tokens)
        ax0.set_yticks(range(len(self.tokens)), self.tokens)
        ax0.set_xlabel("key")
        ax0.set_ylabel("query")
        ax0.set_title(f"weights implied after tile {state.step} (red: tile just folded in)")
        fig.colorbar(im, ax=ax0, fraction=0.046)
        steps = range(1, state.step + 1)
        ax1.plot(steps, [s.m[query].item() for s in self.states[: state.step]], "o-", label="running max m")
        ax1.plot(steps, [s.l[query].item() for s in self.states[: state.step]], "s-", label="denominator ℓ")
        ax1.plot(steps, [s.alpha[query].item() for s in self.states[: state.step]], "^--",
                 label="rescale α = exp(m_old − m_new)")
        err = (state.partial[query] - self.final[query]).abs().max().item()
        ax1.set_xticks(list(steps))
        ax1.set_xlabel("key tiles folded in")
        ax1.set_title(f"query {self.tokens[query]}: |partial − final output| = {err:.2e}")
        ax1.legend(fontsize=8)
        fig.tight_layout()
        return fig

    def widget(self):
        """Sliders for the step and the query row (ipywidgets)."""
        import ipywidgets as W

        from . import interactive_figure
        controls = {"step": W.IntSlider(value=1, min=1, max=len(self.states), description="tiles"),
                    "query": W.IntSlider(value=0, min=0, max=len(self.tokens) - 1, description="query")}
        return interactive_figure(lambda step, query: self.update(step, query)[1], controls,
                                  title="Online softmax, one key tile at a time")
