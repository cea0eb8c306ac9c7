"""The pre-norm transformer block of LLaMA/Mistral-style decoders: RMSNorm, GQA with RoPE (and optional
QK-norm and a sliding window), then a SwiGLU feed-forward network, each added to the residual stream.

    h = x + Attn(RMSNorm₁(x))                     (pre-norm: Xiong et al. 2020, Fig. 1(b))
    y = h + FFN(RMSNorm₂(h)),   FFN(u) = W₂ (SiLU(W₁ u) ⊙ W₃ u)      (SwiGLU: Shazeer 2020, Eq. 6)

Inside Attn, per head: q, k = RoPE(norm_q(q)), RoPE(norm_k(k)) — QK-norm (introduced by Henry et al. 2020 as
ℓ2-normalised q, k with a learned scale; LayerNorm-QK-norm at scale in Dehghani et al. 2023; timm's
``q_norm``/``k_norm``, used by a popular Chinese attention tutorial) is here an RMSNorm over head_dim applied
*before* the rotation, so it only rescales each head's query and key and RoPE's relative-position property is
untouched.

The block has no KV cache: :meth:`TransformerBlock.forward` recomputes every position (a decoder's
``generate`` re-runs its context window); lessons 03 and 09 show the cache on ``GroupedQueryAttention``.

References:

- Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture" (arXiv:2002.04745v2): the
  analysis of pre-norm, which GPT-2 (Radford et al. 2019) and Baevski & Auli 2019 already used.
- Henry, Dachapally, Pawar, Chen 2020, "Query-Key Normalization for Transformers" (arXiv:2010.04245).
- Shazeer 2020, "GLU Variants Improve Transformer" (arXiv:2002.05202v1).
- Touvron et al. 2023, "LLaMA" (arXiv:2302.13971v1): pre-norm RMSNorm + SwiGLU + RoPE.
- Dehghani et al. 2023, "Scaling Vision Transformers to 22B Parameters" (arXiv:2302.05442v1), §3.1 QK-norm.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from . import _validate
from .functional import _check, attention
from .gqa import GroupedQueryAttention
from .masks import causal_mask, sliding_window_mask
from .norm import RMSNorm
from .rope import apply_rope

__all__ = ["TransformerBlock", "SwiGLU", "swiglu_hidden"]


def swiglu_hidden(d_model: int, multiple_of: int = 8) -> int:
    """LLaMA's default FFN width: 2/3 of 4·d_model (so the three SwiGLU matrices hold about as many
    parameters as a 4·d_model two-matrix MLP), rounded up to a multiple of ``multiple_of``."""
    hidden = 2 * 4 * d_model // 3
    return multiple_of * -(-hidden // multiple_of)


class SwiGLU(nn.Module):
    """``W₂ (SiLU(W₁ u) ⊙ W₃ u)``: (..., d_model) -> (..., d_model), three bias-free matrices (Shazeer 2020, Eq. 6)."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden, bias=False)    # gate
        self.w3 = nn.Linear(d_model, hidden, bias=False)    # up
        self.w2 = nn.Linear(hidden, d_model, bias=False)    # down

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(u)) * self.w3(u))


