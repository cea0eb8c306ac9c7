"""Lesson 10 demos: one task, four scoring functions; and a retrieval task where linear attention runs out of room.

* :func:`train_scoring` trains lesson 01's one-layer reversal model with the attention kernel swapped:
  ``"scaled"`` softmax(QKᵀ/√E) (Vaswani et al. 2017), ``"dot"`` softmax(QKᵀ) (Luong et al. 2015),
  ``"additive"`` Bahdanau's w_vᵀ tanh(W_q q + W_k k) (:class:`attn_course.AdditiveAttention`), or
  ``"linear"`` φ(q)ᵀφ(k) / norm with φ = elu + 1 (:func:`attn_course.linear_attention`). Same data, same
  budget, same seed; :func:`train_scorings` trains one scoring's seeds together as one batch, and
  :func:`~attn_course.demos.reverse.reversal_attention` draws each map.
* :class:`RecallTask` — associative recall: N (key, value) pairs, then a query key; the answer is the value
  stored with that key. One attention layer solves it by putting its weight on the one matching key.
  Softmax can make that weight as sharp as it likes (exp grows without bound); linear attention's weights
  are ratios of inner products of E-dimensional positive features, so with N keys and a small E the
  other N − 1 keys always keep some weight. :func:`train_recall` trains both kinds at equal size.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import nn

from .._validate import positive_int
from ..additive import AdditiveAttention
from ..functional import attention
from ..linear import linear_attention, linear_attention_weights
from ._train import fit, token_accuracy
from .reverse import OneLayerAttention, ReversalResult, ReversalTask, train_reversal, train_reversals

__all__ = ["SCORINGS", "ScoringAttention", "train_scoring", "train_scorings", "RecallTask", "RecallModel",
           "train_recall", "recall_accuracy"]

SCORINGS = ("scaled", "dot", "additive", "linear")


class ScoringAttention(OneLayerAttention):
    """:class:`~attn_course.demos.reverse.OneLayerAttention` with the scoring function ``scoring``."""

    def __init__(self, vocab_size: int, seq_len: int, d_model: int = 32, num_heads: int = 1, *,
                 scoring: str = "scaled", hidden_dim: int | None = None):
        super().__init__(vocab_size, seq_len, d_model, num_heads)
        if scoring not in SCORINGS:
            raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
        self.scoring = scoring
        E = d_model // num_heads
        if scoring == "additive":
            self.additive = AdditiveAttention(E, E, hidden_dim or E)

    def attend(self, q, k, v, need_weights):
        if self.scoring == "scaled":
            return attention(q, k, v)
        if self.scoring == "dot":
            return attention(q, k, v, scale=1.0)
        if self.scoring == "additive":
            B = q.shape[0]
            flat = [rearrange(t, "b h l e -> (b h) l e") for t in (q, k, v)]
            out, w = self.additive(*flat)
            return (rearrange(out, "(b h) l e -> b h l e", b=B), rearrange(w, "(b h) i j -> b h i j", b=B))
        out = linear_attention(q, k, v)
        return out, (linear_attention_weights(q, k) if need_weights else None)


def _scoring_model(scoring: str):
    return lambda V, L, d, h: ScoringAttention(V, L, d, h, scoring=scoring)


def train_scoring(scoring: str, task: ReversalTask | None = None, *, steps: int = 100, seed: int = 0,
                  progress: bool = False, **kw) -> tuple[ScoringAttention, ReversalResult]:
    """Train the reversal model with one scoring function (``train_reversal``'s defaults, but 100 steps:
    lesson 10's budget, long enough for every scoring to converge)."""
    return train_reversal(task, steps=steps, seed=seed, progress=progress, desc=scoring,
                          model_cls=_scoring_model(scoring), **kw)


def train_scorings(scoring: str, task: ReversalTask | None = None, *, seeds=(0, 1, 2), steps: int = 100,
                   **kw) -> list[tuple[ScoringAttention, ReversalResult]]:
    """:func:`train_scoring` for every seed, trained together as one batch (``train_reversals``: run i ends
    where ``train_scoring(seed=seeds[i])`` takes it, to round-off)."""
    return train_reversals(task, seeds=seeds, steps=steps, desc=scoring, model_cls=_scoring_model(scoring), **kw)


@dataclass(frozen=True)
class RecallTask:
    """N distinct keys (from ``num_keys`` symbols), each with a random value (``num_values`` symbols), then a
    query: one of the N keys. Target: its value.

    ``sample(gen, B)`` -> ``keys (B, N+1)`` (the last entry is the query key), ``values (B, N)``, ``target (B,)``.
    """

    num_pairs: int = 16
    num_keys: int = 32
    num_values: int = 16

    def __post_init__(self):
        positive_int("num_pairs", self.num_pairs)
        if self.num_keys < self.num_pairs:
            raise ValueError(f"num_keys={self.num_keys} must be >= num_pairs={self.num_pairs} (keys are distinct)")

    def sample(self, gen: torch.Generator, batch_size: int = 64):
        keys = torch.rand(batch_size, self.num_keys, generator=gen).argsort(-1)[:, : self.num_pairs]
        values = torch.randint(self.num_values, (batch_size, self.num_pairs), generator=gen)
        pick = torch.randint(self.num_pairs, (batch_size,), generator=gen)
        query = keys.gather(1, pick[:, None])
        return torch.cat([keys, query], 1), values, values.gather(1, pick[:, None])[:, 0]


class RecallModel(nn.Module):
    """Pairs embedded as key + value embeddings, the query as its key embedding plus a "query" vector; one
    attention layer (``kind="softmax"``: scaled dot-product; ``"linear"``: elu + 1 linear attention) whose
    queries/keys have ``qk_dim`` features; the query position's output is read out over the values.

    forward(keys (B, N+1), values (B, N), need_weights=False) -> logits (B, num_values)
    [+ the query's weights over the N pairs (B, N)].
    """

    def __init__(self, task: RecallTask, *, d_model: int = 64, qk_dim: int = 8, kind: str = "softmax"):
        super().__init__()
        if kind not in ("softmax", "linear"):
            raise ValueError(f"kind must be 'softmax' or 'linear', got {kind!r}")
        self.kind = kind
        self.key_emb = nn.Embedding(task.num_keys, d_model)
        self.val_emb = nn.Embedding(task.num_values + 1, d_model)            # last id: "this is the query"
        self.q_proj, self.k_proj = nn.Linear(d_model, qk_dim), nn.Linear(d_model, qk_dim)
        self.v_proj = nn.Linear(d_model, d_model)
        self.head = nn.Linear(d_model, task.num_values)
        self.query_id = task.num_values

    def forward(self, keys, values, need_weights: bool = False):
        marker = torch.full_like(values[:, :1], self.query_id)
        h = self.key_emb(keys) + self.val_emb(torch.cat([values, marker], 1))   # (B, N+1, d)
        q = self.q_proj(h[:, -1:])                                               # (B, 1, E): the query only
        k, v = self.k_proj(h[:, :-1]), self.v_proj(h[:, :-1])                    # (B, N, E), (B, N, d)
        if self.kind == "softmax":
            out, w = attention(q, k, v)
        else:
            out = linear_attention(q, k, v)
            w = linear_attention_weights(q, k) if need_weights else None
        logits = self.head(out[:, 0])
        return (logits, w[:, 0]) if need_weights else logits


@torch.no_grad()
def recall_accuracy(model: RecallModel, task: RecallTask, *, n: int = 2048, seed: int = 1234) -> float:
    """Held-out accuracy on ``n`` fresh examples (drawn on the CPU, then moved to the model's device)."""
    device = next(model.parameters()).device
    keys, values, target = (t.to(device) for t in task.sample(torch.Generator().manual_seed(seed), n))
    return token_accuracy(model(keys, values), target)


def train_recall(kind: str, task: RecallTask | None = None, *, qk_dim: int = 8, d_model: int = 64,
                 steps: int = 150, batch_size: int = 64, lr: float = 2e-2, seed: int = 0, progress: bool = False,
                 device: torch.device | str | None = None) -> tuple[RecallModel, float, float]:
    """Train :class:`RecallModel` on ``device`` (default CPU); returns ``(model, held-out accuracy, seconds)``.
    Deterministic per seed on a CPU (the data are drawn on the CPU whatever the device). The per-step
    training losses are kept on ``model.losses``."""
    task = task or RecallTask()
    torch.manual_seed(seed)
    model = RecallModel(task, d_model=d_model, qk_dim=qk_dim, kind=kind).to(torch.device(device or "cpu"))

    def sample(g):                                       # fit() wants one input tensor: keys then values
        keys, values, target = task.sample(g, batch_size)
        return torch.cat([keys, values], 1), target

    n = task.num_pairs + 1

    t0 = time.perf_counter()
    model.losses = fit(model, sample, steps=steps, lr=lr, seed=seed, progress=progress, desc=f"recall ({kind})",
        loss_fn=lambda logits, y: nn.functional.cross_entropy(logits, y), forward=lambda m, x: m(x[:, :n], x[:, n:]))
    return model, recall_accuracy(model, task), time.perf_counter() - t0

