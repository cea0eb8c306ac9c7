"""Lesson 08 demo: train the reversal model with ``flash_attention`` — gradients from the recomputing
backward — and check it learns exactly what the textbook attention learns.

    model, result = train_flash_reversal()     # same model, seed and data as demos.reverse.train_reversal
"""
from __future__ import annotations

from functools import partial

import torch
from einops import rearrange

from ..flash import flash_attention
from .reverse import OneLayerAttention, ReversalResult, ReversalTask, train_reversal

__all__ = ["FlashOneLayerAttention", "train_flash_reversal"]


class FlashOneLayerAttention(OneLayerAttention):
    """:class:`~attn_course.demos.reverse.OneLayerAttention` whose attention runs through
    :func:`~attn_course.flash.flash_attention` (tiles of ``block`` queries × ``block`` keys).
    ``need_weights=True`` uses the parent's explicit path, which returns the weights to plot."""

    def __init__(self, *args, block: int = 4, **kwargs):
        super().__init__(*args, **kwargs)
        self.block = block

    def forward(self, x: torch.Tensor, need_weights: bool = False):
        if need_weights:
            return super().forward(x, need_weights=True)
        B, L = x.shape
        if L != self.seq_len:
            raise ValueError(f"input has length L={L} but the model was built for seq_len={self.seq_len}")
        h = self.tok_emb(x) + self.pos_emb(torch.arange(L, device=x.device))          # (B, L, D)
        q, k, v = (rearrange(p(h), "b l (h e) -> b h l e", h=self.num_heads)
                   for p in (self.q_proj, self.k_proj, self.v_proj))                  # (B, H, L, E)
        out = flash_attention(q, k, v, block_q=self.block, block_k=self.block)       # (B, H, L, E)
        return self.head(self.out_proj(rearrange(out, "b h l e -> b l (h e)")))      # (B, L, V)


def train_flash_reversal(task: ReversalTask | None = None, *, steps: int = 150, batch_size: int = 64,
                         d_model: int = 32, num_heads: int = 1, lr: float = 1e-2, block: int = 4, seed: int = 0,
                         progress: bool = True) -> tuple[FlashOneLayerAttention, ReversalResult]:
    """Like :func:`~attn_course.demos.reverse.train_reversal` (same defaults, same initial weights for
    the same seed, CPU, one thread), but every training step runs flash_attention's forward and backward."""
    return train_reversal(task, steps=steps, batch_size=batch_size, d_model=d_model, num_heads=num_heads,
                          lr=lr, seed=seed, progress=progress, desc="reversal (flash)",
                          model_cls=partial(FlashOneLayerAttention, block=block))
