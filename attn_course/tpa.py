"""Tensor Product Attention (TPA): queries, keys and values as contextual low-rank tensor products.

For every token t, each of Q_t, K_t, V_t ∈ R^{H×d_h} is a sum of R outer products of a *head factor*
a_r(x_t) ∈ R^H and a *token factor* b_r(x_t) ∈ R^{d_h}, both linear in x_t (hence "contextual"):

    Q_t = (1/R_q) Σ_r a^q_r(x_t) ⊗ b^q_r(x_t) = (1/R_q) A_q(x_t)ᵀ B_q(x_t)      (same for K with R_k, V with R_v)

RoPE rotates the token factors B_q, B_k (rotating every b_r rotates their weighted sum, so this equals
rotating Q and K). Attention itself is the usual causal scaled dot-product attention over the sequence,
per head; the heads' outputs (H·d_h) go through an output projection. When decoding, the cache holds
the factors (A_k, rotated B_k, A_v, B_v): (R_k + R_v)(H + d_h) numbers per token instead of 2·H·d_h.

Reference: Zhang, Liu, Yuan, et al. 2025, "Tensor Product Attention Is All You Need" (arXiv:2501.06425),
§3.1 (factorisation), §3.2 (RoPE on the token factors), §3.3 (KV cache), §4 (MHA/MQA/GQA as
non-contextual TPA); official code: github.com/tensorgi/T6.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ._validate import last_dim, positive_int, probability, tensor
from .functional import _check, attention, masked_softmax
from .rope import apply_rope

__all__ = ["TensorProductAttention", "TPACache", "combine_factors", "attention_from_factors"]


def combine_factors(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Contract head factors ``A (B, L, H, R)`` with token factors ``B (B, L, R, d)`` into ``(B, L, H, d)``.

    ``out[b, l, h, :] = (1/R) Σ_r A[b, l, h, r] · B[b, l, r, :]`` — the 1/R of §3.1, not 1/√R.
    """
    return torch.einsum("blhr,blrd->blhd", A, B) / A.shape[-1]


@dataclass
class TPACache:
    """What TPA keeps per past token while decoding: the *factors*, not K and V (§3.3).

    ``A_k (B, T, H, R_k)``, ``B_k (B, T, R_k, d_h)`` (already rotated by RoPE at its own position),
    ``A_v (B, T, H, R_v)``, ``B_v (B, T, R_v, d_h)``. Start with ``TPACache()`` and pass it to every
    ``forward(..., cache=cache)`` call; each call appends its tokens in place.
    """
    A_k: torch.Tensor | None = None
    B_k: torch.Tensor | None = None
    A_v: torch.Tensor | None = None
    B_v: torch.Tensor | None = None

    def __len__(self) -> int:
        """Number of cached tokens T."""
        return 0 if self.A_k is None else self.A_k.shape[1]

    def update(self, A_k, B_k, A_v, B_v) -> tuple[torch.Tensor, ...]:
        """Append the new tokens' factors (along the sequence axis 1); return all cached factors."""
        new = (A_k, B_k, A_v, B_v)
        if self.A_k is not None:
            for name, o, n in zip(("A_k", "B_k", "A_v", "B_v"), (self.A_k, self.B_k, self.A_v, self.B_v), new):
                if o.shape[0] != n.shape[0] or o.shape[2:] != n.shape[2:]:
                    raise ValueError(f"cache holds {name} of shape {tuple(o.shape)}, cannot append {name} of "
                                     f"shape {tuple(n.shape)}: batch size, heads, rank and head_dim must match")
        old = (self.A_k, self.B_k, self.A_v, self.B_v)
        self.A_k, self.B_k, self.A_v, self.B_v = (n if o is None else torch.cat((o, n), dim=1)
                                                  for o, n in zip(old, new))
        return self.A_k, self.B_k, self.A_v, self.B_v

    def nbytes(self) -> int:
        """Bytes actually held by the cached tensors."""
        return sum(t.numel() * t.element_size() for t in (self.A_k, self.B_k, self.A_v, self.B_v)
                   if t is not None)


