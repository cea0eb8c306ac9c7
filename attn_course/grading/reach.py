"""What the bulk grader will not see: warnings ``check()`` gives before a learner loses points silently.

The grader (:mod:`~attn_course.grading.runner`) rebuilds each program from the trusted ``solutions/`` notebook and the
learner's *exercise cells*, found by their nbgrader ``grade_id``. So two things that work in the learner's
kernel do not exist there:

* a helper the answer calls that was defined in a cell the learner added (the grader raises NameError);
* an exercise cell that was deleted and re-typed: it lost its ``grade_id``, so the grader finds no answer.

Both are found here from the learner's own kernel, when the trusted notebook (or the notebook file being
edited) can be read; otherwise nothing is claimed.
"""
from __future__ import annotations

import ast
import builtins
import dis
import functools
import inspect
import json
import os
import types
from pathlib import Path

from . import notebook as nbk

__all__ = ["names_the_grader_lacks", "exercise_cell_missing"]


def _codes(obj) -> list[types.CodeType]:
    """Every code object of ``obj`` (a function, a partial, a class's methods, an instance's class), nested ones too."""
    while isinstance(obj, functools.partial):
        obj = obj.func
    obj = getattr(obj, "__func__", obj)
    if isinstance(getattr(obj, "__code__", None), types.CodeType):
        roots = [obj.__code__]
    else:
        cls = obj if inspect.isclass(obj) else type(obj)
        roots = [getattr(m, "__func__", m).__code__ for m in vars(cls).values()
                 if isinstance(getattr(m, "__func__", m), types.FunctionType)]
    out, todo = [], list(roots)
    while todo:
        code = todo.pop()
        out.append(code)
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return out


def _globals_of(obj) -> dict:
    while isinstance(obj, functools.partial):
        obj = obj.func
    obj = getattr(obj, "__func__", obj)
    if hasattr(obj, "__globals__"):
        return obj.__globals__
    cls = obj if inspect.isclass(obj) else type(obj)
    for m in vars(cls).values():
        if hasattr(getattr(m, "__func__", m), "__globals__"):
            return getattr(m, "__func__", m).__globals__
    return {}


def _bound_names(source: str) -> set[str]:
    """Every name a cell's code may bind (assignments, defs, classes, imports, loop targets), at any depth:
    a generous superset, so that nothing defined there is reported missing."""
    try:
        tree = ast.parse(nbk.strip_magics(source))
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


@functools.lru_cache(maxsize=16)
def _trusted_names(path: str, mtime: float) -> frozenset[str]:
    nb = nbk.read(path)
    return frozenset(n for c in nb.cells if c.cell_type == "code" for n in _bound_names(nbk.source_of(c)))


def _solutions_notebook(exercise_id: str) -> Path | None:
    """The trusted notebook of this exercise's lesson in the course checkout around the kernel, if any."""
    from .release import find_root
    try:
        found = sorted((find_root() / "solutions").glob(f"{exercise_id[:2]}_*.ipynb"))
    except OSError:
        return None
    return found[0] if found else None


def names_the_grader_lacks(obj, exercise_id: str, source: str | None) -> list[str]:
    """Global names ``obj`` reads that exist in the learner's kernel but that neither its own cell nor any
    cell of the trusted notebook defines: in the grader they would raise NameError. [] when unknown."""
    codes = _codes(obj)
    if not codes or any(os.path.isfile(c.co_filename) for c in codes[:1]):
        return []                                 # defined in a module or a test file, not in a notebook cell
    path = _solutions_notebook(exercise_id)
    if path is None or source is None:
        return []
    trusted = _trusted_names(str(path), path.stat().st_mtime) | _bound_names(source)
    g = _globals_of(obj)
    read = {ins.argval for code in _codes(obj) for ins in dis.get_instructions(code)
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    return sorted(n for n in read if n in g and n not in trusted and not hasattr(builtins, n))


def exercise_cell_missing(exercise_id: str) -> bool:
    """True when the notebook file the kernel was started for (``JPY_SESSION_NAME``, set by Jupyter Server)
    has no cell marked as this exercise — e.g. the exercise cell was deleted and the code re-typed in a new
    one. False when that file cannot be read (nothing is claimed)."""
    path = os.environ.get("JPY_SESSION_NAME")
    if not path or not path.endswith(".ipynb") or not os.path.isfile(path):
        return False
    try:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return exercise_id not in nbk.exercise_cells(nb)
