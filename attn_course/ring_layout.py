"""Ring attention's bookkeeping: which positions each rank holds, which blocks it computes, what it sends.

* **layouts** — ``"contiguous"``: rank r holds positions ``[r·L/P, (r+1)·L/P)``; ``"zigzag"``: the sequence is
  cut into 2P chunks and rank r holds chunks r and 2P−1−r (one early, one late: equal causal work);
* **the plan** — at ring step t rank r holds the K/V shard of rank ``(r − t) mod P`` (:func:`ring_schedule`);
  :func:`ring_plan` says at which step each score is computed (or that a causal skip never computes it), and
  :func:`work_per_rank` counts each rank's scores;
* **the traffic** — communication per rank and layer (fp elements, forward, H query heads and H_kv key/value
  heads): the ring sends its K and V shard P − 1 times, ``2·(P−1)·B·H_kv·(L/P)·E``; Ulysses sends (P−1)/P of
  q and the output (H heads) and of k and v (H_kv heads), ``(P−1)/P·B·(L/P)·E·(2H + 2H_kv)`` — P/2 times
  less than the ring with MHA, P/5 with H = 4·H_kv. Ulysses can split at most H_kv ways without replicating
  K/V heads. :func:`attn_course.ring.comm_stats` reports the bytes a process actually sent.

The loops themselves are in :mod:`attn_course.ring`, which re-exports these names.
"""
from __future__ import annotations

import torch

__all__ = ["LAYOUTS", "shard_positions", "shard", "ring_schedule", "ring_plan", "work_per_rank",
           "ring_comm_bytes", "ulysses_comm_bytes"]

LAYOUTS = ("contiguous", "zigzag")


def _chunks(rank: int, world: int, L: int, layout: str) -> list[tuple[int, int]]:
    """The global ``[start, end)`` ranges rank ``rank`` holds, in the order they are concatenated."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    parts = world if layout == "contiguous" else 2 * world
    if L % parts:
        raise ValueError(f"seq_len L={L} must be divisible by {parts} "
                         f"({'P' if layout == 'contiguous' else '2P'} for the {layout} layout, P={world})")
    c = L // parts
    ids = [rank] if layout == "contiguous" else [rank, 2 * world - 1 - rank]
    return [(i * c, (i + 1) * c) for i in ids]


def shard_positions(rank: int, world: int, L: int, layout: str = "contiguous") -> torch.Tensor:
    """Global positions (``(L/P,)`` int64) held by ``rank``: contiguous ``[r·L/P, (r+1)·L/P)``; zigzag:
    chunks r and 2P−1−r of size L/(2P), concatenated in that order."""
    return torch.cat([torch.arange(a, b) for a, b in _chunks(rank, world, L, layout)])


def shard(x: torch.Tensor, rank: int, world: int, layout: str = "contiguous", dim: int = -2) -> torch.Tensor:
    """This rank's shard of a full-sequence tensor (sequence on ``dim``), e.g. ``(B, H, L, E) -> (B, H, L/P, E)``."""
    return torch.cat([x.narrow(dim, a, b - a) for a, b in _chunks(rank, world, x.shape[dim], layout)], dim=dim)


def ring_schedule(world: int) -> list[list[int]]:
    """``schedule[t][r]`` = the rank whose K/V shard rank r holds at step t, i.e. ``(r − t) mod P``."""
    return [[(r - t) % world for r in range(world)] for t in range(world)]


def ring_plan(world: int, L: int, layout: str = "contiguous", is_causal: bool = False) -> torch.Tensor:
    """``(L, L)`` int64: for query position i and key position j, the ring step at which the rank holding
    query i computes the score (i, j) — ``(r − s) mod P`` for query rank r and key rank s — or −1 when it
    is never computed (a causal skip, or a masked pair inside a diagonal block)."""
    plan = torch.full((L, L), -1, dtype=torch.int64)
    owner = {r: shard_positions(r, world, L, layout) for r in range(world)}
    for r in range(world):
        for s_ in range(world):
            for qs, ks, diag in _pairs(_chunks(r, world, L, layout), _chunks(s_, world, L, layout), is_causal):
                qi, kj = owner[r][qs], owner[s_][ks]
                block = torch.full((len(qi), len(kj)), (r - s_) % world, dtype=torch.int64)
                if diag:
                    block = block.masked_fill(torch.ones_like(block, dtype=torch.bool).triu(1), -1)
                plan[qi[:, None], kj[None, :]] = block
    return plan