class TensorProductAttention(nn.Module):
    """Multi-head attention whose Q, K, V are contextual tensor products (Zhang et al. 2025).

    Args:
        d_model: input and output width.
        num_heads: H. head_dim: d_h (H·d_h need not equal d_model).
        q_rank, k_rank, v_rank: R_q, R_k, R_v (the paper's default 6, 2, 2).
        rope: rotate B_q and B_k by their positions (needs an even head_dim); rope_base: its base.
        dropout: dropout on the attention weights in training.

    Layers (all bias-free): ``W_A_q: d_model → H·R_q`` viewed head-major ``(B, L, H, R_q)``,
    ``W_B_q: d_model → R_q·d_h`` viewed ``(B, L, R_q, d_h)``; likewise ``W_A_k, W_B_k, W_A_v, W_B_v``;
    ``out_proj: H·d_h → d_model``.
    """

    def __init__(self, d_model: int, num_heads: int, head_dim: int, q_rank: int = 6, k_rank: int = 2,
                 v_rank: int = 2, rope: bool = True, rope_base: float = 10000.0, dropout: float = 0.0):
        super().__init__()
        for name, value in (("d_model", d_model), ("num_heads", num_heads), ("head_dim", head_dim),
                            ("q_rank", q_rank), ("k_rank", k_rank), ("v_rank", v_rank)):
            positive_int(name, value)
        if rope and head_dim % 2 != 0:
            raise ValueError(f"RoPE needs an even head_dim, got head_dim={head_dim}")
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, head_dim
        self.q_rank, self.k_rank, self.v_rank = q_rank, k_rank, v_rank
        self.rope, self.rope_base = rope, float(rope_base)
        self.dropout = probability("dropout", dropout)
        H, d = num_heads, head_dim
        self.W_A_q = nn.Linear(d_model, H * q_rank, bias=False)
        self.W_B_q = nn.Linear(d_model, q_rank * d, bias=False)
        self.W_A_k = nn.Linear(d_model, H * k_rank, bias=False)
        self.W_B_k = nn.Linear(d_model, k_rank * d, bias=False)
        self.W_A_v = nn.Linear(d_model, H * v_rank, bias=False)
        self.W_B_v = nn.Linear(d_model, v_rank * d, bias=False)
        self.out_proj = nn.Linear(H * d, d_model, bias=False)

    def _rotate(self, B: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """RoPE on token factors ``(B, L, R, d_h)``: every rank's b_r is rotated by its token's position."""
        if not self.rope:
            return B
        return rearrange(apply_rope(rearrange(B, "b l r d -> b r l d"), positions, self.rope_base),
                         "b r l d -> b l r d")

    def factors(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The six factors of ``x (B, L, d_model)``; B_q and B_k rotated (positions default 0..L-1).

        Returns ``A_q (B, L, H, R_q)``, ``B_q (B, L, R_q, d_h)`` and the same for k and v.
        """
        if positions is None:
            positions = torch.arange(x.shape[1], device=x.device)
        H, d = self.num_heads, self.head_dim
        return {
            "A_q": rearrange(self.W_A_q(x), "b l (h r) -> b l h r", h=H),                       # (B, L, H, R_q)
            "B_q": self._rotate(rearrange(self.W_B_q(x), "b l (r d) -> b l r d", d=d), positions),  # (B, L, R_q, d_h)
            "A_k": rearrange(self.W_A_k(x), "b l (h r) -> b l h r", h=H),                       # (B, L, H, R_k)
            "B_k": self._rotate(rearrange(self.W_B_k(x), "b l (r d) -> b l r d", d=d), positions),  # (B, L, R_k, d_h)
            "A_v": rearrange(self.W_A_v(x), "b l (h r) -> b l h r", h=H),                       # (B, L, H, R_v)
            "B_v": rearrange(self.W_B_v(x), "b l (r d) -> b l r d", d=d),                       # (B, L, R_v, d_h)
        }

    def forward(self, x: torch.Tensor, *, attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                need_weights: bool = False, cache: TPACache | None = None):
        """Self-attention over ``x (B, L, d_model)``; returns ``(out (B, L, d_model), weights or None)``.

        ``attn_mask`` (True = may attend, or float added) broadcasts to ``(B, H, L, T + L)`` where T is
        the number of cached tokens (0 without a cache). ``is_causal``: query i sees keys j <= i; with a
        cache holding T tokens the new queries sit at positions T..T+L-1 and see every cached key and
        the new keys up to their own position (bottom-right aligned). ``cache``: a :class:`TPACache` that
        is read and extended in place; token-by-token decoding with it equals the full causal forward.
        ``need_weights=True`` also returns the per-head weights ``(B, H, L, T + L)``.
        """
        tensor("x", x, dim=3)
        last_dim("x", x, self.d_model, "d_model")
        if attn_mask is not None and is_causal:
            raise ValueError("pass either attn_mask or is_causal=True, not both (as in SDPA)")
        L = x.shape[1]
        T = 0 if cache is None else len(cache)
        f = self.factors(x, torch.arange(T, T + L, device=x.device))
        A_k, B_k, A_v, B_v = f["A_k"], f["B_k"], f["A_v"], f["B_v"]
        if cache is not None:
            A_k, B_k, A_v, B_v = cache.update(A_k, B_k, A_v, B_v)     # (B, T+L, ...): past and new factors
            if is_causal:   # bottom-right alignment: new query i sits at absolute position T + i
                attn_mask = torch.ones(L, T + L, dtype=torch.bool, device=x.device).tril(diagonal=T)
                is_causal = False
        # §3.1: Q_t = (1/R_q) A_q(x_t) B_q(x_t), likewise K and V; B_q, B_k already rotated (§3.2)
        q = rearrange(combine_factors(f["A_q"], f["B_q"]), "b l h d -> b h l d")   # (B, H, L, d_h)
        k = rearrange(combine_factors(A_k, B_k), "b s h d -> b h s d")              # (B, H, T+L, d_h)
        v = rearrange(combine_factors(A_v, B_v), "b s h d -> b h s d")              # (B, H, T+L, d_h)
        p = self.dropout if self.training else 0.0
        if need_weights:
            out, weights = attention(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=is_causal)
        else:
            _check(q, k, v, attn_mask, is_causal, enable_gqa=False)     # ValueErrors that name the sizes
            out, weights = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p,
                                                          is_causal=is_causal), None
        out = rearrange(out, "b h l d -> b l (h d)")            # heads side by side: (B, L, H·d_h)
        return self.out_proj(out), weights


def attention_from_factors(A_q, B_q, A_k, B_k, A_v, B_v, *, is_causal: bool = False):
    """Causal-or-not attention computed straight from the factors, never forming Q, K or V.

    Shapes as returned by :meth:`TensorProductAttention.factors` (B_q and B_k already rotated).
    The score of query i and key j in head h is

        q_{i,h}·k_{j,h} = (1/(R_q R_k)) Σ_{r,s} A_q[i,h,r] A_k[j,h,s] ⟨B_q[i,r], B_k[j,s]⟩

    so the d_h-wide dot products are taken once per *rank pair* (R_q·R_k of them), shared by all H
    heads; the values are contracted the same way. Returns ``(out (B, H, Lq, d_h), weights (B, H, Lq, Lk))``.
    This is the idea behind the paper's factor-based decoding (§5); it is here to be checked against
    the materialised path, not for speed.
    """
    Rq, Rk, Rv, d = A_q.shape[-1], A_k.shape[-1], A_v.shape[-1], B_q.shape[-1]
    G = torch.einsum("bird,bjsd->bijrs", B_q, B_k)                          # (B, Lq, Lk, R_q, R_k)
    scores = torch.einsum("bihr,bjhs,bijrs->bhij", A_q, A_k, G) / (Rq * Rk * math.sqrt(d))   # (B, H, Lq, Lk)
    if is_causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = masked_softmax(scores, dim=-1)                               # (B, H, Lq, Lk)
    out = torch.einsum("bhij,bjhs,bjsd->bhid", weights, A_v, B_v) / Rv      # (B, H, Lq, d_h)
    return out, weights
