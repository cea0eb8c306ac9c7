"""``attn-course bench``: naive attention vs ``flash_attention`` vs SDPA, side by side, in one run.

Every cell of the table is measured in a **fresh Python process**, so one method's allocator caches
never flatter or penalise another's:

* time: median of ``--repeats`` runs (default 7), after ``--warmup`` untimed runs of the same size
  (default 1) and the memory run; on CUDA every run ends with ``torch.cuda.synchronize()``;
* peak extra memory: on CPU the rise of the process's resident set size (RSS) during one run — after a
  warm-up run of the same size (so lazily loaded code and JIT-compiled kernels are not counted), the
  peak-RSS counter (``VmHWM``) is reset via ``/proc/self/clear_refs`` (Linux; ``ru_maxrss`` elsewhere)
  and the baseline is the RSS with the inputs allocated. During that run glibc's malloc is told to
  serve every block ≥ 64 KiB with its own ``mmap`` (``mallopt``), so memory freed by the warm-up is not
  silently reused and every tensor shows up in RSS. On CUDA it is the caching allocator's peak
  (``torch.cuda.max_memory_allocated``) above the inputs.

"naive" is the three-line textbook computation ``softmax(Q Kᵀ · scale) V`` (with the causal mask filled
in place), which materialises the ``L × L`` scores and weights; "flash" is :func:`attn_course.flash_attention`
(tiles ``--block`` × ``--block``); "sdpa" is ``torch.nn.functional.scaled_dot_product_attention``, which
on CPU and CUDA dispatches to fused kernels that do not store the matrix either (``--sdpa-backend``
pins one of them with ``torch.nn.attention.sdpa_kernel``: flash, efficient, cudnn or math).

Device and dtype: ``--device`` defaults to CUDA when available; ``--dtype`` defaults to float16 on CUDA
(the FLASH backend has no fp32 kernel) and float32 on CPU.

Run it on a quiet machine. On a busy one, OpenMP threads that spin-wait for each other stall every op,
which hurts the tiled loop's many small ops most; ``OMP_WAIT_POLICY=PASSIVE attn-course bench …`` (or
``--threads 1``) is then fairer to all three methods, at some cost on a quiet machine.

Usage: ``attn-course bench [--lengths 512 1024 ...] [--modes fwd fwd+bwd] [--causal both] [--repeats 7]``
(also ``python -m attn_course.bench``). ``--check`` evaluates the course's CPU targets and exits 1 if one
is missed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["main", "measure", "largest_tensor_created", "run_benchmark", "format_table", "check_targets",
           "load_recorded", "RECORDED_CPU", "METHODS", "TARGETS", "time_call", "median_time", "default_device",
           "finish", "measure_in_subprocess",
           "SDPA_BACKENDS"]

METHODS = ("naive", "flash", "sdpa")
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")     # torch.nn.attention.SDPBackend members, by short name
COLUMNS = ("mode", "causal", "L", "naive ms", "flash ms", "sdpa ms", "naive MiB", "flash MiB", "sdpa MiB",
           "flash/naive time", "flash/sdpa time", "flash/naive mem")

# (description, mode, causal, L, metric, bound) — the CPU targets of the FlashAttention lesson
TARGETS = (
    ("forward, L=4096: flash memory <= 5% of naive", "fwd", False, 4096, "flash/naive mem", 0.05),
    ("forward, L=4096: flash time <= 1.0x naive", "fwd", False, 4096, "flash/naive time", 1.0),
    ("forward, L=4096: flash time <= 2x SDPA", "fwd", False, 4096, "flash/sdpa time", 2.0),
    ("causal forward, L=4096: flash time <= 0.5x naive", "fwd", True, 4096, "flash/naive time", 0.5),
    ("forward+backward, L=2048: flash memory <= 20% of naive", "fwd+bwd", False, 2048, "flash/naive mem", 0.20),
)


def _naive(q, k, v, is_causal):
    import torch
    S = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))          # (B, H, L, L)
    if is_causal:
        L = q.shape[-2]
        S = S.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=q.device).tril(), -math.inf)
    return torch.softmax(S, dim=-1) @ v                                    # (B, H, L, D)


def _method(name: str, block: int, sdpa_backend: str | None = None):
    import torch.nn.functional as F

    from .flash import flash_attention

    def sdpa(q, k, v, c):
        if sdpa_backend is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=c)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                   "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[sdpa_backend]
        with sdpa_kernel(backend):                   # RuntimeError if that kernel cannot run these inputs
            return F.scaled_dot_product_attention(q, k, v, is_causal=c)

    return {"naive": _naive,
            "flash": lambda q, k, v, c: flash_attention(q, k, v, is_causal=c, block_q=block, block_k=block),
            "sdpa": sdpa}[name]


def default_device() -> str:
    """``"cuda"`` when a CUDA GPU is available, else ``"cpu"``."""
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def time_call(fn, *, repeats: int = 7, warmup: int = 1, device=None) -> dict:
    """Wall-clock time of ``fn()``: ``warmup`` untimed calls, then ``repeats`` timed ones.

    Returns ``{"times_s": [...], "time_s": median, "min_s": fastest}``. With a CUDA ``device`` the GPU is
    synchronised before the clock starts and after every call (kernels run asynchronously). Report the
    median, and compare methods by the ratio of medians measured in the same run.
    """
    import torch
    if repeats <= 0 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    cuda = device is not None and torch.device(device).type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return {"times_s": times, "time_s": statistics.median(times), "min_s": min(times)}


def largest_tensor_created(fn, *args, **kwargs) -> int:
    """Bytes of the largest tensor any op creates while ``fn(*args, **kwargs)`` runs (and, if its result
    requires grad, while ``result.sum().backward()`` runs). Deterministic, unlike RSS: it counts what the
    code asks for, whatever the allocator does with it."""
    import torch

    from .grading.guard import TensorWatch              # the same counter guards the tiling exercises

    with TensorWatch() as watch:
        out = fn(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.sum().backward()
    return watch.largest_bytes


def median_time(fn, *args, repeats: int = 7, warmup: int = 1, device=None, **kwargs) -> float:
    """Median wall-clock seconds of ``fn(*args, **kwargs)`` (see :func:`time_call`: warm-up runs first,
    CUDA synchronised around every run)."""
    return time_call(lambda: fn(*args, **kwargs), repeats=repeats, warmup=warmup, device=device)["time_s"]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _mallopt_mmap_threshold(nbytes: int) -> None:
    """glibc only: allocations of at least ``nbytes`` get their own mmap (returned to the OS on free)."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, int(nbytes))                                      # -3 = M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (Linux ≥ 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes(reset_ok: bool) -> int:
    if reset_ok:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024       # Linux reports KiB


