"""Attention across processes: ring attention and DeepSpeed-Ulysses on ``torch.distributed``.

When one device cannot hold a sequence, each of the P ranks keeps a shard of ``L/P`` positions of q, k
and v. Queries are easy to split — each output row needs only its own query — but every query needs
*all* keys and values. Two ways to get them there:

**Ring attention** (Liu, Zaharia & Abbeel 2023; Brandon et al. 2023 "Striped Attention"). The K/V shards
travel around a ring: at step t rank r holds the shard that started on rank ``(r − t) mod P``, computes
its queries against it with the tiled kernel of lesson 08 (which also returns the log-sum-exp), and
passes it on to rank r + 1 while receiving the next one from r − 1 (``isend``/``irecv``, overlapped with
the compute — it stays hidden if a step's compute, 4·B·H·(L/P)²·E FLOPs, outlasts its transfer). The partial results are exact once merged by their log-sum-exps (lesson 08):

    lse = log(e^{lse_1} + e^{lse_2}),    out = e^{lse_1 − lse} · out_1 + e^{lse_2 − lse} · out_2

With ``is_causal`` a query never needs keys from later positions, so blocks wholly in the future are
skipped. With the *contiguous* layout rank r's queries see r + 1 of the P shards (its own one only
causally) — rank P−1 does 2P−1 times the work of rank 0, (2P−1)/P of the mean. The *zigzag* layout cuts the sequence into 2P chunks and gives rank r chunks r and
2P−1−r: every rank then does the same work (one early and one late chunk).

The backward pass (also a ring) recomputes each block from the saved output and log-sum-exp, exactly like
lesson 08's backward: the K/V shards go round again (input dtype, P − 1 hops, sent while computing), and
with them their gradient accumulators dK, dV (accumulation dtype, fp32 for bf16/fp16), which every rank
adds its queries' contribution to; after P hops they are home. The dK/dV hop can only start once the step's
compute is done, so in this teaching version it is NOT overlapped; its traffic,
``2(P−1)·shard·bytes + 2P·shard·max(bytes, 4)``, is 2–4× the forward's.

**Ulysses** (Jacobs et al. 2023, DeepSpeed-Ulysses). One all-to-all turns sequence shards into head
shards — rank r gets *all* L positions of heads ``r·H/P … (r+1)·H/P − 1`` — then ordinary attention runs
locally, and a second all-to-all turns the output back into sequence shards. It needs H divisible by P.

Communication per rank and layer (fp elements, forward, H query heads and H_kv key/value heads): ring
sends its K and V shard P − 1 times, ``2·(P−1)·B·H_kv·(L/P)·E``; Ulysses sends (P−1)/P of q and the output
(H heads) and of k and v (H_kv heads), ``(P−1)/P·B·(L/P)·E·(2H + 2H_kv)`` — P/2 times less than the ring
with MHA, P/5 with H = 4·H_kv. Ulysses can split at most H_kv ways without replicating K/V heads.
:func:`comm_stats` reports the bytes this process actually sent.

Every function here is called on every rank of ``group`` (default: the default process group). The
tensors live on whatever device the rank uses (gloo on CPU, NCCL on CUDA); nothing is hard-coded.
:func:`launch` spawns P local processes on a free loopback port (used by the lesson, the tests and
``attn-course ring``; :func:`choose_backend` picks nccl with one GPU per rank, else gloo); under
``torchrun`` the CLI reads LOCAL_RANK, calls ``torch.cuda.set_device`` and the same functions run unchanged.
"""
from __future__ import annotations

import math
import os
import pickle
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .flash import flash_attention_backward, flash_attention_forward

__all__ = ["ring_attention", "ulysses_attention", "shard_positions", "shard", "merge_partials",
           "ring_schedule", "comm_stats", "reset_comm_stats", "launch", "ring_comm_bytes",
           "ulysses_comm_bytes", "verify", "ring_plan", "work_per_rank", "LAYOUTS", "choose_backend",
           "rank_device", "reference_rows"]

