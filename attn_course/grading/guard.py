"""Forbidden APIs: a static check of the learner's source and a runtime guard around the learner's code.

An exercise lists the APIs it forbids as dotted names (``spec.FORBID_SDPA``, ``spec.FORBID_COURSE``):
an attribute chain such as ``"torch.nn.functional.scaled_dot_product_attention"`` or a whole module such
as ``"attn_course"``.

* :func:`static_findings` reads source code — the whole exercise cell, the same text for ``check()`` (see
  :func:`judged_source`) and for the bulk grader: only an actual *reference* to a forbidden API counts (an
  attribute chain or import that resolves to it, or ``getattr``/``__import__``/``importlib`` with its
  name as a constant string). Strings, docstrings, comments and names the learner binds never count.
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
import linecache
import os
import sys
import types
import weakref
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["static_findings", "static_violations", "Finding", "judged_source", "RuntimeGuard", "TensorWatch",
           "TensorCallWatch", "Work", "MatmulWork", "DEFAULT_ALIASES"]

# Files of the grading machinery itself, which runs inside the guard (answer functions, the guard).
_GRADING_DIR = os.path.dirname(os.path.abspath(__file__))


def _leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


# ---- the static check ------------------------------------------------------------------------------------

# Names a learner may use in an exercise cell without importing them there (the notebooks' setup cells
# import ``torch``; ``F`` and ``nn`` are the universal spellings of these modules). A name the cell binds
# itself (an import, a ``def``, an assignment, an argument) replaces its default.
DEFAULT_ALIASES = {"torch": "torch", "F": "torch.nn.functional", "nn": "torch.nn"}


@dataclass(frozen=True)
class Finding:
    """One reference to a forbidden API in the learner's source."""
    line: int                 # 1-based line in the judged source
    token: str                # the code as written, e.g. "F.scaled_dot_product_attention"
    api: str                  # the forbidden entry it resolves to, e.g. "torch.nn.functional.scaled_dot_product_attention"

    def __str__(self) -> str:
        return f"line {self.line}: `{self.token}` ({self.api})"


