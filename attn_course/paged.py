"""A paged KV cache (vLLM's PagedAttention) and the decode step that reads it block by block.

A server holds the KV caches of many requests at once. Giving each request one contiguous buffer sized for
the longest answer it *might* produce wastes most of that buffer (its reserved tail) and fragments memory
between requests. PagedAttention (Kwon et al. 2023) borrows the operating system's answer: the cache is a
pool of fixed-size **blocks** (pages) of ``block_size`` tokens; each sequence owns a **block table** — the
list of its blocks in order — and takes one more block only when its last one is full, so at most
``block_size − 1`` slots per sequence are ever unused.

Token ``t`` of a sequence lives in block ``table[t // block_size]`` at slot ``t % block_size``.

Blocks are reference-counted, so sequences can **share** them: :meth:`PagedKVCache.fork` gives a new
sequence the parent's block table (a shared system prompt, or beams of one prompt) without copying a
byte. The first write into a shared block copies it first (**copy-on-write**); full blocks are never
written again, so only a shared, partly filled last block is ever copied.

:func:`paged_attention` is the decode step: one query per sequence, each sequence's keys visited block by
block straight from the pool through its block table, folded in with lesson 08's online softmax
(:func:`attn_course.flash.online_softmax_step`) — the sequence's keys are never gathered into one
contiguous tensor. Query head ``h`` reads KV head ``h // (num_heads / num_kv_heads)`` (GQA, lesson 03).

Reference: Kwon, Li, Zhuang, Sheng, Zheng, Yu, Gonzalez, Zhang, Stoica 2023, "Efficient Memory Management
for Large Language Model Serving with PagedAttention" (vLLM).
"""
from __future__ import annotations

import math

import torch

from . import _validate
from .flash import LOG2E, online_softmax_finish, online_softmax_step

__all__ = ["OutOfBlocksError", "PagedKVCache", "paged_attention"]


class OutOfBlocksError(RuntimeError):
    """The pool has fewer free blocks than an operation needs; the cache was left unchanged."""


