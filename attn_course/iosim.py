"""Counting slow-memory traffic: standard attention vs the tiled (FlashAttention) schedule.

A GPU has a small fast memory (SRAM, M elements per streaming multiprocessor) and a large slow one (HBM).
Dao et al. 2022 (Theorem 2) count HBM accesses: standard attention needs Θ(N·d + N²) — it writes the
N×N scores and reads them back — while the tiled forward needs Θ(N²·d²/M): every query block of size
B_r ≈ M/(4d) streams all of K and V once, and there are N/B_r of them.

This module *simulates* both schedules — it walks the same loops as the kernels and adds up the elements
each tile load and store moves — so the lesson can plot the count against the block size and against
the Θ(N²d²/M) law. Units are elements (multiply by the dtype's size for bytes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ._validate import positive_int

__all__ = ["IOCount", "naive_io", "tiled_io", "blocks_for_sram", "sram_elements"]


@dataclass(frozen=True)
class IOCount:
    """Elements read from / written to slow memory (HBM)."""
    reads: int
    writes: int

    @property
    def total(self) -> int:
        return self.reads + self.writes


def naive_io(N: int, d: int) -> IOCount:
    """Standard attention (Dao et al. 2022, Algorithm 0), materialising S and P in slow memory.

    1. read Q, K (2Nd); write S = QKᵀ (N²)      2. read S (N²); write P = softmax(S) (N²)
    3. read P (N²) and V (Nd); write O = PV (Nd)
    """
    positive_int("N", N)
    positive_int("d", d)
    return IOCount(reads=2 * N * d + N * N + N * N + N * d, writes=N * N + N * N + N * d)


def sram_elements(block_q: int, block_k: int, d: int) -> int:
    """Fast memory one tile step needs: Q_i, O_i (B_r·d each), K_j, V_j (B_c·d each), S_ij (B_r·B_c), m, ℓ."""
    return 2 * block_q * d + 2 * block_k * d + block_q * block_k + 2 * block_q


def blocks_for_sram(M: int, d: int) -> tuple[int, int]:
    """FlashAttention's block sizes for a fast memory of ``M`` elements: B_c = ⌈M/4d⌉, B_r = min(B_c, d)
    (Dao et al. 2022, Algorithm 1, line 1)."""
    positive_int("M", M)
    positive_int("d", d)
    block_k = math.ceil(M / (4 * d))
    return min(block_k, d), block_k


def tiled_io(N: int, d: int, *, block_q: int, block_k: int, is_causal: bool = False) -> IOCount:
    """The FlashAttention-2 forward schedule, simulated tile by tile.

    Outer loop over query blocks Q_i (read once, B_r·d); inner loop over the key blocks it needs
    (read K_j, V_j: 2·B_c·d each time — this is the term that grows like N²d/B_r); write O_i and the
    logsumexp L_i once. With ``is_causal`` the tiles above the diagonal are never loaded.
    """
    for name, value in (("N", N), ("d", d), ("block_q", block_q), ("block_k", block_k)):
        positive_int(name, value)
    reads = writes = 0
    for q0 in range(0, N, block_q):
        q1 = min(q0 + block_q, N)
        reads += (q1 - q0) * d                                        # Q_i
        stop = min(N, q1) if is_causal else N
        for k0 in range(0, stop, block_k):
            k1 = min(k0 + block_k, N)
            reads += 2 * (k1 - k0) * d                                # K_j, V_j
        writes += (q1 - q0) * d + (q1 - q0)                           # O_i, L_i
    return IOCount(reads=reads, writes=writes)