def _bound_names(tree: ast.AST) -> set[str]:
    """Names the source binds other than by ``import`` (def, class, assignment, argument, loop, with, ...)."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
    return bound


def _const_str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


class _Resolver:
    """Resolves expressions of the source to dotted API names with simple, flow-insensitive aliasing:
    ``import a.b as c``, ``from a import b``, ``x = torch.nn.functional``, ``getattr(F, "name")``,
    ``__import__("a")``, ``importlib.import_module("a.b")``."""

    def __init__(self, tree: ast.AST):
        bound = _bound_names(tree)
        self.aliases: dict[str, str] = {k: v for k, v in DEFAULT_ALIASES.items() if k not in bound}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.aliases[a.asname] = a.name
                    else:
                        top = a.name.split(".")[0]
                        self.aliases[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if a.name != "*":
                        self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        # simple assignments of a resolvable value (``f = torch.nn.functional``), to a fixed point
        for _ in range(3):
            for node in ast.walk(tree):
                if (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and isinstance(node.targets[0], ast.Name)):
                    value = self.resolve(node.value)
                    if value is not None:
                        self.aliases[node.targets[0].id] = value

    def resolve(self, node) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return None if base is None else f"{base}.{node.attr}"
        if isinstance(node, ast.Call):
            fn = self.resolve(node.func)
            name = _const_str(node.args[0]) if node.args else None
            if isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) >= 2:
                base, attr = self.resolve(node.args[0]), _const_str(node.args[1])
                return None if base is None or attr is None else f"{base}.{attr}"
            if name is not None and isinstance(node.func, ast.Name) and node.func.id == "__import__":
                return name.split(".")[0]
            if name is not None and fn == "importlib.import_module":
                return name
        return None


def _matches(path: str, api: str) -> bool:
    return path == api or path.startswith(api + ".")


def static_findings(source: str, forbidden) -> list[Finding]:
    """Every reference to a forbidden API in ``source`` (one per line and API, in source order).

    Only a real reference counts: an attribute chain or imported name that resolves (through the cell's
    imports, the default names ``torch``/``F``/``nn`` and simple assignments) to a forbidden API, an
    ``import`` of it, or ``getattr``/``__import__``/``importlib.import_module`` with its name as a constant
    string. Strings, docstrings, comments and names the learner binds (their own ``logsumexp`` or
    ``def scaled_dot_product_attention``) never count. Unparsable source has no findings (it fails when run).
    """
    forbidden = tuple(forbidden)
    if not forbidden:
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    res = _Resolver(tree)
    leaves = {_leaf(f): f for f in forbidden if "." in f}
    found: dict[tuple[int, str], Finding] = {}

    def add(node, path: str | None, token: str | None = None):
        if path is None:
            return
        for api in forbidden:
            if _matches(path, api):
                if token is None:
                    seg = ast.get_source_segment(source, node) or path
                    token = " ".join(seg.split())
                key = (node.lineno, api)
                found.setdefault(key, Finding(node.lineno, token, api))
                return

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(node, a.name, f"import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            add(node, node.module, f"from {node.module} import ...")
            for a in node.names:
                add(node, f"{node.module}.{a.name}", f"from {node.module} import {a.name}")
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            add(node, res.resolve(node))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in res.aliases \
                and res.aliases[node.id] != node.id:
            add(node, res.aliases[node.id])
        elif isinstance(node, ast.Call):
            path = res.resolve(node)
            if path is not None:
                add(node, path)
            elif isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) >= 2:
                attr = _const_str(node.args[1])
                if attr in leaves:                          # getattr(something, "scaled_dot_product_attention")
                    add(node, leaves[attr])
    return sorted(found.values(), key=lambda f: (f.line, f.api))


def static_violations(source: str, forbidden) -> list[str]:
    """The forbidden APIs that ``source`` references (sorted, each once); see :func:`static_findings`."""
    return sorted({f.api for f in static_findings(source, forbidden)})


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
        self._allow = {os.path.abspath(f) for f in allow_files} | _learner_tool_files()
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
            if not self._ran_dynamo and _DYNAMO_DIR in code.co_filename:
                self._ran_dynamo = True
            name = (self._codes.get(code) or (self._dirs and self._file_rule(code.co_filename))
                    or self._reference_rule(frame))
            if name:
                self.violations.add(name)
        elif event == "c_call":
            name = self._builtins.get(id(arg))
            if name:
                self.violations.add(name)

    def __enter__(self):
        self._ran_dynamo = False
        if not self.forbidden:
            return self
        if any(name == "torch" or name.startswith("torch.") for _, name in self._dirs):
            _import_dispatch_modes()      # not inside the guard: that import runs code of torch.autograd
        self._old_profile = sys.getprofile()
        sys.setprofile(self._profile)
        if self._codes or self._builtins:
            self._spy = _TorchSpy(self)
            self._spy.__enter__()
        return self

    def __exit__(self, *exc):
        if self.forbidden:
            if self._spy is not None:
                self._spy.__exit__(*exc)
                self._spy = None
            sys.setprofile(self._old_profile)
            if self._ran_dynamo:
                # The learner's code ran torch.compile (FlexAttention compiles even in eager mode) under the
                # guard's spies: what it cached would break later compiles in this process (the lesson's own
                # flex_attention raised "Attempted to call function marked as skipped"), so drop it.
                import torch._dynamo
                torch._dynamo.reset()
        return False


_DYNAMO_DIR = os.sep + os.path.join("torch", "_dynamo") + os.sep


@lru_cache(maxsize=None)
def _import_dispatch_modes() -> None:
    """Enter a dispatch mode once, outside any guard: the first one in a process imports ``torch._dynamo``,
    whose import runs code in ``torch.autograd`` — which a guard forbidding that module would charge to the
    learner when an exercise counts work (:class:`Work`) inside it."""
    with Work():
        torch.zeros(1) + 1                # the first op dispatched to a Python mode does the import


# ---- which source is judged ------------------------------------------------------------------------------

def _code_of(obj):
    """A code object that belongs to ``obj`` (function, method, partial, class or instance), else None."""
    import functools
    for _ in range(4):
        if isinstance(obj, functools.partial):
            obj = obj.func
            continue
        code = getattr(getattr(obj, "__func__", obj), "__code__", None)
        if isinstance(code, types.CodeType):
            return code
        cls = obj if inspect.isclass(obj) else type(obj)
        for member in vars(cls).values():
            member = getattr(member, "__func__", member)
            if isinstance(member, types.FunctionType):
                return member.__code__
        return None
    return None


def judged_source(obj) -> str | None:
    """The source that :func:`static_findings` judges for ``check(id, obj)``: the whole notebook cell that
    defined ``obj`` (IPython keeps every cell's text in ``linecache`` under a name that is not a file on
    disk) — exactly what the bulk grader reads, the exercise cell. For an object defined in a real file
    (a module, a test), its own source. None if there is none."""
    code = _code_of(obj)
    if code is not None and not os.path.isfile(code.co_filename):
        lines = linecache.getlines(code.co_filename)
        if lines:
            return "".join(lines)
    try:
        target = obj if (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismethod(obj)) else type(obj)
        return inspect.getsource(target)
    except (OSError, TypeError):
        return None


# ---- tiling: the largest tensor the learner's code creates -------------------------------------------

def _distinct(t) -> int:
    """Elements a tensor really holds: an ``expand``ed (stride-0) axis holds its elements once."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n


