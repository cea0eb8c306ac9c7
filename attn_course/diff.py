"""Differential attention (DIFF Transformer; Hugging Face's DiffLlama): the difference of two softmax maps,
so that attention noise common to both cancels.

    DiffAttn(X) = (softmax(Q₁K₁ᵀ/√d) − λ · softmax(Q₂K₂ᵀ/√d)) V                 (Ye et al. 2024, Eq. 1)
    λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init,    λ_init = 0.8 − 0.6·exp(−0.3·(l−1))    (Eq. 2)
    head_i = (1 − λ_init) · RMSNorm(DiffAttn_i(X))                                             (Eq. 3)

Each differential head pairs two ordinary query/key heads and reads a value twice as wide. In DiffLlama's
layout (followed here exactly), the first half of the query heads give the Q₁ maps and the second half the
Q₂ maps (pair i = heads i and i + H/2); each map reads the concatenation of the two halves of the key/value
heads, so a pair's output is 2·head_dim wide, normalised by an RMSNorm without gain (the paper's GroupNorm per
head). λ is re-parameterised through four learned vectors so that it can go below λ_init or above 1.

Parameter names follow ``transformers``' ``DiffLlamaAttention`` (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``,
``lambda_q1``, ``lambda_k1``, ``lambda_q2``, ``lambda_k2``); :meth:`DifferentialAttention.from_config` reads a
``DiffLlamaConfig``. Note that DiffLlama's ``layer_idx`` counts from 0 in λ_init (the paper's l − 1).

Reference: Ye et al. 2024, "Differential Transformer" (arXiv:2410.05258).
"""
from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import nn

from . import _validate
from ._hfconfig import RopeSpec, attr, rope_params
from .functional import attention

__all__ = ["DifferentialAttention", "lambda_init"]


def lambda_init(layer_idx: int) -> float:
    """``0.8 − 0.6·exp(−0.3·layer_idx)`` (layer_idx counted from 0): 0.2 in the first layer, → 0.8 deep down."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)


class DifferentialAttention(nn.Module):
    """Causal differential attention with GQA and RoPE, in DiffLlama's layout.

    Args:
        hidden_size: model width ``d``.
        num_heads: ordinary query heads (even: H/2 differential pairs); num_kv_heads: key/value heads (even).
        head_dim: per-map width; each pair outputs 2·head_dim.
        layer_idx: the layer's index from 0 (sets λ_init).

    ``forward(x (B, L, d), positions=None, need_weights=False) -> (y, maps | None)`` with maps
    ``(B, H/2, L, L)``: the differential maps softmax₁ − λ·softmax₂ (rows sum to 1 − λ).
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, *, layer_idx: int = 0,
                 bias: bool = False, eps: float = 1e-5, lambda_std: float = 0.1, rope: RopeSpec | None = None):
        super().__init__()
        _validate.positive_int("hidden_size", hidden_size)
        _validate.positive_int("head_dim", head_dim)
        if num_heads <= 0 or num_kv_heads <= 0 or num_heads % num_kv_heads or num_heads % 2 or num_kv_heads % 2:
            raise ValueError(f"num_heads={num_heads} and num_kv_heads={num_kv_heads} must be even and num_heads a "
                             f"multiple of num_kv_heads")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.lambda_init = lambda_init(layer_idx)
        self.eps = float(eps)
        self.rope = rope if rope is not None else RopeSpec(head_dim)
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, name, nn.Parameter(torch.randn(head_dim) * lambda_std))

    @classmethod
    def from_config(cls, config, layer_idx: int = 0) -> "DifferentialAttention":
        """Build from a ``DiffLlamaConfig`` (read by attributes) for layer ``layer_idx``."""
        head_dim = attr(config, "head_dim", config.hidden_size // config.num_attention_heads)
        return cls(config.hidden_size, config.num_attention_heads, config.num_key_value_heads, head_dim,
                   layer_idx=layer_idx, bias=bool(attr(config, "attention_bias", False)),
                   eps=attr(config, "rms_norm_eps", 1e-5), lambda_std=attr(config, "lambda_std_dev", 0.1),
                   rope=rope_params(config, head_dim))

    def lam(self) -> torch.Tensor:
        """λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init (a scalar tensor)."""
        return (torch.exp((self.lambda_q1 * self.lambda_k1).sum()) - torch.exp((self.lambda_q2 * self.lambda_k2).sum())
                + self.lambda_init)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, *, need_weights: bool = False):
        _validate.tensor("x", x, dim=3)
        _validate.last_dim("x", x, self.q_proj.in_features, "hidden_size")
        q = rearrange(self.q_proj(x), "b l (h e) -> b h l e", h=self.num_heads)
        k = rearrange(self.k_proj(x), "b l (h e) -> b h l e", h=self.num_kv_heads)
        v = rearrange(self.v_proj(x), "b l (h e) -> b h l e", h=self.num_kv_heads)
        q, k = self.rope(q, positions), self.rope(k, positions)
        v1, v2 = v.chunk(2, dim=1)                                  # the two halves of the value heads
        v = torch.cat((v1, v2), dim=-1).repeat(1, 2, 1, 1)          # each kv head reads [v1 ; v2], 2·head_dim
        o, w = attention(q, k, v, is_causal=True, enable_gqa=self.num_heads > self.num_kv_heads)   # (B, H, L, 2E)
        o1, o2 = o.chunk(2, dim=1)                                  # pair i: heads i and i + H/2
        lam = self.lam().to(o.dtype)
        diff = o1 - lam * o2                                        # (softmax₁ − λ softmax₂) [v1 ; v2]
        acc = torch.promote_types(diff.dtype, torch.float32)
        d = diff.to(acc)
        d = (d * torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + self.eps)).to(diff.dtype)   # RMSNorm, no gain
        y = self.o_proj(rearrange((1 - self.lambda_init) * d, "b h l e -> b l (h e)"))
        maps = None
        if need_weights:
            w1, w2 = w.chunk(2, dim=1)
            maps = w1 - lam * w2
        return y, maps
