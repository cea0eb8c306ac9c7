"""The one runner every benchmark suite uses: how a row is measured, the machine it ran on, the recording format.

A **suite** (:mod:`~attn_course.bench.attention`, :mod:`~attn_course.bench.sparse`, :mod:`~attn_course.bench.linear`) says which rows exist (e.g. one per
``(mode, causal, L)``), how to build each method's call for a row, how to print the table and which targets
to check. This module measures, records and checks, the same way for all three:

* **one fresh process per row** (``python -m attn_course.bench --worker …``), so nothing a previous row
  loaded or cached changes this one; a row whose process crashes or times out is measured again one
  method per process, so one method's failure costs only its own cell;
* in that process, for each method in turn: a first call (timed: ``first_call_s``, e.g. a compile), then the
  **peak extra memory** of one call — on CPU the rise of the resident set size after resetting the
  kernel's peak counter (Linux ``/proc/self/clear_refs``), with glibc told to ``mmap`` every block ≥ 64 KiB
  so that memory freed earlier is returned, not silently reused; on CUDA the caching allocator's peak
  above the inputs;
* then the **time** of every method of the row, measured together by :func:`attn_course.timing.compare`:
  ``--warmup`` untimed calls each, then ``--repeats`` (default 7) **interleaved rounds** (each round calls
  every method once, in rotated order, so a change in the machine's load hits all methods alike), at a
  **fixed thread count** (``--threads``, default 1), CUDA synchronised after every call. Each cell records
  its median and its spread (every round's time, the fastest and the slowest);
* the **machine** is recorded with the rows: CPU model, cores, torch version, threads, the CPU capability
  ATen dispatches to, the GPU if any, and the load average before and after the run (a busy machine
  shows there, not only in the spread).

Recording format (``--json PATH``; :func:`save_record` / :func:`load_record`)::

    {"format": 2, "suite": "attention" | "sparse" | "linear",
     "args": {...the suite's parameters: lengths, batch, heads, dim, dtype, device, repeats, warmup, threads...},
     "machine": {"cpu", "cores", "torch", "threads", "load_avg_start", "load_avg_end", ...},
     "rows": [{...the row's keys (e.g. "mode", "causal", "L")...,
               "<method>": {"time_s" (median), "times_s", "min_s", "max_s", "mem_bytes", "first_call_s", ...}
                           or {"error": "..."}}, ...]}
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

__all__ = ["Case", "Suite", "time_call", "median_time", "largest_tensor_created", "default_device",
           "measure_row", "measure_in_subprocess", "run_suite", "machine_info", "save_record", "load_record",
           "load_recorded", "evaluate_targets", "FORMAT"]

FORMAT = 2                                   # version of the recording format (the unversioned one was 1)


# ---------------------------------------------------------------------------------------------- small timers
def default_device() -> str:
    """``"cuda"`` when a CUDA GPU is available, else ``"cpu"``."""
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def time_call(fn, *, repeats: int = 7, warmup: int = 1, device=None) -> dict:
    """Wall-clock time of ``fn()``: ``warmup`` untimed calls, then ``repeats`` timed ones.

    Returns ``{"times_s": [...], "time_s": median, "min_s": fastest}``. With a CUDA ``device`` the GPU is
    synchronised before the clock starts and after every call (kernels run asynchronously). To compare
    methods, prefer :func:`attn_course.timing.compare` (interleaved rounds, fixed threads).
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


def median_time(fn, *args, repeats: int = 7, warmup: int = 1, device=None, **kwargs) -> float:
    """Median wall-clock seconds of ``fn(*args, **kwargs)`` (see :func:`time_call`: warm-up runs first,
    CUDA synchronised around every run)."""
    return time_call(lambda: fn(*args, **kwargs), repeats=repeats, warmup=warmup, device=device)["time_s"]


