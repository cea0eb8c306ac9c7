"""Temporal attention (Rosin & Radinsky 2022): self-attention whose scores depend on *when* a text was written.

    TemporalAttention(Q, K, V, T) = softmax( Q (Tᵀ T / ‖T‖) Kᵀ / √d_h ) V

Per sample and head, T ``(L, d_h)`` is the time embedding of the sequence's tokens projected like Q and
K (``t_proj``, split into heads). ``M = TᵀT / ‖T‖_F`` is a ``(d_h, d_h)`` symmetric matrix that sits
*between* the queries and the keys: time is a condition on how tokens compare, not an extra token. We
compute the time-conditioned queries ``Q M`` and then call ordinary attention with scale 1/√d_h, so the
softmax is the course's one shared path (``attention()`` / SDPA).

‖T‖_F is taken per sample and per head, so a sample's output never depends on the rest of its batch.
(The authors' code divides by ``time_layer.norm(2.0)``, the norm of the whole ``(B, H, L, d_h)``
tensor: the lesson shows how that makes outputs change with the batch they are computed in.)

With one time per sequence (``time`` of shape ``(B, 1, time_dim)``, as in the paper, where every token of
a document carries the document's year), every row of T_h is the same vector t, so
``TᵀT = L t tᵀ`` is rank one and each head's scores factorise: ``S = √L / (‖t‖ √d_h) · (Q t)(K t)ᵀ``.

References: G. D. Rosin and K. Radinsky, "Temporal Attention for Language Models", Findings of NAACL
2022, §3 (arXiv:2202.02093); authors' code github.com/guyrosin/temporal_attention
(``BertTemporalSelfAttention``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import _validate
from .functional import _check, attention
from .mha import merge_heads, split_heads

__all__ = ["TemporalAttention", "time_matrix"]


def time_matrix(T: torch.Tensor, time_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``M = TᵀT / ‖T‖_F`` for every leading index: ``T (..., L, d) -> M (..., d, d)``.

    ``time_mask`` (bool, broadcastable to ``T.shape[:-1]``, True = real token) drops the rows of padded
    tokens from both TᵀT and the norm. An all-zero T gives M = 0 (the norm is clamped away from 0).
    fp16/bf16 inputs are computed in fp32 and cast back.
    """
    if time_mask is not None:
        T = T * time_mask[..., None].to(T.dtype)                               # padded rows -> 0
    Ta = T.to(torch.promote_types(T.dtype, torch.float32))                     # fp16/bf16 accumulate in fp32
    norm = torch.linalg.matrix_norm(Ta, ord="fro", keepdim=True)               # (..., 1, 1) ‖T‖_F per sample, head
    M = (Ta.transpose(-2, -1) @ Ta) / norm.clamp_min(torch.finfo(Ta.dtype).tiny)   # (..., d, d)  TᵀT / ‖T‖_F
    return M.to(T.dtype)


class TemporalAttention(nn.Module):
    """Multi-head temporal self-attention on batch-first tensors.

    Args:
        d_model: width of ``x`` and of the output; divisible by ``num_heads`` (``d_h = d_model // num_heads``).
        num_heads: H.
        time_dim: width of the time embedding passed to ``forward`` (e.g. a learned embedding of the year).
        bias: bias in the five projections.
        dropout: dropout on the attention weights while training.

    Parameters: ``q_proj, k_proj, v_proj, out_proj: Linear(d_model, d_model)`` and
    ``t_proj: Linear(time_dim, d_model)`` (the paper's W_T; head h owns rows ``h·d_h … (h+1)·d_h − 1``).
    """

    def __init__(self, d_model: int, num_heads: int, time_dim: int, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        _validate.positive_int("d_model", d_model)
        _validate.positive_int("num_heads", num_heads)
        _validate.positive_int("time_dim", time_dim)
        _validate.divisible("d_model", d_model, "num_heads", num_heads)
        self.d_model, self.num_heads, self.head_dim, self.time_dim = d_model, num_heads, d_model // num_heads, time_dim
        self.dropout = _validate.probability("dropout", dropout)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)       # W_Q
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)       # W_K
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)       # W_V
        self.t_proj = nn.Linear(time_dim, d_model, bias=bias)      # W_T: time embedding -> T
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)     # W_O

    def forward(self, x: torch.Tensor, time: torch.Tensor, *, attn_mask: torch.Tensor | None = None,
                need_weights: bool = False, time_mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Self-attention over ``x`` ``(B, L, d_model)`` conditioned on ``time``.

        ``time``: ``(B, L, time_dim)`` one time embedding per token, or ``(B, 1, time_dim)`` one per sequence
        (then T_h has L identical rows).
        ``attn_mask``: bool (True = may attend) or float (added), broadcastable to ``(B, H, L, L)``.
        ``time_mask``: optional bool ``(B, L)``, True = real token. Padded tokens' rows are left out of TᵀT
        and ‖T‖_F; without it they count (as in the authors' code), so padding changes the real tokens'
        outputs. Pass it together with a key-padding ``attn_mask``.
        Returns ``(out (B, L, d_model), weights (B, H, L, L) if need_weights else None)``.
        """
        _validate.tensor("x", x, dim=3)
        _validate.tensor("time", time, dim=3)
        _validate.last_dim("x", x, self.d_model, "d_model")
        _validate.last_dim("time", time, self.time_dim, "time_dim")
        B, L, _ = x.shape
        if time.shape[0] != B or time.shape[1] not in (1, L):
            raise ValueError(f"time must have shape (B={B}, L={L} or 1, time_dim={self.time_dim}), "
                             f"got {tuple(time.shape)} for x of shape {tuple(x.shape)}")
        if time_mask is not None and (time_mask.dtype != torch.bool or tuple(time_mask.shape) != (B, L)):
            raise ValueError(f"time_mask must be a bool tensor of shape (B={B}, L={L}), "
                             f"got {time_mask.dtype} {tuple(time_mask.shape)}")
        q = split_heads(self.q_proj(x), self.num_heads)                 # (B, H, L, d_h)
        k = split_heads(self.k_proj(x), self.num_heads)                 # (B, H, L, d_h)
        v = split_heads(self.v_proj(x), self.num_heads)                 # (B, H, L, d_h)
        T = split_heads(self.t_proj(time), self.num_heads)              # (B, H, L or 1, d_h)
        T = T.expand(B, self.num_heads, L, self.head_dim)               # one time per sequence: L equal rows
        M = time_matrix(T, None if time_mask is None else time_mask[:, None])   # (B, H, d_h, d_h) TᵀT/‖T‖_F
        q_t = q @ M                                                     # (B, H, L, d_h) time-conditioned queries Q M
        p = self.dropout if self.training else 0.0
        if need_weights:   # explicit path: softmax(Q M Kᵀ / √d_h) V, weights kept
            y, weights = attention(q_t, k, v, attn_mask=attn_mask, dropout_p=p)
        else:              # fused kernel on (Q M, K, V); default scale 1/√d_h
            _check(q_t, k, v, attn_mask, False, enable_gqa=False)
            y = F.scaled_dot_product_attention(q_t, k, v, attn_mask=attn_mask, dropout_p=p)
            weights = None
        return self.out_proj(merge_heads(y)), weights                   # (B, L, d_model)
