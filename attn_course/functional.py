"""The one explicit ("textbook") attention computation every module in the course shares.

    Attention(Q, K, V) = softmax(Q Kᵀ · scale + M) V,      scale = 1/√d_k by default

Same semantics as ``torch.nn.functional.scaled_dot_product_attention`` (SDPA), but it also returns
the attention weights, which the fused kernels never materialise.

References: Vaswani et al. 2017, "Attention Is All You Need", Eq. (1);
PyTorch docs for ``scaled_dot_product_attention`` (mask polarity, causal alignment, GQA).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["attention", "masked_softmax", "repeat_kv"]


def masked_softmax(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax that returns 0 (not NaN) for rows whose entries are all −∞, in forward and backward.

    A plain ``softmax`` of an all −∞ row computes exp(−∞ − (−∞)) = NaN. We subtract the row maximum
    only where it is finite, so a fully masked row becomes 0/0, which we turn into 0 by dividing by 1.
    Rows of length 0 (no keys at all, Lk = 0) give an empty result, as SDPA does (its output is then 0).
    """
    if scores.shape[dim] == 0:                     # nothing to normalise (amax would raise IndexError)
        return scores.softmax(dim=dim)
    m = scores.amax(dim=dim, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(scores - m)                      # masked entries: exp(−∞) = 0
    s = e.sum(dim=dim, keepdim=True)
    return e / torch.where(s == 0, torch.ones_like(s), s)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(..., H_kv, L, D) -> (..., H_kv·n_rep, L, D): kv head j serves query heads j·n_rep … j·n_rep+n_rep−1.

    This is ``repeat_interleave`` (each head repeated in place), not ``repeat`` (the whole stack tiled):
    with ``enable_gqa`` query head i reads kv head i // n_rep.
    """
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=-3)


def _shape(x: torch.Tensor) -> tuple[int, ...]:
    return tuple(x.shape)


def _check(q, k, v, attn_mask, is_causal, enable_gqa) -> int:
    """Validate shapes like SDPA does, but with messages naming the sizes. Returns n_rep for GQA."""
    for name, t in (("query", q), ("key", k), ("value", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., L, E), got {_shape(t)}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if not (q.dim() == k.dim() == v.dim()):
        raise ValueError(
            f"query, key and value must have the same number of dimensions, got "
            f"query {_shape(q)}, key {_shape(k)}, value {_shape(v)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"query, key and value must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"query and key must have the same embedding size E, got query E={q.shape[-1]} "
            f"{_shape(q)} and key E={k.shape[-1]} {_shape(k)}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"key and value must agree on every dimension but the last (same batch, heads and length S), "
            f"got key {_shape(k)} and value {_shape(v)}")
    n_rep = 1
    if q.dim() >= 3 and q.shape[-3] != k.shape[-3]:
        hq, hkv = q.shape[-3], k.shape[-3]
        if not enable_gqa:
            raise ValueError(
                f"query has {hq} heads but key/value have {hkv}; pass enable_gqa=True for grouped-query "
                f"attention (shapes query {_shape(q)}, key {_shape(k)})")
        if hq % hkv != 0:
            raise ValueError(f"number of query heads {hq} is not divisible by number of key/value heads {hkv}")
        n_rep = hq // hkv
    if q.shape[:-3] != k.shape[:-3]:
        raise ValueError(f"query and key batch dimensions differ: query {_shape(q)}, key {_shape(k)}")
    if attn_mask is not None:
        if is_causal:
            raise ValueError("pass either attn_mask or is_causal=True, not both (as in SDPA)")
        if not isinstance(attn_mask, torch.Tensor):
            raise ValueError(f"attn_mask must be a torch.Tensor, got {type(attn_mask).__name__}")
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            raise ValueError(f"attn_mask must be bool (True = may attend) or float (added), got {attn_mask.dtype}")
        target = (*q.shape[:-1], k.shape[-2])
        try:
            ok = torch.broadcast_shapes(attn_mask.shape, target) == torch.Size(target)
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"attn_mask of shape {_shape(attn_mask)} does not broadcast to the scores' shape "
                f"{target} = (..., Lq={q.shape[-2]}, Lk={k.shape[-2]})")
    return n_rep


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
              dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
              enable_gqa: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, computed explicitly, returning ``(out, weights)``.

    Args:
        q: queries ``(..., Hq, Lq, E)`` (any leading dims; usually ``(B, H, L, E)``).
        k: keys ``(..., Hkv, Lk, E)``.
        v: values ``(..., Hkv, Lk, Ev)``.
        attn_mask: bool (True = may attend) or float (added to the scaled scores), broadcastable to
            ``(..., Hq, Lq, Lk)``.
        dropout_p: dropout on the weights (applied whenever > 0, exactly like SDPA).
        is_causal: query i sees keys j <= i, top-left aligned when Lq != Lk (SDPA's convention).
        scale: multiplies Q Kᵀ; default ``1/sqrt(E)``.
        enable_gqa: allow Hkv < Hq; query head i uses kv head ``i // (Hq // Hkv)``.

    Returns:
        out ``(..., Hq, Lq, Ev)`` in the input dtype, and weights ``(..., Hq, Lq, Lk)`` (post-softmax,
        pre-dropout). A query whose keys are all masked gets zero weights and zero output, never NaN.

    fp16/bf16 inputs are computed in fp32 (scores, softmax, weighted sum) and cast back; fp64 stays fp64.
    """
    n_rep = _check(q, k, v, attn_mask, is_causal, enable_gqa)
    dtype = q.dtype
    acc = torch.promote_types(dtype, torch.float32)           # fp16/bf16 -> fp32, fp64 stays fp64
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale

    scores = (q.to(acc) @ k.to(acc).transpose(-2, -1)) * scale      # (..., Lq, Lk)
    if is_causal:
        Lq, Lk = q.shape[-2], k.shape[-2]
        attn_mask = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril()   # top-left aligned
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.to(acc)
    weights = masked_softmax(scores, dim=-1)                        # (..., Lq, Lk), rows sum to 1 (or 0)
    p = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    out = p @ v.to(acc)                                             # (..., Lq, Ev)
    return out.to(dtype), weights.to(dtype)