class TransformerBlock(nn.Module):
    """Pre-norm decoder block on ``(B, L, d_model)``: ``x + attn(norm1(x))``, then ``+ ffn(norm2(·))``.

    Args:
        d_model: width; divisible by ``num_heads``; ``head_dim = d_model // num_heads`` must be even with RoPE.
        num_heads: H query heads.
        num_kv_heads: H_kv key/value heads (GQA; divides H). Default ``num_heads`` (plain multi-head).
        ffn_dim: hidden width of the SwiGLU FFN; default :func:`swiglu_hidden` (d_model) ≈ 8·d_model/3.
        qk_norm: RMSNorm over head_dim on every head's q and k (one gain vector of size head_dim shared
            by the heads, as timm's ``q_norm``/``k_norm``), before RoPE. Off: ``nn.Identity``.
        rope: rotate q and k by their positions 0..L-1 (:func:`attn_course.rope.apply_rope`, half-split).
        window: if set, query i sees only keys with i − j < window (a sliding window, Mistral); with
            ``is_causal=False`` the band ``|i − j| < window``.
        dropout: dropout on the attention weights while training.
        rope_interleaved: use the interleaved (GPT-J / complex) RoPE convention instead of the half-split.

    Parameters: ``norm1``, ``attn`` (a :class:`~attn_course.GroupedQueryAttention`, whose ``q_proj``,
    ``k_proj``, ``v_proj``, ``out_proj`` this block uses), ``q_norm``, ``k_norm``, ``norm2``, ``ffn``
    (``w1``, ``w3``: d_model → ffn_dim; ``w2``: ffn_dim → d_model), all bias-free.
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None, ffn_dim: int | None = None,
                 qk_norm: bool = False, rope: bool = True, window: int | None = None, dropout: float = 0.0,
                 *, rope_interleaved: bool = False):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.attn = GroupedQueryAttention(d_model, num_heads, num_kv_heads, bias=False, dropout=dropout)
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.head_dim = self.attn.head_dim
        if rope and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got d_model={d_model} / num_heads={num_heads} = {self.head_dim}")
        self.window = None if window is None else _validate.positive_int("window", window)
        self.ffn_dim = swiglu_hidden(d_model) if ffn_dim is None else _validate.positive_int("ffn_dim", ffn_dim)
        self.rope, self.rope_interleaved = bool(rope), bool(rope_interleaved)
        self.norm1 = RMSNorm(d_model)
        self.q_norm = RMSNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.head_dim) if qk_norm else nn.Identity()
        self.norm2 = RMSNorm(d_model)
        self.ffn = SwiGLU(d_model, self.ffn_dim)

    # -- attention sub-layer, in three steps so lessons can look inside ------------------------------------

    def qkv(self, h: torch.Tensor, positions: torch.Tensor | None = None):
        """Project the normalised input ``h`` (B, L, d_model) to per-head ``q (B, H, L, d_h)`` and
        ``k, v (B, H_kv, L, d_h)``; q and k get QK-norm, then RoPE at ``positions`` (default 0..L-1)."""
        a = self.attn
        q = rearrange(a.q_proj(h), "b l (h d) -> b h l d", h=self.num_heads)
        k = rearrange(a.k_proj(h), "b l (h d) -> b h l d", h=self.num_kv_heads)
        v = rearrange(a.v_proj(h), "b l (h d) -> b h l d", h=self.num_kv_heads)
        q, k = self.q_norm(q), self.k_norm(k)                 # per head, over d_h (timm q_norm / k_norm)
        if self.rope:
            q = apply_rope(q, positions, interleaved=self.rope_interleaved)
            k = apply_rope(k, positions, interleaved=self.rope_interleaved)
        return q, k, v

    def mask(self, L: int, *, is_causal: bool = True, attn_mask: torch.Tensor | None = None, device=None):
        """The mask the attention uses: the block's structure (causal and/or window) combined with
        ``attn_mask`` — AND for a bool mask, −∞ outside the structure for a float (additive) mask.
        Returns ``None`` when there is nothing to mask."""
        if self.window is not None:
            allowed = sliding_window_mask(L, self.window, causal=is_causal, device=device)
        elif is_causal:
            allowed = causal_mask(L, device=device)
        else:
            allowed = None
        if attn_mask is not None:
            if not isinstance(attn_mask, torch.Tensor) or not (attn_mask.dtype == torch.bool or attn_mask.is_floating_point()):
                raise ValueError(f"attn_mask must be a bool (True = may attend) or float (added) tensor, got "
                                 f"{getattr(attn_mask, 'dtype', type(attn_mask).__name__)}")
            try:
                torch.broadcast_shapes(attn_mask.shape[-2:], (L, L))
            except RuntimeError:
                raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to the scores' "
                                 f"(..., L, L) with L={L}") from None
        if attn_mask is None or allowed is None:
            return allowed if attn_mask is None else attn_mask
        if attn_mask.dtype == torch.bool:
            return attn_mask & allowed
        return attn_mask.masked_fill(~allowed, float("-inf"))

    def attend(self, h: torch.Tensor, *, is_causal: bool = True, attn_mask: torch.Tensor | None = None,
               need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The attention sub-layer on the normalised input ``h``: ``(out (B, L, d_model), weights or None)``.

        ``need_weights=True`` takes the explicit path (:func:`attn_course.attention`) and returns the
        weights ``(B, H, L, L)``; otherwise SDPA (with ``is_causal=True`` itself when no other mask applies).
        """
        q, k, v = self.qkv(h)
        L = h.shape[1]
        p = self.attn.dropout if self.training else 0.0
        if need_weights:
            y, w = attention(q, k, v, attn_mask=self.mask(L, is_causal=is_causal, attn_mask=attn_mask, device=h.device),
                             dropout_p=p, enable_gqa=True)
        else:
            plain_causal = is_causal and self.window is None and attn_mask is None
            m = None if plain_causal else self.mask(L, is_causal=is_causal, attn_mask=attn_mask, device=h.device)
            _check(q, k, v, m, plain_causal, enable_gqa=True)              # ValueErrors naming the sizes
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=p, is_causal=plain_causal,
                                               enable_gqa=True)
            w = None
        return self.attn.out_proj(rearrange(y, "b h l d -> b l (h d)")), w

    def forward(self, x: torch.Tensor, *, is_causal: bool = True, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x (B, L, d_model) -> y (B, L, d_model)``.

        Args:
            is_causal: query i sees keys j <= i (default, a decoder). ``False``: bidirectional (an encoder).
            attn_mask: extra mask broadcastable to ``(B, H, L, L)``: bool (True = may attend) or float
                (added to the scores, e.g. an ALiBi bias); it is *combined* with causality and the window.
        """
        _validate.tensor("x", x, dim=3)
        _validate.last_dim("x", x, self.d_model, "d_model")
        x = x + self.attend(self.norm1(x), is_causal=is_causal, attn_mask=attn_mask)[0]
        return x + self.ffn(self.norm2(x))
