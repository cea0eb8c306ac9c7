"""Attention across processes: ring attention and DeepSpeed-Ulysses on ``torch.distributed``.

When one device cannot hold a sequence, each of the P ranks keeps a shard of ``L/P`` positions of q, k
and v. Queries are easy to split — each output row needs only its own query — but every query needs
*all* keys and values. Two ways to get them there:

**Ring attention** (Liu, Zaharia & Abbeel 2023; Brandon et al. 2023 "Striped Attention"). The K/V shards
travel around a ring: at step t rank r holds the shard that started on rank ``(r − t) mod P``, computes
its queries against it with the tiled kernel of lesson 08 (which also returns the log-sum-exp), and
passes it on to rank r + 1 while receiving the next one from r − 1 (``isend``/``irecv``, overlapped with
the compute). The partial results are exact once merged by their log-sum-exps (lesson 08):

    lse = log(e^{lse_1} + e^{lse_2}),    out = e^{lse_1 − lse} · out_1 + e^{lse_2 − lse} · out_2

With ``is_causal`` a query never needs keys from later positions, so blocks wholly in the future are
skipped. With the *contiguous* layout rank r's queries see r + 1 of the P shards — rank P−1 does P times
the work of rank 0. The *zigzag* layout cuts the sequence into 2P chunks and gives rank r chunks r and
2P−1−r: every rank then does the same work (one early and one late chunk).

The backward pass (also a ring) recomputes each block from the saved output and log-sum-exp, exactly like
lesson 08's backward: the K/V shards go round again, each carrying its gradient accumulators dK, dV, which
every rank adds its queries' contribution to; after P hops they are home.

**Ulysses** (Jacobs et al. 2023, DeepSpeed-Ulysses). One all-to-all turns sequence shards into head
shards — rank r gets *all* L positions of heads ``r·H/P … (r+1)·H/P − 1`` — then ordinary attention runs
locally, and a second all-to-all turns the output back into sequence shards. It needs H divisible by P.

Communication per rank and layer (fp elements, forward): ring sends its K and V shard P − 1 times,
``2·(P−1)·B·H·(L/P)·E``; Ulysses sends (P−1)/P of q, k, v and of the output, ``4·(P−1)/P·B·H·(L/P)·E``.
:func:`comm_stats` reports the bytes this process actually sent.

Every function here is called on every rank of ``group`` (default: the default process group). The
tensors live on whatever device the rank uses (gloo on CPU, NCCL on CUDA); nothing is hard-coded.
:func:`launch` spawns P local processes on a free loopback port (used by the lesson, the tests and
``attn-course ring``); under ``torchrun`` the same functions run unchanged.
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
           "ulysses_comm_bytes", "verify", "ring_plan", "work_per_rank", "LAYOUTS"]

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
    E, Ev = k.shape[-1], v.shape[-1]
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    # the travelling bundle: [k | v | dk | dv] of the shard that started on rank (rank − t) mod P
    bundle = torch.cat([k.to(acc), v.to(acc), torch.zeros_like(k, dtype=acc), torch.zeros_like(v, dtype=acc)],
                       dim=-1).contiguous()
    for t in range(world):
        src = (rank - t) % world
        k_t, v_t = bundle[..., :E], bundle[..., E:E + Ev]
        dk_t, dv_t = bundle[..., E + Ev:2 * E + Ev], bundle[..., 2 * E + Ev:]
        for qs, ks, diag in _pairs(q_chunks, _chunks(src, world, L, layout), is_causal):
            gq, gk, gv = flash_attention_backward(q[..., qs, :].to(acc), k_t[..., ks, :], v_t[..., ks, :],
                                                  out[..., qs, :].to(acc), lse[..., qs], dout[..., qs, :].to(acc),
                                                  is_causal=diag)
            dq[..., qs, :] += gq
            dk_t[..., ks, :] += gk
            dv_t[..., ks, :] += gv
        # P hops bring every bundle home: after the last one rank r holds its own shard's dk, dv
        if world > 1:
            bundle, reqs = _start_shift(bundle, rank, world, group)
            _wait(reqs)
    dk, dv = bundle[..., E + Ev:2 * E + Ev], bundle[..., 2 * E + Ev:]
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


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
                    backward: bool = False) -> int:
    """Bytes one rank sends in :func:`ring_attention`: forward P−1 hops of its K and V shard
    (``2·(P−1)·B·H·(L/P)·E`` elements); the backward sends P hops of [k, v, dk, dv] (4 shard-sized pieces,
    in the accumulation dtype)."""
    shard = batch * heads * (seq_len // world) * head_dim
    return (4 * world * shard if backward else 2 * (world - 1) * shard) * elem_bytes


def ulysses_comm_bytes(*, world: int, batch: int, heads: int, seq_len: int, head_dim: int,
                       elem_bytes: int = 4) -> int:
    """Bytes one rank sends in the forward of :func:`ulysses_attention`: (P−1)/P of each of q, k, v on the
    way in and of the output on the way back, ``4·(P−1)/P·B·H·(L/P)·E`` elements."""
    shard = batch * heads * (seq_len // world) * head_dim
    return 4 * (world - 1) * shard // world * elem_bytes


# ---- launching P local processes -----------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, fn, args, queue, timeout):
    try:
        torch.set_num_threads(1)                                  # P processes share the machine's cores
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=__import__("datetime").timedelta(seconds=timeout))
        reset_comm_stats()
        result = fn(rank, world, *args)
        queue.put((rank, "ok", pickle.dumps(result)))      # plain bytes: no shared-memory handles to outlive us
        dist.barrier()                                            # nobody tears down while others still send
        dist.destroy_process_group()
    except BaseException as exc:                                  # report, then die: the parent kills the rest
        queue.put((rank, "error", f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"))
        raise SystemExit(1)


def launch(fn, world_size: int, *args, timeout: float = 60.0):
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh local processes joined in a gloo group
    on a free loopback port; return the list of their results (rank order).

    ``fn`` must be importable (defined in a module, not in a notebook cell), its result picklable.
    If a rank raises, the whole run fails at once with that rank's message (the other ranks are killed,
    never left hanging); the run is killed after ``timeout`` seconds. Every child is reaped on exit.
    """
    import multiprocessing as mp
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn, args, queue, timeout), daemon=True)
             for r in range(world_size)]
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

