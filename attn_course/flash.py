"""FlashAttention in pure PyTorch: exact attention, tile by tile, in memory linear in the sequence length.

The textbook computation ``softmax(Q Kᵀ · scale) V`` materialises the ``Lq × Lk`` score matrix. Here the
keys are visited in blocks of ``block_k`` and each query block keeps only three running quantities per
row — the running maximum ``m``, the running denominator ``ℓ`` and the unnormalised output ``Õ`` — which
the *online softmax* recurrence rescales whenever a new block raises the maximum (Milakov & Gimelshein
2018; Dao et al. 2022, Algorithm 1; Dao 2023, Algorithm 1):

    S_ij   = Q_i K_jᵀ · scale                                 # (…, B_r, B_c)   one tile of scores
    m_new  = max(m, rowmax(S_ij))
    P̃_ij   = exp(S_ij − m_new)
    ℓ_new  = exp(m − m_new) · ℓ + rowsum(P̃_ij)
    Õ_new  = exp(m − m_new) · Õ + P̃_ij V_j
    O_i    = Õ / ℓ,    L_i = m + log ℓ   (the logsumexp, all the backward pass needs)

The backward pass (Dao 2023, Algorithm 2) saves only ``O`` and ``L`` and recomputes each tile:
``P_ij = exp(S_ij − L_i)``, ``dV_j += P_ijᵀ dO_i``, ``dP_ij = dO_i V_jᵀ``,
``dS_ij = P_ij ∘ (dP_ij − D_i)`` with ``D_i = rowsum(dO_i ∘ O_i)``, ``dQ_i += dS_ij K_j · scale``,
``dK_j += dS_ijᵀ Q_i · scale``. Besides the ``L × d`` inputs, outputs and gradients, no tensor larger
than one ``B_r × B_c`` tile per (batch, head) is ever created, in forward or backward.

Like the CUDA/Triton kernels, the code works in base 2: ``log2(e)`` is folded into the scale once, so
each tile needs ``exp2`` (cheaper than ``exp``) and ``exp2(x · log2 e) = exp(x)`` leaves the result unchanged.

With ``is_causal`` the tiles that lie entirely above the diagonal are skipped (never computed), which
roughly halves the work; only tiles that straddle the diagonal are masked element-wise. With
``window=W`` (sliding-window attention, Beltagy et al. 2020; Jiang et al. 2023) query i sees only keys
with ``i − j < W`` (and ``j − i < W`` when not causal): the loops visit only the tiles that meet that band,
forward and backward, so the cost grows as ``L · W`` instead of ``L²`` — FlashAttention's block-sparse
mode (Dao et al. 2022, §3.3) for the one pattern whose blocks are known in closed form.

This is the teaching version, on every device. A FlashAttention-2-style Triton kernel with the same
semantics is :func:`attn_course.flash_triton.flash_attention_triton` (CUDA, ``triton`` extra).

References: Dao, Fu, Ermon, Rudra, Ré 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention
with IO-Awareness"; Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism and Work
Partitioning"; Milakov & Gimelshein 2018, "Online normalizer calculation for softmax".
"""
from __future__ import annotations

import math

import torch

from . import _validate

LOG2E = 1.4426950408889634      # log2(e): exp(x) = exp2(x · log2 e)
LN2 = 0.6931471805599453        # ln(2):   log(x) = log2(x) · ln 2

__all__ = ["flash_attention", "flash_attention_forward", "flash_attention_backward",
           "online_softmax_step", "online_softmax_finish", "causal_tile_mask", "band_tile_mask",
           "FlashAttentionFunction"]


