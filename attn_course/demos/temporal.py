"""A synthetic task whose answer depends on *when* a sentence was written, for TemporalAttention.

Every sentence mentions three gadgets, one from each period (``PERIODS``), among filler words:
``"we used the pager and our ipod with the smartphone"``. The question is "which gadget was new then?": the
answer is the gadget of the sentence's period. The words alone cannot tell (a time-blind model is stuck
at 1/3); the time can. The model is an embedding, one TemporalAttention layer fed the period as a learned
time embedding (one time per sequence, as in Rosin & Radinsky 2022), mean pooling and a classifier.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..functional import attention
from ..mha import split_heads
from ..temporal import TemporalAttention
from ._train import fit, fit_many

__all__ = ["PERIODS", "GADGETS", "FILLERS", "VOCAB", "SEQ_LEN", "sample_batch", "encode", "PeriodModel",
           "train_period_model", "train_period_models", "accuracy", "batchwide_norm_weights"]

PERIODS = ["1985", "2005", "2025"]
GADGETS = [["walkman", "pager", "vcr", "floppy"],
           ["ipod", "dvd", "flip-phone", "usb-stick"],
           ["smartphone", "podcast", "smartwatch", "cloud"]]
FILLERS = ["we", "used", "the", "a", "and", "with", "our", "new"]
VOCAB = [g for era in GADGETS for g in era] + FILLERS       # gadget ids first: 0..11 are also the classes
SEQ_LEN = 8
_N_GADGETS = sum(len(e) for e in GADGETS)


def sample_batch(gen: torch.Generator, batch_size: int = 64):
    """``(tokens (B, SEQ_LEN), period (B,), label (B,))``; label is the id of the period's gadget."""
    B, P, G = batch_size, len(PERIODS), len(GADGETS[0])
    tokens = _N_GADGETS + torch.randint(len(FILLERS), (B, SEQ_LEN), generator=gen)
    pos = torch.rand(B, SEQ_LEN, generator=gen).argsort(-1)[:, :P]              # where the 3 gadgets go
    gadget = torch.arange(P) * G + torch.randint(G, (B, P), generator=gen)         # one gadget per period
    tokens.scatter_(1, pos, gadget)
    period = torch.randint(P, (B,), generator=gen)
    return tokens, period, gadget[torch.arange(B), period]


def encode(sentence: str) -> torch.Tensor:
    """``"we used the pager ..."`` -> token ids ``(1, L)``; ValueError naming an unknown word."""
    words = sentence.split()
    unknown = [w for w in words if w not in VOCAB]
    if unknown:
        raise ValueError(f"unknown words {unknown}; the vocabulary is {VOCAB}")
    return torch.tensor([[VOCAB.index(w) for w in words]])


class PeriodModel(nn.Module):
    """Embedding -> TemporalAttention (time = learned period embedding, ``(B, 1, time_dim)``) -> classes.

    ``forward(tokens (B, L), period (B,), need_weights=False) -> (logits (B, L, 12), weights or None)``:
    every token predicts the answer (trained with the label at every position, so every query has to find
    the gadget — no residual path lets a token answer from itself); the sentence's answer is
    ``logits.mean(1).argmax(-1)``. ``batchwide_norm=True`` replaces the per-sample norm by the authors'
    batch-wide one (:func:`batchwide_norm_weights`, explicit path): a reproduction of that pitfall.
    """

    def __init__(self, d_model: int = 32, num_heads: int = 1, time_dim: int = 8, batchwide_norm: bool = False):
        super().__init__()
        self.emb = nn.Embedding(len(VOCAB), d_model)
        self.time_emb = nn.Embedding(len(PERIODS), time_dim)        # one learned vector per period
        self.attn = TemporalAttention(d_model, num_heads, time_dim)
        self.head = nn.Linear(d_model, _N_GADGETS)
        self.batchwide_norm = batchwide_norm                          # the authors' norm (a pitfall), for the lesson

    def forward(self, tokens: torch.Tensor, period: torch.Tensor, need_weights: bool = False):
        x = self.emb(tokens)                                          # (B, L, d)
        time = self.time_emb(period)[:, None, :]                      # (B, 1, time_dim): one time per sentence
        if self.batchwide_norm:                                       # each sample's output depends on its batch
            w = batchwide_norm_weights(self.attn, x, time)            # (B, H, L, L)
            y = (w @ split_heads(self.attn.v_proj(x), self.attn.num_heads)).transpose(1, 2).flatten(2)
            return self.head(self.attn.out_proj(y)), (w if need_weights else None)
        a, w = self.attn(x, time, need_weights=need_weights)
        return self.head(a), w                                          # (B, L, 12)


