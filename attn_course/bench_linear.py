"""``attn-course bench --suite linear``: linear attention vs SDPA vs textbook softmax attention, in one run.

Same method as :mod:`attn_course.bench` (whose measuring helpers it reuses): every cell runs in a
**fresh Python process**; time = median of ``--repeats`` runs after a warm-up; peak extra memory = the
rise of the resident set size during one run (glibc told to ``mmap`` every block ≥ 64 KiB, so freed
memory is not silently reused), or the allocator's peak on CUDA.

Methods, all forward only (``torch.no_grad``), inputs ``(B, H, L, E)``:

* ``linear`` — :func:`attn_course.linear_attention` (φ = elu + 1; causal: the chunked scan);
* ``sdpa`` — ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels, no L × L matrix);
* ``naive`` — softmax attention that materialises **one** ``(B, H, L, L)`` score matrix and does the
  mask, the softmax and the scaling in place on it — the leanest textbook version, so the memory
  comparison with ``linear`` is not flattered by avoidable copies.

Usage: ``attn-course bench --suite linear [--lengths 1024 2048 4096 8192] [--causal both] [--repeats 7]``
(also ``python -m attn_course.bench_linear``). ``--check`` evaluates the lesson-10 CPU targets (exit 1 if
one is missed); ``--json PATH`` records the run (the course ships one: :data:`RECORDED_CPU`).
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

__all__ = ["main", "measure", "run_benchmark", "table_rows", "format_table", "check_targets", "load_recorded",
           "RECORDED_CPU", "METHODS", "TARGETS"]

METHODS = ("linear", "sdpa", "naive")
COLUMNS = ("causal", "L", "linear ms", "sdpa ms", "naive ms", "linear MiB", "sdpa MiB", "naive MiB",
           "linear/sdpa time", "linear/naive mem", "linear time ×prev L")

# (description, causal, L, metric, bound) — the CPU targets of lesson 10
TARGETS = (
    ("non-causal, L=8192: linear time <= 0.2x SDPA", False, 8192, "linear/sdpa time", 0.2),
    ("non-causal: linear time grows <= 2.5x from L=4096 to L=8192", False, 8192, "linear time ×prev L", 2.5),
    ("causal, L=8192: linear peak extra memory <= 10% of naive", True, 8192, "linear/naive mem", 0.10),
)


def _naive(q, k, v, is_causal):
    import torch
    L = q.shape[-2]
    S = q @ k.transpose(-2, -1)                                            # (B, H, L, L): the one big matrix
    S.mul_(1.0 / math.sqrt(q.shape[-1]))
    if is_causal:
        S.masked_fill_(~torch.ones(L, L, dtype=torch.bool, device=q.device).tril(), -math.inf)
    S.sub_(S.amax(-1, keepdim=True)).exp_()                                # softmax, in place
    S.div_(S.sum(-1, keepdim=True))
    return S @ v


def _method(name: str):
    import torch.nn.functional as F

    from .linear import linear_attention
    return {"linear": lambda q, k, v, c: linear_attention(q, k, v, is_causal=c),
            "sdpa": lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c),
            "naive": _naive}[name]


def measure(method: str, *, L: int, causal: bool = False, batch: int = 1, heads: int = 8, dim: int = 64,
            dtype: str = "float32", device: str = "cpu", repeats: int = 7, threads: int = 0, seed: int = 0) -> dict:
    """Measure one method in the *current* process: ``{"times_s", "time_s" (median), "mem_bytes"}``.
    Call it in a fresh process (as :func:`run_benchmark` does) for a meaningful memory figure."""
    import torch
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        torch.manual_seed(seed)
        fn = _method(method)
        dev, dt = torch.device(device), getattr(torch, dtype)
        q, k, v = (torch.randn(batch, heads, L, dim, device=dev, dtype=dt) for _ in range(3))
        cuda = dev.type == "cuda"

        def run():
            with torch.no_grad():
                fn(q, k, v, causal)
            if cuda:
                torch.cuda.synchronize()

        if cuda:
            run()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            run()
            mem = torch.cuda.max_memory_allocated() - base
        else:
            _mallopt_mmap_threshold(64 * 1024)
            run()                                                          # warm-up
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
    finally:
        torch.set_num_threads(previous)
    return {"method": method, "L": L, "causal": causal, "times_s": times, "time_s": statistics.median(times),
            "mem_bytes": int(mem)}


def _measure_in_subprocess(method: str, timeout: float, **kw) -> dict:
    return measure_in_subprocess("attn_course.bench_linear", method, timeout, **kw)


def run_benchmark(*, lengths=(1024, 2048, 4096, 8192), causal=(False, True), methods=METHODS,
                  timeout: float = 600.0, progress=None, **kw) -> list[dict]:
    """One row per (causal, L), each cell measured in its own fresh process; ``kw`` goes to :func:`measure`."""
    rows = []
    for c in causal:
        for L in lengths:
            row = {"causal": c, "L": L}
            for m in methods:
                if progress:
                    progress(f"causal={c!s:5s} L={L:5d} {m}")
                row[m] = _measure_in_subprocess(m, timeout, L=L, causal=c, **kw)
            rows.append(row)
    return rows


def _get(row, m, key):
    return row.get(m, {}).get(key)


def table_rows(rows: list[dict]) -> list[dict]:
    """Flatten measurements into the table's columns (ms, MiB, ratios; None where not measured)."""
    out, prev = [], {}
    for r in rows:
        t = {"causal": r["causal"], "L": r["L"]}
        for m in METHODS:
            s, b = _get(r, m, "time_s"), _get(r, m, "mem_bytes")
            t[f"{m} ms"] = None if s is None else s * 1e3
            t[f"{m} MiB"] = None if b is None else b / 2**20
        lin, sd, nv = _get(r, "linear", "time_s"), _get(r, "sdpa", "time_s"), _get(r, "naive", "mem_bytes")
        t["linear/sdpa time"] = lin / sd if lin is not None and sd else None
        lm = _get(r, "linear", "mem_bytes")
        t["linear/naive mem"] = lm / nv if lm is not None and nv else None
        p = prev.get(r["causal"])                                          # previous row with the same causal
        t["linear time ×prev L"] = (lin / p[1] if lin is not None and p and p[1] and r["L"] == 2 * p[0] else None)
        prev[r["causal"]] = (r["L"], lin)
        out.append(t)
    return out


