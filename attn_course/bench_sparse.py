"""``attn-course bench --suite sparse`` (kept importable for lesson 09): see :mod:`attn_course.bench.sparse`."""
from __future__ import annotations

from pathlib import Path

from .bench import load_record
from .bench.sparse import (RECORDED_SPARSE_CPU, SPARSE_METHODS, SPARSE_TARGETS, check_sparse, format_sparse,
                           measure_sparse)

__all__ = ["main", "measure_sparse", "format_sparse", "check_sparse", "load_recorded_sparse", "SPARSE_METHODS",
           "SPARSE_TARGETS", "RECORDED_SPARSE_CPU"]


def load_recorded_sparse(path: str | Path = RECORDED_SPARSE_CPU) -> tuple[dict, list[dict]]:
    """``(args, rows)`` of a recorded run; the package ships the course's 2-core CPU run."""
    data = load_record(path)
    return data["args"], data["rows"]


def main(argv: list[str] | None = None) -> int:
    """``attn-course bench --suite sparse ARGS``."""
    from .bench import main as bench_main
    return bench_main(["--suite", "sparse", *(argv or [])])