def largest_tensor_created(fn, *args, **kwargs) -> int:
    """Bytes of the largest tensor any op creates while ``fn(*args, **kwargs)`` runs (and, if its result
    requires grad, while ``result.sum().backward()`` runs). Deterministic, unlike RSS: it counts what the
    code asks for, whatever the allocator does with it."""
    import torch

    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        """The largest tensor any ATen op creates while active (autograd's backward included)."""
        largest = 0

        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):
                    self.largest = max(self.largest, t.numel() * t.element_size())
            return out

    with Largest() as watch:
        out = fn(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.sum().backward()
    return watch.largest


# ---------------------------------------------------------------------------------------------- memory
def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _glibc(name: str, *args) -> None:
    """Call glibc's ``name(*args)``; nothing where there is no glibc (macOS, Windows, musl)."""
    import ctypes
    import ctypes.util
    try:
        getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)(*args)
    except (OSError, AttributeError):
        pass


def _mallopt_mmap_threshold(nbytes: int) -> None:
    """glibc only: allocations of at least ``nbytes`` get their own mmap (returned to the OS on free)."""
    _glibc("mallopt", -3, int(nbytes))                                     # -3 = M_MMAP_THRESHOLD


def _malloc_trim() -> None:
    """glibc only: hand the heap's free pages back to the OS, so that an allocation the heap could serve
    from memory freed earlier (still resident) touches fresh pages and shows in the RSS rise. Without it a
    process that freed a large tensor before measures 0 bytes for a smaller one."""
    _glibc("malloc_trim", 0)


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


def _peak_extra_bytes(fn: Callable[[], object], device) -> int:
    """Peak extra memory of one ``fn()`` (already warmed up): allocator peak on CUDA, RSS rise on CPU
    (call :func:`_mallopt_mmap_threshold` with 64 KiB first, as :func:`measure_row` does)."""
    import torch
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated() - base)
    _malloc_trim()
    reset_ok = _reset_peak_rss()
    base = _rss_bytes()
    fn()
    return int(max(0, _peak_rss_bytes(reset_ok) - base))


# ---------------------------------------------------------------------------------------------- suites
@dataclass
class Case:
    """One method built for one row: ``fn()`` runs it once (CUDA synchronised by the runner); ``extra``
    goes into the cell as is (e.g. a mask's bytes); ``error()``, if given, returns the largest difference
    from a reference (recorded as ``max_err``)."""
    fn: Callable[[], object]
    extra: dict = field(default_factory=dict)
    error: Callable[[], float] | None = None


@dataclass(frozen=True)
class Suite:
    """What a benchmark suite defines; this module (:mod:`attn_course.bench.runner`) does the rest.

    ``rows(args)`` lists the row keys (dicts) of a run; ``build(method, row, args, device)`` returns a
    :class:`Case`; ``skip(method, row, args)`` a reason not to measure a cell (or None); ``check(rows)``
    evaluates the targets; ``format(rows)`` prints the table; ``quick``/``full``: default parameters of a
    ``make bench`` run and of the recorded run (``--full``); ``recorded``: the shipped recording;
    ``row_label(row)``: a row for progress lines; ``header(args)``: the line printed above the table."""
    name: str
    methods: tuple[str, ...]
    rows: Callable[[dict], list[dict]]
    build: Callable[..., Case]
    check: Callable[[list[dict]], list]
    format: Callable[[list[dict]], str]
    quick: dict
    full: dict
    recorded: Path
    row_label: Callable[[dict], str]
    header: Callable[[dict], str]
    skip: Callable[[str, dict, dict], str | None] = lambda method, row, args: None


def _suite(name: str) -> Suite:
    from . import SUITES
    return SUITES[name]


def _cell_error(exc: BaseException) -> dict:
    return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]}