def format_table(rows: list[dict]) -> str:
    """A Markdown table of :func:`run_benchmark`'s rows."""
    def fmt(col, x):
        if x is None:
            return "—"
        if col == "causal":
            return "yes" if x else "no"
        if isinstance(x, float):
            return f"{x:.3f}" if "/" in col else f"{x:.2f}" if "×" in col else f"{x:.0f}" if x >= 10 else f"{x:.1f}"
        return str(x)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for t in table_rows(rows):
        lines.append("| " + " | ".join(fmt(c, t[c]) for c in COLUMNS) + " |")
    errors = [f"causal={r['causal']} L={r['L']} {m}: {r[m]['error']}"
              for r in rows for m in METHODS if "error" in r.get(m, {})]
    return "\n".join(lines + [f"\nnot measured: {e}" for e in errors])


def check_targets(rows: list[dict]) -> list[tuple[str, float | None, bool]]:
    """Evaluate :data:`TARGETS`: ``(description, measured value or None, passed)``."""
    flat = {(t["causal"], t["L"]): t for t in table_rows(rows)}
    results = []
    for desc, causal, L, metric, bound in TARGETS:
        value = flat.get((causal, L), {}).get(metric)
        results.append((desc, value, value is not None and value <= bound))
    return results


RECORDED_CPU = Path(__file__).resolve().parent / "data" / "bench_linear_cpu_2core.json"


def load_recorded(path: str | Path = RECORDED_CPU) -> tuple[dict, list[dict]]:
    """``(args, rows)`` of a run saved with ``attn-course bench --suite linear --json PATH``."""
    data = json.loads(Path(path).read_text())
    return data["args"], data["rows"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attn-course bench --suite linear", description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per cell (the median is reported)")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads in each worker (0: default)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per measurement")
    p.add_argument("--json", metavar="PATH", help="also write the raw measurements as JSON")
    p.add_argument("--check", action="store_true", help="evaluate the CPU targets; exit 1 if one is missed")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        print(json.dumps(measure(**json.loads(args.worker))))
        return 0
    for name in ("batch", "heads", "dim", "repeats"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"attn-course bench --suite linear: --{name} must be positive, got {getattr(args, name)}")
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    causal = {"no": (False,), "yes": (True,), "both": (False, True)}[args.causal]
    progress = None if args.quiet else (lambda msg: print(f"measuring {msg}", file=sys.stderr, flush=True))
    rows = run_benchmark(lengths=args.lengths, causal=causal, methods=args.methods, timeout=args.timeout,
                         progress=progress, batch=args.batch, heads=args.heads, dim=args.dim, dtype=args.dtype,
                         device=args.device, repeats=args.repeats, threads=args.threads)
    print(f"B={args.batch} H={args.heads} E={args.dim} {args.dtype} {args.device}; forward; time: median of "
          f"{args.repeats}; memory: peak extra "
          f"({'allocator peak' if args.device.startswith('cuda') else 'RSS rise, fresh process'})")
    print(format_table(rows))
    return finish(args, rows, check_targets)


if __name__ == "__main__":
    sys.exit(main())
