"""Forbidden APIs: a static check of the learner's source and a runtime guard around the learner's code.

An exercise lists the APIs it forbids as dotted names (``spec.FORBID_SDPA``, ``spec.FORBID_COURSE``):
an attribute chain such as ``"torch.nn.functional.scaled_dot_product_attention"`` or a whole module such
as ``"attn_course"``.

* :func:`static_violations` reads source code (the grader runs it, trusted, on the learner's cell): any
  name, attribute, import or string literal that mentions a forbidden API counts.
* :class:`RuntimeGuard` records forbidden calls while the learner's object runs: a ``sys.setprofile``
  hook sees Python functions (by code object, or by file for a forbidden module) and builtins
  (by identity), and a ``TorchFunctionMode`` sees torch functions called from C (``functools.partial``,
  ``map`` and other indirections that the profile hook misses).

The runtime guard lives in the same process as the learner's code, so a determined learner can switch it
off; the grader's real defence is that it draws fresh inputs and compares with its own references (see
docs/grading.md). Both checks are best effort against shortcuts, not a security boundary.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import os
import sys
import types
from functools import lru_cache

from torch.overrides import TorchFunctionMode

__all__ = ["static_violations", "RuntimeGuard"]

# Files of the grading machinery itself, which runs inside the guard (answer functions, the guard).
_GRADING_DIR = os.path.dirname(os.path.abspath(__file__))


def _leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def static_violations(source: str, forbidden: tuple[str, ...] | list[str]) -> list[str]:
    """Forbidden APIs that ``source`` mentions (sorted, each once). Unparsable source mentions nothing
    (it fails when run instead). Comments are ignored; string literals count (``getattr(F, "scaled_…")``)."""
    if not forbidden:
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: set[str] = set()
    leaves = {f: _leaf(f) for f in forbidden}

    def mentions(text: str, f: str) -> bool:
        return text == f or text.startswith(f + ".") or text == leaves[f]

    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names] + [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            names = [mod, mod.split(".")[0]] + [f"{mod}.{a.name}" for a in node.names] + [a.name for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(f for f in forbidden if leaves[f] in node.value)
            continue
        for f in forbidden:
            if any(mentions(n, f) for n in names):
                found.add(f)
    return sorted(found)


@lru_cache(maxsize=None)
def _resolve(name: str):
    """Import the longest module prefix of ``name`` and walk the attributes; None if it does not exist."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _targets(forbidden) -> tuple[dict, dict, list]:
    """-> (code objects -> name, builtins by id -> name, [(directory or file, name)])."""
    codes, builtins, dirs = {}, {}, []
    for name in forbidden:
        obj = _resolve(name)
        if obj is None:
            continue
        if isinstance(obj, types.ModuleType):
            path = getattr(obj, "__file__", None)
            if path:
                dirs.append((os.path.dirname(os.path.abspath(path)) if path.endswith("__init__.py")
                             else os.path.abspath(path), name))
            continue
        members = vars(obj).values() if inspect.isclass(obj) else [obj]
        for m in members:
            m = getattr(m, "__func__", m)                      # staticmethod / classmethod
            if isinstance(m, types.FunctionType):
                codes[m.__code__] = name
            elif callable(m) and not inspect.isclass(m):
                builtins[id(m)] = name
    return codes, builtins, dirs


class _TorchSpy(TorchFunctionMode):
    """Sees every torch function that dispatches ``__torch_function__``, however it was called."""

    def __init__(self, guard):
        super().__init__()
        self.guard = guard

    def __torch_function__(self, func, _types, args=(), kwargs=None):
        name = self.guard._builtins.get(id(func))
        if name is None and isinstance(func, types.FunctionType):
            name = self.guard._codes.get(func.__code__)
        if name:
            self.guard.violations.add(name)
        return func(*args, **(kwargs or {}))


class RuntimeGuard:
    """Context manager recording forbidden calls made while it is active, in ``self.violations``.

    ``allow_files``: source files that may run inside the guard even if they belong to a forbidden module
    (the exercise's own answer function lives in ``attn_course.grading``).
    """

    def __init__(self, forbidden, allow_files=()):
        self.forbidden = tuple(forbidden)
        self.violations: set[str] = set()
        self._allow = {os.path.abspath(f) for f in allow_files}
        self._codes, self._builtins, self._dirs = _targets(self.forbidden)
        self._file_verdict: dict[str, str | None] = {}
        # the forbidden module that contains the grader itself (e.g. "attn_course"), if any
        self._grading_name = next((name for d, name in self._dirs
                                   if _GRADING_DIR == d or _GRADING_DIR.startswith(d + os.sep)), None)
        self._spy = None
        self._old_profile = None

    def _file_rule(self, filename: str) -> str | None:
        verdict = self._file_verdict.get(filename, "?")
        if verdict == "?":
            verdict = None
            path = os.path.abspath(filename)
            if path not in self._allow and not path.startswith(_GRADING_DIR + os.sep):
                for d, name in self._dirs:
                    if path == d or path.startswith(d + os.sep):
                        verdict = name
            self._file_verdict[filename] = verdict
        return verdict

    def _reference_rule(self, frame) -> str | None:
        """The grader's own code (answer functions, references) may run inside the guard only when
        called by the grader: a call into it straight from other code (the learner's object calling the
        exercise's reference) counts as using the forbidden module that contains the grader."""
        if not self._grading_name or not frame.f_code.co_filename.startswith(_GRADING_DIR + os.sep):
            return None
        if os.path.abspath(frame.f_code.co_filename) == os.path.abspath(__file__):
            return None                                        # the guard's own torch-function spy
        caller = frame.f_back
        if caller is not None and not os.path.abspath(caller.f_code.co_filename).startswith(_GRADING_DIR + os.sep):
            return self._grading_name
        return None

    def _profile(self, frame, event, arg):
        if event == "call":
            code = frame.f_code
            name = (self._codes.get(code) or (self._dirs and self._file_rule(code.co_filename))
                    or self._reference_rule(frame))
            if name:
                self.violations.add(name)
        elif event == "c_call":
            name = self._builtins.get(id(arg))
            if name:
                self.violations.add(name)

    def __enter__(self):
        if not self.forbidden:
            return self
        self._old_profile = sys.getprofile()
        sys.setprofile(self._profile)
        if self._codes or self._builtins:
            self._spy = _TorchSpy(self)
            self._spy.__enter__()
        return self

    def __exit__(self, *exc):
        if not self.forbidden:
            return False
        if self._spy is not None:
            self._spy.__exit__(*exc)
            self._spy = None
        sys.setprofile(self._old_profile)
        return False
