"""Flash-decoding: split the keys, softmax each split on its own, merge the splits by log-sum-exp.

At decode time a sequence has **one** new query per head against a long KV cache. FlashAttention
parallelises over (batch, head, query block); with one query there is one query block per (batch, head),
so a batch of a few sequences launches a few dozen programs — far fewer than a GPU's 100+ SMs, and each
of them walks the whole cache alone. Flash-decoding (Dao, Haziza, Massa, Sizov 2023) also splits the
**keys** into ``S`` chunks, computes a partial attention for every (batch, head, split) in parallel, and
merges the partials with the same log-sum-exp rule that lesson 08's online softmax uses::

    for split s (keys K_s, values V_s):
        m_s   = rowmax(q K_sᵀ · scale)
        ℓ_s   = rowsum(exp(q K_sᵀ · scale − m_s))
        O_s   = exp(q K_sᵀ · scale − m_s) V_s / ℓ_s           # the split's own softmax-weighted values
        lse_s = m_s + log ℓ_s                                  # its log-sum-exp
    lse = log Σ_s exp(lse_s),    O = Σ_s exp(lse_s − lse) · O_s   # exact: equals softmax over all keys

Each split keeps only ``(O_s, lse_s)`` — ``Ev + 1`` numbers per query row — whatever its length. Here the
splits are one batched matmul (the per-split step is :func:`attn_course.flash.online_softmax_step` on a
single tile, :func:`attn_course.flash.online_softmax_finish` gives ``(O_s, lse_s)``), and the merge is
lesson 08/13's :func:`attn_course.ring.merge_partials` folded over the splits.

Reference: Dao, Haziza, Massa, Sizov 2023, "Flash-Decoding for long-context inference" (PyTorch blog);
Hong et al. 2024, "FlashDecoding++".
"""
from __future__ import annotations

import math

import torch

from . import _validate
from .flash import LOG2E, _check, online_softmax_finish, online_softmax_step
from .ring import merge_partials

__all__ = ["split_bounds", "split_partials", "merge_splits", "split_kv_attention"]


def split_bounds(Lk: int, num_splits: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` key range of each split: ``num_splits`` chunks of ``ceil(Lk / num_splits)``
    keys (the last ones shorter, or empty when ``num_splits > Lk``)."""
    _validate.positive_int("num_splits", num_splits)
    chunk = -(-Lk // num_splits)
    return [(min(s * chunk, Lk), min((s + 1) * chunk, Lk)) for s in range(num_splits)]


def split_partials(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_splits: int, *,
                   scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every split's partial attention, computed together (one batched matmul over the splits).

    ``q (…, Lq, E)``, ``k (…, Lk, E)``, ``v (…, Lk, Ev)``. Returns ``out (S, …, Lq, Ev)`` — each split's
    output normalised over its own keys — and ``lse (S, …, Lq)``, its log-sum-exp (−∞ for an empty split).
    Computed in the accumulation dtype (fp32 for fp16/bf16 inputs).
    """
    _check(q, k, v, scale, 1, 1)
    _validate.positive_int("num_splits", num_splits)
    acc = torch.promote_types(q.dtype, torch.float32)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    lead, (Lq, E), (Lk, Ev) = q.shape[:-2], q.shape[-2:], (k.shape[-2], v.shape[-1])
    N, S = math.prod(lead), num_splits
    C = max(1, -(-Lk // S))                                           # keys per split
    pad = S * C - Lk                                                  # the last split(s) padded, then masked
    Q = q.reshape(N, Lq, E).to(acc) * (scale * LOG2E)                 # base 2, as lesson 08's kernels
    K, V = k.reshape(N, Lk, E).to(acc), v.reshape(N, Lk, Ev).to(acc)
    if pad:                                                           # (a copy only when Lk is not a multiple)
        K, V = torch.nn.functional.pad(K, (0, 0, 0, pad)), torch.nn.functional.pad(V, (0, 0, 0, pad))
    K, V = K.reshape(N, S, C, E), V.reshape(N, S, C, Ev)
    # (N·S, Lq, C): every split's scores in one batched matmul — the S splits run in parallel
    scores = torch.matmul(Q.unsqueeze(1), K.transpose(-1, -2)).view(N * S, Lq, C)
    if pad:
        valid = torch.arange(S * C, device=q.device).view(S, 1, C) < Lk          # (S, 1, C)
        scores = scores.view(N, S, Lq, C).masked_fill_(~valid, -math.inf).view(N * S, Lq, C)
    m = scores.new_full((N * S, Lq, 1), -math.inf)
    l = scores.new_zeros(N * S, Lq, 1)
    o = scores.new_zeros(N * S, Lq, Ev)
    m, l, o = online_softmax_step(m, l, o, scores, V.reshape(N * S, C, Ev))   # one tile per split
    out, lse = online_softmax_finish(m, l, o)                          # O_s = Õ_s/ℓ_s, lse_s = m_s + log ℓ_s
    out = out.view(*lead, S, Lq, Ev).movedim(-3, 0)                   # (S, …, Lq, Ev)
    lse = lse.view(*lead, S, Lq).movedim(-2, 0)                       # (S, …, Lq)
    return out, lse


def merge_splits(out: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge ``S`` partials ``out (S, …, Lq, Ev)``, ``lse (S, …, Lq)`` over disjoint key sets into the
    attention over all of them and its log-sum-exp, folding :func:`attn_course.ring.merge_partials`:
    ``lse = log Σ_s e^{lse_s}``, ``O = Σ_s e^{lse_s − lse} O_s``. Rows no split saw stay zero."""
    if out.dim() < 3 or lse.shape != out.shape[:-1]:
        raise ValueError(f"need out (S, …, Lq, Ev) and lse (S, …, Lq), got out {tuple(out.shape)} "
                         f"and lse {tuple(lse.shape)}")
    o, m = out[0], lse[0]
    for s in range(1, out.shape[0]):
        o, m = merge_partials(o, m, out[s], lse[s])
    return o, m


def split_kv_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_splits: int, *,
                       scale: float | None = None) -> torch.Tensor:
    """Flash-decoding: exact attention computed as ``num_splits`` partial softmaxes over chunks of the
    keys, merged by log-sum-exp.

    Same result as ``F.scaled_dot_product_attention(q, k, v, scale=scale)`` (no mask).

    Args:
        q: queries ``(…, Lq, E)`` — at decode time ``Lq = 1``.
        k: keys ``(…, Lk, E)``; v: values ``(…, Lk, Ev)``; the same leading dimensions as ``q``.
        num_splits: the number of key chunks ``S`` (a positive int); chunk ``s`` holds keys
            ``[s·C, (s+1)·C)`` with ``C = ceil(Lk / S)``. ``S > Lk`` is allowed (the extra splits are empty).
        scale: multiplies ``q kᵀ``; default ``1/√E``.

    Returns ``(…, Lq, Ev)`` in the input dtype (fp16/bf16 accumulate in fp32). ``Lk = 0`` gives zeros, as SDPA.
    """
    out, lse = split_partials(q, k, v, num_splits, scale=scale)
    o, _ = merge_splits(out, lse)
    return o.to(q.dtype)
