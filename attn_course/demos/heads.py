"""Tiny tasks for lessons 02 and 03: one attention layer that has to fetch two tokens in two roles.

Lesson 02, :class:`NeighbourTask` (bidirectional): ``y_t = (x_{t-1} − x_{t+1}) mod V`` with cyclic
positions. Subtraction is not symmetric, so a head that averages both neighbours *equally* cannot tell
which token came from where. One head still solves it: it weights the two neighbours unequally (the
positions are fixed, so the ratio is too) and the MLP read-out decodes the unequal mixture. Several
heads are not needed here; the task is used to look at how heads specialise.

Lesson 02, :class:`KeyPairTask` (bidirectional), where one head does not learn what four heads of the
same total width learn: every position holds a key and a value (two embeddings added, like a token and
its position), and the target at a position with key ``k`` is ``(value of key k+1 − value of key k−1)
mod V``. The two values are found by content, and each key occurs a random number of times, so a single
softmax cannot give the two keys a fixed unequal share; averaging them equally loses which value is
which (the best such a model can do is :meth:`KeyPairTask.unordered_ceiling`).

Lesson 03, :class:`LagTask` (causal, so it can be decoded token by token with a KV cache):
``y_t = (x_{t-1} − x_{t-lag}) mod V``. Again two positions with different roles; with many heads of
small width the layer needs room in its keys and values to fetch and keep both tokens apart, which is
exactly what sharing K/V (GQA, MQA) takes away.

:class:`TinyAttentionModel`: token + position embeddings -> ONE attention layer -> an MLP read-out, no
residual, so every correct prediction has to come through the attention weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from .._validate import positive_int
from ..gqa import GroupedQueryAttention, KVCache
from ..mha import MultiHeadAttention
from ._train import SeedRuns, fit, fit_many, token_accuracy

__all__ = ["NeighbourTask", "KeyPairTask", "LagTask", "TinyAttentionModel", "make_model", "train", "evaluate",
           "train_seeds", "SeedRuns", "key_role_weights"]

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
class KeyPairTask:
    """Two lookups by content: ``y_t = (val[k_t + 1] − val[k_t − 1]) mod num_values`` (keys mod num_keys).

    A sequence draws one value per key, ``val`` ``(num_keys,)``, and its keys from a skewed distribution
    of its own (weights ~ Exp(1)), so each key occurs a random number of times; every occurrence of key
    ``k`` holds ``(k, val[k])``, encoded as the token id ``k * num_values + val[k]`` and embedded as
    ``E_key[k] + E_val[val[k]]`` (``fields``). Positions where key ``k_t ± 1`` is absent are not scored.
    """
    num_keys: int = 4
    num_values: int = 4
    seq_len: int = 12
    causal = False

    def __post_init__(self):
        positive_int("num_keys", self.num_keys)
        positive_int("num_values", self.num_values)
        positive_int("seq_len", self.seq_len)
        if self.num_keys < 3:
            raise ValueError(f"num_keys={self.num_keys} must be at least 3 (keys k-1, k and k+1 must differ)")

    @property
    def vocab_size(self) -> int:
        return self.num_keys * self.num_values

    @property
    def num_classes(self) -> int:
        return self.num_values

    @property
    def fields(self) -> tuple[int, int]:
        """Token id ``i`` is the pair ``(i // num_values, i % num_values)`` = (key, value)."""
        return self.num_keys, self.num_values

    def targets(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``(B, L)`` token ids -> targets ``(B, L)`` (IGNORE where a needed key is absent)."""
        K, V = self.fields
        keys, vals = x // V, x % V
        present = torch.zeros(*x.shape[:-1], K, dtype=torch.bool, device=x.device).scatter_(-1, keys, True)
        table = torch.zeros(*x.shape[:-1], K, dtype=x.dtype, device=x.device).scatter_(-1, keys, vals)
        up, down = (keys + 1) % K, (keys - 1) % K
        y = (table.gather(-1, up) - table.gather(-1, down)) % V
        y[~(present.gather(-1, up) & present.gather(-1, down))] = IGNORE
        return y

    def sample(self, gen: torch.Generator, batch_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
        K, V = self.fields
        p = torch.empty(batch_size, K).exponential_(generator=gen)                   # skewed key counts
        keys = torch.multinomial(p, self.seq_len, replacement=True, generator=gen)  # (B, L)
        vals = torch.randint(V, (batch_size, K), generator=gen)                      # one value per key
        x = keys * V + vals.gather(-1, keys)
        return x, self.targets(x)

    def unordered_ceiling(self) -> float:
        """Best accuracy from the unordered pair {val[k+1], val[k−1]} alone (values uniform, independent).

        For ``a ≠ b`` with ``(a − b) ≠ (b − a) mod V`` the two orders are equally likely and give
        different answers, so such a predictor is right half of the time; otherwise always.
        """
        V = self.num_values
        return sum(1.0 if (a - b) % V == (b - a) % V else 0.5 for a in range(V) for b in range(V)) / V**2


class FieldEmbedding(nn.Module):
    """Token id -> ``E_first[i // n_second] + E_second[i % n_second]``: two features added, not bound."""

    def __init__(self, fields: tuple[int, int], d_model: int):
        super().__init__()
        self.n_second = fields[1]
        self.first, self.second = nn.Embedding(fields[0], d_model), nn.Embedding(fields[1], d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.first(x // self.n_second) + self.second(x % self.n_second)


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
    (which also supports a :class:`KVCache` for decoding). ``fields=(n1, n2)`` embeds token ``i`` as two
    added features (:class:`FieldEmbedding`, ``vocab_size == n1 * n2``) instead of one table row.
    """

    def __init__(self, vocab_size: int, seq_len: int, num_classes: int, *, d_model: int = 32,
                 num_heads: int = 4, num_kv_heads: int | None = None, hidden: int = 128, causal: bool = False,
                 fields: tuple[int, int] | None = None):
        super().__init__()
        self.causal = causal
        if fields is not None and fields[0] * fields[1] != vocab_size:
            raise ValueError(f"fields={tuple(fields)} do not multiply to vocab_size={vocab_size}")
        self.tok = nn.Embedding(vocab_size, d_model) if fields is None else FieldEmbedding(fields, d_model)
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
    """A :class:`TinyAttentionModel` sized for ``task`` (causal iff the task is; the task's ``fields``,
    if it has them), initialised from ``seed``."""
    torch.manual_seed(seed)
    kw.setdefault("fields", getattr(task, "fields", None))
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


def _loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, -2), y.flatten(), ignore_index=IGNORE)


def train(model: nn.Module, task, *, steps: int = 400, lr: float = 1e-2, batch_size: int = 128, seed: int = 0,
          progress: bool = True, desc: str = "training", schedule: str = "one-cycle") -> list[float]:
    """Train ``model`` on ``task`` with the shared :func:`fit` loop; returns the losses."""
    return fit(model, lambda g: task.sample(g, batch_size), steps=steps, lr=lr, seed=seed, progress=progress,
               desc=desc, loss_fn=_loss, schedule=schedule)


def train_seeds(task, seeds: Sequence[int], *, steps: int = 400, lr: float = 1e-2, batch_size: int = 128,
                schedule: str = "one-cycle", read_at: Sequence[int] = (), device=None, progress: bool = False,
                desc: str = "training", models: Sequence[nn.Module] | None = None, data_seeds: Sequence[int] | None = None,
                **model_kw) -> SeedRuns:
    """One model per seed (``make_model(task, seed=s, **model_kw)``, or the given ``models``), trained together.

    The batched :func:`fit_many` loop: model ``i`` ends where ``train(model_i, task, seed=data_seeds[i], ...)``
    alone takes it (``data_seeds`` defaults to ``seeds``). ``read_at`` lists steps at which every model's
    accuracy is also read — with ``schedule="constant"`` that is the accuracy of a run of that many steps.
    """
    models = list(models) if models is not None else [make_model(task, seed=s, **model_kw) for s in seeds]
    if device is not None:
        models = [m.to(device) for m in models]
    at_acc: dict[int, list[float]] = {}
    at = {k: (lambda ms, k=k: at_acc.__setitem__(k, [evaluate(m, task) for m in ms])) for k in read_at}
    losses = fit_many(models, lambda g: task.sample(g, batch_size), steps=steps, lr=lr, schedule=schedule,
                      seeds=list(data_seeds if data_seeds is not None else seeds), progress=progress, desc=desc,
                      loss_fn=_loss, at_steps=at)
    return SeedRuns(models, losses, [evaluate(m, task) for m in models], at_acc)


@torch.no_grad()
def key_role_weights(model: nn.Module, task: KeyPairTask, *, n: int = 512, seed: int = 11) -> torch.Tensor:
    """Where each head of a :class:`KeyPairTask` model looks, by the query's key.

    Returns ``(num_keys, 2, H)``: entry ``[q, 0, h]`` is head ``h``'s mean weight on the positions holding key
    ``q+1`` over the scored queries whose key is ``q`` (``n`` fresh sequences), ``[q, 1, h]`` on key ``q−1``.
    """
    x, y = task.sample(torch.Generator().manual_seed(seed), n)
    device = next(model.parameters()).device
    _, w = model(x.to(device), need_weights=True)                          # (n, H, L, L)
    w, K = w.cpu(), task.num_keys
    keys, scored = x // task.num_values, (y >= 0).float()                  # (n, L)
    out = torch.zeros(K, 2, w.shape[1])
    for q in range(K):
        sel = (keys == q).float() * scored                                 # (n, L) queries with key q
        for j, other in enumerate(((q + 1) % K, (q - 1) % K)):
            on = (w * (keys == other).float()[:, None, None, :]).sum(-1)   # (n, H, L) weight on that key
            out[q, j] = (on * sel[:, None]).sum((0, 2)) / sel.sum()
    return out