def measure(method: str, *, L: int, mode: str = "fwd", causal: bool = False, batch: int = 1, heads: int = 8,
            dim: int = 64, block: int = 128, dtype: str | None = None, device: str | None = None,
            repeats: int = 7, warmup: int = 1, threads: int = 0, seed: int = 0,
            sdpa_backend: str | None = None) -> dict:
    """Measure one method in the *current* process.

    Returns ``{"method", "L", "mode", "causal", "device", "dtype", "times_s": [...], "time_s": median,
    "mem_bytes": peak extra}``. ``device`` defaults to :func:`default_device`; ``dtype`` to ``"float16"`` on
    CUDA and ``"float32"`` on CPU. ``warmup`` untimed runs come first, then one run that measures memory
    (CPU: RSS rise; CUDA: allocator peak above the inputs), then ``repeats`` timed runs (median reported).
    ``sdpa_backend`` (one of :data:`SDPA_BACKENDS`) pins SDPA's kernel. Call it in a fresh process (as
    :func:`run_benchmark` does) for a meaningful CPU memory figure.
    """
    import torch
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if sdpa_backend is not None and sdpa_backend not in SDPA_BACKENDS:
        raise ValueError(f"sdpa_backend must be one of {SDPA_BACKENDS} or None, got {sdpa_backend!r}")
    if repeats <= 0 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    device = default_device() if device is None else str(device)
    if dtype is None:
        dtype = "float16" if torch.device(device).type == "cuda" else "float32"
    previous_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _measure(method, L, mode, causal, batch, heads, dim, block, dtype, device, repeats, warmup, seed,
                        sdpa_backend)
    finally:
        torch.set_num_threads(previous_threads)


