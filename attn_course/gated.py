"""Gated attention (Qwen3-Next): every head's output is multiplied by a sigmoid gate computed from the
layer's input, before the output projection.

    [q_h ; g_h] = W_q x            (the query projection produces the gate too: 2·head_dim per head)
    o_h = softmax(RoPE(n(q_h)) RoPE(n(k_h))ᵀ / √d) v_h          n: RMSNorm over head_dim (QK-norm)
    y   = W_o (o ⊙ σ(g))

The gate is elementwise and input-dependent (Qiu et al. 2025, the "G1" position after SDPA): a head can
shut its output off for a token without putting its attention somewhere harmless, which removes the need
for a "sink" token soaking up attention mass, and it adds a non-linearity between W_v and W_o. Qwen3-Next
also rotates only a quarter of each head's channels (partial RoPE, ``partial_rotary_factor=0.25``), and
its RMSNorm gains are stored as offsets from one (``(1 + w)``, initialised at zero).

Parameter names follow ``transformers``' ``Qwen3NextAttention`` (``q_proj`` — query and gate interleaved
per head —, ``k_proj``, ``v_proj``, ``o_proj``, ``q_norm``, ``k_norm``), so
``load_state_dict(peer.state_dict(), strict=True)`` works; :meth:`GatedAttention.from_config` reads a
``Qwen3NextConfig``.

Reference: Qiu et al. 2025, "Gated Attention for Large Language Models: Non-linearity, Sparsity, and
Attention-Sink-Free" (arXiv:2505.06708); Qwen team 2025, Qwen3-Next.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from . import _validate
from ._hfconfig import RopeSpec, attr, rope_params
from .functional import attention, repeat_kv

__all__ = ["GatedAttention", "OffsetRMSNorm"]


class OffsetRMSNorm(nn.Module):
    """RMSNorm whose gain is ``1 + weight`` (``weight`` initialised at zero), computed in fp32 or fp64 —
    the form Qwen3-Next (and Gemma) store."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.zeros(_validate.positive_int("dim", dim)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acc = torch.promote_types(x.dtype, torch.float32)
        xf = x.to(acc)
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.weight.to(acc))).to(x.dtype)


class GatedAttention(nn.Module):
    """Causal GQA with QK-norm, partial RoPE and a sigmoid output gate per head and channel.

    ``forward(x (B, L, d), positions=None, need_weights=False, gate=True) -> (y (B, L, d), weights | None)``;
    ``gate=False`` skips the gate (the same weights, ungated: for experiments, not a model).
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, *,
                 bias: bool = False, eps: float = 1e-6, rope: RopeSpec | None = None):
        super().__init__()
        _validate.positive_int("hidden_size", hidden_size)
        _validate.positive_int("head_dim", head_dim)
        if num_heads <= 0 or num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be a positive multiple of num_kv_heads={num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope = rope if rope is not None else RopeSpec(head_dim, partial_rotary_factor=0.25)
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim * 2, bias=bias)     # [q_h ; g_h] per head
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias)
        self.q_norm = OffsetRMSNorm(head_dim, eps)
        self.k_norm = OffsetRMSNorm(head_dim, eps)

    @classmethod
    def from_config(cls, config) -> "GatedAttention":
        """Build from a ``Qwen3NextConfig`` (read by attributes)."""
        head_dim = attr(config, "head_dim", config.hidden_size // config.num_attention_heads)
        return cls(config.hidden_size, config.num_attention_heads, config.num_key_value_heads, head_dim,
                   bias=bool(attr(config, "attention_bias", False)), eps=attr(config, "rms_norm_eps", 1e-6),
                   rope=rope_params(config, head_dim))

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, *, need_weights: bool = False,
                gate: bool = True):
        _validate.tensor("x", x, dim=3)
        _validate.last_dim("x", x, self.q_proj.in_features, "hidden_size")
        qg = rearrange(self.q_proj(x), "b l (h two e) -> two b h l e", h=self.num_heads, two=2)
        q, g = qg[0], qg[1]                                                           # (B, H, L, E) each
        k = rearrange(self.k_proj(x), "b l (h e) -> b h l e", h=self.num_kv_heads)
        v = rearrange(self.v_proj(x), "b l (h e) -> b h l e", h=self.num_kv_heads)
        q, k = self.rope(self.q_norm(q), positions), self.rope(self.k_norm(k), positions)   # QK-norm, then RoPE
        n_rep = self.num_heads // self.num_kv_heads
        if need_weights:
            o, w = attention(q, k, v, is_causal=True, enable_gqa=n_rep > 1)
        else:
            o, w = F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), is_causal=True), None
        if gate:
            o = o * torch.sigmoid(g)                                                  # o ⊙ σ(g), per channel
        return self.o_proj(rearrange(o, "b h l e -> b l (h e)")), w