class _LargestTensor:
    """Records the largest tensor (elements, bytes, shape) among the results it is shown."""

    def _reset(self):
        self.largest_numel = 0
        self.largest_bytes = 0
        self.largest_shape: tuple[int, ...] = ()

    _views_once = False       # count an expanded (stride-0) axis once: a view allocates nothing

    def _record(self, out):
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                n = _distinct(t) if self._views_once else t.numel()
                if n > self.largest_numel:
                    self.largest_numel, self.largest_shape = n, tuple(t.shape)
                self.largest_bytes = max(self.largest_bytes, n * t.element_size())


class TensorWatch(_LargestTensor, TorchDispatchMode):
    """The largest tensor any ATen op creates while it is active — autograd's backward included.

    Deterministic, unlike memory counters: it counts what the code asks for. This is the counter behind
    :func:`attn_course.bench.largest_tensor_created`. (Its first use in a process imports
    ``torch._dynamo``, a few seconds: the tiling guard uses :class:`TensorCallWatch` instead.)"""

    def __init__(self):
        super().__init__()
        self._reset()

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._record(out)
        return out


class TensorCallWatch(_LargestTensor, TorchFunctionMode):
    """The same counter one level up: the largest tensor returned by any torch function, tensor method or
    operator called while it is active (factories such as ``torch.empty`` included). It sees every tensor
    the learner's code holds, at no import cost; it does not see a composite op's internal temporaries
    or a backward pass. Used by exercises that promise tiling (``Exercise.max_numel_fn``); it lives here,
    in the grading package, so the runtime guard lets it run inside learner code.

    A view that repeats an axis without copying it (``expand``, stride 0) counts the elements it really holds:
    ``c_kv[:, None].expand(B, H, S, d_c)`` is B·S·d_c, not B·H·S·d_c (it allocates nothing; what is computed from
    it is a new tensor, counted in full)."""

    _views_once = True

    def __init__(self):
        super().__init__()
        self._reset()

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._record(out)
        return out


# ---- lesson 13: course objects that the grader hands to the learner's code ---------------------------------

LEARNER_TOOLS = ("attn_course.ring_sim",)
"""Modules whose code the learner's code may run inside a forbidden ``attn_course``: the grader passes their
objects as arguments (13.6 hands each rank a :class:`attn_course.ring_sim.SimulatedRing`). They hold no
answers; they only play the part of another library (here ``torch.distributed``)."""


