"""``attn-course bench --suite notebooks``: how long each notebook takes to run, recorded with the machine.

Every notebook (default: ``notebooks/`` and ``exercises/`` of the checkout; ``--solutions`` adds
``solutions/``) is executed headless with ``nbclient`` (a fresh kernel each, as "Restart & Run All" does;
``nbclient`` is in the ``dev`` extra), in the notebook's folder. Each row records the wall time from starting the
kernel to the last cell's end (the kernel's start included, and recorded separately; its shutdown after the
last cell recorded apart), the cells, and the load average before and after; the run records the machine
(CPU model, cores and the cores this process may use, torch, the threads torch uses by default, the load
average). The recording is saved after every notebook to ``attn_course/data/notebook_times.json``
(``--taskset-one-core``: ``notebook_times_one_core.json``; ``--json PATH`` elsewhere); a table is printed.

``--rounds N`` runs the whole list N times, interleaved (every notebook once, then again), so that a
slow minute of a shared machine falls on one round of each notebook, not on every round of one: a row then
records each round (``rounds``: wall and kernel-start times, loads) and its ``wall_s`` is their median, as the
other suites report medians of interleaved repeats.

``--taskset-one-core`` pins the run and every kernel it starts to CPU 0 (``os.sched_setaffinity``, inherited
by the kernels: the same as ``taskset -c 0 attn-course bench --suite notebooks``), which stands in for a
slower machine: torch then uses one thread. ``--check`` compares with the course's bars: a lesson
≤ 30 s (≤ 60 s at most), an exercise notebook ≤ 15 s.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

__all__ = ["RECORDED_NOTEBOOKS", "RECORDED_NOTEBOOKS_ONE_CORE", "TARGETS", "find_notebooks", "run_notebook",
           "run_notebooks", "format_notebooks", "check_notebooks"]

_DATA = Path(__file__).resolve().parents[1] / "data"
RECORDED_NOTEBOOKS = _DATA / "notebook_times.json"
RECORDED_NOTEBOOKS_ONE_CORE = _DATA / "notebook_times_one_core.json"

# (description, folder, seconds): every notebook of the folder at most that long (issue 42; the bar is 60 s)
TARGETS = (("lessons (notebooks/) <= 30 s each", "notebooks", 30.0),
           ("lessons (notebooks/) <= 60 s each (the bar)", "notebooks", 60.0),
           ("exercises (exercises/) <= 15 s each", "exercises", 15.0))


def find_notebooks(root: str | Path, *, solutions: bool = False) -> list[Path]:
    """The numbered notebooks of ``root``'s ``notebooks/`` and ``exercises/`` (and ``solutions/``), in order."""
    root = Path(root)
    folders = ("notebooks", "exercises", "solutions") if solutions else ("notebooks", "exercises")
    return [p for f in folders for p in sorted((root / f).glob("[0-9][0-9]_*.ipynb"))]


def _load() -> list[float] | None:
    with contextlib.suppress(OSError, AttributeError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


def run_notebook(path: str | Path, *, timeout: float = 600.0, kernel_name: str = "python3") -> dict:
    """Execute one notebook headless in a fresh kernel (its outputs are not saved) and time it:
    ``{"wall_s", "kernel_start_s", "shutdown_s", "cells", "load_avg_before", "load_avg_after"}``, plus
    ``"error"`` (the first line of the failing cell's error) if a cell raised or ran past ``timeout`` seconds.
    ``wall_s`` runs from starting the kernel to the end of the last cell: what Restart & Run All makes a learner
    wait. The kernel's shutdown after it (seconds for a lesson's kernel: the interpreter's exit after
    torch) is not part of that wait and is recorded apart, ``shutdown_s``."""
    import nbformat
    from nbclient import NotebookClient
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name,
                            resources={"metadata": {"path": str(path.parent)}})
    row = {"load_avg_before": _load(), "cells": sum(c.cell_type == "code" for c in nb.cells)}
    t0 = t_cells = time.perf_counter()
    try:
        with client.setup_kernel():
            row["kernel_start_s"] = round(time.perf_counter() - t0, 3)
            try:
                for index, cell in enumerate(nb.cells):
                    client.execute_cell(cell, index)
            finally:
                t_cells = time.perf_counter()             # the last cell's end (or the failing cell's)
    except Exception as exc:                                      # noqa: BLE001 - recorded in the row
        row["error"] = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[-1]}"[:300]
    t_done = time.perf_counter()
    row["wall_s"] = round((t_cells if "kernel_start_s" in row else t_done) - t0, 3)
    row["shutdown_s"] = round(t_done - t_cells, 3) if "kernel_start_s" in row else None
    row["load_avg_after"] = _load()
    return row


def run_notebooks(paths, *, root: str | Path, timeout: float = 600.0, one_core: bool = False,
                  path: str | Path | None = None, progress=None, rounds: int = 1) -> dict:
    """Time every notebook of ``paths`` (one after the other; ``rounds`` times, interleaved), recording after
    each run to ``path``. Returns the recording: ``{"format", "suite": "notebooks", "args", "machine", "rows"}``;
    a row's ``notebook`` is relative to ``root``; with ``rounds`` > 1 its ``rounds`` list each run and its
    ``wall_s`` and ``kernel_start_s`` are their medians."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    with _pinned(one_core):
        return _run(paths, root=root, timeout=timeout, one_core=one_core, path=path, progress=progress,
                    rounds=rounds)


@contextlib.contextmanager
def _pinned(one_core: bool):
    """With ``one_core``: this process (and the kernels it starts, which inherit it) on its first usable CPU;
    the affinity is restored afterwards."""
    if not one_core:
        yield
        return
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(old)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, old)


def _row(name: str, runs: list[dict]) -> dict:
    """One notebook's row: its run as is (one round), or each run under ``rounds`` with median times."""
    if len(runs) == 1:
        return {"notebook": name, **runs[0]}

    def median(key):                      # over the runs that have it (a kernel that never started has no times)
        xs = [r[key] for r in runs if r.get(key) is not None]
        return round(statistics.median(xs), 3) if xs else None
    row = {"notebook": name, "cells": runs[0]["cells"], "wall_s": median("wall_s"),
           "kernel_start_s": median("kernel_start_s"), "shutdown_s": median("shutdown_s"),
           "load_avg_before": runs[0]["load_avg_before"], "load_avg_after": runs[-1]["load_avg_after"],
           "rounds": [{k: v for k, v in r.items() if k != "cells"} for r in runs]}
    errors = [r["error"] for r in runs if "error" in r]
    return row | ({"error": errors[0]} if errors else {})


