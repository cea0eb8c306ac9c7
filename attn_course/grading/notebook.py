"""Reading notebooks: exercise cells (found by their nbgrader ``grade_id``), ``check(...)`` cells, stubs.

An exercise cell is a code cell whose metadata holds ``nbgrader: {solution: true, grade_id: "<id>", ...}``;
its solution lines sit between ``### BEGIN SOLUTION`` and ``### END SOLUTION``. A check cell contains a
top-level statement ``check("<id>", <expression>)``.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import nbformat

__all__ = ["BEGIN", "END", "read", "source_of", "grade_id", "exercise_cells", "stub_source",
           "solution_regions", "split_checks", "strip_magics", "submission_sources"]

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
STUB = 'raise NotImplementedError("Exercise {id}: your code here")'


def read(path: str | Path) -> "nbformat.NotebookNode":
    # imported here: nbformat's schema validator takes ~3 s to import (jsonschema's format checkers), which
    # every exercise notebook would pay in its first cell (check() -> the sandbox's runner -> this module)
    import nbformat
    return nbformat.read(str(path), as_version=4)


def source_of(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def grade_id(cell) -> str | None:
    """The exercise id of a code cell that holds a solution, else None."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    if cell.get("cell_type") != "code" or not isinstance(meta, dict) or not meta.get("solution"):
        return None
    gid = meta.get("grade_id")
    return gid if isinstance(gid, str) and gid else None


def exercise_cells(nb) -> dict[str, dict]:
    """``{grade_id: cell}`` for the exercise cells of a notebook, in notebook order (first one wins)."""
    found: dict[str, dict] = {}
    for cell in nb.get("cells", []):
        gid = grade_id(cell)
        if gid is not None and gid not in found:
            found[gid] = cell
    return found


def solution_regions(source: str) -> list[tuple[int, int, str]]:
    """``[(begin_line, end_line, indent)]`` (0-based, inclusive) of the solution regions of ``source``.

    Raises ``ValueError`` for unbalanced markers."""
    regions, start, indent = [], None, ""
    for i, line in enumerate(source.split("\n")):
        stripped = line.strip()
        if stripped == BEGIN:
            if start is not None:
                raise ValueError(f"line {i + 1}: '{BEGIN}' inside another solution region")
            start, indent = i, line[: len(line) - len(line.lstrip())]
        elif stripped == END:
            if start is None:
                raise ValueError(f"line {i + 1}: '{END}' without '{BEGIN}'")
            regions.append((start, i, indent))
            start = None
    if start is not None:
        raise ValueError(f"line {start + 1}: '{BEGIN}' is never closed by '{END}'")
    return regions


def stub_source(source: str, exercise_id: str) -> str:
    """Replace every solution region (markers included) by ``raise NotImplementedError(...)`` at the
    region's indentation; every line outside the regions is kept as it is."""
    lines = source.split("\n")
    out, pos = [], 0
    for begin, end, indent in solution_regions(source):
        out += lines[pos:begin]
        out.append(indent + STUB.format(id=exercise_id))
        pos = end + 1
    out += lines[pos:]
    return "\n".join(out)


_MAGIC = re.compile(r"^(\s*)(%|!)")


def strip_magics(source: str) -> str:
    """IPython line magics and shell escapes (``%time``, ``!pip``) become ``pass``; a cell magic line
    (``%%time``) is dropped and its body kept, so the source is plain Python."""
    out = []
    for i, line in enumerate(source.split("\n")):
        m = _MAGIC.match(line)
        if m and i == 0 and line.lstrip().startswith("%%"):
            out.append("")
        elif m:
            out.append(m.group(1) + "pass")
        else:
            out.append(line)
    return "\n".join(out)


def _check_call(stmt) -> tuple[str, ast.expr] | None:
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return None
    call = stmt.value
    if not (isinstance(call.func, ast.Name) and call.func.id == "check" and len(call.args) == 2
            and not call.keywords and isinstance(call.args[0], ast.Constant)
            and isinstance(call.args[0].value, str)):
        return None
    return call.args[0].value, call.args[1]


def split_checks(source: str) -> list[tuple]:
    """Split a trusted cell into steps: ``("code", source)`` and ``("capture", exercise_id, expression)``
    for each top-level ``check("<id>", expr)`` statement. A cell without check calls is one code step."""
    src = strip_magics(source)
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return [("code", src)]
    lines = src.split("\n")
    steps: list[tuple] = []
    pos = 0                                           # next line (0-based) not yet emitted
    for stmt in tree.body:
        found = _check_call(stmt)
        if found is None:
            continue
        before = "\n".join(lines[pos: stmt.lineno - 1])
        if before.strip():
            steps.append(("code", before))
        steps.append(("capture", found[0], ast.get_source_segment(src, found[1])))
        pos = stmt.end_lineno
    rest = "\n".join(lines[pos:])
    if rest.strip() or not steps:
        steps.append(("code", rest))
    return steps


def submission_sources(text: str) -> dict[str, str]:
    """``{grade_id: source}`` of a submitted notebook's exercise cells (first cell per id). Only the
    source is used; outputs, tags and other metadata are ignored. Raises ``ValueError`` if ``text`` is
    not a notebook."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not a notebook (invalid JSON: {type(exc).__name__})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise ValueError("not a notebook (no 'cells' list)")
    found: dict[str, str] = {}
    for cell in data["cells"]:
        if not isinstance(cell, dict) or not isinstance(cell.get("metadata", {}), dict):
            continue
        meta = cell["metadata"].get("nbgrader")
        gid = meta.get("grade_id") if isinstance(meta, dict) and cell.get("cell_type") == "code" else None
        src = cell.get("source", "")
        if isinstance(src, list) and all(isinstance(s, str) for s in src):
            src = "".join(src)
        if not isinstance(gid, str) or gid in found or not isinstance(src, str):
            continue
        found[gid] = src
    return found