def measure_row(suite: Suite | str, row: dict, methods, args: dict) -> dict:
    """Measure ``methods`` of one row in the *current* process (see the module docstring for the protocol):
    ``{method: cell}``. ``args``: the suite's parameters (``device``, ``repeats``, ``warmup``, ``threads``,
    ``seed`` and what ``build`` reads). Call it in a fresh process for a meaningful CPU memory figure."""
    import torch

    from ..timing import compare, num_threads
    suite = _suite(suite) if isinstance(suite, str) else suite
    repeats, warmup = int(args.get("repeats", 7)), int(args.get("warmup", 1))
    if repeats <= 0 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    device = args.get("device") or default_device()
    threads = int(args.get("threads", 1)) or None                  # 0: leave torch's default
    cuda = torch.device(device).type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cells, cases = {}, {}
    with num_threads(threads):
        if not cuda:
            _mallopt_mmap_threshold(64 * 1024)                      # every tensor block: its own mmap
        for m in methods:
            try:
                torch.manual_seed(int(args.get("seed", 0)))
                case = suite.build(m, row, args, device)
                t0 = time.perf_counter()
                case.fn()
                sync()
                first = time.perf_counter() - t0
                cell = {"first_call_s": first, **case.extra}
                if case.error is not None:
                    cell["max_err"] = float(case.error())
                cell["mem_bytes"] = _peak_extra_bytes(case.fn, device)
                cells[m], cases[m] = cell, case
            except Exception as exc:                                # noqa: BLE001 - recorded in the cell
                cells[m] = _cell_error(exc)
        if not cuda:
            _mallopt_mmap_threshold(32 * 2**20)                     # timing: glibc's usual reuse
        if cases:
            timings = compare({m: c.fn for m, c in cases.items()}, repeats=repeats, warmup=warmup,
                              threads=threads, device=device)
            for m, t in timings.items():
                cells[m].update(times_s=list(t.times_s), time_s=t.median_s, min_s=t.min_s, max_s=t.max_s)
    return cells


def measure_in_subprocess(module: str, method: str, timeout: float, **kw) -> dict:
    """Run ``python -m <module> --worker <json>`` (a fresh process) and return the JSON dict its last line
    prints, or an ``error`` entry after a crash or ``timeout`` seconds."""
    return _run_worker([sys.executable, "-m", module, "--worker", json.dumps({"method": method, **kw})],
                       timeout) or {"method": method}


def _run_worker(cmd: list[str], timeout: float) -> dict:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {res.returncode}: {tail}"[:300]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def _row_in_subprocess(suite: str, row: dict, methods, args: dict, timeout: float) -> dict:
    job = {"suite": suite, "row": row, "methods": list(methods), "args": args}
    out = _run_worker([sys.executable, "-m", "attn_course.bench", "--worker", json.dumps(job)], timeout)
    if "error" in out:
        return {m: dict(out) for m in methods}
    return out


def run_suite(suite: Suite | str, args: dict, *, methods=None, timeout: float = 900.0, progress=None,
              in_process: bool = False, on_row=None) -> list[dict]:
    """Every row of ``suite.rows(args)``, each measured in a fresh process (``in_process=True``: in this
    one, for tests). A row whose process fails is measured again one method per process. ``on_row(rows)``
    is called with the rows so far after each row (``attn-course bench --json`` saves them: a long run
    that is interrupted keeps its finished rows)."""
    suite = _suite(suite) if isinstance(suite, str) else suite
    methods = list(methods or suite.methods)
    rows = []
    for key in suite.rows(args):
        todo = [m for m in methods if suite.skip(m, key, args) is None]
        if progress:
            progress(f"{suite.name}: {suite.row_label(key)} ({', '.join(todo)})")
        if in_process:
            cells = measure_row(suite, key, todo, args)
        else:
            cells = _row_in_subprocess(suite.name, key, todo, args, timeout)
            if len(todo) > 1 and all("error" in c for c in cells.values()):
                cells = {m: _row_in_subprocess(suite.name, key, [m], args, timeout)[m] for m in todo}
        row = dict(key)
        for m in methods:
            reason = suite.skip(m, key, args)
            row[m] = {"method": m, "error": reason} if reason else {"method": m, **cells[m]}
        rows.append(row)
        if on_row:
            on_row(rows)
    return rows


def worker_main(job_json: str) -> int:
    job = json.loads(job_json)
    print(json.dumps(measure_row(job["suite"], job["row"], job["methods"], job["args"])))
    return 0