def _measure(method, L, mode, causal, batch, heads, dim, block, dtype, device, repeats, warmup, seed,
             sdpa_backend) -> dict:
    import torch
    torch.manual_seed(seed)
    fn = _method(method, block, sdpa_backend)
    dev, dt = torch.device(device), getattr(torch, dtype)
    backward = mode == "fwd+bwd"
    q, k, v = (torch.randn(batch, heads, L, dim, device=dev, dtype=dt, requires_grad=backward) for _ in range(3))
    grad = torch.randn(batch, heads, L, dim, device=dev, dtype=dt)
    cuda = dev.type == "cuda"

    def run():
        if backward:
            out = fn(q, k, v, causal)
            out.backward(grad)
            q.grad = k.grad = v.grad = None
        else:
            with torch.no_grad():
                fn(q, k, v, causal)
        if cuda:
            torch.cuda.synchronize()

    if cuda:
        for _ in range(max(1, warmup)):
            run()                                                          # warm-up (kernels, cuBLAS handles)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        run()
        mem = torch.cuda.max_memory_allocated(dev) - base
    else:
        _mallopt_mmap_threshold(64 * 1024)                                 # every tensor block: own mmap
        for _ in range(max(1, warmup)):
            run()                                                          # warm-up: code pages, JIT kernels
        reset_ok = _reset_peak_rss()
        base = _rss_bytes()
        run()
        mem = max(0, _peak_rss_bytes(reset_ok) - base)
        _mallopt_mmap_threshold(32 * 2**20)                                # timing: glibc's usual reuse
    timing = time_call(run, repeats=repeats, warmup=0 if cuda else 1)      # CPU: one run at the usual malloc
    return {"method": method, "L": L, "mode": mode, "causal": causal, "device": str(dev), "dtype": dtype,
            "times_s": timing["times_s"], "time_s": timing["time_s"], "mem_bytes": int(mem)}


def measure_in_subprocess(module: str, method: str, timeout: float, **kw) -> dict:
    """Run ``python -m <module> --worker <json>`` (a fresh process, so allocator caches and lazily loaded
    code never leak between cells) and return the JSON dict its last line prints, or an ``error`` entry
    after a crash or ``timeout`` seconds. Every benchmark suite measures its cells this way."""
    cmd = [sys.executable, "-m", module, "--worker", json.dumps({"method": method, **kw})]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"method": method, "error": f"timed out after {timeout:.0f} s"}
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return {"method": method, "error": f"exit {res.returncode}: {tail}"}
    return json.loads(res.stdout.strip().splitlines()[-1])


def _measure_in_subprocess(method: str, timeout: float, **kw) -> dict:
    return measure_in_subprocess("attn_course.bench", method, timeout, **kw)


def run_benchmark(*, lengths=(512, 1024, 2048, 4096, 8192), modes=("fwd", "fwd+bwd"), causal=(False, True),
                  methods=METHODS, timeout: float = 600.0, progress=None, **kw) -> list[dict]:
    """One table row per (mode, causal, L), each cell measured in its own fresh process.

    ``kw`` goes to :func:`measure` (batch, heads, dim, block, dtype, device, repeats, warmup, threads,
    sdpa_backend).
    ``progress(msg)`` is called before each measurement when given.
    """
    rows = []
    for mode in modes:
        for c in causal:
            for L in lengths:
                row = {"mode": mode, "causal": c, "L": L}
                for m in methods:
                    if progress:
                        progress(f"{mode:7s} causal={c!s:5s} L={L:5d} {m}")
                    row[m] = _measure_in_subprocess(m, timeout, L=L, mode=mode, causal=c, **kw)
                rows.append(row)
    return rows


def _ratio(row, a, b, key):
    x, y = row.get(a, {}).get(key), row.get(b, {}).get(key)
    return None if x is None or not y else x / y


def table_rows(rows: list[dict]) -> list[dict]:
    """Flatten measurements into the table's columns (ms, MiB, ratios; None where not measured)."""
    out = []
    for r in rows:
        t = {"mode": r["mode"], "causal": r["causal"], "L": r["L"]}
        for m in METHODS:
            cell = r.get(m, {})
            t[f"{m} ms"] = None if "time_s" not in cell else cell["time_s"] * 1e3
            t[f"{m} MiB"] = None if "mem_bytes" not in cell else cell["mem_bytes"] / 2**20
        t["flash/naive time"] = _ratio(r, "flash", "naive", "time_s")
        t["flash/sdpa time"] = _ratio(r, "flash", "sdpa", "time_s")
        t["flash/naive mem"] = _ratio(r, "flash", "naive", "mem_bytes")
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
            return f"{x:.2f}" if "/" in col else f"{x:.0f}" if x >= 10 else f"{x:.1f}"
        return str(x)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for t in table_rows(rows):
        lines.append("| " + " | ".join(fmt(c, t[c]) for c in COLUMNS) + " |")
    errors = [f"{r['mode']} causal={r['causal']} L={r['L']} {m}: {r[m]['error']}"
              for r in rows for m in METHODS if "error" in r.get(m, {})]
    return "\n".join(lines + [f"\nnot measured: {e}" for e in errors])


