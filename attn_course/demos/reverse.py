"""Sequence reversal: the smallest task whose learned attention you can read at a glance.

Input ``x = (x_0, …, x_{L-1})``, target ``y_i = x_{L-1-i}``. A single attention layer solves it exactly
when output position i puts all its weight on input position L-1-i, so the trained weights form an
**anti-diagonal**. The model is deliberately minimal (no MLP, no residual): token + position
embeddings -> one attention layer (Vaswani et al. 2017, Eq. 1, computed by ``attn_course.attention``)
-> a linear read-out. Because the read-out sees only the attention output, every correct prediction
has to come through the attention weights.

    task = ReversalTask()
    model, result = train_reversal()          # seconds on a CPU; result.accuracy >= 0.95
    w, q_labels, k_labels = reversal_attention(model, task, "ABCDEFGH")
    viz.plot_attention(w, query_labels=q_labels, key_labels=k_labels)
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from einops import rearrange
from torch import nn

from .._validate import divisible, positive_int
from ..functional import attention
from ._train import fit, fit_many, token_accuracy

__all__ = ["ReversalTask", "OneLayerAttention", "ReversalResult", "train_reversal", "train_reversals", "evaluate",
           "reversal_attention"]

_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class ReversalTask:
    """Random token sequences of length ``seq_len`` over ``vocab_size`` symbols (shown as letters)."""

    vocab_size: int = 16
    seq_len: int = 8

    def __post_init__(self):
        positive_int("seq_len", self.seq_len)
        positive_int("vocab_size", self.vocab_size)
        if self.vocab_size > len(_ALPHABET):
            raise ValueError(f"vocab_size={self.vocab_size} exceeds the {len(_ALPHABET)} printable symbols")

    def sample(self, gen: torch.Generator, batch_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)``, both ``(batch_size, seq_len)`` int64, with ``y = x.flip(-1)``."""
        x = torch.randint(self.vocab_size, (batch_size, self.seq_len), generator=gen)
        return x, x.flip(-1)

    def encode(self, text: str) -> torch.Tensor:
        """``"ABC…"`` -> ``(1, seq_len)`` token ids; ValueError for a wrong length or unknown symbol."""
        if len(text) != self.seq_len:
            raise ValueError(f"text has length {len(text)} but the task's seq_len={self.seq_len}")
        symbols = _ALPHABET[: self.vocab_size]
        bad = sorted(set(text) - set(symbols))
        if bad:
            raise ValueError(f"symbols {bad} are not in the vocabulary {symbols!r} (vocab_size={self.vocab_size})")
        return torch.tensor([[symbols.index(c) for c in text]])

    def decode(self, ids: torch.Tensor) -> str:
        """``(seq_len,)`` token ids -> string."""
        return "".join(_ALPHABET[i] for i in ids.tolist())


class OneLayerAttention(nn.Module):
    """Embeddings -> one multi-head attention layer -> linear read-out over the vocabulary.

    forward(x: (B, L) int64, need_weights=False) -> logits (B, L, vocab_size),
    plus the attention weights (B, H, L, L) when ``need_weights=True``.
    """

    def __init__(self, vocab_size: int, seq_len: int, d_model: int = 64, num_heads: int = 1):
        super().__init__()
        divisible("d_model", d_model, "num_heads", num_heads)
        self.seq_len, self.num_heads = seq_len, num_heads
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)          # learned absolute positions
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, x: torch.Tensor, need_weights: bool = False):
        B, L = x.shape
        if L != self.seq_len:
            raise ValueError(f"input has length L={L} but the model was built for seq_len={self.seq_len}")
        h = self.tok_emb(x) + self.pos_emb(torch.arange(L, device=x.device))          # (B, L, D)
        q, k, v = (rearrange(p(h), "b l (h e) -> b h l e", h=self.num_heads)
                   for p in (self.q_proj, self.k_proj, self.v_proj))                  # (B, H, L, E)
        out, weights = self.attend(q, k, v, need_weights)                             # (B, H, L, E)
        logits = self.head(self.out_proj(rearrange(out, "b h l e -> b l (h e)")))    # (B, L, V)
        return (logits, weights) if need_weights else logits

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, need_weights: bool):
        """softmax(QKᵀ/√d_k)V on ``(B, H, L, E)``; returns ``(out, weights)``. Subclasses swap the kernel."""
        return attention(q, k, v)


