"""The tiled FlashAttention forward of :mod:`attn_course.flash`, tuned for speed on a CPU (pure PyTorch).

:func:`attn_course.flash.flash_attention` is the loop to read: one tile at a time, every quantity named as in
the papers. This is the same algorithm with what makes it fast on a CPU, in the order lesson 08 measures them:

1. **larger tiles** (``block_q=256, block_k=512`` — the split sizes of PyTorch's own CPU flash kernel): each
   PyTorch call costs a few microseconds before any arithmetic, so fewer, larger tiles spend less time in
   Python and give the matrix products bigger shapes;
2. **no per-tile allocations**: ``scale · log2(e)`` is folded into ``K`` once, which is also transposed once
   (``Kᵀ`` contiguous, ``(N, E, Lk)``); one score buffer, the running statistics and the output are
   allocated once and every tile writes into them (``out=``, ``baddbmm_``, ``exp2_``, ``sub_``). The
   unnormalised output ``Õ`` *is* the output tensor, divided by ``ℓ`` in place at the end. The heads go
   through the tiles in groups, as many as keep one score tile within ``tile_bytes`` (2 MiB: 4 heads of
   256 × 512 in fp32), so that ``exp2`` and ``sum`` find the tile still in the core's cache; the buffer is
   constant in ``L``;
3. **conditional rescaling** (``lazy_rescale=True``, FlashAttention-4's trick, Dao et al. 2025): the running
   maximum ``m`` is exact after the first key tile; later tiles are computed as
   ``P̃ = exp2(S − m)`` with the subtraction inside the matrix product (``baddbmm(−m, Q, Kᵀ)``), with no
   ``rowmax`` pass and no rescale of ``Õ`` and ``ℓ``. Any reference ``m`` gives the same softmax — the
   maximum is only there to keep ``exp`` from overflowing — so this is exact as long as ``P̃`` stays
   bounded: when a tile's row sum exceeds ``2^20`` (a score more than 20 base-2 units above ``m``), that
   tile is recomputed the exact way (``m`` raised to the tile's maximum, ``Õ`` and ``ℓ`` rescaled).
   Each tile then costs two passes over its scores (``exp2``, ``sum``) instead of four (``max``, ``−m``,
   ``exp2``, ``sum``) — what the fused kernels do in registers.

The base-2 exponent and ``baddbmm`` accumulation are already in the readable loop; causal tiles above the
diagonal are skipped in both. Forward only (``torch.no_grad``): train with :func:`flash_attention`.
"""
from __future__ import annotations

import math

import torch

from .flash import LOG2E, _check, _flatten

__all__ = ["flash_attention_tuned", "RESCALE_LIMIT", "TILE_BYTES"]

TILE_BYTES = 2 ** 21            # heads per tile: as many as keep one score tile within 2 MiB (a CPU core's L2)
RESCALE_LIMIT = 2.0 ** 20       # a row sum of P̃ above this (or not finite) recomputes the tile with the exact max


def _exact_step(S, negm, l, acc, V_j, t, first):
    """Fold a tile in the FlashAttention-2 way: ``S`` holds ``Q Kᵀ·scale·log2 e − m`` (``m = −negm``).

    Raises ``m`` to the tile's row maximum (on the first tile: sets it), rescales ``ℓ`` and ``Õ`` by
    ``exp2(m_old − m_new)``, then adds ``rowsum(P̃)`` and ``P̃ V``. ``t`` is an ``(N, B_r, 1)`` scratch."""
    torch.amax(S, dim=-1, keepdim=True, out=t)                    # rowmax(S) − m_old
    if not first:
        t.clamp_min_(0.0)                                         # the max only grows (−∞ rows: unchanged)
    S.sub_(t).exp2_()                                             # P̃ = exp2(S − m_new)
    negm.sub_(t)                                                  # m_new = m_old + t
    if first:
        torch.sum(S, dim=-1, keepdim=True, out=l)                 # ℓ = rowsum(P̃)
        acc.baddbmm_(S, V_j, beta=0.0)                            # Õ = P̃ V (beta=0: the buffer's old values ignored)
        return
    t.neg_().exp2_()                                              # α = exp2(m_old − m_new)
    l.mul_(t).add_(S.sum(dim=-1, keepdim=True))                   # ℓ = α ℓ + rowsum(P̃)
    acc.mul_(t).baddbmm_(S, V_j)                                  # Õ = α Õ + P̃ V


def _key_tiles(q0: int, q1: int, Lk: int, bk: int, is_causal: bool):
    """``(k0, k1)`` of the key tiles query block ``q0:q1`` visits: ``bk`` wide over all keys; causal, the
    keys before the block in tiles of ``bk`` (fully visible), then one diagonal tile ``q0:q1`` (the only one
    masked, half of it above the diagonal)."""
    if not is_causal:
        return [(k0, min(k0 + bk, Lk)) for k0 in range(0, Lk, bk)]
    end = min(q0, Lk)
    tiles = [(k0, min(k0 + bk, end)) for k0 in range(0, end, bk)]
    return tiles + ([(q0, min(q1, Lk))] if q0 < Lk else [])