# ---------------------------------------------------------------------------------------------- records
def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_info(device: str = "cpu", threads: int | None = None) -> dict:
    """What the numbers depend on: CPU model, cores, torch and Python versions, the thread count, ATen's CPU
    capability, the GPU (if ``device`` is CUDA), the date and the load average (1, 5, 15 min) now."""
    import torch
    info = {"cpu": _cpu_model(), "cores": os.cpu_count(),
            "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(), "device": device,
            "threads": threads if threads else torch.get_num_threads(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    with contextlib.suppress(OSError, AttributeError):
        info["load_avg_start"] = [round(x, 2) for x in os.getloadavg()]
    return info


def describe_machine(machine: dict) -> str:
    """One line: ``cpu (N cores), torch X, T thread(s), load average a → b``."""
    if not machine:
        return "machine not recorded"
    load = ""
    if "load_avg_start" in machine:
        load = f", load average {machine['load_avg_start'][0]:.1f}"
        if "load_avg_end" in machine:
            load += f" → {machine['load_avg_end'][0]:.1f}"
    gpu = f", {machine['gpu']}" if machine.get("gpu") else ""
    return (f"{machine.get('cpu', '?')} ({machine.get('cores', '?')} cores){gpu}, torch {machine.get('torch', '?')}, "
            f"{machine.get('threads', '?')} thread(s){load}")


def save_record(path: str | Path, suite: str, args: dict, machine: dict, rows: list[dict]) -> None:
    """Write a run in the recording format (see the module docstring)."""
    data = {"format": FORMAT, "suite": suite, "args": args, "machine": machine, "rows": rows}
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def load_record(path: str | Path) -> dict:
    """A recording as a dict with ``format``, ``suite``, ``args``, ``machine`` and ``rows`` (a file written
    before the format was versioned reads as format 1 with an empty ``machine``)."""
    data = json.loads(Path(path).read_text())
    data.setdefault("format", 1)
    data.setdefault("machine", {})
    data.setdefault("suite", None)
    return data


def load_recorded(path: str | Path) -> tuple[dict, list[dict]]:
    """``(args, rows)`` of a recording: what a lesson prints instead of measuring again (each suite ships the
    course's reference run, ``Suite.recorded``)."""
    data = load_record(path)
    return data["args"], data["rows"]


def evaluate_targets(targets, flat: dict) -> list[tuple[str, float | None, bool]]:
    """``targets``: ``(description, row key, metric, low, high)``; ``flat``: row key → the table's columns.
    Returns ``(description, measured value or None, passed)``; a row not measured never passes."""
    out = []
    for desc, key, metric, lo, hi in targets:
        value = flat.get(key, {}).get(metric)
        ok = value is not None and (lo is None or value >= lo) and (hi is None or value <= hi)
        out.append((desc, value, ok))
    return out


def method_columns(row: dict, methods) -> dict:
    """``"<m> ms"`` (median) and ``"<m> MiB"`` (peak extra) of every method of a row; None where not measured."""
    t = {}
    for m in methods:
        cell = row.get(m, {})
        t[f"{m} ms"] = None if "time_s" not in cell else cell["time_s"] * 1e3
        t[f"{m} MiB"] = None if "mem_bytes" not in cell else cell["mem_bytes"] / 2**20
    return t


def markdown_table(columns, flat_rows: list[dict], rows: list[dict], methods, label, ratio_digits: int = 2) -> str:
    """A Markdown table of ``flat_rows`` (one dict of ``columns`` per row: ratios (``/``) with ``ratio_digits``,
    growth factors (``×``) with 2, times and sizes with 0 or 1 digit), then one "not measured" line per cell
    of ``rows`` that holds an error (``label(row)`` names the row)."""
    def fmt(col, x):
        if x is None:
            return "—"
        if col == "causal":
            return "yes" if x else "no"
        if isinstance(x, float):
            if "×" in col:
                return f"{x:.2f}"
            return f"{x:.{ratio_digits}f}" if "/" in col else f"{x:.0f}" if x >= 10 else f"{x:.1f}"
        return str(x)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(c, t[c]) for c in columns) + " |" for t in flat_rows]
    errors = [f"{label(r)} {m}: {r[m]['error']}" for r in rows for m in methods if "error" in r.get(m, {})]
    return "\n".join(lines + [f"\nnot measured: {e}" for e in errors])


def spread(rows: list[dict], methods) -> tuple[float, str] | None:
    """The largest slowest/fastest ratio of any measured cell, and where it was (how noisy the run was)."""
    worst = None
    for r in rows:
        for m in methods:
            c = r.get(m, {})
            if c.get("min_s") and c.get("max_s"):
                x = c["max_s"] / c["min_s"]
                if worst is None or x > worst[0]:
                    where = ", ".join(f"{k}={v}" for k, v in r.items() if not isinstance(v, dict))
                    worst = (x, f"{m} at {where}")
    return worst
