"""Cross-attention: queries from one sequence, keys and values from another.

    CrossAttention(X, C) = Concat(head_1, …, head_H) W^O,
    head_i = softmax((X W_i^Q)(C W_i^K)ᵀ / √d_h) (C W_i^V)

X ``(B, Lq, d_model)`` is the sequence that *asks* (the decoder, the text); C ``(B, Lk, context_dim)``
is the sequence that *is read* (the encoder output, the image patches). Lq and Lk may differ, and so may
the widths: ``k_proj``/``v_proj`` map ``context_dim -> d_model``, so every head lives in the queries'
space. The attention map of a head is ``(Lq, Lk)``: one row per query token, one column per context token.

References: Vaswani et al. 2017, "Attention Is All You Need", §3.2.3 ("encoder-decoder attention": queries
come from the previous decoder layer, keys and values from the output of the encoder) and the
multi-head equation of §3.2.2; ``torch.nn.MultiheadAttention(kdim=, vdim=)`` holds the same parameters.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import _validate
from .functional import _check, attention
from .mha import merge_heads, split_heads

__all__ = ["CrossAttention"]


class CrossAttention(nn.Module):
    """Multi-head cross-attention on batch-first tensors.

    Args:
        d_model: width of the queries' sequence ``x`` and of the output; divisible by ``num_heads``.
        num_heads: H; each head has ``d_h = d_model // num_heads``.
        context_dim: width of ``context`` (defaults to ``d_model``), e.g. 768 for image patch features
            read by a 512-wide text decoder.
        bias: bias in the four projections.
        dropout: dropout on the attention weights while training.

    Parameters: ``q_proj: Linear(d_model, d_model)``, ``k_proj``/``v_proj: Linear(context_dim, d_model)``,
    ``out_proj: Linear(d_model, d_model)``; head h owns rows ``h·d_h … (h+1)·d_h − 1`` of the first three.
    """

    def __init__(self, d_model: int, num_heads: int, context_dim: int | None = None, bias: bool = True,
                 dropout: float = 0.0):
        super().__init__()
        _validate.positive_int("d_model", d_model)
        _validate.positive_int("num_heads", num_heads)
        context_dim = d_model if context_dim is None else _validate.positive_int("context_dim", context_dim)
        _validate.divisible("d_model", d_model, "num_heads", num_heads)
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, d_model // num_heads
        self.context_dim = context_dim
        self.dropout = _validate.probability("dropout", dropout)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)        # W^Q: reads the queries' sequence X
        self.k_proj = nn.Linear(context_dim, d_model, bias=bias)    # W^K: reads the context C
        self.v_proj = nn.Linear(context_dim, d_model, bias=bias)    # W^V: reads the context C
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)      # W^O

    def forward(self, x: torch.Tensor, context: torch.Tensor, *, attn_mask: torch.Tensor | None = None,
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Let every token of ``x`` ``(B, Lq, d_model)`` read ``context`` ``(B, Lk, context_dim)``.

        ``attn_mask``: bool (True = may attend) or float (added to the scaled scores), broadcastable to
        ``(B, H, Lq, Lk)``; for a padded context pass ``masks.padding_mask(context_lengths, Lk)``
        ``(B, 1, 1, Lk)``: padded context tokens then get exactly zero weight. (Padded *query* rows need no
        mask: they read the context like any other row and are dropped by the loss.)
        Returns ``(out (B, Lq, d_model), weights (B, H, Lq, Lk) if need_weights else None)``.
        """
        _validate.tensor("x", x, dim=3)
        _validate.tensor("context", context, dim=3)
        _validate.last_dim("x", x, self.d_model, "d_model")
        _validate.last_dim("context", context, self.context_dim, "context_dim")
        if x.shape[0] != context.shape[0]:
            raise ValueError(f"x {tuple(x.shape)} and context {tuple(context.shape)} must have the same batch "
                             f"size, got B={x.shape[0]} and B={context.shape[0]}")
        q = split_heads(self.q_proj(x), self.num_heads)             # (B, H, Lq, d_h)  queries from X
        k = split_heads(self.k_proj(context), self.num_heads)       # (B, H, Lk, d_h)  keys from C
        v = split_heads(self.v_proj(context), self.num_heads)       # (B, H, Lk, d_h)  values from C
        p = self.dropout if self.training else 0.0
        if need_weights:   # explicit path: softmax(Q_i K_iᵀ/√d_h) V_i with the (Lq, Lk) map kept
            y, weights = attention(q, k, v, attn_mask=attn_mask, dropout_p=p)
        else:              # fused kernel; weights never materialised
            _check(q, k, v, attn_mask, False, enable_gqa=False)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)
            weights = None
        return self.out_proj(merge_heads(y)), weights               # (B, Lq, d_model)
