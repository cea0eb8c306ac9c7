"""Running :mod:`attn_course.ring` on P local processes: the launcher, the verifier and ``attn-course ring``.

:func:`launch` spawns P local processes on a free loopback port (used by lesson 13, the tests and
``attn-course ring``; :func:`choose_backend` picks nccl with one GPU per rank, else gloo); under ``torchrun``
the CLI reads LOCAL_RANK, calls ``torch.cuda.set_device`` and the same functions run unchanged.
:func:`verify` runs ring (or Ulysses) attention on every rank and compares its shard with single-process
attention (:func:`reference_rows`), with the bytes sent and the work per rank. The names are also importable
from :mod:`attn_course.ring`.
"""
from __future__ import annotations

import math
import os
import pickle
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .ring import comm_stats, reset_comm_stats, ring_attention, ulysses_attention
from .ring_layout import LAYOUTS, ring_comm_bytes, shard, shard_positions, ulysses_comm_bytes

__all__ = ["launch", "verify", "choose_backend", "rank_device", "reference_rows", "main"]


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