def _forward(Q, K, V, scale, is_causal, block_q, block_k, lazy_rescale, tile_bytes):
    """Tuned tiled forward on flattened ``(N, L, ·)`` tensors: ``O (N, Lq, Dv)``.

    The ``N`` heads go through the tiles in groups of ``g``, as many as keep one score tile
    (``g · block_q · block_k`` floats) within ``tile_bytes``: a tile that stays in the CPU's cache is read by
    ``exp2`` and ``sum`` without a trip to memory."""
    N, Lq, E = Q.shape
    Lk, Dv = K.shape[1], V.shape[2]
    O = Q.new_zeros(N, Lq, Dv)                                    # Õ accumulates here, then O = Õ / ℓ
    if Lq == 0 or Lk == 0 or N == 0:
        return O                                                  # SDPA: no keys → zeros
    KT = (K * (scale * LOG2E)).transpose(1, 2).contiguous()       # (N, E, Lk): scale and log2 e folded in once
    bq, bk = min(block_q, Lq), min(block_k, Lk)
    width = max(bk, bq) if is_causal else bk                      # causal: the diagonal tile is bq wide
    g = max(1, min(N, tile_bytes // (bq * width * Q.element_size())))
    buf = Q.new_empty(g * bq * width)                             # the one score tile
    negm_buf, l_buf, t_buf = (Q.new_empty(g, bq, 1) for _ in range(3))
    above = torch.ones(bq, bq, dtype=torch.bool, device=Q.device).triu_(1) if is_causal else None  # j > i
    for n0 in range(0, N, g):
        n = min(g, N - n0)
        for q0 in range(0, Lq, bq):
            q1 = min(q0 + bq, Lq)
            r = q1 - q0
            Q_i, acc = Q[n0:n0 + n, q0:q1], O[n0:n0 + n, q0:q1]  # acc: a view of the output
            negm, l, t = negm_buf[:n, :r], l_buf[:n, :r], t_buf[:n, :r]
            negm.zero_()
            for j, (k0, k1) in enumerate(_key_tiles(q0, q1, Lk, bk, is_causal)):
                S = buf[:n * r * (k1 - k0)].view(n, r, k1 - k0)
                KT_j, V_j = KT[n0:n0 + n, :, k0:k1], V[n0:n0 + n, k0:k1]
                torch.baddbmm(negm, Q_i, KT_j, out=S)             # S − m in the matrix product
                mask = above[:r, :k1 - k0] if is_causal and k0 == q0 else None   # the diagonal tile
                if mask is not None:
                    S.masked_fill_(mask, -math.inf)
                if lazy_rescale and j > 0:
                    S.exp2_()                                     # P̃ = exp2(S − m), m from earlier tiles
                    torch.sum(S, dim=-1, keepdim=True, out=t)
                    if t.max().item() <= RESCALE_LIMIT:           # bounded: no overflow, nothing to rescale
                        l.add_(t)
                        acc.baddbmm_(S, V_j)
                        continue
                    torch.baddbmm(negm, Q_i, KT_j, out=S)         # rare: recompute, then the exact step
                    if mask is not None:
                        S.masked_fill_(mask, -math.inf)
                _exact_step(S, negm, l, acc, V_j, t, first=j == 0)
            acc.div_(l)
    return O


def flash_attention_tuned(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                          scale: float | None = None, block_q: int = 256, block_k: int = 512,
                          lazy_rescale: bool = True, tile_bytes: int = TILE_BYTES) -> torch.Tensor:
    """Exact attention forward, tiled like :func:`attn_course.flash_attention`, tuned for a CPU.

    Same result as ``F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)`` (to
    round-off), in memory linear in ``L``: the largest intermediate is one ``(N, block_q, block_k)`` tile.

    Args:
        q: ``(…, Lq, E)``; k: ``(…, Lk, E)``; v: ``(…, Lk, Ev)``, same leading dimensions.
        is_causal: key j visible to query i iff ``j ≤ i`` (top-left aligned, as SDPA); tiles above the
            diagonal are skipped.
        scale: multiplies ``Q Kᵀ``; default ``1/√E``.
        block_q, block_k: tile sizes (default 256 × 512).
        tile_bytes: heads are processed in groups whose score tile fits this many bytes (at least one head).
        lazy_rescale: skip the per-tile max and rescale while the sums stay below :data:`RESCALE_LIMIT`
            (see the module docstring); ``False`` is the FlashAttention-2 update on every tile.

    Returns ``(…, Lq, Ev)`` in the input dtype (fp16/bf16 accumulate in fp32). Forward only: inputs that
    require grad raise ``ValueError`` (use :func:`attn_course.flash_attention`, which has a backward).
    """
    _check(q, k, v, scale, block_q, block_k)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ValueError("flash_attention_tuned is forward-only; use attn_course.flash_attention to train "
                         "(or call this under torch.no_grad())")
    Q, K, V, s = _flatten(q, k, v, scale)
    with torch.no_grad():
        O = _forward(Q, K, V, s, bool(is_causal), block_q, block_k, lazy_rescale, int(tile_bytes))
    return O.reshape(*q.shape[:-1], v.shape[-1]).to(q.dtype)