@dataclass
class ReversalResult:
    """What ``train_reversal`` measured: held-out token accuracy, wall-clock seconds, the loss curve."""

    accuracy: float
    seconds: float
    losses: list[float]


@torch.no_grad()
def evaluate(model: nn.Module, task: ReversalTask, *, n: int = 2048, seed: int = 1234) -> float:
    """Token accuracy on ``n`` fresh sequences drawn with ``seed`` (a stream disjoint from training's)."""
    device = next(model.parameters()).device
    x, y = task.sample(torch.Generator().manual_seed(seed), n)
    was_training = model.training
    model.eval()
    acc = token_accuracy(model(x.to(device)), y.to(device))
    model.train(was_training)
    return acc


def train_reversal(task: ReversalTask | None = None, *, steps: int = 150, batch_size: int = 64,
                   d_model: int = 32, num_heads: int = 1, lr: float = 1e-2, seed: int = 0,
                   device: torch.device | str | None = None, progress: bool = True,
                   model_cls: Callable[..., OneLayerAttention] = OneLayerAttention, desc: str = "reversal"
                   ) -> tuple[OneLayerAttention, ReversalResult]:
    """Train :class:`OneLayerAttention` on reversal; deterministic for a given ``seed`` on CPU.

    Returns the trained model (in eval mode) and a :class:`ReversalResult` with the held-out token
    accuracy (>= 0.95 with the defaults, about a second on a CPU) and the training time in seconds.
    Training runs single-threaded (see :func:`~attn_course.demos._train.fit`): for matrices this small,
    thread synchronisation costs more than it saves, and one thread is also bit-reproducible.
    ``model_cls(vocab_size, seq_len, d_model, num_heads)`` builds the model (lesson 08 swaps in a
    flash-attention variant); ``desc`` labels the progress bar.
    """
    task = ReversalTask() if task is None else task
    device = torch.device(device or "cpu")
    torch.manual_seed(seed)
    model = model_cls(task.vocab_size, task.seq_len, d_model, num_heads).to(device)
    t0 = time.perf_counter()
    losses = fit(model, lambda g: task.sample(g, batch_size), steps=steps, lr=lr, seed=seed,
                 progress=progress, desc=desc)
    seconds = time.perf_counter() - t0
    return model, ReversalResult(evaluate(model, task), seconds, losses)


def train_reversals(task: ReversalTask | None = None, *, seeds: Sequence[int] = (0, 1, 2), steps: int = 150,
                    batch_size: int = 64, d_model: int = 32, num_heads: int = 1, lr: float = 1e-2,
                    device: torch.device | str | None = None, progress: bool = False,
                    model_cls: Callable[..., OneLayerAttention] = OneLayerAttention, desc: str = "reversal"
                    ) -> list[tuple[OneLayerAttention, ReversalResult]]:
    """:func:`train_reversal` for every seed, trained together as one batch (:func:`fit_many`: model i ends where
    ``train_reversal(seed=seeds[i])`` takes it). ``ReversalResult.seconds`` is the whole batch's time."""
    task = ReversalTask() if task is None else task
    device = torch.device(device or "cpu")
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(model_cls(task.vocab_size, task.seq_len, d_model, num_heads).to(device))
    t0 = time.perf_counter()
    curves = fit_many(models, lambda g: task.sample(g, batch_size), steps=steps, lr=lr, seeds=list(seeds),
                      progress=progress, desc=desc)
    seconds = time.perf_counter() - t0
    return [(m, ReversalResult(evaluate(m, task), seconds, c)) for m, c in zip(models, curves)]


@torch.no_grad()
def reversal_attention(model: OneLayerAttention, task: ReversalTask, text: str, head: int = 0
                       ) -> tuple[torch.Tensor, list[str], list[str]]:
    """Attention weights ``(L, L)`` of one head on the example ``text``, with labels for plotting.

    Query labels are the tokens each output position should produce (the reversed text), key labels
    the input tokens, so a correct model lights up the cell where a row's label equals its column's.
    """
    x = task.encode(text).to(next(model.parameters()).device)
    _, weights = model(x, need_weights=True)                 # (1, H, L, L)
    return weights[0, head].cpu(), list(text[::-1]), list(text)