def online_softmax_step(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, S: torch.Tensor,
                        V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of the online-softmax recurrence: fold a tile of scores ``S`` and its values ``V`` in.

    Works in base 2, as FlashAttention kernels do: ``S`` holds the scaled scores times ``log2(e)``, so that
    ``exp2(S − m)`` equals ``exp(S_nat − m_nat)`` — and ``exp2`` is cheaper than ``exp``.

    Shapes use ``N`` = batch × heads.

    Args:
        m: running row maximum ``(N, B_r, 1)`` in base-2 units (−∞ before the first tile).
        l: running denominator ``(N, B_r, 1)`` (0 before the first tile).
        acc: unnormalised output ``Õ`` ``(N, B_r, D)`` (0 before the first tile); updated in place.
        S: this tile's scores ``Q_i K_jᵀ · scale · log2(e)``, ``(N, B_r, B_c)``, −∞ where masked.
            Overwritten in place (it becomes ``P̃``), so pass a tensor you no longer need.
        V: the tile's values ``(N, B_c, D)``.

    Returns ``(m_new, l_new, acc_new)``. A row that has seen only −∞ so far keeps ``m = −∞``, ``l = 0``
    and ``Õ = 0`` — never NaN: we subtract a finite stand-in (the most negative float) instead of
    ``m_new = −∞``, so ``exp2(−∞ − stand-in) = 0``.
    """
    m_new = torch.maximum(m, S.amax(dim=-1, keepdim=True))            # (N, B_r, 1)
    m_safe = m_new.clamp_min(torch.finfo(m_new.dtype).min)            # finite stand-in: exp(−∞ − (−∞)) is NaN
    P = S.sub_(m_safe).exp2_()                                        # P̃_ij = exp(S_ij − m_new)
    alpha = torch.exp2(m - m_safe)                                    # rescale of everything seen so far
    l_new = alpha * l + P.sum(dim=-1, keepdim=True)                   # ℓ_new = e^{m−m_new} ℓ + rowsum(P̃)
    acc_new = acc.mul_(alpha).baddbmm_(P, V)                          # Õ_new = e^{m−m_new} Õ + P̃ V
    return m_new, l_new, acc_new


def online_softmax_finish(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """``O = Õ / ℓ`` and the natural-log ``logsumexp = (m + log2 ℓ) · ln 2``; a row with ``ℓ = 0`` (all
    keys masked) gets ``O = 0`` and ``logsumexp = −∞``."""
    empty = l == 0
    out = acc / torch.where(empty, 1.0, l)
    lse = torch.where(empty, -math.inf, (m + torch.log2(torch.where(empty, 1.0, l))) * LN2)
    return out, lse.squeeze(-1)


def causal_tile_mask(q0: int, q1: int, k0: int, k1: int, device=None) -> torch.Tensor | None:
    """Bool ``(q1−q0, k1−k0)`` mask, True = may attend (key ≤ query, top-left aligned), for the tile of
    queries ``q0:q1`` and keys ``k0:k1``; ``None`` when the whole tile is visible (below the diagonal)."""
    if k1 - 1 <= q0:
        return None
    rows = torch.arange(q0, q1, device=device).unsqueeze(-1)
    cols = torch.arange(k0, k1, device=device)
    return cols <= rows


def band_tile_mask(q0: int, q1: int, k0: int, k1: int, is_causal: bool, window: int | None,
                   device=None) -> torch.Tensor | None:
    """Bool ``(q1−q0, k1−k0)`` mask, True = may attend, of the tile ``q0:q1 × k0:k1`` under ``is_causal``
    (``j ≤ i``) and ``window`` (``i − j < W``, and ``j − i < W`` when not causal); ``None`` when the whole
    tile is visible. Positions are top-left aligned, as SDPA's ``is_causal``."""
    if window is None:
        return causal_tile_mask(q0, q1, k0, k1, device) if is_causal else None
    inside = (q1 - 1) - k0 < window and (k1 - 1 <= q0 if is_causal else (k1 - 1) - q0 < window)
    if inside:
        return None
    d = torch.arange(q0, q1, device=device).unsqueeze(-1) - torch.arange(k0, k1, device=device)  # i − j
    return (d >= 0) & (d < window) if is_causal else d.abs() < window


def _tiles(lo: int, hi: int, block: int) -> range:
    """Starts of the grid tiles of size ``block`` that meet positions ``[lo, hi)``."""
    return range(max(lo, 0) // block * block, hi, block)


def _key_tiles(q0: int, q1: int, Lk: int, is_causal: bool, window: int | None, block_k: int) -> range:
    """Key tiles a query block ``q0:q1`` needs: all, up to the diagonal (causal), and (window) from ``q0 − W + 1``."""
    lo = 0 if window is None else q0 - window + 1
    hi = Lk if not is_causal else min(Lk, q1)
    if window is not None and not is_causal:
        hi = min(Lk, q1 - 1 + window)
    return _tiles(lo, hi, block_k)


def _query_tiles(k0: int, k1: int, Lq: int, is_causal: bool, window: int | None, block_q: int) -> range:
    """Query tiles that see some key of ``k0:k1`` (the transpose of :func:`_key_tiles`, for the backward)."""
    lo = k0 if is_causal else (0 if window is None else k0 - window + 1)
    hi = Lq if window is None else min(Lq, k1 - 1 + window)
    return _tiles(lo, hi, block_q)


def _check(q, k, v, scale, block_q, block_k, window=None):
    for name, t in (("q", q), ("k", k), ("v", v)):
        _validate.tensor(name, t, min_dim=2)
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same embedding size E, got q {tuple(q.shape)} "
                         f"(E={q.shape[-1]}) and k {tuple(k.shape)} (E={k.shape[-1]})")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k and v must agree on every dimension but the last, got k {tuple(k.shape)} "
                         f"and v {tuple(v.shape)}")
    if q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"q and k must have the same leading (batch, head) dimensions, got q "
                         f"{tuple(q.shape)} and k {tuple(k.shape)}")
    _validate.positive_int("block_q", block_q)
    _validate.positive_int("block_k", block_k)
    if window is not None:
        _validate.positive_int("window", window)
    if scale is not None and not (isinstance(scale, (int, float)) and not isinstance(scale, bool)
                                  and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")


def _flatten(q, k, v, scale):
    """(…, L, E) -> (N, L, E) in the accumulation dtype (fp32 for fp16/bf16 inputs; fp64 stays)."""
    acc = torch.promote_types(q.dtype, torch.float32)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    N = math.prod(q.shape[:-2])
    return (q.reshape(N, *q.shape[-2:]).to(acc), k.reshape(N, *k.shape[-2:]).to(acc),
            v.reshape(N, *v.shape[-2:]).to(acc), scale)


def _forward(Q, K, V, scale, is_causal, block_q, block_k, window=None):
    """Tiled forward on flattened ``(N, L, ·)`` tensors. Returns ``O (N, Lq, Dv)`` and ``L (N, Lq)``."""
    N, Lq, _ = Q.shape
    Lk, Dv = K.shape[1], V.shape[2]
    O = Q.new_empty(N, Lq, Dv)
    LSE = Q.new_empty(N, Lq)
    for q0 in range(0, Lq, block_q):                                   # outer loop: query blocks Q_i
        q1 = min(q0 + block_q, Lq)
        Q_i = Q[:, q0:q1] * (scale * LOG2E)                            # (N, B_r, E); scale, log2 e folded in
        m = Q.new_full((N, q1 - q0, 1), -math.inf)                     # running max
        l = Q.new_zeros(N, q1 - q0, 1)                                 # running denominator
        acc = Q.new_zeros(N, q1 - q0, Dv)                              # unnormalised output Õ
        for k0 in _key_tiles(q0, q1, Lk, is_causal, window, block_k):  # inner loop: key blocks K_j, V_j (those in the band)
            k1 = min(k0 + block_k, Lk)
            S = torch.bmm(Q_i, K[:, k0:k1].transpose(1, 2))           # (N, B_r, B_c)  S_ij = Q_i K_jᵀ·scale (base 2)
            mask = band_tile_mask(q0, q1, k0, k1, is_causal, window, Q.device)
            if mask is not None:
                S.masked_fill_(~mask, -math.inf)
            m, l, acc = online_softmax_step(m, l, acc, S, V[:, k0:k1])
        O[:, q0:q1], LSE[:, q0:q1] = online_softmax_finish(m, l, acc)
    return O, LSE


def _backward(Q, K, V, O, LSE, dO, scale, is_causal, block_q, block_k, window=None):
    """Tiled backward by recomputation (Dao 2023, Algorithm 2) on flattened tensors: (dQ, dK, dV)."""
    Lq, Lk = Q.shape[1], K.shape[1]
    D = (dO * O).sum(dim=-1, keepdim=True)                             # (N, Lq, 1)  D_i = rowsum(dO_i ∘ O_i)
    LSE = torch.where(LSE == -math.inf, math.inf, LSE * LOG2E)         # base 2; empty rows: P = exp2(S − ∞) = 0
    LSE = LSE.unsqueeze(-1)                                            # (N, Lq, 1)
    Qs = Q * (scale * LOG2E)                                           # (N, Lq, E) scale, log2 e folded in once
    dQ, dK, dV = torch.zeros_like(Q), torch.zeros_like(K), torch.zeros_like(V)
    for k0 in range(0, Lk, block_k):                                   # outer loop: key blocks (dK_j, dV_j stay local)
        k1 = min(k0 + block_k, Lk)
        K_j, V_j = K[:, k0:k1], V[:, k0:k1]
        dK_j, dV_j = dK[:, k0:k1], dV[:, k0:k1]                        # views: accumulated in place
        for q0 in _query_tiles(k0, k1, Lq, is_causal, window, block_q):  # tiles outside the causal/window band skipped
            q1 = min(q0 + block_q, Lq)
            Q_i = Qs[:, q0:q1]                                         # (N, B_r, E)
            S = torch.bmm(Q_i, K_j.transpose(1, 2))                    # (N, B_r, B_c) recomputed, base 2
            mask = band_tile_mask(q0, q1, k0, k1, is_causal, window, Q.device)
            if mask is not None:
                S.masked_fill_(~mask, -math.inf)
            P = S.sub_(LSE[:, q0:q1]).exp2_()                          # P_ij = exp(S_ij − L_i)
            dO_i = dO[:, q0:q1]
            dV_j.baddbmm_(P.transpose(1, 2), dO_i)                     # dV_j += P_ijᵀ dO_i
            dP = torch.bmm(dO_i, V_j.transpose(1, 2))                  # dP_ij = dO_i V_jᵀ
            dS = P.mul_(dP.sub_(D[:, q0:q1]))                          # dS_ij = P_ij ∘ (dP_ij − D_i)
            dQ[:, q0:q1].baddbmm_(dS, K_j, alpha=scale)                # dQ_i += dS_ij K_j · scale
            dK_j.baddbmm_(dS.transpose(1, 2), Q_i)                     # dK_j += dS_ijᵀ Q_i · scale · log2 e
    return dQ, dK.mul_(LN2), dV                                        # undo the log2 e folded into Q_i


class FlashAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: saves ``q, k, v`` (the inputs), ``O`` and the logsumexp ``L`` — never ``P`` —
    and recomputes the tiles in backward."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, block_q, block_k, window=None):
        Q, K, V, s = _flatten(q, k, v, scale)
        O, LSE = _forward(Q, K, V, s, is_causal, block_q, block_k, window)
        ctx.save_for_backward(q, k, v, O, LSE)
        ctx.cfg = (s, is_causal, block_q, block_k, window)
        return O.reshape(*q.shape[:-1], v.shape[-1]).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, O, LSE = ctx.saved_tensors
        s, is_causal, block_q, block_k, window = ctx.cfg
        Q, K, V, _ = _flatten(q, k, v, s)
        dO = grad_out.reshape(O.shape).to(O.dtype)
        dQ, dK, dV = _backward(Q, K, V, O, LSE, dO, s, is_causal, block_q, block_k, window)
        return (dQ.reshape(q.shape).to(q.dtype), dK.reshape(k.shape).to(k.dtype),
                dV.reshape(v.shape).to(v.dtype), None, None, None, None, None)


def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                            scale: float | None = None, block_q: int = 64, block_k: int = 64,
                            window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The tiled forward alone (no autograd), returning ``(out, logsumexp)``.

    ``out`` is ``(…, Lq, Ev)`` in the input dtype; ``logsumexp`` is ``(…, Lq)`` in the accumulation dtype
    (fp32 for fp16/bf16 inputs): ``logsumexp[i] = log Σ_j exp(S_ij)`` over the visible keys, −∞ for a row
    with none. Same arguments as :func:`flash_attention`.
    """
    _check(q, k, v, scale, block_q, block_k, window)
    Q, K, V, s = _flatten(q, k, v, scale)
    with torch.no_grad():
        O, LSE = _forward(Q, K, V, s, is_causal, block_q, block_k, window)
    return O.reshape(*q.shape[:-1], v.shape[-1]).to(q.dtype), LSE.reshape(q.shape[:-1])


def flash_attention_backward(q, k, v, out, logsumexp, grad_out, *, is_causal: bool = False,
                             scale: float | None = None, block_q: int = 64, block_k: int = 64,
                             window: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dq, dk, dv)`` recomputed tile by tile from ``(out, logsumexp)`` — for teaching;
    :func:`flash_attention` calls the same code through autograd."""
    _check(q, k, v, scale, block_q, block_k, window)
    Q, K, V, s = _flatten(q, k, v, scale)
    O = out.reshape(Q.shape[0], *out.shape[-2:]).to(Q.dtype)
    dO = grad_out.reshape(O.shape).to(Q.dtype)
    with torch.no_grad():
        dQ, dK, dV = _backward(Q, K, V, O, logsumexp.reshape(O.shape[:-1]).to(Q.dtype), dO, s, is_causal,
                               block_q, block_k, window)
    return dQ.reshape(q.shape).to(q.dtype), dK.reshape(k.shape).to(k.dtype), dV.reshape(v.shape).to(v.dtype)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                    scale: float | None = None, block_q: int = 64, block_k: int = 64,
                    window: int | None = None) -> torch.Tensor:
    """Exact scaled dot-product attention, computed in tiles without ever forming the ``Lq × Lk`` matrix.

    Same result as ``F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)``.

    Args:
        q: queries ``(…, Lq, E)`` (usually ``(B, H, Lq, E)``).
        k: keys ``(…, Lk, E)``; v: values ``(…, Lk, Ev)``; same leading dimensions as ``q``.
        is_causal: query i sees keys j ≤ i (top-left aligned when Lq ≠ Lk, as in SDPA); tiles entirely
            above the diagonal are skipped.
        scale: multiplies ``Q Kᵀ``; default ``1/√E``.
        block_q, block_k: tile sizes ``B_r`` (queries) and ``B_c`` (keys); any ``Lq``, ``Lk`` work (the
            last block is simply shorter).
        window: sliding window ``W`` (a positive int) or ``None``: query i sees key j only if ``i − j < W``
            (and, when not causal, ``j − i < W``) — ``masks.sliding_window_mask(L, W, causal=is_causal)``,
            top-left aligned when Lq ≠ Lk. Tiles wholly outside the band are never computed.

    Returns:
        ``(…, Lq, Ev)`` in the input dtype. fp16/bf16 inputs are accumulated in fp32. Differentiable:
        the backward recomputes tiles from the saved output and logsumexp (memory linear in L).
    """
    _check(q, k, v, scale, block_q, block_k, window)
    return FlashAttentionFunction.apply(q, k, v, bool(is_causal), scale, block_q, block_k, window)
