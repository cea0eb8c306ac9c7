"""Lesson 09's explorer: pick a sparse pattern and its parameters; see the mask, its density and the
tiles a block-sparse kernel (FlexAttention's BlockMask, ``flash_attention(window=)``) computes or skips."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import masks, sparse
from . import interactive_figure

__all__ = ["PATTERNS", "SparseView", "pattern_mask", "SparseExplorer"]

PATTERNS = ("causal window", "dilated", "global + local", "BigBird", "Sparse Transformer")


def pattern_mask(pattern: str, L: int, window: int, dilation: int = 2, n_global: int = 1, block: int = 8,
                 seed: int = 0) -> torch.Tensor:
    """The ``(L, L)`` bool mask of one of :data:`PATTERNS` (True = may attend)."""
    if pattern == "causal window":
        return masks.sliding_window_mask(L, window)
    if pattern == "dilated":
        return masks.dilated_mask(L, window, dilation)
    glob = list(range(min(n_global, L)))
    if pattern == "global + local":
        return masks.global_local_mask(L, window, glob)
    nb = -(-L // block)
    if pattern == "BigBird":
        rand = sparse.random_block_layout(nb, 1, generator=torch.Generator().manual_seed(seed))
        return sparse.dense(sparse.bigbird(window, glob, rand, block, L), L)
    if pattern == "Sparse Transformer":
        stride = max(1, window // block) if window >= block else 2
        return sparse.dense(sparse.block_sparse(sparse.sparse_transformer_layout(nb, stride), block, causal=True), L)
    raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")


@dataclass
class SparseView:
    mask: torch.Tensor          # (L, L) bool
    density: float              # fraction of L² pairs kept
    full: torch.Tensor          # (nb, nb) bool tiles computed without an element mask
    partial: torch.Tensor       # (nb, nb) bool tiles computed with an element mask
    tile_share: float           # (full + partial) / all tiles: the work a block-sparse kernel does


class SparseExplorer:
    """``update(pattern, L, window, dilation, n_global, block)`` -> (:class:`SparseView`, Figure)."""

    def view(self, pattern="causal window", L=64, window=8, dilation=2, n_global=1, block=8) -> SparseView:
        m = pattern_mask(pattern, L, window, dilation, n_global, block)
        full, partial = sparse.tile_occupancy(m, block)
        share = float((full | partial).float().mean())
        return SparseView(m, sparse.density(m), full, partial, share)

    def update(self, pattern="causal window", L=64, window=8, dilation=2, n_global=1, block=8):
        import matplotlib.pyplot as plt
        v = self.view(pattern, L, window, dilation, n_global, block)
        fig, (a, b) = plt.subplots(1, 2, figsize=(9, 4))
        a.imshow(v.mask.float(), cmap="viridis", interpolation="nearest")
        a.set_title(f"{pattern}: density {v.density:.3f}")
        a.set_xlabel("key j"); a.set_ylabel("query i")
        occ = v.full.float() * 2 + v.partial.float()                    # 2 full, 1 partial, 0 empty
        b.imshow(occ, cmap="magma", vmin=0, vmax=2, interpolation="nearest")
        b.set_title(f"{block}×{block} tiles: {int(v.full.sum())} full, {int(v.partial.sum())} partial, "
                    f"{int((~(v.full | v.partial)).sum())} empty", fontsize=9)
        b.set_xlabel("key block"); b.set_ylabel("query block")
        fig.tight_layout()
        return v, fig

    def widget(self):
        import ipywidgets as W
        controls = {
            "pattern": W.Dropdown(options=PATTERNS, value="causal window", description="pattern"),
            "L": W.IntSlider(value=64, min=16, max=256, step=16, description="L"),
            "window": W.IntSlider(value=8, min=1, max=64, description="window"),
            "dilation": W.IntSlider(value=2, min=1, max=8, description="dilation"),
            "n_global": W.IntSlider(value=1, min=0, max=8, description="globals"),
            "block": W.Dropdown(options=[4, 8, 16, 32], value=8, description="block"),
        }
        return interactive_figure(lambda **s: self.update(**s)[1], controls,
                                  title="Sparse patterns: mask, density and tiles")
