"""Tiny tasks for lessons 02 and 03, where one attention layer must use several heads.

Lesson 02, :class:`NeighbourTask` (bidirectional): ``y_t = (x_{t-1} − x_{t+1}) mod V`` with cyclic
positions. Subtraction is not symmetric, so a head that averages both neighbours cannot tell which
token came from where: the model needs one head looking left and another looking right.

Lesson 03, :class:`LagTask` (causal, so it can be decoded token by token with a KV cache):
``y_t = (x_{t-1} − x_{t-lag}) mod V``. Again two positions with different roles; with many heads of
small width the layer needs room in its keys and values to fetch and keep both tokens apart, which is
exactly what sharing K/V (GQA, MQA) takes away.

:class:`TinyAttentionModel`: token + position embeddings -> ONE attention layer -> an MLP read-out, no
residual, so every correct prediction has to come through the attention weights.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .._validate import positive_int
from ..gqa import GroupedQueryAttention, KVCache
from ..mha import MultiHeadAttention
from ._train import fit, token_accuracy

__all__ = ["NeighbourTask", "LagTask", "TinyAttentionModel", "make_model", "train", "evaluate"]

IGNORE = -100


@dataclass(frozen=True)
class NeighbourTask:
    """``y_t = (x_{t-1} − x_{t+1}) mod vocab_size``, positions taken cyclically (x_{-1} = x_{L-1})."""
    vocab_size: int = 8
    seq_len: int = 10
    causal = False

    def __post_init__(self):
        positive_int("vocab_size", self.vocab_size)
        positive_int("seq_len", self.seq_len)

    @property
    def num_classes(self) -> int:
        return self.vocab_size

    def targets(self, x: torch.Tensor) -> torch.Tensor:
        return (x.roll(1, dims=-1) - x.roll(-1, dims=-1)) % self.vocab_size

    def sample(self, gen: torch.Generator, batch_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(self.vocab_size, (batch_size, self.seq_len), generator=gen)
        return x, self.targets(x)


@dataclass(frozen=True)
class LagTask:
    """``y_t = (x_{t-1} − x_{t-lag}) mod vocab_size`` for t ≥ lag (earlier positions are not scored).

    Causal: every target depends only on the past, so the model can be decoded token by token.
    """
    vocab_size: int = 8
    seq_len: int = 16
    lag: int = 3
    causal = True

    def __post_init__(self):
        positive_int("vocab_size", self.vocab_size)
        positive_int("seq_len", self.seq_len)
        positive_int("lag", self.lag)

    @property
    def num_classes(self) -> int:
        return self.vocab_size

    def targets(self, x: torch.Tensor) -> torch.Tensor:
        y = (x.roll(1, dims=-1) - x.roll(self.lag, dims=-1)) % self.vocab_size
        y[..., : self.lag] = IGNORE
        return y

    def sample(self, gen: torch.Generator, batch_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(self.vocab_size, (batch_size, self.seq_len), generator=gen)
        return x, self.targets(x)


class TinyAttentionModel(nn.Module):
    """Embeddings -> one attention layer -> MLP read-out (no residual: the answer must come through attention).

    ``num_kv_heads=None`` uses :class:`MultiHeadAttention`; an int uses :class:`GroupedQueryAttention`
    (which also supports a :class:`KVCache` for decoding).
    """

    def __init__(self, vocab_size: int, seq_len: int, num_classes: int, *, d_model: int = 32,
                 num_heads: int = 4, num_kv_heads: int | None = None, hidden: int = 128, causal: bool = False):
        super().__init__()
        self.causal = causal
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.attn = (MultiHeadAttention(d_model, num_heads) if num_kv_heads is None
                     else GroupedQueryAttention(d_model, num_heads, num_kv_heads))
        self.head = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, hidden), nn.GELU(),
                                  nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor, *, need_weights: bool = False, cache: KVCache | None = None):
        """``x`` ``(B, L)`` token ids -> logits ``(B, L, C)`` (and weights ``(B, H, L, L_k)`` if asked).

        With a ``cache`` (GQA only) the tokens are placed after the ``len(cache)`` cached ones.
        """
        start = 0 if cache is None else len(cache)
        pos = torch.arange(start, start + x.shape[-1], device=x.device)
        h = self.tok(x) + self.pos(pos)                                   # (B, L, d_model)
        extra = {} if cache is None else {"cache": cache}
        a, w = self.attn(h, is_causal=self.causal, need_weights=need_weights, **extra)
        logits = self.head(a)                                             # (B, L, C)
        return (logits, w) if need_weights else logits


def make_model(task, *, seed: int = 0, **kw) -> TinyAttentionModel:
    """A :class:`TinyAttentionModel` sized for ``task`` (causal iff the task is), initialised from ``seed``."""
    torch.manual_seed(seed)
    return TinyAttentionModel(task.vocab_size, task.seq_len, task.num_classes, causal=task.causal, **kw)


@torch.no_grad()
def evaluate(model: nn.Module, task, *, batches: int = 8, seed: int = 1234, batch_size: int = 256) -> float:
    """Token accuracy on fresh batches (a fixed evaluation seed, distinct from training)."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    accs = []
    for _ in range(batches):
        x, y = task.sample(gen, batch_size)
        accs.append(token_accuracy(model(x.to(device)), y.to(device), IGNORE))
    return sum(accs) / len(accs)


def train(model: nn.Module, task, *, steps: int = 400, lr: float = 1e-2, batch_size: int = 128, seed: int = 0,
          progress: bool = True, desc: str = "training") -> list[float]:
    """Train ``model`` on ``task`` with the shared :func:`fit` loop; returns the losses."""
    import torch.nn.functional as F
    return fit(model, lambda g: task.sample(g, batch_size), steps=steps, lr=lr, seed=seed, progress=progress,
               desc=desc, loss_fn=lambda lg, y: F.cross_entropy(lg.flatten(0, -2), y.flatten(), ignore_index=IGNORE))
