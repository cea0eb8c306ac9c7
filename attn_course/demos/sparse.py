"""Lesson 09: two tiny tasks for sparse attention, trained in seconds with a fixed mask.

* ``"shift"`` — a task that needs only local context: ``y_i = x_{i−shift}`` (default 2 back). A window of
  ``W > shift`` suffices; the trained weights light up one sub-diagonal inside the band.
* ``"first"`` — a task that needs a global token: ``y_i = x_0`` (position 0 holds a "topic" token that
  every position must report). A window alone cannot see it from positions ``i ≥ W``; making position 0
  global (Longformer's pattern, :func:`attn_course.masks.global_local_mask`) solves it, and the weights
  light up column 0.

The model is lesson 01's :class:`~attn_course.demos.reverse.OneLayerAttention` (embeddings → one attention
layer → read-out, no residual, so every prediction goes through the attention weights) with a fixed
bool mask (True = may attend) passed to :func:`attn_course.attention`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import positive_int
from ..functional import attention
from ._train import fit, fit_many
from .reverse import OneLayerAttention

__all__ = ["SparseTask", "MaskedAttentionModel", "train_masked", "train_masked_many",
           "accuracy_by_position"]


@dataclass(frozen=True)
class SparseTask:
    """``kind="shift"``: ``y_i = x_{i−shift}`` (positions ``i < shift`` are not scored);
    ``kind="first"``: ``y_i = x_0`` for ``i ≥ 1``. Tokens uniform over ``vocab_size`` symbols."""

    kind: str = "shift"
    vocab_size: int = 16
    seq_len: int = 24
    shift: int = 2

    def __post_init__(self):
        if self.kind not in ("shift", "first"):
            raise ValueError(f"kind must be 'shift' or 'first', got {self.kind!r}")
        positive_int("vocab_size", self.vocab_size)
        positive_int("seq_len", self.seq_len)
        positive_int("shift", self.shift)
        if self.shift >= self.seq_len:
            raise ValueError(f"shift={self.shift} must be smaller than seq_len={self.seq_len}")

    def sample(self, gen: torch.Generator, batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` int64 ``(batch_size, seq_len)``; unscored targets are −100 (cross-entropy's ignore_index)."""
        x = torch.randint(self.vocab_size, (batch_size, self.seq_len), generator=gen)
        y = torch.full_like(x, -100)
        if self.kind == "shift":
            y[:, self.shift:] = x[:, :-self.shift]
        else:
            y[:, 1:] = x[:, :1]
        return x, y


class MaskedAttentionModel(OneLayerAttention):
    """:class:`OneLayerAttention` whose single attention layer uses a fixed bool ``mask`` ``(L, L)``."""

    def __init__(self, vocab_size: int, seq_len: int, mask: torch.Tensor, d_model: int = 32, num_heads: int = 1):
        super().__init__(vocab_size, seq_len, d_model, num_heads)
        if mask.shape != (seq_len, seq_len) or mask.dtype != torch.bool:
            raise ValueError(f"mask must be bool ({seq_len}, {seq_len}), got {mask.dtype} {tuple(mask.shape)}")
        self.register_buffer("mask", mask, persistent=False)

    def attend(self, q, k, v, need_weights):
        return attention(q, k, v, attn_mask=self.mask)


@torch.no_grad()
def accuracy_by_position(model: MaskedAttentionModel, task: SparseTask, *, n: int = 1024, seed: int = 1234
                         ) -> torch.Tensor:
    """``(seq_len,)`` held-out accuracy at each position (NaN where nothing is scored)."""
    x, y = task.sample(torch.Generator().manual_seed(seed), n)         # drawn on the CPU: same data on any device
    device = next(model.parameters()).device
    x, y = x.to(device), y.to(device)
    pred = model(x).argmax(-1)
    scored = y != -100
    acc = ((pred == y) & scored).sum(0).float() / scored.sum(0).float()
    return torch.where(scored.any(0), acc, torch.nan)


def _masked_loss(logits, y):
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)


def _masked_model(task: SparseTask, mask: torch.Tensor, d_model: int, seed: int, device) -> MaskedAttentionModel:
    torch.manual_seed(seed)
    return MaskedAttentionModel(task.vocab_size, task.seq_len, mask.cpu(), d_model).to(device)


def train_masked(task: SparseTask, mask: torch.Tensor, *, steps: int = 300, lr: float = 1e-2, d_model: int = 32,
                 seed: int = 0, progress: bool = True, desc: str = "training", device=None) -> MaskedAttentionModel:
    """Train a :class:`MaskedAttentionModel` with ``mask`` on ``task``, on ``device`` (default: the mask's).
    Deterministic for ``seed`` on a given device: the parameters are initialised on the CPU and the batches
    are drawn on the CPU, then moved. The per-step training losses are kept on ``model.losses``."""
    device = mask.device if device is None else torch.device(device)
    model = _masked_model(task, mask, d_model, seed, device)
    model.losses = fit(model, task.sample, steps=steps, lr=lr, seed=seed, progress=progress, desc=desc,
                       loss_fn=_masked_loss)
    return model


def train_masked_many(task: SparseTask, masks: dict[str, torch.Tensor], seeds=(0, 1, 2), *, steps: int = 300,
                      lr: float = 1e-2, d_model: int = 32, progress: bool = True, desc: str = "training",
                      device=None) -> dict[str, list[MaskedAttentionModel]]:
    """:func:`train_masked` for every mask in ``masks`` and every seed, as one batch
    (:func:`~attn_course.demos._train.fit_many`: the models differ only in their weights and their mask
    buffer). Returns ``{name: [model per seed]}``, each with its ``losses``; model (name, s) is the one
    ``train_masked(task, masks[name], seed=s)`` trains, to round-off."""
    device = next(iter(masks.values())).device if device is None else torch.device(device)
    runs = [(name, s) for name in masks for s in seeds]
    models = [_masked_model(task, masks[name], d_model, s, device) for name, s in runs]
    curves = fit_many(models, task.sample, seeds=[s for _, s in runs], steps=steps, lr=lr, progress=progress,
                      desc=desc, loss_fn=_masked_loss)
    out: dict[str, list[MaskedAttentionModel]] = {name: [] for name in masks}
    for (name, _), m, c in zip(runs, models, curves):
        m.losses = c
        out[name].append(m)
    return out