def verify(rank: int, world: int, configs: list[dict]) -> list[dict]:
    """Run on every rank (e.g. through :func:`launch`): for each config draw the FULL q, k, v from its
    seed (identically on every rank), run ``ring_attention`` (or ``ulysses_attention``) on this rank's
    shard, and compare output (and, with ``backward``, gradients) with single-process attention on the
    full sequence. A config is a dict with keys ``seq_len``, and optionally ``method`` ("ring" |
    "ulysses"), ``layout``, ``causal``, ``batch``, ``heads``, ``head_dim``, ``dtype`` ("float32" |
    "float64"), ``backward``, ``seed``, ``repeats`` (timed runs after a warm-up). Returns per config:
    max abs errors, bytes sent, q·k score entries computed, median forward ms."""
    from .functional import attention
    out = []
    for cfg in configs:
        method, layout = cfg.get("method", "ring"), cfg.get("layout", "contiguous")
        causal, backward = bool(cfg.get("causal", False)), bool(cfg.get("backward", False))
        B, H, L, E = cfg.get("batch", 1), cfg.get("heads", 2), cfg["seq_len"], cfg.get("head_dim", 16)
        dtype = getattr(torch, cfg.get("dtype", "float64"))
        gen = torch.Generator().manual_seed(cfg.get("seed", 0))
        q, k, v, g = (torch.randn(B, H, L, E, generator=gen, dtype=dtype) for _ in range(4))
        q_s, k_s, v_s = (shard(t, rank, world, layout).requires_grad_(backward) for t in (q, k, v))
        fn = (lambda a, b, c: ring_attention(a, b, c, is_causal=causal, layout=layout)) if method == "ring" \
            else (lambda a, b, c: ulysses_attention(a, b, c, is_causal=causal))
        times = []
        for i in range(1 + cfg.get("repeats", 0)):              # the first run is the warm-up when timing
            dist.barrier()
            reset_comm_stats()
            t0 = time.perf_counter()
            o_s = fn(q_s, k_s, v_s)
            times.append((time.perf_counter() - t0) * 1e3)
        stats = comm_stats()
        ref_in = [t.clone().requires_grad_(backward) for t in (q, k, v)]
        ref, _ = attention(*ref_in, is_causal=causal)
        res = {**cfg, "rank": rank, "world": world, "out_err": (o_s.detach() - shard(ref.detach(), rank, world, layout)).abs().max().item(),
               "bytes_sent": stats["bytes_sent"], "score_entries": stats["score_entries"],
               "ms": sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0]}
        if backward:
            g_s = shard(g, rank, world, layout)
            reset_comm_stats()
            (o_s * g_s).sum().backward()
            res["bytes_sent_backward"] = comm_stats()["bytes_sent"]
            (ref * g).sum().backward()
            res["grad_err"] = max((a.grad - shard(b.grad, rank, world, layout)).abs().max().item()
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
             f"{c.get('head_dim', 16)}), {c.get('dtype', 'float64')}; shard = {shard_elems} elements",
             f"{'rank':>4} {'max |err| vs 1 process':>23} {'bytes sent':>11} {'formula':>9} {'work share':>10} "
             f"{'fwd ms (median)':>16}"]
    for r in rows:
        share = f"{r['score_entries'] / total:.1%}" if r["score_entries"] else "—"
        lines.append(f"{r['rank']:>4} {r['out_err']:>23.2e} {r['bytes_sent']:>11,} {formula:>9,} {share:>10} "
                     f"{r['ms']:>16.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="attn-course ring", description=(
        "Run ring (or Ulysses) attention on P local processes (gloo) and compare with single-process "
        "attention: error, bytes sent per rank and each rank's share of the work."))
    p.add_argument("--world-size", type=int, default=2, help="P, processes to spawn (ignored under torchrun)")
    p.add_argument("--seq-len", type=int, default=1024, help="L, the full sequence length")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--layout", choices=LAYOUTS, default="contiguous")
    p.add_argument("--method", choices=("ring", "ulysses"), default="ring")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up (default 3)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before the run is killed")
    a = p.parse_args(argv)
    cfg = [dict(seq_len=a.seq_len, causal=a.causal, layout=a.layout, method=a.method, batch=a.batch,
                heads=a.heads, head_dim=a.head_dim, dtype=a.dtype, repeats=a.repeats)]
    try:
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:    # under torchrun: we are one of the ranks
            dist.init_process_group("gloo")
            mine = verify(dist.get_rank(), dist.get_world_size(), cfg)
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
            if dist.get_rank() == 0:
                print(_format(gathered))
            dist.destroy_process_group()
        else:
            print(_format(launch(verify, a.world_size, cfg, timeout=a.timeout)))
    except (ValueError, RuntimeError, TimeoutError) as exc:
        print(f"attn-course ring: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
