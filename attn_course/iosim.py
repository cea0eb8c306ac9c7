"""Counting slow-memory traffic: standard attention vs the tiled (FlashAttention) schedules.

A GPU has a small fast memory (SRAM, M elements per streaming multiprocessor) and a large slow one (HBM).
Dao et al. 2022 (Theorem 2) count HBM accesses for d ≤ M ≤ Nd: standard attention needs Θ(Nd + N²) —
it writes the N×N scores and reads them back — while the tiled forward needs Θ(N²d²/M).

Where the N²d²/M comes from depends on the loop order, and each paper sizes its blocks for its own order:

* **FlashAttention (Dao et al. 2022, Algorithm 1)**: the *outer* loop runs over K/V blocks of
  B_c = ⌈M/4d⌉ rows; for each, the *inner* loop re-reads every query block Q_i and its partial output
  O_i, ℓ_i, m_i and writes them back. Q and O are streamed T_c = ⌈N/B_c⌉ times: Θ(N·d·T_c) = Θ(N²d²/M).
  The inner (query) block is capped, B_r = min(⌈M/4d⌉, d), so that the B_r × B_c score tile fits in SRAM;
  it does not drive the traffic.
* **FlashAttention-2 (Dao 2023, Algorithm 1)**: the outer loop runs over query blocks Q_i (read once,
  O_i written once); the inner loop streams all of K and V for each: Θ(N·d·T_r) with T_r = ⌈N/B_r⌉.
  Here the *query* block drives the traffic, so the count is Θ(N²d²/M) when B_r = ⌈M/4d⌉ and the
  streamed K/V block is the capped one (:func:`blocks_for_sram` with ``order="fa2"``). (The paper itself
  fixes B_r, B_c ∈ {64, 128} for real GPUs rather than deriving them from M.)

Giving FA2's loop order FA1's capped query block is a classic mix-up: the count then stops falling once
⌈M/4d⌉ > d, i.e. for M > 4d², which looks like the end of the Θ(N²d²/M) law but is only an artefact.

The backward passes are counted too: standard attention (Dao et al. 2022, Algorithm 3) reads and writes
the N×N matrices P, dP, dS; FlashAttention-2's backward (Dao 2023, Algorithm 2) recomputes each score
tile from Q_i, K_j and the logsumexp instead, moving Θ(N²d²/M) elements.

This module *simulates* the schedules — it walks the same loops as the algorithms and adds up the
elements each tile load and store moves — so the lesson can compare the counts with the closed forms
and the Θ(N²d²/M) law. Units are elements (multiply by the dtype's size for bytes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ._validate import positive_int

__all__ = ["IOCount", "naive_io", "tiled_io", "naive_backward_io", "tiled_backward_io", "blocks_for_sram",
           "sram_elements", "ORDERS"]

ORDERS = ("fa1", "fa2")


@dataclass(frozen=True)
class IOCount:
    """Elements read from / written to slow memory (HBM)."""
    reads: int
    writes: int

    @property
    def total(self) -> int:
        return self.reads + self.writes


def _check_order(order: str) -> None:
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")


def naive_io(N: int, d: int) -> IOCount:
    """Standard attention (Dao et al. 2022, Algorithm 0), materialising S and P in slow memory.

    1. read Q, K (2Nd); write S = QKᵀ (N²)      2. read S (N²); write P = softmax(S) (N²)
    3. read P (N²) and V (Nd); write O = PV (Nd)
    """
    positive_int("N", N)
    positive_int("d", d)
    return IOCount(reads=2 * N * d + N * N + N * N + N * d, writes=N * N + N * N + N * d)


def naive_backward_io(N: int, d: int) -> IOCount:
    """Standard attention's backward (Dao et al. 2022, Algorithm 3), with P saved by the forward.

    1. read P, dO (N² + Nd); write dV = PᵀdO (Nd)     2. read dO, V (2Nd); write dP = dO Vᵀ (N²)
    3. read P, dP (2N²); write dS = P ∘ (dP − rowsum(P ∘ dP)) (N²)
    4. read dS, K (N² + Nd); write dQ = dS K (Nd)      5. read dS, Q (N² + Nd); write dK = dSᵀQ (Nd)
    """
    positive_int("N", N)
    positive_int("d", d)
    return IOCount(reads=5 * N * N + 5 * N * d, writes=2 * N * N + 3 * N * d)


def sram_elements(block_q: int, block_k: int, d: int) -> int:
    """Fast memory one tile step needs: Q_i, O_i (B_r·d each), K_j, V_j (B_c·d each), S_ij (B_r·B_c), m, ℓ."""
    return 2 * block_q * d + 2 * block_k * d + block_q * block_k + 2 * block_q


def blocks_for_sram(M: int, d: int, order: str = "fa1") -> tuple[int, int]:
    """Block sizes ``(block_q, block_k)`` = (B_r, B_c) for a fast memory of ``M`` elements.

    ``order="fa1"`` (default): FlashAttention's rule (Dao et al. 2022, Algorithm 1, line 1), B_c = ⌈M/4d⌉
    for the K/V blocks of its outer loop and B_r = min(⌈M/4d⌉, d) for the query blocks of its inner loop.
    ``order="fa2"``: the same rule with the roles swapped for FlashAttention-2's loop order — the outer
    query block gets B_r = ⌈M/4d⌉ and the streamed K/V block B_c = min(⌈M/4d⌉, d). Either way
    :func:`sram_elements` stays within about 1.25·M (plus 2·B_r for m, ℓ).
    """
    positive_int("M", M)
    positive_int("d", d)
    _check_order(order)
    outer = math.ceil(M / (4 * d))
    inner = min(outer, d)
    return (inner, outer) if order == "fa1" else (outer, inner)


def _visible(q0: int, q1: int, k0: int, is_causal: bool) -> bool:
    """Does the query block [q0, q1) see any key of a block starting at k0? (causal: key j <= query i)"""
    return not is_causal or k0 <= q1 - 1


def tiled_io(N: int, d: int, *, block_q: int, block_k: int, is_causal: bool = False,
             order: str = "fa2") -> IOCount:
    """A tiled forward schedule, simulated tile by tile.

    ``order="fa2"`` (default) — FlashAttention-2 (Dao 2023, Algorithm 1): outer loop over query blocks
    Q_i (read once, B_r·d); inner loop over the key blocks it needs (read K_j, V_j: 2·B_c·d each time —
    the term that grows like 2N²d/B_r); write O_i and the logsumexp L_i once. Total for full attention:
    reads Nd + ⌈N/B_r⌉·2Nd, writes Nd + N.

    ``order="fa1"`` — FlashAttention (Dao et al. 2022, Algorithm 1): initialise O, ℓ, m in HBM
    (Nd + 2N writes); outer loop over K/V blocks (read K_j, V_j once); inner loop over the query blocks
    that see them: read Q_i, O_i, ℓ_i, m_i and write O_i, ℓ_i, m_i back. Total for full attention:
    reads 2Nd + ⌈N/B_c⌉·(2Nd + 2N), writes Nd + 2N + ⌈N/B_c⌉·(Nd + 2N) — the term that grows like
    3N²d/B_c.

    With ``is_causal`` a (query block, key block) tile whose keys all come after its queries is never
    visited, so its loads and stores are skipped.
    """
    for name, value in (("N", N), ("d", d), ("block_q", block_q), ("block_k", block_k)):
        positive_int(name, value)
    _check_order(order)
    reads = writes = 0
    if order == "fa2":
        for q0 in range(0, N, block_q):
            q1 = min(q0 + block_q, N)
            reads += (q1 - q0) * d                                        # Q_i
            for k0 in range(0, N, block_k):
                if _visible(q0, q1, k0, is_causal):
                    reads += 2 * (min(k0 + block_k, N) - k0) * d          # K_j, V_j
            writes += (q1 - q0) * d + (q1 - q0)                           # O_i, L_i
        return IOCount(reads=reads, writes=writes)
    writes += N * d + 2 * N                                               # line 2: O = 0, ℓ = 0, m = −∞
    for k0 in range(0, N, block_k):
        reads += 2 * (min(k0 + block_k, N) - k0) * d                      # K_j, V_j
        for q0 in range(0, N, block_q):
            q1 = min(q0 + block_q, N)
            if _visible(q0, q1, k0, is_causal):
                reads += 2 * (q1 - q0) * d + 2 * (q1 - q0)                # Q_i, O_i, ℓ_i, m_i
                writes += (q1 - q0) * d + 2 * (q1 - q0)                   # O_i, ℓ_i, m_i
    return IOCount(reads=reads, writes=writes)


def tiled_backward_io(N: int, d: int, *, block_q: int, block_k: int, is_causal: bool = False) -> IOCount:
    """FlashAttention-2's backward (Dao 2023, Algorithm 2), simulated tile by tile; nothing N×N is stored.

    Read O, dO and write D = rowsum(dO ∘ O) (2Nd reads, N writes); initialise dQ = 0 (Nd writes).
    Outer loop over K/V blocks: read K_j, V_j; inner loop over the query blocks that see them: read
    Q_i, O_i, dO_i, dQ_i (4·B_r·d), L_i, D_i (2·B_r), recompute S_ij and P_ij = exp(S_ij − L_i) on chip,
    write dQ_i back; after the inner loop write dK_j, dV_j. Full attention: reads 4Nd + ⌈N/B_c⌉·(4Nd + 2N),
    writes N + 3Nd + ⌈N/B_c⌉·Nd.
    """
    for name, value in (("N", N), ("d", d), ("block_q", block_q), ("block_k", block_k)):
        positive_int(name, value)
    reads, writes = 2 * N * d, N + N * d                                  # D = rowsum(dO ∘ O); dQ = 0
    for k0 in range(0, N, block_k):
        bk = min(k0 + block_k, N) - k0
        reads += 2 * bk * d                                               # K_j, V_j
        for q0 in range(0, N, block_q):
            q1 = min(q0 + block_q, N)
            if _visible(q0, q1, k0, is_causal):
                reads += 4 * (q1 - q0) * d + 2 * (q1 - q0)                # Q_i, O_i, dO_i, dQ_i, L_i, D_i
                writes += (q1 - q0) * d                                   # dQ_i
        writes += 2 * bk * d                                              # dK_j, dV_j
    return IOCount(reads=reads, writes=writes)