RECORDED_CPU = Path(__file__).resolve().parent / "data" / "bench_cpu_2core.json"


def load_recorded(path: str | Path = RECORDED_CPU) -> tuple[dict, list[dict]]:
    """``(args, rows)`` of a run saved with ``attn-course bench --json PATH``. The package ships the course's
    reference run on a 2-core CPU (:data:`RECORDED_CPU`), so a lesson can print measured numbers without
    spending minutes measuring them again."""
    data = json.loads(Path(path).read_text())
    return data["args"], data["rows"]


def check_targets(rows: list[dict]) -> list[tuple[str, float | None, bool]]:
    """Evaluate :data:`TARGETS` on the measured rows: ``(description, measured ratio or None, passed)``."""
    flat = {(t["mode"], t["causal"], t["L"]): t for t in table_rows(rows)}
    results = []
    for desc, mode, causal, L, metric, bound in TARGETS:
        value = flat.get((mode, causal, L), {}).get(metric)
        results.append((desc, value, value is not None and value <= bound))
    return results


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attn-course bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    p.add_argument("--modes", nargs="+", choices=["fwd", "fwd+bwd"], default=["fwd", "fwd+bwd"])
    p.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--block", type=int, default=128, help="flash tile size (block_q = block_k)")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                   help="default: float16 on CUDA, float32 on CPU")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per cell (the median is reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per cell before measuring")
    p.add_argument("--sdpa-backend", choices=SDPA_BACKENDS, default=None,
                   help="pin SDPA's kernel with torch.nn.attention.sdpa_kernel (default: let SDPA choose)")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads in each worker (0: default)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per measurement")
    p.add_argument("--json", metavar="PATH", help="also write the raw measurements as JSON")
    p.add_argument("--check", action="store_true", help="evaluate the CPU targets; exit 1 if one is missed")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p


def finish(args, rows: list[dict], check) -> int:
    """The common end of every suite's ``main``: write ``--json`` (the arguments and rows), and with
    ``--check`` print PASS/FAIL per target (``check(rows) -> [(description, value, ok)]``); exit status."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "worker"}, "rows": rows}, f, indent=1)
    if args.check:
        results = check(rows)
        print()
        for desc, value, ok in results:
            print(f"{'PASS' if ok else 'FAIL'}  {desc}  (measured {'—' if value is None else f'{value:.3f}'})")
        return 0 if all(ok for _, _, ok in results) else 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.worker:
        print(json.dumps(measure(**json.loads(args.worker))))
        return 0
    for name in ("batch", "heads", "dim", "block", "repeats"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"attn-course bench: --{name} must be positive, got {getattr(args, name)}")
    if args.warmup < 0:
        raise SystemExit(f"attn-course bench: --warmup must be >= 0, got {args.warmup}")
    if args.device is None:
        args.device = default_device()
    if args.dtype is None:
        args.dtype = "float16" if args.device.startswith("cuda") else "float32"
    causal = {"no": (False,), "yes": (True,), "both": (False, True)}[args.causal]
    progress = None if args.quiet else (lambda msg: print(f"measuring {msg}", file=sys.stderr, flush=True))
    rows = run_benchmark(lengths=args.lengths, modes=args.modes, causal=causal, methods=args.methods,
                         timeout=args.timeout, progress=progress, batch=args.batch, heads=args.heads,
                         dim=args.dim, block=args.block, dtype=args.dtype, device=args.device,
                         repeats=args.repeats, warmup=args.warmup, threads=args.threads,
                         sdpa_backend=args.sdpa_backend)
    sdpa = f" sdpa backend={args.sdpa_backend}" if args.sdpa_backend else ""
    print(f"B={args.batch} H={args.heads} D={args.dim} {args.dtype} {args.device} block={args.block}{sdpa}; "
          f"time: median of {args.repeats} after {args.warmup} warm-up; memory: peak extra "
          f"({'allocator peak' if args.device.startswith('cuda') else 'RSS rise, fresh process'})")
    print(format_table(rows))
    return finish(args, rows, check_targets)


if __name__ == "__main__":
    sys.exit(main())