@lru_cache(maxsize=None)
def _learner_tool_files() -> frozenset[str]:
    return frozenset(os.path.abspath(importlib.import_module(m).__file__) for m in LEARNER_TOOLS)


# ---- the work of products (tiles visited): matrix products and elementwise multiply-and-reduce -------------

class Work(TorchDispatchMode):
    """Counts the work of the products run while it is active, however they are written:

    * ``flops``: 2 per multiply-add — of every matrix product (``mm``/``bmm``/``addmm``/``baddbmm``/``mv``/``dot``,
      where ``@``, ``matmul``, ``einsum`` and ``F.linear`` end up), **and** of every reduction (``sum``, ``mean``,
      ``cumsum``, ``prod``) of the result of an elementwise product (``mul``/``div``/``prod``, or a view of it):
      2 per element reduced, a multiply and an add. So ``(q[..., :, None, :] * k[..., None, :, :]).sum(-1)`` counts
      exactly what ``q @ k.transpose(-2, -1)`` counts, and an elementwise scaling that is not reduced
      (``alpha * acc``, ``s / math.sqrt(d)``) counts nothing;
    * ``calls``: the matrix products and counted reductions;
    * ``largest`` / ``largest_shape``: the largest result of such a product (a matrix product's result, or a
      counted reduction's), i.e. the largest block of scores the code formed at once.

    A tiling exercise compares ``flops`` with what the tiles it allows need (09_window_tiles: the band's tiles;
    10_chunked_scan: O(L·C); 13_ring_loop: the causal skip) and ``largest`` with one tile. Best effort, like
    :class:`TensorCallWatch`: a product spelled with additions (``exp(log a + log b)``) is not seen. It lives here
    so the runtime guard lets it run inside learner code; its first use in a process imports ``torch._dynamo``
    (a few seconds)."""

    _SIZES = {"mm": lambda a, b: a.shape[0] * a.shape[1] * b.shape[1],
              "bmm": lambda a, b: a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2],
              "mv": lambda a, b: a.shape[0] * a.shape[1],
              "dot": lambda a, b: a.shape[0], "vdot": lambda a, b: a.shape[0]}
    _BIASED = {"addmm": "mm", "baddbmm": "bmm", "addmv": "mv", "addmm_": "mm", "baddbmm_": "bmm", "addmv_": "mv"}
    _PRODUCTS = {"mul", "mul_", "div", "div_", "prod", "cumprod", "addcmul"}     # their results are products
    _REDUCTIONS = {"sum", "mean", "nansum", "cumsum", "prod", "cumprod"}          # count when they reduce one

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.flops = 0
        self.largest = 0
        self.largest_shape: tuple[int, ...] = ()
        self._products: dict[int, weakref.ref] = {}

    def _is_product(self, t) -> bool:
        for x in (t, getattr(t, "_base", None)):
            ref = self._products.get(id(x)) if isinstance(x, torch.Tensor) else None
            if ref is not None and ref() is x:
                return True
        return False

    def _result(self, out):
        if isinstance(out, torch.Tensor) and out.numel() > self.largest:
            self.largest, self.largest_shape = out.numel(), tuple(out.shape)

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        reduced = name in self._REDUCTIONS and args and isinstance(args[0], torch.Tensor) \
            and self._is_product(args[0])
        out = func(*args, **(kwargs or {}))
        if name in self._BIASED:                               # bias + a @ b
            name, operands = self._BIASED[name], args[1:3]
        else:
            operands = args[:2]
        size = self._SIZES.get(name)
        if size is not None:
            self.calls += 1
            self.flops += 2 * size(*operands)
            self._result(out)
        elif reduced:                                          # Σ of a product: a multiply and an add per element
            self.calls += 1
            self.flops += 2 * args[0].numel()
            self._result(out)
        if name in self._PRODUCTS and isinstance(out, torch.Tensor):
            key = id(out)
            self._products[key] = weakref.ref(out, lambda _, key=key: self._products.pop(key, None))
        return out


MatmulWork = Work
"""The work counter's first name (it counted matrix products only); kept for old imports."""