def work_per_rank(world: int, L: int, layout: str = "contiguous", is_causal: bool = False) -> list[int]:
    """Scores each rank computes (per batch element and head) — what :func:`comm_stats` counts as
    ``score_entries``, predicted without running anything."""
    plan = ring_plan(world, L, layout, is_causal)
    return [int((plan[shard_positions(r, world, L, layout)] >= 0).sum()) for r in range(world)]


def _pairs(q_chunks, k_chunks, is_causal):
    """Yield ``(q slice, k slice, diagonal)`` in shard-local coordinates for every visible chunk pair.

    Chunks are equal-sized ranges of global positions. Non-causal: everything. Causal: a key chunk wholly
    before the query chunk is fully visible, the same chunk is causal on the diagonal, a later one is
    skipped (never computed)."""
    qo = 0
    for qa, qb in q_chunks:
        ko = 0
        for ka, kb in k_chunks:
            if not is_causal or kb <= qa:
                yield slice(qo, qo + qb - qa), slice(ko, ko + kb - ka), False
            elif ka == qa:
                yield slice(qo, qo + qb - qa), slice(ko, ko + kb - ka), True
            ko += kb - ka
        qo += qb - qa


def ring_comm_bytes(*, world: int, batch: int, heads: int, seq_len: int, head_dim: int, elem_bytes: int = 4,
                    backward: bool = False, num_kv_heads: int | None = None) -> int:
    """Bytes one rank sends in :func:`ring_attention`, with ``num_kv_heads`` K/V heads (GQA; default
    ``heads``, i.e. MHA — only K and V travel, so only H_kv matters).

    Forward: P − 1 hops of its K and V shard, ``2·(P−1)·B·H_kv·(L/P)·E`` elements of ``elem_bytes``.
    ``backward=True``: the backward alone — K and V go round again (P − 1 hops, input dtype) and the
    gradient accumulators dK, dV make P hops (to come home) in the accumulation dtype, at least 4 bytes:
    ``2·(P−1)·shard·elem_bytes + 2·P·shard·max(elem_bytes, 4)``.
    """
    if any(int(x) <= 0 for x in (world, batch, heads, seq_len, head_dim, elem_bytes)):
        raise ValueError(f"sizes must be positive: world={world}, batch={batch}, heads={heads}, "
                         f"seq_len={seq_len}, head_dim={head_dim}, elem_bytes={elem_bytes}")
    h_kv = heads if num_kv_heads is None else num_kv_heads
    shard = batch * h_kv * (seq_len // world) * head_dim
    if backward:
        return 2 * (world - 1) * shard * elem_bytes + 2 * world * shard * max(elem_bytes, 4)
    return 2 * (world - 1) * shard * elem_bytes


def ulysses_comm_bytes(*, world: int, batch: int, heads: int, seq_len: int, head_dim: int,
                       elem_bytes: int = 4, num_kv_heads: int | None = None) -> int:
    """Bytes one rank sends in the forward of :func:`ulysses_attention`: (P−1)/P of its q and output
    shards (H heads) and of its k and v shards (``num_kv_heads`` heads, default ``heads``):
    ``(P−1)/P·B·(L/P)·E·(2H + 2H_kv)`` elements. With MHA that is ``4·(P−1)/P·B·H·(L/P)·E``. (Ulysses can
    split at most H_kv ways without replicating K/V heads.)"""
    if any(int(x) <= 0 for x in (world, batch, heads, seq_len, head_dim, elem_bytes)):
        raise ValueError(f"sizes must be positive: world={world}, batch={batch}, heads={heads}, "
                         f"seq_len={seq_len}, head_dim={head_dim}, elem_bytes={elem_bytes}")
    h_kv = heads if num_kv_heads is None else num_kv_heads
    per_head = batch * (seq_len // world) * head_dim
    return (world - 1) * per_head * (2 * heads + 2 * h_kv) // world * elem_bytes
