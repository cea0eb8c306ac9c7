"""``attn-course bench --suite linear`` (kept importable for lesson 10): see :mod:`attn_course.bench.linear`."""
from __future__ import annotations

from pathlib import Path

from .bench import load_record
from .bench.linear import COLUMNS, METHODS, RECORDED_CPU, TARGETS, _naive, check_targets, format_table, measure, table_rows

__all__ = ["main", "measure", "table_rows", "format_table", "check_targets", "load_recorded", "RECORDED_CPU",
           "METHODS", "TARGETS", "COLUMNS"]


def load_recorded(path: str | Path = RECORDED_CPU) -> tuple[dict, list[dict]]:
    """``(args, rows)`` of a recorded run (``attn-course bench --suite linear --json PATH``)."""
    data = load_record(path)
    return data["args"], data["rows"]


def main(argv: list[str] | None = None) -> int:
    """``attn-course bench --suite linear ARGS``."""
    from .bench import main as bench_main
    return bench_main(["--suite", "linear", *(argv or [])])