LAYOUTS = ("contiguous", "zigzag")


# ---- layouts: which global positions each rank holds ------------------------------------------------

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


# ---- the log-sum-exp merge of lesson 08 ---------------------------------------------------------------

def merge_partials(out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor, lse2: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attentions of the same queries over disjoint key sets.

    ``out_i``: ``(…, Lq, Ev)`` each normalised over its own keys; ``lse_i``: ``(…, Lq)`` their log-sum-exps
    (−∞ for a row that saw no key). Returns the attention over the union and its log-sum-exp. Rows with no
    key on either side stay zero (never NaN).
    """
    lse = torch.logaddexp(lse1, lse2)                                          # (…, Lq)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)           # both empty: avoid −∞ − −∞
    w1 = torch.exp(lse1 - safe).unsqueeze(-1)                                  # e^{lse_1 − lse}
    w2 = torch.exp(lse2 - safe).unsqueeze(-1)
    return w1 * out1 + w2 * out2, lse


# ---- which pieces of a (query shard, key shard) pair are visible ----------------------------------------

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


# ---- communication, with a byte counter ----------------------------------------------------------------

@dataclass
class _Stats:
    bytes_sent: int = 0
    score_entries: int = 0           # query·key pairs whose score this rank computed (forward)
    steps: list = field(default_factory=list)


_STATS = _Stats()


def comm_stats() -> dict:
    """What this process did since :func:`reset_comm_stats`: ``bytes_sent`` (point-to-point and all-to-all
    payload this rank sent) and ``score_entries`` (q·k scores it computed in the forward pass, over all batches and heads: its work)."""
    return {"bytes_sent": _STATS.bytes_sent, "score_entries": _STATS.score_entries}


def reset_comm_stats() -> None:
    _STATS.bytes_sent = 0
    _STATS.score_entries = 0


def _group_info(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call dist.init_process_group first "
                           "(or run through attn_course.ring.launch / torchrun)")
    return dist.get_rank(group), dist.get_world_size(group)


def _start_shift(buf: torch.Tensor, rank: int, world: int, group):
    """Send ``buf`` to rank+1 and receive the same-shaped tensor from rank−1 (non-blocking)."""
    recv = torch.empty_like(buf)
    to, frm = (rank + 1) % world, (rank - 1) % world
    g = group if group is not None else dist.group.WORLD
    ops = [dist.P2POp(dist.isend, buf, dist.get_global_rank(g, to), group),
           dist.P2POp(dist.irecv, recv, dist.get_global_rank(g, frm), group)]
    reqs = dist.batch_isend_irecv(ops)
    _STATS.bytes_sent += buf.numel() * buf.element_size()
    return recv, reqs


def _wait(reqs):
    for r in reqs:
        r.wait()


# ---- ring attention ------------------------------------------------------------------------------------

def _check_qkv(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() < 2 or not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor (…, L/P, E), got "
                             f"{getattr(t, 'shape', type(t).__name__)}")
    if q.shape[:-1] != k.shape[:-1] or k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"ring attention needs q, k, v shards of one length: q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)} (and q, k of one embedding size)")


def _ring_forward(q, k, v, is_causal, layout, group):
    rank, world = _group_info(group)
    Lloc = q.shape[-2]
    L = Lloc * world
    q_chunks = _chunks(rank, world, L, layout)
    acc = torch.promote_types(q.dtype, torch.float32)
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=acc, device=q.device)
    lse = torch.full(q.shape[:-1], -math.inf, dtype=acc, device=q.device)
    E = k.shape[-1]
    kv = torch.cat([k, v], dim=-1).contiguous()                                 # one message per hop
    for t in range(world):
        if t < world - 1:
            nxt, reqs = _start_shift(kv, rank, world, group)                    # overlap: send while computing
        src = (rank - t) % world
        k_t, v_t = kv[..., :E], kv[..., E:]
        for qs, ks, diag in _pairs(q_chunks, _chunks(src, world, L, layout), is_causal):
            o, l = flash_attention_forward(q[..., qs, :], k_t[..., ks, :], v_t[..., ks, :], is_causal=diag)
            out[..., qs, :], lse[..., qs] = merge_partials(out[..., qs, :], lse[..., qs], o.to(acc), l.to(acc))
            n = (qs.stop - qs.start) * (ks.stop - ks.start)                     # per (batch, head)
            c = qs.stop - qs.start
            n = c * (c + 1) // 2 if diag else n                                # diagonal block: c(c+1)/2
            _STATS.score_entries += n * math.prod(q.shape[:-2])
        if t < world - 1:
            _wait(reqs)
            kv = nxt
    return out.to(q.dtype), lse


def _ring_backward(q, k, v, out, lse, dout, is_causal, layout, group):
    rank, world = _group_info(group)
    Lloc = q.shape[-2]
    L = Lloc * world
    q_chunks = _chunks(rank, world, L, layout)
    acc = torch.promote_types(q.dtype, torch.float32)
    E = k.shape[-1]
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    # two travelling messages for the shard that started on rank (rank − t) mod P:
    #   kv   = [k | v] in the INPUT dtype: P − 1 hops, sent while this step computes (as in the forward);
    #   dkdv = [dk | dv] in the accumulation dtype (fp32 for bf16/fp16): P hops, sent only AFTER this
    #          step has added its contribution, so this teaching version does not overlap it with compute.
    kv = torch.cat([k, v], dim=-1).contiguous()
    dkdv = torch.zeros(*k.shape[:-1], E + v.shape[-1], dtype=acc, device=k.device)
    for t in range(world):
        if t < world - 1:
            nxt, reqs_kv = _start_shift(kv, rank, world, group)                 # overlapped: K/V for step t+1
        k_t, v_t = kv[..., :E].to(acc), kv[..., E:].to(acc)
        for qs, ks, diag in _pairs(q_chunks, _chunks((rank - t) % world, world, L, layout), is_causal):
            gq, gk, gv = flash_attention_backward(q[..., qs, :].to(acc), k_t[..., ks, :], v_t[..., ks, :],
                                                  out[..., qs, :].to(acc), lse[..., qs], dout[..., qs, :].to(acc),
                                                  is_causal=diag)
            dq[..., qs, :] += gq
            dkdv[..., ks, :E] += gk
            dkdv[..., ks, E:] += gv
        if world > 1:                          # P hops bring every dk, dv home (not overlapped: see above)
            dkdv, reqs = _start_shift(dkdv, rank, world, group)
            _wait(reqs)
        if t < world - 1:
            _wait(reqs_kv)
            kv = nxt
    return dq.to(q.dtype), dkdv[..., :E].to(k.dtype), dkdv[..., E:].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, layout, group):
        out, lse = _ring_forward(q, k, v, is_causal, layout, group)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cfg = (is_causal, layout, group)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(q, k, v, out, lse, dout.contiguous(), *ctx.cfg)
        return dq, dk, dv, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                   layout: str = "contiguous", group=None) -> torch.Tensor:
    """Exact softmax attention over a sequence sharded across the ranks of ``group``.

    Args:
        q, k, v: this rank's shards ``(…, L/P, E)`` (usually ``(B, H, L/P, E)``), positions as given by
            :func:`shard_positions` for ``layout``. Every rank calls this with same-shaped shards.
        is_causal: causal over *global* positions; key shards wholly in a query shard's future are skipped.
        layout: ``"contiguous"`` (rank r holds ``[r·L/P, (r+1)·L/P)``) or ``"zigzag"`` (chunks r and
            2P−1−r of 2P, concatenated — balanced causal work).
        group: the process group (default: the default group).

    Returns:
        This rank's shard of the output, ``(…, L/P, Ev)``, in the input dtype, equal to its rows of
        ``F.scaled_dot_product_attention`` on the full sequence. Differentiable: the backward is a second
        ring that recomputes blocks from the saved output and log-sum-exp.
    """
    _check_qkv(q, k, v)
    _, world = _group_info(group)
    _chunks(0, world, q.shape[-2] * world, layout)                  # validates layout and divisibility
    if layout == "zigzag" and q.shape[-2] % 2:
        raise ValueError(f"the zigzag layout needs an even shard length, got L/P={q.shape[-2]}")
    return _RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), bool(is_causal), layout, group)


# ---- Ulysses -------------------------------------------------------------------------------------------

def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    """Split ``x`` into P pieces along ``scatter_dim``, send piece j to rank j, concatenate what arrives
    along ``gather_dim`` (in rank order)."""
    rank, world = _group_info(group)
    ins = [t.contiguous() for t in x.chunk(world, dim=scatter_dim)]
    outs = [torch.empty_like(ins[0]) for _ in range(world)]
    dist.all_to_all(outs, ins, group=group)
    _STATS.bytes_sent += sum(t.numel() * t.element_size() for j, t in enumerate(ins) if j != rank)
    return torch.cat(outs, dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """Differentiable all-to-all: its adjoint is the all-to-all with the two dims swapped."""
    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.cfg = (scatter_dim, gather_dim, group)
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, g):
        scatter_dim, gather_dim, group = ctx.cfg
        return _all_to_all(g, gather_dim, scatter_dim, group), None, None, None


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                      group=None) -> torch.Tensor:
    """DeepSpeed-Ulysses: sequence shards ``(B, H, L/P, E)`` (contiguous layout) -> head shards
    ``(B, H/P, L, E)`` by all-to-all, full attention locally (SDPA), all-to-all back to ``(B, H, L/P, Ev)``.

    Requires the number of heads H to be divisible by P. Differentiable.
    """
    _check_qkv(q, k, v)
    if q.dim() != 4:
        raise ValueError(f"ulysses_attention needs (B, H, L/P, E) shards, got q {tuple(q.shape)}")
    _, world = _group_info(group)
    H = q.shape[1]
    if H % world:
        raise ValueError(f"Ulysses splits heads across ranks: num_heads H={H} is not divisible by "
                         f"the world size P={world}")
    qh, kh, vh = (_AllToAll.apply(t, 1, 2, group) for t in (q, k, v))           # (B, H/P, L, E)
    oh = F.scaled_dot_product_attention(qh, kh, vh, is_causal=is_causal)         # (B, H/P, L, Ev)
    return _AllToAll.apply(oh, 2, 1, group)                                      # (B, H, L/P, Ev)


# ---- formulas ------------------------------------------------------------------------------------------

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


# ---- launching P local processes -----------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def choose_backend(backend: str = "auto", world_size: int = 1) -> str:
    """The ``torch.distributed`` backend for ``world_size`` local ranks: ``"nccl"`` when CUDA is available
    with at least one GPU per rank (NCCL needs a GPU per rank), else ``"gloo"`` (CPU tensors).
    ``backend="gloo"`` or ``"nccl"`` forces it; ``"nccl"`` without enough GPUs is a ValueError."""
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', got {backend!r}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" and gpus < world_size:
        raise ValueError(f"the nccl backend needs one CUDA GPU per rank: world_size={world_size}, "
                         f"GPUs available={gpus}")
    if backend == "auto":
        backend = "nccl" if gpus >= world_size and dist.is_nccl_available() else "gloo"
    return backend


def rank_device(backend: str, local_rank: int = 0) -> torch.device:
    """Where a rank's tensors live: ``cuda:local_rank`` (and made current) for nccl, the CPU for gloo."""
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _worker(rank, world, port, fn, args, queue, timeout, backend="gloo"):
    try:
        torch.set_num_threads(1)                                  # P processes share the machine's cores
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        rank_device(backend, rank)                                # nccl: one GPU per rank, made current
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=__import__("datetime").timedelta(seconds=timeout))
        reset_comm_stats()
        result = fn(rank, world, *args)
        queue.put((rank, "ok", pickle.dumps(result)))      # plain bytes: no shared-memory handles to outlive us
        dist.barrier()                                            # nobody tears down while others still send
        dist.destroy_process_group()
    except BaseException as exc:                                  # report, then die: the parent kills the rest
        queue.put((rank, "error", f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"))
        raise SystemExit(1)


def launch(fn, world_size: int, *args, timeout: float = 60.0, backend: str = "gloo"):
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh local processes joined in a process group
    (``backend``: "gloo" by default, "nccl" — rank r on ``cuda:r`` — or "auto", see :func:`choose_backend`)
    on a free loopback port; return the list of their results (rank order).

    ``fn`` must be importable (defined in a module, not in a notebook cell), its result picklable.
    If a rank raises, the whole run fails at once with that rank's message (the other ranks are killed,
    never left hanging); the run is killed after ``timeout`` seconds. Every child is reaped on exit.
    """
    import multiprocessing as mp
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    backend = choose_backend(backend, world_size)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn, args, queue, timeout, backend),
                         daemon=True) for r in range(world_size)]
    results: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.start()
        while len(results) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"ring run with P={world_size} did not finish within {timeout:.0f} s")
            try:
                rank, status, payload = queue.get(timeout=min(remaining, 0.5))
            except Exception:                                      # queue.Empty: check for silent deaths
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and queue.empty():
                    raise RuntimeError(f"rank {procs.index(dead[0])} died with exit code {dead[0].exitcode}")
                continue
            if status == "error":
                raise RuntimeError(payload)
            results[rank] = pickle.loads(payload)
        for p in procs:
            p.join(max(0.1, deadline - time.monotonic()))
        return [results[r] for r in range(world_size)]
    finally:
        started = [p for p in procs if p.pid is not None]
        for p in started:
            if p.is_alive():
                p.kill()
        for p in started:
            p.join(5)
        queue.close()


# ---- one rank's check against single-process attention (used by the CLI, the tests and lesson 13) -------

def reference_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, *,
                   is_causal: bool = False, max_block_elems: int = 1 << 20,
                   max_block_rows: int = 128) -> torch.Tensor:
    """Exact softmax attention for the query rows ``rows`` (global positions) over ALL of k, v, computed a
    block of at most ``max_block_rows`` query rows at a time so that no (…, L, L) tensor ever exists: the
    largest intermediate, B·H·rows_per_block·L elements, stays under ``max_block_elems`` (or one row).
    Differentiable (autograd through the blocks), in the dtype and on the device of the inputs."""
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"reference_rows needs q (…, L, E), k (…, L, E), v (…, L, Ev) of one batch shape: "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    L = k.shape[-2]
    batch_heads = max(1, math.prod(q.shape[:-2]))
    step = max(1, min(len(rows), max_block_rows, max_block_elems // (batch_heads * L)))
    scale = 1.0 / math.sqrt(q.shape[-1])
    pos_k = torch.arange(L, device=k.device)
    outs = []
    for i in range(0, len(rows), step):
        r = rows[i:i + step].to(q.device)
        s = (q[..., r, :] @ k.transpose(-1, -2)) * scale                    # (…, step, L)
        if is_causal:
            s = s.masked_fill(pos_k[None, :] > r[:, None], -math.inf)
        outs.append(torch.softmax(s, dim=-1) @ v)
    return torch.cat(outs, dim=-2)


def verify(rank: int, world: int, configs: list[dict]) -> list[dict]:
    """Run on every rank (e.g. through :func:`launch`): for each config draw the FULL q, k, v from its
    seed (identically on every rank, on the CPU, then moved to the config's ``device``), run
    ``ring_attention`` (or ``ulysses_attention``) on this rank's shard, and compare the output with a
    blockwise fp64 reference for this rank's rows (:func:`reference_rows`: never an L×L tensor); with
    ``backward`` also the gradients, against a blockwise fp64 backward over all rows. A config is a dict
    with keys ``seq_len``, and optionally ``method`` ("ring" | "ulysses"), ``layout``, ``causal``,
    ``batch``, ``heads``, ``head_dim``, ``dtype`` ("float32" | "float64"), ``backward``, ``seed``,
    ``repeats`` (timed runs after a warm-up), ``device`` (default: ``cuda:<rank>`` under nccl, else cpu).
    Returns per config: max abs errors, bytes sent, q·k score entries computed, median forward ms."""
    out = []
    default_dev = (torch.device("cuda", torch.cuda.current_device())
                   if dist.is_initialized() and dist.get_backend() == "nccl" else torch.device("cpu"))
    for cfg in configs:
        method, layout = cfg.get("method", "ring"), cfg.get("layout", "contiguous")
        causal, backward = bool(cfg.get("causal", False)), bool(cfg.get("backward", False))
        B, H, L, E = cfg.get("batch", 1), cfg.get("heads", 2), cfg["seq_len"], cfg.get("head_dim", 16)
        dtype = getattr(torch, cfg.get("dtype", "float64"))
        dev = torch.device(cfg["device"]) if cfg.get("device") else default_dev
        gen = torch.Generator().manual_seed(cfg.get("seed", 0))
        q, k, v, g = (torch.randn(B, H, L, E, generator=gen, dtype=dtype).to(dev) for _ in range(4))
        q_s, k_s, v_s = (shard(t, rank, world, layout).requires_grad_(backward) for t in (q, k, v))
        fn = (lambda a, b, c: ring_attention(a, b, c, is_causal=causal, layout=layout)) if method == "ring" \
            else (lambda a, b, c: ulysses_attention(a, b, c, is_causal=causal))
        times = []
        for i in range(1 + cfg.get("repeats", 0)):              # the first run is the warm-up when timing
            dist.barrier()
            reset_comm_stats()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            o_s = fn(q_s, k_s, v_s)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            times.append((time.perf_counter() - t0) * 1e3)
        stats = comm_stats()
        rows = shard_positions(rank, world, L, layout)
        q64, k64, v64 = (t.detach().double() for t in (q, k, v))
        with torch.no_grad():
            ref_rows = reference_rows(q64, k64, v64, rows, is_causal=causal)
        res = {**cfg, "rank": rank, "world": world, "device": str(dev), "backend": dist.get_backend(),
               "out_err": (o_s.detach().double() - ref_rows).abs().max().item(),
               "bytes_sent": stats["bytes_sent"], "score_entries": stats["score_entries"],
               "ms": sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0]}
        if backward:
            g_s = shard(g, rank, world, layout)
            reset_comm_stats()
            (o_s * g_s).sum().backward()
            res["bytes_sent_backward"] = comm_stats()["bytes_sent"]
            ref_in = [t.clone().requires_grad_(True) for t in (q64, k64, v64)]
            g64 = g.double()
            blk = max(1, min(L, 128, (1 << 20) // max(1, B * H * L)))
            for i in range(0, L, blk):                          # blockwise backward: one query block at a time
                r = torch.arange(i, min(L, i + blk), device=dev)
                (reference_rows(*ref_in, r, is_causal=causal) * g64[..., r, :]).sum().backward()
            res["grad_err"] = max((a.grad.double() - shard(b.grad, rank, world, layout)).abs().max().item()
                                  for a, b in zip((q_s, k_s, v_s), ref_in))
        out.append(res)
    return out


# ---- command line: `attn-course ring ...` or `torchrun --nproc-per-node P -m attn_course.ring ...` -------

def _format(results: list[list[dict]]) -> str:
    rows = [r[0] for r in results]                                  # one config, one row per rank
    c = rows[0]
    shard_elems = c.get("batch", 1) * c.get("heads", 2) * (c["seq_len"] // c["world"]) * c.get("head_dim", 16)
    elem = torch.finfo(getattr(torch, c.get("dtype", "float64"))).bits // 8
    if c.get("method", "ring") == "ring":
        formula = ring_comm_bytes(world=c["world"], batch=c.get("batch", 1), heads=c.get("heads", 2),
                                  seq_len=c["seq_len"], head_dim=c.get("head_dim", 16), elem_bytes=elem)
    else:
        formula = ulysses_comm_bytes(world=c["world"], batch=c.get("batch", 1), heads=c.get("heads", 2),
                                     seq_len=c["seq_len"], head_dim=c.get("head_dim", 16), elem_bytes=elem)
    total = sum(r["score_entries"] for r in rows) or 1
    lines = [f"{c.get('method', 'ring')} attention, P={c['world']}, L={c['seq_len']}, "
             f"layout={c.get('layout', 'contiguous') if c.get('method', 'ring') == 'ring' else 'contiguous'}, "
             f"causal={c.get('causal', False)}, (B, H, E)=({c.get('batch', 1)}, {c.get('heads', 2)}, "
             f"{c.get('head_dim', 16)}), {c.get('dtype', 'float64')}, {c.get('backend', 'gloo')} on "
             f"{c.get('device', 'cpu')}; shard = {shard_elems} elements",
             f"{'rank':>4} {'max |err| vs fp64 ref':>23} {'bytes sent':>11} {'formula':>9} {'work share':>10} "
             f"{'fwd ms (median)':>16}"]
    for r in rows:
        share = f"{r['score_entries'] / total:.1%}" if r["score_entries"] else "—"
        lines.append(f"{r['rank']:>4} {r['out_err']:>23.2e} {r['bytes_sent']:>11,} {formula:>9,} {share:>10} "
                     f"{r['ms']:>16.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="attn-course ring", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                description=(
        "Run ring (or Ulysses) attention on P local processes and compare each rank's output with a "
        "blockwise fp64 reference (never an L×L matrix): error, bytes sent per rank and each rank's share of "
        "the work. Backend: nccl with one GPU per rank when CUDA has enough GPUs, else gloo on the CPU. "
        "Also runs under `torchrun --nproc-per-node P -m attn_course.ring ...` (LOCAL_RANK picks the GPU)."))
    p.add_argument("--world-size", type=int, default=2, help="P, processes to spawn (ignored under torchrun)")
    p.add_argument("--seq-len", type=int, default=1024, help="L, the full sequence length")
    p.add_argument("--causal", action="store_true", help="causal mask over global positions")
    p.add_argument("--layout", choices=LAYOUTS, default="contiguous", help="how positions are sharded")
    p.add_argument("--method", choices=("ring", "ulysses"), default="ring", help="which algorithm")
    p.add_argument("--batch", type=int, default=1, help="B")
    p.add_argument("--heads", type=int, default=4, help="H")
    p.add_argument("--head-dim", type=int, default=32, help="E")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="dtype of q, k, v")
    p.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="auto: nccl if CUDA has a GPU per rank, else gloo")
    p.add_argument("--device", default=None,
                   help="device of each rank's tensors (default: cuda:<local rank> with nccl, cpu with gloo)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before the run is killed")
    a = p.parse_args(argv)
    cfg = [dict(seq_len=a.seq_len, causal=a.causal, layout=a.layout, method=a.method, batch=a.batch,
                heads=a.heads, head_dim=a.head_dim, dtype=a.dtype, repeats=a.repeats, device=a.device)]
    try:
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:    # under torchrun: we are one of the ranks
            world = int(os.environ["WORLD_SIZE"])
            local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
            local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
            backend = choose_backend(a.backend, local_world)
            rank_device(backend, local)
            dist.init_process_group(backend)
            mine = verify(dist.get_rank(), dist.get_world_size(), cfg)
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
            if dist.get_rank() == 0:
                print(_format(gathered))
            dist.destroy_process_group()
        else:
            print(_format(launch(verify, a.world_size, cfg, timeout=a.timeout, backend=a.backend)))
    except (ValueError, RuntimeError, TimeoutError) as exc:
        print(f"attn-course ring: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
