"""A toy translation whose cross-attention learns the alignment: digits -> English words, smallest first.

Source: 3 to 6 distinct digits in random order, padded to ``MAX_LEN`` (``"7 1 8 3 <pad> <pad>"``).
Target: their names in ascending order (``"one three seven eight"``). The decoder is as small as it can
be: at step i it sees only the previous word (``<bos>`` at step 0), so to say the next word it must *look
up* the source through cross-attention — "the smallest digit greater than the one I just said". The
alignment is a different permutation for every sentence; the trained map shows it, and padded source
positions get exactly zero weight.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..cross import CrossAttention
from ._train import fit_many

__all__ = ["WORDS", "PAD", "BOS", "MAX_LEN", "sample_batch", "ToyTranslator", "train_translator",
           "translate", "exact_match", "train_translators"]

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
PAD = 10          # source padding token (digits are 0..9)
BOS = 10          # decoder start token (target words are 0..9)
MAX_LEN = 6
MIN_LEN = 3


def sample_batch(gen: torch.Generator, batch_size: int = 64):
    """``(src, tgt_in, tgt_out, lengths)``: src ``(B, MAX_LEN)`` digits + PAD; tgt_in = [BOS, sorted[:-1]];
    tgt_out = sorted digits, -100 (ignored) past each sentence's length."""
    lengths = torch.randint(MIN_LEN, MAX_LEN + 1, (batch_size,), generator=gen)
    digits = torch.rand(batch_size, 10, generator=gen).argsort(-1)[:, :MAX_LEN]     # distinct digits
    real = torch.arange(MAX_LEN) < lengths[:, None]                                  # (B, MAX_LEN)
    src = torch.where(real, digits, torch.full_like(digits, PAD))
    srt = torch.where(real, digits, torch.full_like(digits, 99)).sort(-1).values      # pads sort last
    tgt_out = torch.where(real, srt, torch.full_like(srt, -100))
    tgt_in = torch.cat([torch.full((batch_size, 1), BOS), srt[:, :-1].clamp_max(BOS)], 1)
    tgt_in = torch.where(real, tgt_in, torch.full_like(tgt_in, BOS))
    return src, tgt_in, tgt_out, lengths


class ToyTranslator(nn.Module):
    """Embeddings + one CrossAttention (decoder words read source digits) + a small MLP.

    ``forward(src, tgt_in, need_weights=False) -> (logits (B, Lt, 10), weights (B, H, Lt, Ls) or None)``.
    No positional information anywhere: the source is a set, and the alignment is content-based.
    """

    def __init__(self, d_model: int = 64, num_heads: int = 1):
        super().__init__()
        self.src_emb = nn.Embedding(11, d_model)           # digits 0..9 and PAD
        self.tgt_emb = nn.Embedding(11, d_model)           # words 0..9 and BOS
        self.cross = CrossAttention(d_model, num_heads)
        self.mlp = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))
        self.head = nn.Linear(d_model, 10)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, need_weights: bool = False):
        keep = (src != PAD)[:, None, None, :]              # (B, 1, 1, Ls): padding_mask, written so vmap can batch it
        h = self.tgt_emb(tgt_in)                                                    # (B, Lt, d) queries
        a, w = self.cross(h, self.src_emb(src), attn_mask=keep, need_weights=need_weights)
        h = h + a
        h = h + self.mlp(h)
        return self.head(h), w


def train_translator(steps: int = 300, *, seed: int = 0, d_model: int = 64, num_heads: int = 1,
                     lr: float = 5e-3, progress: bool = True, device=None) -> tuple[ToyTranslator, list[float]]:
    """Train a fresh :class:`ToyTranslator` (seconds on a CPU); returns ``(model, losses)``, the model on
    ``device`` (the CPU by default)."""
    return train_seq2seq(ToyTranslator, steps, seeds=[seed], d_model=d_model, num_heads=num_heads, lr=lr,
                         progress=progress, device=device, desc="toy translation")[0]


def train_translators(steps: int = 300, *, seeds: Sequence[int] = (0, 1, 2), d_model: int = 64, num_heads: int = 1,
                      lr: float = 5e-3, progress: bool = False, device=None) -> list[tuple[ToyTranslator, list[float]]]:
    """:func:`train_translator` for every seed, trained together as one batch; ``[(model, losses)]`` per seed."""
    return train_seq2seq(ToyTranslator, steps, seeds=seeds, d_model=d_model, num_heads=num_heads, lr=lr,
                         progress=progress, device=device, desc="toy translation")


def train_seq2seq(model_cls, steps: int, *, seeds: Sequence[int], d_model: int, num_heads: int, lr: float,
                  progress: bool, device, desc: str) -> list[tuple[nn.Module, list[float]]]:
    """Train a fresh ``model_cls(d_model, num_heads)`` (called as ``model(src, tgt_in)``) per seed on the digit
    task, all seeds as one batch (:func:`fit_many`: model i ends where :func:`fit` with seed i takes it);
    returns ``[(model, losses)]``. Shared by the translator here and lesson 04's encoder–decoder."""
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(model_cls(d_model, num_heads).to(device or "cpu"))

    def sample(gen):
        src, tgt_in, tgt_out, _ = sample_batch(gen)
        return torch.stack([src, tgt_in]), tgt_out

    curves = fit_many(models, sample, steps=steps, lr=lr, seeds=seeds, progress=progress, desc=desc,
                      forward=lambda m, xy: m(xy[0], xy[1])[0])
    return list(zip(models, curves))


@torch.no_grad()
def translate(model: ToyTranslator, src: torch.Tensor):
    """Greedy decoding, one word per real source digit. ``src (B, Ls)`` -> ``(words (B, Ls), weights
    (B, H, Ls, Ls))``; row i of the weights is the cross-attention that produced word i (rows past a
    sentence's length are meaningless). Runs on the model's device; returns CPU tensors."""
    model.eval()
    src = src.to(next(model.parameters()).device)
    tgt_in = torch.full_like(src, BOS)
    for i in range(src.shape[1]):
        logits, w = model(src, tgt_in, need_weights=True)
        if i + 1 < src.shape[1]:
            tgt_in[:, i + 1] = logits[:, i].argmax(-1)
    return logits.argmax(-1).cpu(), w.cpu()


def exact_match(model: ToyTranslator, n: int = 1000, seed: int = 1) -> float:
    """Fraction of ``n`` fresh sentences translated entirely right by greedy decoding."""
    src, _, tgt_out, lengths = sample_batch(torch.Generator().manual_seed(seed), n)
    words, _ = translate(model, src)
    real = tgt_out != -100
    return ((words == tgt_out) | ~real).all(-1).float().mean().item()
