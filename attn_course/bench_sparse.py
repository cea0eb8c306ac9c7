"""``attn-course bench --suite sparse``: sliding-window attention five ways, side by side, in one run.

The measured comparison of lesson 09 (it corrects seed 004's table). For each sequence length L, causal
sliding-window attention with window W (forward, no grad) computed by:

* ``naive``        — ``softmax(QKᵀ·scale masked) V`` with a dense ``L × L`` bool mask: materialises the scores;
* ``sdpa_mask``    — ``F.scaled_dot_product_attention`` with the same dense bool mask;
* ``sdpa_causal``  — SDPA ``is_causal=True`` (plain causal, *no* window: the dense-causal baseline);
* ``flex``         — ``torch.compile(flex_attention)`` with the sliding-window ``BlockMask`` (empty tiles skipped);
* ``flash_window`` — :func:`attn_course.flash_attention` ``(window=W, is_causal=True)`` (band tiles only);
* ``flash_causal`` — :func:`attn_course.flash_attention` ``(is_causal=True)``: the same loop without the window.

Each cell runs in a fresh process (:func:`attn_course.bench.measure`'s protocol): one warm-up call (for
``flex`` that call compiles, and its duration is reported as ``compile s``), then the median of
``--repeats`` timed calls, and the peak RSS rise of one call. The bytes of the dense mask (L² bool) and of
the BlockMask are reported too. ``--check`` evaluates the lesson's CPU targets (ratios within one run).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from .bench import (_mallopt_mmap_threshold, _peak_rss_bytes, _reset_peak_rss, _rss_bytes, finish,
                    measure_in_subprocess)

__all__ = ["main", "measure_sparse", "run_sparse", "format_sparse", "check_sparse", "load_recorded_sparse",
           "SPARSE_METHODS", "SPARSE_TARGETS", "RECORDED_SPARSE_CPU"]

SPARSE_METHODS = ("naive", "sdpa_mask", "sdpa_causal", "flex", "flash_window", "flash_causal")
RECORDED_SPARSE_CPU = Path(__file__).resolve().parent / "data" / "bench_sparse_cpu_2core.json"

# (description, L, numerator, denominator, bound): time ratios within one run
SPARSE_TARGETS = (
    ("L=4096: flash_attention(window=W) <= 0.35x flash_attention(is_causal)", 4096, "flash_window", "flash_causal", 0.35),
    ("L=4096: compiled FlexAttention + BlockMask <= 0.3x SDPA + dense mask", 4096, "flex", "sdpa_mask", 0.3),
)


def _window_mask(L, W, device):
    from .masks import sliding_window_mask
    return sliding_window_mask(L, W, causal=True, device=device)                # (L, L) bool, L² bytes


def _setup(method, L, W, block, device):
    """Return ``fn(q, k, v)`` for one method, plus the extra bytes it keeps (its mask)."""
    import torch
    import torch.nn.functional as F
    if method == "naive":
        mask = _window_mask(L, W, device)

        def fn(q, k, v):
            S = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))           # (B, H, L, L)
            return torch.softmax(S.masked_fill_(~mask, -math.inf), dim=-1) @ v
        return fn, mask.numel()
    if method == "sdpa_mask":
        mask = _window_mask(L, W, device)
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)), mask.numel()
    if method == "sdpa_causal":
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), 0
    if method == "flex":
        from . import sparse
        bm = sparse.block_mask(sparse.sliding_window(W), L, block=block, device=device)
        return (lambda q, k, v: sparse.flex(q, k, v, block_mask=bm)), sparse.block_mask_bytes(bm)
    from .flash import flash_attention
    if method == "flash_window":
        return (lambda q, k, v: flash_attention(q, k, v, is_causal=True, window=W, block_q=block, block_k=block)), 0
    if method == "flash_causal":
        return (lambda q, k, v: flash_attention(q, k, v, is_causal=True, block_q=block, block_k=block)), 0
    raise ValueError(f"unknown method {method!r}; choose from {SPARSE_METHODS}")


def measure_sparse(method: str, *, L: int, window: int = 256, batch: int = 1, heads: int = 8, dim: int = 64,
                   block: int = 128, device: str = "cpu", repeats: int = 7, threads: int = 0, seed: int = 0) -> dict:
    """One cell in the current process: ``{"time_s", "times_s", "mem_bytes", "first_call_s", "mask_bytes",
    "max_err"}`` (``max_err``: largest difference from SDPA with the dense window mask — or with
    ``is_causal`` for the two ``*_causal`` methods — on these inputs)."""
    import torch
    import torch.nn.functional as F
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    dev = torch.device(device)
    q, k, v = (torch.randn(batch, heads, L, dim, device=dev) for _ in range(3))
    fn, mask_bytes = _setup(method, L, window, block, dev)
    cuda = dev.type == "cuda"

    def run():
        with torch.no_grad():
            out = fn(q, k, v)
        if cuda:
            torch.cuda.synchronize()
        return out

    t0 = time.perf_counter()
    out = run()                                                         # warm-up (flex: compiles here)
    first = time.perf_counter() - t0
    with torch.no_grad():                                               # the two *_causal methods: no window
        ref = (F.scaled_dot_product_attention(q, k, v, is_causal=True) if method.endswith("_causal") else
               F.scaled_dot_product_attention(q, k, v, attn_mask=_window_mask(L, window, dev)))
    err = float((out - ref).abs().max())
    del out
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run()
        mem = torch.cuda.max_memory_allocated() - base
    else:
        _mallopt_mmap_threshold(64 * 1024)
        reset_ok = _reset_peak_rss()
        base = _rss_bytes()
        run()
        mem = max(0, _peak_rss_bytes(reset_ok) - base)
        _mallopt_mmap_threshold(32 * 2**20)
        run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return {"method": method, "L": L, "times_s": times, "time_s": statistics.median(times), "mem_bytes": int(mem),
            "first_call_s": first, "mask_bytes": int(mask_bytes), "max_err": err}


def _in_subprocess(method: str, timeout: float, **kw) -> dict:
    return measure_in_subprocess("attn_course.bench_sparse", method, timeout, **kw)


def run_sparse(*, lengths=(1024, 2048, 4096, 8192), methods=SPARSE_METHODS, naive_max: int = 4096,
               timeout: float = 900.0, progress=None, **kw) -> list[dict]:
    """One row per L, every cell in a fresh process; ``naive`` only up to ``naive_max`` (its L² scores,
    masked copy and weights need ~3·4·B·H·L² bytes: 6 GiB at L=8192, H=8)."""
    rows = []
    for L in lengths:
        row = {"L": L}
        for m in methods:
            if m == "naive" and L > naive_max:
                row[m] = {"method": m, "error": f"skipped above L={naive_max} (memory)"}
                continue
            if progress:
                progress(f"L={L:5d} {m}")
            row[m] = _in_subprocess(m, timeout, L=L, **kw)
        rows.append(row)
    return rows


def format_sparse(rows: list[dict]) -> str:
    """Markdown tables: time (ms), peak memory (MiB), mask bytes, ratios; flex compile time."""
    methods = [m for m in SPARSE_METHODS if any(m in r for r in rows)]

    def cell(r, m, key, scale, fmt):
        x = r.get(m, {}).get(key)
        return "—" if x is None else fmt.format(x * scale)

    def ratio(r, a, b):
        x, y = r.get(a, {}).get("time_s"), r.get(b, {}).get("time_s")
        return "—" if x is None or not y else f"{x / y:.2f}"

    head = "| L | " + " | ".join(f"{m} ms" for m in methods) + " | flash_window/flash_causal | flex/sdpa_mask |"
    lines = [head, "|" + "---|" * (len(methods) + 3)]
    for r in rows:
        lines.append(f"| {r['L']} | " + " | ".join(cell(r, m, "time_s", 1e3, "{:.1f}") for m in methods)
                     + f" | {ratio(r, 'flash_window', 'flash_causal')} | {ratio(r, 'flex', 'sdpa_mask')} |")
    lines += ["", "| L | " + " | ".join(f"{m} MiB" for m in methods) + " | dense mask KiB | BlockMask KiB | flex first call s |",
              "|" + "---|" * (len(methods) + 4)]
    for r in rows:
        dense = r.get("sdpa_mask", {}).get("mask_bytes")
        blk = r.get("flex", {}).get("mask_bytes")
        lines.append(f"| {r['L']} | " + " | ".join(cell(r, m, "mem_bytes", 2**-20, "{:.0f}") for m in methods)
                     + f" | {'—' if dense is None else f'{dense / 1024:.0f}'} | {'—' if blk is None else f'{blk / 1024:.1f}'}"
                     + f" | {cell(r, 'flex', 'first_call_s', 1, '{:.1f}')} |")
    errors = [f"L={r['L']} {m}: {r[m]['error']}" for r in rows for m in methods if "error" in r.get(m, {})]
    return "\n".join(lines + [f"\nnot measured: {e}" for e in errors])


def check_sparse(rows: list[dict]) -> list[tuple[str, float | None, bool]]:
    """Evaluate :data:`SPARSE_TARGETS`: ``(description, measured ratio or None, passed)``."""
    by_L = {r["L"]: r for r in rows}
    out = []
    for desc, L, a, b, bound in SPARSE_TARGETS:
        r = by_L.get(L, {})
        x, y = r.get(a, {}).get("time_s"), r.get(b, {}).get("time_s")
        value = None if x is None or not y else x / y
        out.append((desc, value, value is not None and value <= bound))
    return out


def load_recorded_sparse(path: str | Path = RECORDED_SPARSE_CPU) -> tuple[dict, list[dict]]:
    """``(args, rows)`` of a run saved with ``--json``; the package ships the course's 2-core CPU run."""
    data = json.loads(Path(path).read_text())
    return data["args"], data["rows"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attn-course bench --suite sparse", description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--methods", nargs="+", choices=SPARSE_METHODS, default=list(SPARSE_METHODS))
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--block", type=int, default=128, help="tile size of flash and of the BlockMask")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per cell (the median is reported)")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads in each worker (0: default)")
    p.add_argument("--naive-max", type=int, default=4096, help="largest L for the naive path (memory)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement")
    p.add_argument("--json", metavar="PATH", help="also write the raw measurements as JSON")
    p.add_argument("--check", action="store_true", help="evaluate the CPU targets; exit 1 if one is missed")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        print(json.dumps(measure_sparse(**json.loads(args.worker))))
        return 0
    for name in ("window", "batch", "heads", "dim", "block", "repeats"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"attn-course bench --suite sparse: --{name} must be positive, got {getattr(args, name)}")
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    progress = None if args.quiet else (lambda msg: print(f"measuring {msg}", file=sys.stderr, flush=True))
    rows = run_sparse(lengths=args.lengths, methods=args.methods, naive_max=args.naive_max, timeout=args.timeout,
                      progress=progress, window=args.window, batch=args.batch, heads=args.heads, dim=args.dim,
                      block=args.block, device=args.device, repeats=args.repeats, threads=args.threads)
    print(f"causal sliding window W={args.window}, B={args.batch} H={args.heads} D={args.dim} float32 {args.device} "
          f"block={args.block}; forward; time: median of {args.repeats} after a warm-up; memory: peak extra "
          f"({'allocator peak' if args.device.startswith('cuda') else 'RSS rise, fresh process'})")
    print(format_sparse(rows))
    return finish(args, rows, check_sparse)


if __name__ == "__main__":
    sys.exit(main())