def _sampler(use_time: bool):
    """The training stream: (tokens, period broadcast over the tokens) stacked, and the label at every token."""
    def sample(gen):
        tokens, period, label = sample_batch(gen)
        return torch.stack([tokens, period[:, None].expand_as(tokens) * use_time]), label[:, None].expand_as(tokens)
    return sample


def _forward(m: PeriodModel, tp: torch.Tensor) -> torch.Tensor:
    return m(tp[0], tp[1][:, 0])[0]


def train_period_model(steps: int = 200, *, use_time: bool = True, seed: int = 0, lr: float = 1e-2,
                       progress: bool = True, device=None, **kwargs) -> tuple[PeriodModel, list[float]]:
    """Train a fresh :class:`PeriodModel`. ``use_time=False`` always feeds period 0: a time-blind baseline."""
    torch.manual_seed(seed)
    model = PeriodModel(**kwargs).to(device or "cpu")
    losses = fit(model, _sampler(use_time), steps=steps, lr=lr, seed=seed, progress=progress,
                 desc="temporal task" if use_time else "time-blind baseline", forward=_forward)
    return model.cpu(), losses


def train_period_models(steps: int = 200, *, seeds: Sequence[int] = (0, 1, 2), use_time: bool = True,
                        lr: float = 1e-2, progress: bool = False, device=None,
                        **kwargs) -> list[tuple[PeriodModel, list[float]]]:
    """:func:`train_period_model` for every seed, trained together as one batch (:func:`fit_many`: model i ends
    where ``train_period_model(seed=seeds[i])`` takes it); ``[(model, losses)]`` per seed, models on CPU."""
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(PeriodModel(**kwargs).to(device or "cpu"))
    curves = fit_many(models, _sampler(use_time), steps=steps, lr=lr, seeds=list(seeds), progress=progress,
                      desc="temporal task" if use_time else "time-blind baseline", forward=_forward)
    return [(m.cpu(), c) for m, c in zip(models, curves)]


@torch.no_grad()
def accuracy(model: PeriodModel, n: int = 2000, *, use_time: bool = True, seed: int = 1) -> float:
    """Accuracy on ``n`` fresh sentences (``use_time=False`` feeds period 0, as the baseline was trained)."""
    model.eval()
    tokens, period, label = sample_batch(torch.Generator().manual_seed(seed), n)
    logits, _ = model(tokens, period * use_time)
    return (logits.mean(1).argmax(-1) == label).float().mean().item()


def batchwide_norm_weights(attn: TemporalAttention, x: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
    """Attention weights ``(B, H, L, L)`` as the authors' code computes them: T divided by the norm of the
    whole ``(B, H, L, d_h)`` time tensor (``time_layer.norm(2.0)``), so each sample depends on its batch.
    A reproduction of the pitfall for the lesson (differentiable, so ``PeriodModel(batchwide_norm=True)`` can
    be trained with it); :class:`TemporalAttention` normalises per sample and head."""
    q = split_heads(attn.q_proj(x), attn.num_heads)                                   # (B, H, L, d_h)
    k = split_heads(attn.k_proj(x), attn.num_heads)
    v = split_heads(attn.v_proj(x), attn.num_heads)
    T = split_heads(attn.t_proj(time), attn.num_heads).expand_as(q)                   # (B, H, L, d_h)
    M = T.transpose(-2, -1) @ T / T.norm(2.0)          # (B, H, d_h, d_h): ONE norm for the whole batch
    _, weights = attention(q @ M, k, v)                # the shared softmax path, scale 1/√d_h
    return weights