def _run(paths, *, root, timeout, one_core, path, progress, rounds=1) -> dict:
    from .runner import machine_info, save_record
    machine = machine_info("cpu", None)
    machine["threads"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    machine["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    args = {"timeout": timeout, "taskset_one_core": one_core, "kernel": "python3", "executor": "nbclient",
            "rounds": rounds}
    root = Path(root).resolve()
    names = [nb.resolve().relative_to(root).as_posix() if nb.resolve().is_relative_to(root) else str(nb)
             for nb in map(Path, paths)]
    runs: dict[str, list[dict]] = {}
    for k in range(rounds):
        for nb, name in zip(map(Path, paths), names):
            if progress:
                progress(f"notebooks: {name}" + (f" (round {k + 1} of {rounds})" if rounds > 1 else ""))
            runs.setdefault(name, []).append(run_notebook(nb, timeout=timeout))
            machine["load_avg_end"] = runs[name][-1]["load_avg_after"]
            if path is not None:
                save_record(path, "notebooks", args, machine, [_row(n, r) for n, r in runs.items()])
    return {"format": 2, "suite": "notebooks", "args": args, "machine": machine,
            "rows": [_row(n, r) for n, r in runs.items()]}


def format_notebooks(rows: list[dict]) -> str:
    """Markdown: notebook, wall seconds (the median and range over rounds, when there were several), kernel
    start, code cells, load average before → after, status."""
    def load(x):
        return "—" if not x else f"{x[0]:.1f}"

    def wall(r):
        walls = [x["wall_s"] for x in r.get("rounds", ())]
        return f"{r['wall_s']:.1f}" + (f" ({min(walls):.1f}–{max(walls):.1f})" if walls else "")
    lines = ["| notebook | wall s | kernel start s | code cells | load before → after | status |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['notebook']} | {wall(r)} | {r.get('kernel_start_s') or float('nan'):.1f} | "
                     f"{r['cells']} | {load(r.get('load_avg_before'))} → {load(r.get('load_avg_after'))} | "
                     f"{r.get('error', 'ok')} |")
    total = sum(r["wall_s"] for r in rows)
    return "\n".join(lines + [f"\ntotal: {total:.0f} s for {len(rows)} notebooks"])


def check_notebooks(rows: list[dict]) -> list[tuple[str, float | None, bool]]:
    """Per target: ``(description, the slowest such notebook's seconds or None, passed)``; a notebook that
    failed never passes."""
    out = []
    for desc, folder, limit in TARGETS:
        mine = [r for r in rows if r["notebook"].split("/")[-2:-1] == [folder]]
        worst = max((r["wall_s"] for r in mine), default=None)
        ok = worst is not None and worst <= limit and not any("error" in r for r in mine)
        out.append((desc, worst, ok))
    return out


def main(ns) -> int:
    """``attn-course bench --suite notebooks`` (``ns``: the bench parser's namespace)."""
    try:
        import nbclient  # noqa: F401
    except ImportError:
        raise SystemExit("attn-course bench --suite notebooks needs nbclient: pip install -e '.[dev]'") from None
    if ns.rounds < 1:
        raise SystemExit(f"attn-course bench --suite notebooks: --rounds must be at least 1, got {ns.rounds}")
    root = Path(ns.root or ".")
    paths = [Path(p) for p in ns.notebooks] if ns.notebooks else find_notebooks(root, solutions=ns.solutions)
    if not paths:
        raise SystemExit(f"attn-course bench --suite notebooks: no notebooks found under {root.resolve()} "
                         "(run it from the course checkout, or pass --root or --notebooks)")
    out = Path(ns.json) if ns.json else (RECORDED_NOTEBOOKS_ONE_CORE if ns.taskset_one_core else RECORDED_NOTEBOOKS)
    progress = None if ns.quiet else (lambda msg: print(f"running {msg}", file=sys.stderr, flush=True))
    timeout = ns.timeout or 600.0
    record = run_notebooks(paths, root=root, timeout=timeout, one_core=ns.taskset_one_core, path=out,
                           progress=progress, rounds=ns.rounds)
    from .runner import describe_machine
    print(f"[notebooks] executed headless with nbclient, one fresh kernel each"
          f"{', pinned to one core' if ns.taskset_one_core else ''}"
          f"{f'; {ns.rounds} interleaved rounds, the median (lowest–highest)' if ns.rounds > 1 else ''}; recorded in {out}")
    print(f"machine: {describe_machine(record['machine'])}\n")
    print(format_notebooks(record["rows"]))
    failed = any("error" in r for r in record["rows"])
    if ns.check:
        print()
        for desc, value, ok in check_notebooks(record["rows"]):
            print(f"{'SKIP' if value is None else 'PASS' if ok else 'FAIL'}  {desc}  "
                  f"({'none run' if value is None else f'slowest {value:.1f} s'})")
            failed |= value is not None and not ok
    return 1 if failed else 0
