"""Additive (Bahdanau) attention: a small MLP scores every (query, key) pair.

    score(q_i, k_j) = w_vᵀ tanh(W_q q_i + W_k k_j)       Bahdanau et al. 2015, §3.1 Eqs. (5)–(6), App. A.1.2
    weights = softmax_j(score),   out_i = Σ_j weights_ij v_j

Unlike the dot product, the query and key sizes may differ (W_q and W_k map both to ``hidden_dim``).
The price: the tanh sits *between* the two projections, so nothing factorises — every pair (i, j) needs
its own hidden vector, a ``(B, Lq, Lk, hidden_dim)`` tensor, and the cost is O(Lq · Lk · hidden) on top
of the projections' O((Lq + Lk) · d · hidden). (A Chinese attention survey's "O(L d²)" leaves out the Lq · Lk pairs.)

Reference: Bahdanau, Cho & Bengio, "Neural Machine Translation by Jointly Learning to Align and
Translate", ICLR 2015, arXiv:1409.0473v7.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import _validate
from .functional import masked_softmax

__all__ = ["AdditiveAttention"]


class AdditiveAttention(nn.Module):
    """Bahdanau attention. W_q: Linear(query_dim, hidden_dim), W_k: Linear(key_dim, hidden_dim),
    w_v: Linear(hidden_dim, 1), all bias-free.

    forward(query (B, Lq, query_dim), key (B, Lk, key_dim), value (B, Lk, Dv), *, attn_mask=None)
        -> (out (B, Lq, Dv), weights (B, Lq, Lk))

    attn_mask: bool ``(B or 1, Lq or 1, Lk)``, True = may attend. A query whose keys are all masked gets
    zero weights and a zero output (never NaN). Dropout (training only) applies to the weights used for
    the output; the returned weights are pre-dropout. fp16/bf16: the softmax runs in fp32.
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int, dropout: float = 0.0):
        super().__init__()
        self.query_dim = _validate.positive_int("query_dim", query_dim)
        self.key_dim = _validate.positive_int("key_dim", key_dim)
        self.hidden_dim = _validate.positive_int("hidden_dim", hidden_dim)
        self.dropout = _validate.probability("dropout", dropout)
        self.W_q = nn.Linear(query_dim, hidden_dim, bias=False)
        self.W_k = nn.Linear(key_dim, hidden_dim, bias=False)
        self.w_v = nn.Linear(hidden_dim, 1, bias=False)

    def score(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """Unnormalised scores ``(B, Lq, Lk)``; builds the ``(B, Lq, Lk, hidden_dim)`` pair features."""
        hq = self.W_q(query)                                       # (B, Lq, h)
        hk = self.W_k(key)                                         # (B, Lk, h)
        pair = torch.tanh(hq[:, :, None, :] + hk[:, None, :, :])   # (B, Lq, Lk, h): one vector per pair
        return self.w_v(pair).squeeze(-1)                          # (B, Lq, Lk)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        self._check(query, key, value, attn_mask)
        scores = self.score(query, key)
        acc = torch.promote_types(scores.dtype, torch.float32)    # fp16/bf16 softmax in fp32
        scores = scores.to(acc)
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        weights = masked_softmax(scores, dim=-1)                   # fully masked rows -> 0
        p = F.dropout(weights, p=self.dropout, training=self.training) if self.dropout > 0 else weights
        out = p.to(value.dtype) @ value                            # (B, Lq, Dv)
        return out, weights.to(query.dtype)

    def _check(self, query, key, value, attn_mask) -> None:
        for name, t in (("query", query), ("key", key), ("value", value)):
            _validate.tensor(name, t, dim=3)
        B, Lq, Dq = query.shape
        if Dq != self.query_dim:
            raise ValueError(f"query has last dimension {Dq} (shape {tuple(query.shape)}), "
                             f"expected query_dim={self.query_dim}")
        if key.shape[-1] != self.key_dim:
            raise ValueError(f"key has last dimension {key.shape[-1]} (shape {tuple(key.shape)}), "
                             f"expected key_dim={self.key_dim}")
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(f"key and value must share batch and length (B, Lk), got key {tuple(key.shape)} "
                             f"and value {tuple(value.shape)}")
        if key.shape[0] != B:
            raise ValueError(f"query and key batch sizes differ: query {tuple(query.shape)}, key {tuple(key.shape)}")
        if attn_mask is None:
            return
        Lk = key.shape[1]
        if not isinstance(attn_mask, torch.Tensor) or attn_mask.dtype != torch.bool:
            raise ValueError(f"attn_mask must be a bool tensor (True = may attend), got "
                             f"{getattr(attn_mask, 'dtype', type(attn_mask).__name__)}")
        ok = (attn_mask.dim() == 3 and attn_mask.shape[0] in (1, B) and attn_mask.shape[1] in (1, Lq)
              and attn_mask.shape[2] == Lk)
        if not ok:
            raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} must be (B or 1, Lq or 1, Lk) = "
                             f"({B} or 1, {Lq} or 1, {Lk})")
