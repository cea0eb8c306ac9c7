"""Benchmarks of the course: three suites, one runner, one recording format (``attn-course bench``).

* :mod:`.runner` — how every suite measures (a fresh process per row; memory per method; all methods of a
  row timed in interleaved rounds at a fixed thread count, median and spread), records (the machine with the
  rows) and checks its targets;
* :mod:`.attention` — naive vs ``flash_attention`` vs SDPA (lesson 08; the default suite);
* :mod:`.sparse` — sliding-window attention five ways (lesson 09);
* :mod:`.linear` — linear attention vs SDPA vs naive (lesson 10);
* :mod:`.flash` — the FlashAttention forward against SDPA, one tuning step at a time (lesson 08);
* :mod:`.notebooks` — every notebook executed headless, its wall time recorded with the machine;
* :mod:`.gpu` — the course's GPU run (``tools/gpu_bench.py``) as recorded on an H200 (lessons 08 and 09);
* :mod:`.cli` — the command line: ``attn-course bench [--suite attention|sparse|linear|flash|notebooks|all] ...``.

The names lessons use live here, as before the package: :func:`time_call`, :func:`median_time`,
:func:`largest_tensor_created`, :func:`measure`, :data:`METHODS`, :func:`format_table`,
:func:`load_recorded`, :func:`check_targets`, :func:`default_device`.
"""
from __future__ import annotations

from pathlib import Path

from . import attention as _attention
from . import flash as _flash
from . import linear as _linear
from . import runner as _runner
from . import sparse as _sparse
from .attention import (COLUMNS, METHODS, RECORDED_CPU, SDPA_BACKENDS, TARGETS, _method, _naive, check_targets,
                        format_table, measure, table_rows)
from .cli import main
from .runner import (Case, Suite, default_device, describe_machine, largest_tensor_created, load_record, machine_info,
                     measure_in_subprocess, measure_row, median_time, run_suite, save_record, time_call)

__all__ = ["main", "measure", "largest_tensor_created", "run_benchmark", "format_table", "table_rows",
           "check_targets", "load_recorded", "load_record", "save_record", "RECORDED_CPU", "METHODS", "TARGETS",
           "COLUMNS", "time_call", "median_time", "default_device", "measure_row", "measure_in_subprocess",
           "run_suite", "machine_info", "describe_machine", "SDPA_BACKENDS", "SUITES", "Suite", "Case"]

SUITES: dict[str, Suite] = {s.name: s for s in (_attention.SUITE, _sparse.SUITE, _linear.SUITE, _flash.SUITE)}


def load_recorded(path: str | Path = RECORDED_CPU) -> tuple[dict, list[dict]]:
    """``(args, rows)`` of a recorded run (``attn-course bench --json PATH``). The package ships the course's
    reference run on a 2-core CPU (:data:`RECORDED_CPU`), so a lesson can print measured numbers without
    spending minutes measuring them again; :func:`load_record` also returns the machine it ran on."""
    return _runner.load_recorded(path)


def run_benchmark(*, lengths=(512, 1024, 2048, 4096, 8192), modes=("fwd", "fwd+bwd"), causal=(False, True),
                  methods=METHODS, timeout: float = 1800.0, progress=None, **kw) -> list[dict]:
    """The attention suite's rows, one fresh process per ``(mode, causal, L)``; ``kw``: batch, heads, dim,
    block, dtype, device, repeats, warmup, threads, seed, sdpa_backend."""
    c = {(False,): "no", (True,): "yes"}.get(tuple(causal), "both")
    args = dict(batch=1, heads=8, dim=64, block=128, dtype=None, device=None, repeats=7, warmup=1, threads=1,
                seed=0, sdpa_backend=None)
    args.update(kw, lengths=list(lengths), modes=list(modes), causal=c)
    args["device"] = args["device"] or default_device()
    return run_suite("attention", args, methods=methods, timeout=timeout, progress=progress)