class PagedKVCache:
    """A pool of ``num_blocks`` blocks of ``block_size`` tokens for the keys and values of many sequences.

    Storage: ``k_pool``, ``v_pool`` of shape ``(num_blocks, num_kv_heads, block_size, head_dim)``.

    * :meth:`new_sequence` → a sequence id (no blocks yet); :meth:`append` ``(seq, k, v)`` adds
      ``k, v (num_kv_heads, n, head_dim)`` for any ``n ≥ 1``, taking blocks as needed.
    * :meth:`fork` ``(seq)`` → a new sequence sharing every block of ``seq`` (copy-on-write).
    * :meth:`free` returns a sequence's blocks (a shared block only when its last user frees it).
    * :meth:`block_table`, :meth:`seq_len`, :meth:`gather` (a contiguous copy, for checking),
      :meth:`num_free_blocks`.

    An append that needs more blocks than are free raises :class:`OutOfBlocksError` and changes nothing.
    Blocks are handed out lowest index first, so a run is reproducible.
    """

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device=None):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size),
                            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            _validate.positive_int(name, value)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        self.k_pool = torch.zeros(shape, dtype=dtype, device=device)  # (num_blocks, H_kv, block_size, D)
        self.v_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.ref_count = [0] * num_blocks                             # users of each block
        self._free = list(range(num_blocks - 1, -1, -1))              # a stack: pop() gives the lowest id
        self._tables: dict[int, list[int]] = {}
        self._lens: dict[int, int] = {}
        self._next_id = 0

    # ---- bookkeeping -------------------------------------------------------------------------------
    def _seq(self, seq) -> list[int]:
        if isinstance(seq, bool) or not isinstance(seq, int) or seq not in self._tables:
            raise ValueError(f"unknown sequence {seq!r}; live sequences: {sorted(self._tables)}")
        return self._tables[seq]

    def _alloc(self) -> int:
        b = self._free.pop()
        self.ref_count[b] = 1
        return b

    def _release(self, b: int) -> None:
        self.ref_count[b] -= 1
        if self.ref_count[b] == 0:
            self._free.append(b)
            self._free.sort(reverse=True)

    def num_free_blocks(self) -> int:
        return len(self._free)

    def block_table(self, seq: int) -> list[int]:
        """The ids of ``seq``'s blocks, in token order (a copy)."""
        return list(self._seq(seq))

    def seq_len(self, seq: int) -> int:
        """How many tokens ``seq`` holds."""
        self._seq(seq)
        return self._lens[seq]

    def sequences(self) -> list[int]:
        """The live sequence ids."""
        return sorted(self._tables)

    def blocks_needed(self, seq: int, n: int) -> int:
        """Free blocks an append of ``n`` tokens to ``seq`` would take: new blocks for the tokens that do
        not fit in the last block, plus one copy if that last block is shared and partly filled."""
        table, L, B = self._seq(seq), self._lens[seq], self.block_size
        new = -(-(L + n) // B) - len(table)
        cow = 1 if (n > 0 and L % B and self.ref_count[table[-1]] > 1) else 0
        return new + cow

    # ---- the API -------------------------------------------------------------------------------------
    def new_sequence(self) -> int:
        """Start an empty sequence; returns its id (ids are never reused)."""
        seq, self._next_id = self._next_id, self._next_id + 1
        self._tables[seq], self._lens[seq] = [], 0
        return seq

    def append(self, seq: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append ``k, v (num_kv_heads, n, head_dim)`` (any ``n ≥ 1``) to ``seq``.

        Raises :class:`OutOfBlocksError` — before touching anything — when fewer blocks are free than the
        append needs (:meth:`blocks_needed`)."""
        table = self._seq(seq)
        want = (self.num_kv_heads, "n", self.head_dim)
        for name, x in (("k", k), ("v", v)):
            _validate.tensor(name, x, dim=3)
            if x.shape[0] != self.num_kv_heads or x.shape[2] != self.head_dim or x.shape[1] < 1:
                raise ValueError(f"{name} must be (num_kv_heads, n, head_dim) = {want} with n >= 1, "
                                 f"got {tuple(x.shape)}")
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        n, L, B = k.shape[1], self._lens[seq], self.block_size
        need = self.blocks_needed(seq, n)
        if need > len(self._free):
            raise OutOfBlocksError(f"appending {n} tokens to sequence {seq} (length {L}) needs {need} free "
                                   f"blocks of {B} tokens, but only {len(self._free)} of {self.num_blocks} "
                                   f"are free; the cache was left unchanged")
        if L % B and self.ref_count[table[-1]] > 1:                   # copy-on-write of the shared last block
            old, new = table[-1], self._alloc()
            self.k_pool[new].copy_(self.k_pool[old])
            self.v_pool[new].copy_(self.v_pool[old])
            self._release(old)
            table[-1] = new
        while len(table) * B < L + n:
            table.append(self._alloc())
        k, v = k.to(self.k_pool.dtype), v.to(self.v_pool.dtype)
        t = 0
        while t < n:                                                  # write block by block
            pos = L + t
            b, slot = table[pos // B], pos % B
            m = min(B - slot, n - t)
            self.k_pool[b, :, slot:slot + m] = k[:, t:t + m]
            self.v_pool[b, :, slot:slot + m] = v[:, t:t + m]
            t += m
        self._lens[seq] = L + n

    def fork(self, seq: int) -> int:
        """A new sequence that shares all of ``seq``'s blocks (no copy; copy-on-write on the first write)."""
        table = self._seq(seq)
        child = self.new_sequence()
        self._tables[child], self._lens[child] = list(table), self._lens[seq]
        for b in table:
            self.ref_count[b] += 1
        return child

    def free(self, seq: int) -> None:
        """Drop ``seq``; each of its blocks returns to the pool when no other sequence uses it."""
        table = self._seq(seq)
        for b in table:
            self._release(b)
        del self._tables[seq], self._lens[seq]

    def gather(self, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A contiguous copy of ``seq``'s keys and values, ``(num_kv_heads, len, head_dim)`` each."""
        table, L = self._seq(seq), self._lens[seq]
        idx = torch.tensor(table, dtype=torch.long, device=self.k_pool.device)
        H, D = self.num_kv_heads, self.head_dim

        def cat(pool):                                                # (nb, H, B, D) -> (H, nb·B, D)[:, :L]
            return pool[idx].transpose(0, 1).reshape(H, -1, D)[:, :L]
        return cat(self.k_pool), cat(self.v_pool)

    def nbytes(self) -> int:
        """Bytes of the pool (keys and values)."""
        return self.k_pool.numel() * self.k_pool.element_size() * 2

    def __repr__(self) -> str:
        return (f"PagedKVCache({self.num_blocks} blocks × {self.block_size} tokens, {self.num_kv_heads} KV heads "
                f"× {self.head_dim}; {len(self._free)} free, {len(self._tables)} sequences)")


def paged_attention(q: torch.Tensor, cache: PagedKVCache, seqs, *, scale: float | None = None) -> torch.Tensor:
    """One decode step: query ``q[i]`` attends to all the keys of sequence ``seqs[i]``, read block by block.

    Args:
        q: ``(len(seqs), num_heads, head_dim)`` — one new query per sequence; ``num_heads`` a multiple of
            the cache's ``num_kv_heads`` (query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)``).
        cache: the :class:`PagedKVCache`.
        seqs: the sequence ids (a list of ints; repeats allowed).
        scale: multiplies ``q kᵀ``; default ``1/√head_dim``.

    Returns ``(len(seqs), num_heads, head_dim)`` in ``q``'s dtype, equal to SDPA of each query over its
    sequence's gathered keys and values (an empty sequence gives zeros, as SDPA with no keys). The loop
    runs over block *positions* ``j``; step ``j`` reads block ``table[j]`` of every sequence (a
    ``(len(seqs), H_kv, block_size, head_dim)`` tile) and folds it in with the online softmax.
    """
    seqs = list(seqs)
    _validate.tensor("q", q, dim=3)
    Hkv, D, Bs = cache.num_kv_heads, cache.head_dim, cache.block_size
    if q.shape[0] != len(seqs) or q.shape[2] != D or q.shape[1] % Hkv:
        raise ValueError(f"q must be (len(seqs), num_heads, head_dim) = ({len(seqs)}, a multiple of "
                         f"num_kv_heads={Hkv}, {D}), got {tuple(q.shape)}")
    if not q.is_floating_point():
        raise ValueError(f"q must be a floating-point tensor, got dtype {q.dtype}")
    if scale is not None and not (isinstance(scale, (int, float)) and not isinstance(scale, bool)
                                  and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")
    tables = [cache.block_table(s) for s in seqs]
    lens = torch.tensor([cache.seq_len(s) for s in seqs], device=q.device)
    N, Hq = q.shape[:2]
    g = Hq // Hkv                                                    # query heads per KV head
    acc = torch.promote_types(q.dtype, torch.float32)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    Q = q.to(acc).reshape(N * Hkv, g, D) * (scale * LOG2E)            # (N·H_kv, g, D): a KV head's g queries
    m = Q.new_full((N * Hkv, g, 1), -math.inf)
    l = Q.new_zeros(N * Hkv, g, 1)
    o = Q.new_zeros(N * Hkv, g, D)
    slots = torch.arange(Bs, device=q.device)
    for j in range(max((len(t) for t in tables), default=0)):       # block position j of every sequence
        idx = torch.tensor([t[j] if j < len(t) else 0 for t in tables], device=q.device)
        K_j = cache.k_pool[idx].to(acc).reshape(N * Hkv, Bs, D)      # (N·H_kv, block_size, D): one block each
        V_j = cache.v_pool[idx].to(acc).reshape(N * Hkv, Bs, D)
        S = torch.bmm(Q, K_j.transpose(1, 2))                         # (N·H_kv, g, block_size)
        valid = (j * Bs + slots).unsqueeze(0) < lens.unsqueeze(1)     # (N, block_size): slots holding tokens
        S = S.view(N, Hkv, g, Bs).masked_fill_(~valid[:, None, None, :], -math.inf).view(N * Hkv, g, Bs)
        m, l, o = online_softmax_step(m, l, o, S, V_j)
    out, _ = online_softmax_finish(m, l, o)
    return out.reshape(N, Hq, D).to(q.dtype)
