"""Lesson 08 demo: train the reversal model with ``flash_attention`` — gradients from the recomputing
backward — and check it learns exactly what the textbook attention learns.

    model, result = train_flash_reversal()     # same model, seed and data as demos.reverse.train_reversal
"""
from __future__ import annotations

from functools import partial

import torch

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

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, need_weights: bool):
        if need_weights:            # the explicit path: flash attention never forms the weights
            return super().attend(q, k, v, need_weights)
        return flash_attention(q, k, v, block_q=self.block, block_k=self.block), None


def train_flash_reversal(task: ReversalTask | None = None, *, steps: int = 150, batch_size: int = 64,
                         d_model: int = 32, num_heads: int = 1, lr: float = 1e-2, block: int = 4, seed: int = 0,
                         progress: bool = True) -> tuple[FlashOneLayerAttention, ReversalResult]:
    """Like :func:`~attn_course.demos.reverse.train_reversal` (same defaults, same initial weights for
    the same seed, CPU, one thread), but every training step runs flash_attention's forward and backward."""
    return train_reversal(task, steps=steps, batch_size=batch_size, d_model=d_model, num_heads=num_heads,
                          lr=lr, seed=seed, progress=progress, desc="reversal (flash)",
                          model_cls=partial(FlashOneLayerAttention, block=block))
