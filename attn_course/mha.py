"""Multi-head attention: H scaled dot-product attentions in parallel, each in its own d_model/H subspace.

    MultiHead(Q, K, V) = Concat(head_1, …, head_H) W^O,   head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

The H projections W_i^Q (d_model × d_h) are stored side by side as one ``nn.Linear(d_model, d_model)``;
splitting its output into heads is a reshape, ``(B, L, H·d_h) -> (B, H, L, d_h)``.

References: Vaswani et al. 2017, "Attention Is All You Need", §3.2.2 (the multi-head equation above);
``torch.nn.MultiheadAttention`` (same parameters, packed as ``in_proj_weight``; masks True = blocked).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from . import _validate
from .functional import _check, attention

__all__ = ["MultiHeadAttention", "split_heads", "merge_heads"]


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``(B, L, H·d_h) -> (B, H, L, d_h)``: feature block h of every token becomes head h.

    Equivalent to ``x.view(B, L, H, d_h).transpose(1, 2)``; ``x.view(B, H, L, d_h)`` is a bug (it cuts
    the flattened tokens, not the features) that has the right shape for every L, so nothing fails.
    """
    return rearrange(x, "b l (h d) -> b h l d", h=num_heads)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(B, H, L, d_h) -> (B, L, H·d_h)``: the inverse of :func:`split_heads` (the "Concat" of the equation)."""
    return rearrange(x, "b h l d -> b l (h d)")


class MultiHeadAttention(nn.Module):
    """Multi-head attention on batch-first ``(B, L, d_model)`` tensors.

    Args:
        d_model: model width; must be divisible by ``num_heads``. Each head has ``d_h = d_model // num_heads``.
        num_heads: H.
        bias: bias in the four projections.
        dropout: dropout on the attention weights while training.

    Parameters ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``: ``nn.Linear(d_model, d_model)``; head h
    owns rows ``h·d_h … (h+1)·d_h − 1`` of ``q_proj/k_proj/v_proj`` (and those columns of ``out_proj``).
    """

    def __init__(self, d_model: int, num_heads: int, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        _validate.positive_int("d_model", d_model)
        _validate.positive_int("num_heads", num_heads)
        _validate.divisible("d_model", d_model, "num_heads", num_heads)
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, d_model // num_heads
        self.dropout = _validate.probability("dropout", dropout)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)     # W^Q = [W_1^Q … W_H^Q]
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)     # W^K
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)     # W^V
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)   # W^O

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None, value: torch.Tensor | None = None,
                *, attn_mask: torch.Tensor | None = None, is_causal: bool = False, need_weights: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend ``query`` ``(B, Lq, d_model)`` to ``key``/``value`` ``(B, Lk, d_model)``.

        ``key`` defaults to ``query`` (self-attention) and ``value`` to ``key``.
        ``attn_mask``: bool (True = may attend) or float (added), broadcastable to ``(B, H, Lq, Lk)``.
        ``is_causal``: query i sees keys j <= i, top-left aligned when Lq != Lk (as SDPA).
        Returns ``(out (B, Lq, d_model), weights (B, H, Lq, Lk) if need_weights else None)``.
        """
        key = query if key is None else key
        value = key if value is None else value
        for name, t in (("query", query), ("key", key), ("value", value)):
            _validate.tensor(name, t, dim=3)
            _validate.last_dim(name, t, self.d_model, "d_model")
        if key.shape[:2] != value.shape[:2] or query.shape[0] != key.shape[0]:
            raise ValueError(f"query (B, Lq, d)={tuple(query.shape)}, key {tuple(key.shape)} and value "
                             f"{tuple(value.shape)} must share B, and key/value must share Lk")
        q = split_heads(self.q_proj(query), self.num_heads)      # (B, H, Lq, d_h)
        k = split_heads(self.k_proj(key), self.num_heads)        # (B, H, Lk, d_h)
        v = split_heads(self.v_proj(value), self.num_heads)      # (B, H, Lk, d_h)
        p = self.dropout if self.training else 0.0
        if need_weights:   # explicit path: head_i = softmax(Q_i K_iᵀ/√d_h) V_i, weights kept
            y, weights = attention(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=is_causal)
        else:              # fused kernel (flash / memory-efficient on GPU): weights never materialised
            _check(q, k, v, attn_mask, is_causal, enable_gqa=False)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=is_causal)
            weights = None
        return self.out_proj(merge_heads(y)), weights            # Concat(head_1 … head_H) W^O
