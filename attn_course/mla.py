"""Multi-head Latent Attention (MLA): keys and values from a small shared latent, decoupled RoPE, absorption.

DeepSeek-V2 §2.1 (symbols as in the paper; h_t is the token's input, n_h heads):

    c^KV_t = W^DKV h_t                       (9)   the latent, d_c numbers — what the cache keeps
    k^C_t  = W^UK c^KV_t                     (10)  per-head "content" keys, n_h·d_h
    v^C_t  = W^UV c^KV_t                     (11)  per-head values, n_h·d_h
    c^Q_t  = W^DQ h_t,   q^C_t = W^UQ c^Q_t  (12, 13) optional low-rank queries (d'_c)
    q^R_t  = RoPE(W^QR c^Q_t)                (14)  per-head rope queries, n_h·d^R_h
    k^R_t  = RoPE(W^KR h_t)                  (15)  ONE rope key shared by all heads, d^R_h
    q_t,i  = [q^C_t,i ; q^R_t,i],   k_t,i = [k^C_t,i ; k^R_t]          (16, 17)
    o_t,i  = Σ_j softmax_j(q_t,iᵀ k_j,i / sqrt(d_h + d^R_h)) v^C_j,i    (18)
    u_t    = W^O [o_t,1; ...; o_t,n_h]                                 (19)

While decoding, each past token costs (d_c + d^R_h) cached numbers: the normalised latent and the
rotated shared rope key. **Absorption**: q^C_t,iᵀ k^C_j,i = (W^UK_iᵀ q^C_t,i)ᵀ c^KV_j, so a query can be
mapped into the latent space once and scored against the cached latents directly; likewise the values'
W^UV_i can be applied after the weighted sum of latents. Attention then runs as *multi-query* attention
over the latent: one shared key [c^KV_j ; k^R_j] and one shared value c^KV_j for all heads. RoPE on
the content keys would put a position-dependent rotation between W^UK and c^KV and break this — which
is why the positional part lives in the separate, shared k^R.

Parameter names and channel layout follow the DeepSeek checkpoints (and Hugging Face's
``DeepseekV3Attention``), so their attention weights load with ``load_state_dict``. The released V2/V3
models also use YaRN RoPE scaling: pass their config's ``rope_scaling`` dict (``factor``,
``original_max_position_embeddings``, ``mscale``, ``mscale_all_dim``, optional ``beta_fast``/``beta_slow``) as
``rope_scaling=``, which switches the rope channels to YaRN's frequencies and multiplies the softmax scale by
mscale² (≈ 1.59 for V2's factor 40, mscale_all_dim 0.707), as HF does; without it the module computes Eq. (18)
with plain RoPE, which is not the released model:
``q_proj`` (or ``q_a_proj``, ``q_a_layernorm``, ``q_b_proj``) output per head ``[nope | rope]``;
``kv_a_proj_with_mqa`` output ``[latent | k_rope]`` (= W^DKV and W^KR stacked); ``kv_a_layernorm``
on the latent; ``kv_b_proj`` output per head ``[k_nope | v]`` (= W^UK and W^UV); ``o_proj`` = W^O.

RoPE convention: DeepSeek's reference code rotates its rope channels as interleaved neighbour pairs
(2i, 2i+1) (complex-number form), and Hugging Face's ``DeepseekV3Config.rope_interleave`` defaults to True
for those checkpoints: load them with ``rope_interleaved=True``. The default ``rope_interleaved=False``
pairs (i, i + d_R/2) (rotate_half), as HF does with ``rope_interleave=False``. Outputs agree with HF's
``DeepseekV3Attention`` given the same state dict in either setting (``tests/test_mla.py``).

Reference: DeepSeek-AI 2024, "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts
Language Model" (arXiv:2405.04434v5), §2.1.2–2.1.3, Eqs. (9)–(19), Table 1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ._validate import last_dim, positive_int, tensor
from .functional import _check, attention
from .norm import RMSNorm
from .rope import apply_rope, yarn_inv_freq, yarn_mscale

__all__ = ["MultiHeadLatentAttention", "MLACache"]


@dataclass
class MLACache:
    """What MLA keeps per past token, for ONE layer: ``c_kv (B, T, d_c)`` — the latent after
    ``kv_a_layernorm`` — and ``k_rope (B, T, d_R)`` — the shared rope key, already rotated at its own
    position. No per-head keys or values: ``d_c + d_R`` numbers per token, whatever the head count.

    Start with ``MLACache()`` and pass it to every ``forward(..., cache=cache)``; each call appends.
    """
    c_kv: torch.Tensor | None = None
    k_rope: torch.Tensor | None = None

    def __len__(self) -> int:
        """Number of cached tokens T."""
        return 0 if self.c_kv is None else self.c_kv.shape[1]

    def update(self, c_kv: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new ``c_kv (B, L, d_c)`` and ``k_rope (B, L, d_R)``; return everything cached."""
        if self.c_kv is not None:
            for name, old, new in (("c_kv", self.c_kv, c_kv), ("k_rope", self.k_rope, k_rope)):
                if old.shape[0] != new.shape[0] or old.shape[2:] != new.shape[2:]:
                    raise ValueError(f"cache holds {name} of shape {tuple(old.shape)}, cannot append {name} of "
                                     f"shape {tuple(new.shape)}: batch size and width must match")
        self.c_kv = c_kv if self.c_kv is None else torch.cat((self.c_kv, c_kv), dim=1)         # (B, T+L, d_c)
        self.k_rope = k_rope if self.k_rope is None else torch.cat((self.k_rope, k_rope), dim=1)  # (B, T+L, d_R)
        return self.c_kv, self.k_rope

    def nbytes(self) -> int:
        """Bytes actually held by the cached tensors."""
        return sum(t.numel() * t.element_size() for t in (self.c_kv, self.k_rope) if t is not None)


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent self-attention (DeepSeek-V2 §2.1) on batch-first ``(B, L, d_model)`` inputs.

    Args:
        d_model: input and output width.
        num_heads: n_h.
        kv_lora_rank: d_c, the width of the cached latent c^KV.
        qk_nope_head_dim: d_h of the content ("no position") part of each head's query and key.
        qk_rope_head_dim: d^R_h of the rotated part (even); the rope key is shared by all heads.
        v_head_dim: width of each head's value.
        q_lora_rank: d'_c. ``None``: queries come from one ``q_proj``; otherwise ``q_a_proj``
            (d_model → d'_c), ``q_a_layernorm`` (RMSNorm) and ``q_b_proj`` (d'_c → heads).
        rope_base: RoPE base. rope_interleaved: rotate neighbour pairs (2i, 2i+1) of the rope channels
            (DeepSeek's reference code; HF ``rope_interleave=True``) instead of (i, i + d^R/2).
        rope_scaling: ``None`` (plain RoPE, scale 1/sqrt(d_nope + d_R)) or a released checkpoint's YaRN dict:
            ``{"type" or "rope_type": "yarn", "factor", "original_max_position_embeddings", "mscale",
            "mscale_all_dim", "beta_fast" (32), "beta_slow" (1)}`` — YaRN frequencies on the rope channels
            (:func:`attn_course.rope.yarn_inv_freq`), the rotated channels times
            ``yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)`` (1 for V2/V3), and the softmax
            scale times ``yarn_mscale(factor, mscale_all_dim)²`` — the same as HF's ``DeepseekV3Attention``.

    Layers (all bias-free): ``q_proj: d_model → H·(d_nope + d_R)`` (or the q_a/q_b pair),
    ``kv_a_proj_with_mqa: d_model → d_c + d_R``, ``kv_a_layernorm: RMSNorm(d_c)``,
    ``kv_b_proj: d_c → H·(d_nope + d_v)``, ``o_proj: H·d_v → d_model``. Scale 1/sqrt(d_nope + d_R).
    """

    def __init__(self, d_model: int, num_heads: int, *, kv_lora_rank: int, qk_nope_head_dim: int,
                 qk_rope_head_dim: int, v_head_dim: int, q_lora_rank: int | None = None,
                 rope_base: float = 10000.0, rope_interleaved: bool = False, rope_scaling: dict | None = None):
        super().__init__()
        for name, value in (("d_model", d_model), ("num_heads", num_heads), ("kv_lora_rank", kv_lora_rank),
                            ("qk_nope_head_dim", qk_nope_head_dim), ("qk_rope_head_dim", qk_rope_head_dim),
                            ("v_head_dim", v_head_dim)):
            positive_int(name, value)
        if q_lora_rank is not None:
            positive_int("q_lora_rank", q_lora_rank)
        if qk_rope_head_dim % 2:
            raise ValueError(f"RoPE needs an even qk_rope_head_dim, got qk_rope_head_dim={qk_rope_head_dim}")
        if not float(rope_base) > 0:
            raise ValueError(f"rope_base must be positive, got {rope_base!r}")
        self.d_model, self.num_heads = d_model, num_heads
        self.kv_lora_rank, self.q_lora_rank = kv_lora_rank, q_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.rope_base, self.rope_interleaved = float(rope_base), bool(rope_interleaved)
        self.scale = 1.0 / math.sqrt(self.qk_head_dim)          # Eq. (18): sqrt(d_h + d^R_h), both parts
        # YaRN (rope_scaling): fp64 frequencies kept as a plain attribute (not a buffer, so .half() cannot round
        # them; apply_rope moves them to the input's device), the rotated channels' factor
        self.rope_scaling, self.rope_inv_freq, self.rope_factor = None, None, 1.0
        if rope_scaling is not None:
            self._set_yarn(dict(rope_scaling))
        H = num_heads
        if q_lora_rank is None:
            self.q_proj = nn.Linear(d_model, H * self.qk_head_dim, bias=False)
        else:                                                    # Eqs. (12)-(14): W^DQ, norm, [W^UQ; W^QR]
            self.q_a_proj = nn.Linear(d_model, q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(q_lora_rank)
            self.q_b_proj = nn.Linear(q_lora_rank, H * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d_model, kv_lora_rank + qk_rope_head_dim, bias=False)  # [W^DKV; W^KR]
        self.kv_a_layernorm = RMSNorm(kv_lora_rank)
        self.kv_b_proj = nn.Linear(kv_lora_rank, H * (qk_nope_head_dim + v_head_dim), bias=False)  # [W^UK; W^UV]
        self.o_proj = nn.Linear(H * v_head_dim, d_model, bias=False)                               # W^O

    # ---- pieces ---------------------------------------------------------------------------------------

    def _set_yarn(self, cfg: dict) -> None:
        kind = cfg.get("rope_type", cfg.get("type"))
        if kind != "yarn":
            raise ValueError(f"rope_scaling supports the released checkpoints' YaRN only, got type {kind!r}")
        missing = [k for k in ("factor", "original_max_position_embeddings") if k not in cfg]
        if missing:
            raise ValueError(f"rope_scaling is missing {missing}")
        factor = float(cfg["factor"])
        inv_freq = yarn_inv_freq(self.qk_rope_head_dim, self.rope_base, factor,
                                 int(cfg["original_max_position_embeddings"]),
                                 cfg.get("beta_fast") or 32.0, cfg.get("beta_slow") or 1.0)
        self.rope_inv_freq = inv_freq
        mscale, mscale_all_dim = cfg.get("mscale"), cfg.get("mscale_all_dim")
        # HF: cos and sin times the "attention factor" (1 when mscale == mscale_all_dim, as in V2/V3) ...
        self.rope_factor = (yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
                            if mscale and mscale_all_dim else yarn_mscale(factor))
        # ... and the softmax scale times mscale_all_dim's mscale squared
        if mscale_all_dim:
            self.scale = self.scale * yarn_mscale(factor, mscale_all_dim) ** 2
        self.rope_scaling = cfg

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out = apply_rope(x, positions, self.rope_base, interleaved=self.rope_interleaved, inv_freq=self.rope_inv_freq)
        return out if self.rope_factor == 1.0 else out * self.rope_factor

    def queries(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``q_nope (B, H, L, d_nope)`` and rotated ``q_rope (B, H, L, d_R)`` of ``x (B, L, d_model)``."""
        q = self.q_proj(x) if self.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = rearrange(q, "b l (h d) -> b h l d", h=self.num_heads)                     # (B, H, L, d_nope + d_R)
        q_nope, q_rope = q.split((self.qk_nope_head_dim, self.qk_rope_head_dim), dim=-1)
        return q_nope, self._rope(q_rope, positions)                                   # Eq. (14)

    def latents(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the cache stores for ``x (B, L, d_model)``: ``c_kv (B, L, d_c)`` (normalised) and the
        shared, rotated ``k_rope (B, L, d_R)``."""
        c_kv, k_rope = self.kv_a_proj_with_mqa(x).split((self.kv_lora_rank, self.qk_rope_head_dim), dim=-1)
        return self.kv_a_layernorm(c_kv), self._rope(k_rope, positions)                 # Eqs. (9), (15)

    def up_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``W_UK (H, d_nope, d_c)`` and ``W_UV (H, d_v, d_c)``: kv_b_proj's weight split per head."""
        W = rearrange(self.kv_b_proj.weight, "(h e) c -> h e c", h=self.num_heads)      # (H, d_nope + d_v, d_c)
        return W[:, : self.qk_nope_head_dim], W[:, self.qk_nope_head_dim:]

    # ---- forward --------------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, *, attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                need_weights: bool = False, cache: MLACache | None = None, absorb: bool = False):
        """Self-attention over ``x (B, L, d_model)``; returns ``(out (B, L, d_model), weights or None)``.

        ``attn_mask`` (bool, True = may attend, or float added to the scaled scores) broadcasts to
        ``(B, H, L, T + L)``, T = cached tokens (0 without a cache). ``is_causal``: query i sees keys
        j <= i; with a cache the new tokens sit at positions T..T+L-1 and see every cached key
        (bottom-right alignment). RoPE positions are T..T+L-1. ``cache``: an :class:`MLACache`, read and
        extended in place. ``need_weights=True`` also returns the weights ``(B, H, L, T + L)``.

        ``absorb=False`` (naive): up-project the latents into per-head keys and values (Eqs. 10, 11, 17)
        and run ordinary multi-head attention (with a cache: every cached latent, at every call; DeepSeek's
        reference ``attn_impl="naive"`` caches per-head K/V instead, see
        :func:`attn_course.demos.mla.per_head_kv_decode`). ``absorb=True``: fold W^UK into the queries and W^UV into
        the output side; attention runs over the latents themselves as multi-query attention with one
        key ``[c_kv ; k_rope]`` and one value ``c_kv`` — per-head K and V are never formed. Same result.
        """
        tensor("x", x, dim=3)
        last_dim("x", x, self.d_model, "d_model")
        if attn_mask is not None and is_causal:
            raise ValueError("pass either attn_mask or is_causal=True, not both (as in SDPA)")
        L = x.shape[1]
        T = 0 if cache is None else len(cache)
        positions = torch.arange(T, T + L, device=x.device)
        q_nope, q_rope = self.queries(x, positions)                # (B, H, L, d_nope), (B, H, L, d_R)
        c_kv, k_rope = self.latents(x, positions)                  # (B, L, d_c), (B, L, d_R)
        if cache is not None:
            c_kv, k_rope = cache.update(c_kv, k_rope)              # (B, S, ...), S = T + L
            if is_causal:   # bottom-right alignment: new query i sits at absolute position T + i
                attn_mask = torch.ones(L, T + L, dtype=torch.bool, device=x.device).tril(diagonal=T)
                is_causal = False
        H = self.num_heads
        if absorb:
            W_UK, W_UV = self.up_weights()                         # (H, d_nope, d_c), (H, d_v, d_c)
            q_lat = torch.einsum("bhld,hdc->bhlc", q_nope, W_UK)   # W^UK_iᵀ q^C_t,i: (B, H, L, d_c)
            q = torch.cat((q_lat, q_rope), dim=-1)                 # (B, H, L, d_c + d_R)
            k = torch.cat((c_kv, k_rope), dim=-1)[:, None]         # one shared key: (B, 1, S, d_c + d_R)
            v = c_kv[:, None]                                      # one shared value: (B, 1, S, d_c)
            _check(q, k, v, attn_mask, is_causal, enable_gqa=True)     # ValueErrors that name the sizes
            # Every head reads the same key and value, so fold the heads into the query axis and run
            # ONE-head attention over H·L query rows (no per-head copy of the latent is ever made).
            if is_causal:                                          # top-left aligned, as in SDPA
                attn_mask, is_causal = torch.ones(L, k.shape[-2], dtype=torch.bool, device=x.device).tril(), False
            if attn_mask is not None:
                full = torch.broadcast_shapes(attn_mask.shape, (1, H, L, k.shape[-2]))   # (B or 1, H, L, S)
                attn_mask = rearrange(attn_mask.expand(full), "b h l s -> b 1 (h l) s")
            q = rearrange(q, "b h l e -> b 1 (h l) e")             # (B, 1, H·L, d_c + d_R)
        else:
            kv = rearrange(self.kv_b_proj(c_kv), "b s (h e) -> b h s e", h=H)              # Eqs. (10), (11)
            k_nope, v = kv.split((self.qk_nope_head_dim, self.v_head_dim), dim=-1)         # (B, H, S, ·)
            v = v.contiguous()   # a view d_nope elements in: CUDA SDPA can read it misaligned (pytorch#183484)
            q = torch.cat((q_nope, q_rope), dim=-1)                                       # Eq. (16)
            k = torch.cat((k_nope, k_rope[:, None].expand(-1, H, -1, -1)), dim=-1)        # Eq. (17)
        if need_weights:   # Eq. (18) explicitly
            out, weights = attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=self.scale)
        else:
            _check(q, k, v, attn_mask, is_causal, enable_gqa=False)    # ValueErrors that name the sizes
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                                 scale=self.scale)
            weights = None
        if absorb:   # unfold the heads; the weighted sum of latents times each head's W^UV: (B, H, L, d_v)
            out = torch.einsum("bhlc,hvc->bhlv", rearrange(out, "b 1 (h l) c -> b h l c", h=H), W_UV)
            if weights is not None:
                weights = rearrange(weights, "b 1 (h l) s -> b h l s", h=H)
        out = rearrange(out, "b h l v -> b l (h v)")               # heads side by side: (B, L, H·d_v)
        return self.o_proj(out), weights                           # Eq. (19)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, kv_lora_rank={self.kv_lora_rank}, "
                f"qk_nope_head_dim={self.qk_nope_head_dim}, qk_rope_head_dim={self.qk_rope_head_dim}, "
                f"v_head_dim={self.v_head_dim}, q_lora_rank={self.q_lora_rank}, "
                f"rope_interleaved={self.rope_interleaved}"
                + ("" if self.rope_scaling is None else f", rope_scaling={self.rope_scaling}"))
