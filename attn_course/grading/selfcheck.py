"""``check(exercise_id, obj)``: the learner's instant self-check.

It draws the exercise's cases from a fixed seed (so its report is the same on every run), runs the learner's
code on them in the SAME sandboxed child as the grader (:mod:`._child`, forked from a per-kernel zygote:
:func:`program_of` says what it runs), compares with the reference here and shows one line per case (✓/✗ and, for a wrong answer,
the detected misconception): as HTML in a notebook, as text elsewhere. It never raises for the learner's
mistakes: an exception in the learner's code becomes one line (``TypeError: … (line 3, in attention)``),
``NotImplementedError`` means "not attempted yet". It is a self-check, not the grade: the instructor's
grader (:mod:`attn_course.grading.runner`) re-runs the same cases on fresh inputs in a sandbox.

nbgrader (an autograder-test cell ``check("<id>", obj)``, see docs/grading.md) reads the cell's *value*:
the returned :class:`CheckResult` shows as the bare score (``text/plain``), which nbgrader takes as the
cell's partial credit. Two rules keep that grade honest:

* nothing reaches stderr while ``check()`` runs (nbgrader gives 0 to a test cell with stderr output):
  the learner's prints to stderr and every warning are captured and listed in the report instead;
* under ``nbgrader autograde`` (environment ``NBGRADER_EXECUTION=autograde``, set by nbgrader for the
  kernel it runs) the cases are drawn from :func:`held_out_seed` of the learner's exercise cell, not from
  the self-check's seed: fresh inputs, the same for the same submission, and the same that
  ``attn-course grade`` draws for that cell (:func:`exercise_seed`: one seed for the whole class where the
  exercise ranks a class).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import html
import inspect
import io
import linecache
import os
import secrets
import sys
import textwrap
import types
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch

from .exercises import get
from .sandbox import describe_exception
from .spec import Case, Exercise, validate

__all__ = ["check", "CheckResult", "CaseResult", "judge_case", "describe_exception", "case_seed",
           "held_out_seed", "exercise_seed", "held_out_cases", "self_check_cases", "in_nbgrader_autograde"]

SELF_CHECK_SEED = 20240601
NBGRADER_ENV = "NBGRADER_EXECUTION"          # nbgrader sets it to "autograde" (or "validate") for the kernel


def case_seed(exercise_id: str, base: int) -> int:
    """Seed of an exercise's case generator: ``base`` mixed with the id (different exercises differ)."""
    return (zlib.crc32(exercise_id.encode()) * 1_000_003 + int(base)) % (2**63 - 1)


def _case_key(case: Case) -> str:
    """A case's identity: its parameters and its input tensors' dtypes, shapes and bytes."""
    def digest(t: torch.Tensor) -> str:
        flat = t.detach().cpu().contiguous().reshape(-1)
        return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"").hexdigest()
    tensors = {k: (str(v.dtype), tuple(v.shape), digest(v)) for k, v in sorted(case.inputs.items())}
    return repr((sorted(case.params.items()), tensors))


def self_check_cases(ex: Exercise) -> list[Case]:
    """The cases :func:`check` draws and shows to the learner."""
    return ex.cases(torch.Generator().manual_seed(case_seed(ex.id, SELF_CHECK_SEED)))


def held_out_cases(ex: Exercise, base: int, tries: int = 64) -> list[Case]:
    """The cases the grader (and :func:`check` under nbgrader autograde) draws for base seed ``base``: none of
    them is a case the self-check shows. Case i comes from the first of ``tries`` draws (seeds derived from
    ``base``) whose case i the self-check does not show; an exercise whose cases ignore the seed raises
    (tests/test_grading_heldout.py draws every exercise)."""
    shown = {_case_key(c) for c in self_check_cases(ex)}
    seed = case_seed(ex.id, base)
    out = ex.cases(torch.Generator().manual_seed(seed))
    todo = [i for i, c in enumerate(out) if _case_key(c) in shown]
    for attempt in range(1, tries):
        if not todo:
            break
        alt = ex.cases(torch.Generator().manual_seed((seed + attempt * 7_919) % (2**63 - 1)))
        for i in list(todo):
            if i < len(alt) and _case_key(alt[i]) not in shown:
                out[i] = alt[i]
                todo.remove(i)
    if todo:
        raise ValueError(f"{ex.id}: cases {todo} are the self-check's whatever the seed; draw them from the generator")
    return out


def _normalised(source: str) -> str:
    """A cell's text without what an editor or IPython may change: trailing spaces, blank lines at the
    ends, CRLF (IPython's cell cache ends every line with a newline; the notebook JSON does not)."""
    lines = [line.rstrip() for line in source.replace("\r\n", "\n").split("\n")]
    return "\n".join(lines).strip("\n")


def held_out_seed(source: str | None) -> int:
    """Base seed of the held-out inputs for one submitted exercise cell: a hash of its (normalised) text.

    The same cell always gets the same inputs (re-grading gives the same grade), a changed cell gets new
    ones, and they are not the self-check's (:data:`SELF_CHECK_SEED`). ``attn-course grade`` and ``check()``
    under nbgrader autograde both use it, so both graders judge a cell on the same inputs."""
    text = "attn_course held-out inputs\n" + _normalised(source or "")
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:15], 16)


CLASS_SEED_ENV = "ATTN_COURSE_CLASS_SEED"   # the instructor's class seed (an integer), where one is kept


@functools.lru_cache(maxsize=1)
def _process_class_seed() -> int:
    """A secret drawn once per process: one grading batch's class seed when the instructor keeps none."""
    return secrets.randbits(62)


def exercise_seed(ex: Exercise, source: str | None) -> int:
    """Base seed of one submitted exercise's held-out inputs: :func:`held_out_seed` of its cell, except for an
    exercise that ranks a class (``rank_by``, the capstone's leaderboard): there the whole class shares ONE seed,
    the instructor's — the environment variable ``ATTN_COURSE_CLASS_SEED`` where the instructor keeps one, else a
    secret drawn once per process (one ``attn-course grade`` batch; the grader writes it to ``class_seed.txt``) —
    never derivable from the exercise, so a learner cannot rehearse the graded run; every design is measured on the
    same draw and editing a comment re-rolls nothing (``attn-course grade --seed`` replaces it for every
    exercise). The self-check draws from :data:`SELF_CHECK_SEED`, another seed."""
    if ex.rank_by:
        kept = os.environ.get(CLASS_SEED_ENV, "").strip()
        if kept:
            try:
                return int(kept) % (2**63 - 1)
            except ValueError:
                raise ValueError(f"{CLASS_SEED_ENV}={kept!r}: the class seed must be an integer") from None
        return _process_class_seed()
    return held_out_seed(source)


def in_nbgrader_autograde() -> bool:
    """True inside a kernel that ``nbgrader autograde`` runs (it sets ``NBGRADER_EXECUTION=autograde``)."""
    return os.environ.get(NBGRADER_ENV) == "autograde"


@dataclass(frozen=True)
class CaseResult:
    name: str
    ok: bool
    message: str = ""          # hint or error for a failed case


@dataclass
class CheckResult:
    """What :func:`check` found. ``passed`` is True when every case passed."""
    exercise_id: str
    max_score: float
    score: float = 0.0
    status: str = "checked"    # "checked" | "not attempted" | "forbidden" | "unknown exercise"
    cases: list[CaseResult] = field(default_factory=list)
    forbidden: list[str] = field(default_factory=list)    # the sandbox rules that refused the learner's code
    held_out: bool = False     # cases drawn from held_out_seed (nbgrader autograde), not the self-check seed
    captured: list[str] = field(default_factory=list)     # stderr text and warnings while the learner's code ran
    unreachable: list[str] = field(default_factory=list)  # why the bulk grader would not see this answer as check() does

    @property
    def n_passed(self) -> int:
        return sum(c.ok for c in self.cases)

    @property
    def passed(self) -> bool:
        return self.status == "checked" and bool(self.cases) and all(c.ok for c in self.cases)

    def __repr__(self) -> str:
        return (f"CheckResult({self.exercise_id!r}: {self.n_passed}/{len(self.cases)} cases, "
                f"{self.score:g}/{self.max_score:g} points, {self.status})")

    def _repr_pretty_(self, p, cycle) -> None:
        """In IPython the result shows as the bare score (``text/plain``): the value of a check cell is
        what nbgrader reads as that autograder-test cell's partial credit. The report itself was
        already shown by :func:`check`."""
        p.text(f"{self.score:g}")

    def _repr_html_(self) -> str:
        label = "score on held-out inputs" if self.held_out else "self-check score"
        return (f'<span style="font-family: monospace; color: #555">{label}: '
                f'<b>{self.score:g}</b> / {self.max_score:g}</span>')


def judge_case(ex: Exercise, got: Any, want: dict[str, torch.Tensor], case: Case) -> CaseResult:
    """Validate ``got`` (type, keys, dtype, shape) and judge it against ``want``; never raises."""
    reason = validate(got, want)
    if reason is not None:
        return CaseResult(case.name, False, reason)
    try:
        verdict = ex.judge(got, want, case)
    except Exception as exc:                       # a judge must not crash on odd values (NaN, inf, ...)
        return CaseResult(case.name, False, f"could not compare your answer ({type(exc).__name__})")
    return CaseResult(case.name, bool(verdict.ok), verdict.note if verdict.ok else (verdict.hint or "wrong values"))


def _code_of(obj):
    """A code object that belongs to ``obj`` (function, method, partial, class or instance), else None."""
    while isinstance(obj, functools.partial):
        obj = obj.func
    code = getattr(getattr(obj, "__func__", obj), "__code__", None)
    if isinstance(code, types.CodeType):
        return code
    cls = obj if inspect.isclass(obj) else type(obj)
    for member in vars(cls).values():
        member = getattr(member, "__func__", member)
        if isinstance(member, types.FunctionType):
            return member.__code__
    return None


def judged_source(obj) -> str | None:
    """The source ``check(id, obj)`` runs: the whole notebook cell that defined ``obj`` (IPython keeps every cell's
    text in ``linecache`` under a name that is not a file) — what the bulk grader reads, the exercise cell. For an
    object defined in a real file (a module, a test), its own source. None if there is none."""
    code = _code_of(obj)
    if code is not None and not os.path.isfile(code.co_filename):
        lines = linecache.getlines(code.co_filename)
        if lines:
            return "".join(lines)
    try:
        target = obj if (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismethod(obj)) else type(obj)
        return textwrap.dedent(inspect.getsource(target))
    except (OSError, TypeError):
        return None


def program_of(ex_id: str, obj: Any) -> list[dict]:
    """The program ``check()`` runs in the sandboxed child, rebuilt like the grader's (runner.Course.program):
    the cell that defined ``obj`` (labelled as the exercise cell), before it every notebook cell that defined a
    function or class it reads (an earlier exercise's helper), and, for the other names it reads from the
    kernel's namespace, the statement that recreates them there: ``import torch.nn.functional as F`` for a
    module, ``from einops import rearrange`` for a library function, the literal for a number or a string.
    Then a capture of ``obj`` by its name (or the cell's own ``check("<id>", expr)`` expression).

    Why not replay the kernel's ``In`` history or read the notebook file: the history holds every experiment
    and re-run (slow, and not what is graded), and the file on disk lags behind the cells the learner just ran.
    The defining cells are exactly the code the grader judges; what lives only in the kernel (a tensor built
    in another cell) is not recreated, and :mod:`.reach` warns when the grader would lack it too."""
    if obj is None:
        return [{"kind": "capture", "id": ex_id, "expr": "None"}]
    from . import notebook as nbk
    from .reach import _bound_names, _globals_of
    # a tuple of functions (e.g. 9.7's pair) is rebuilt part by part and captured as a tuple of their names
    parts = list(obj) if isinstance(obj, tuple) and obj and all(callable(o) for o in obj) else [obj]
    g = {}
    for part in parts:
        g.update(_globals_of(part) or {})
    cells: list[tuple[str, str]] = []
    prelude: dict[str, str] = {}

    def visit(source: str, label: str) -> None:
        if any(src == source for src, _ in cells):
            return
        try:
            codes = [compile(nbk.strip_magics(source), label, "exec")]
        except (SyntaxError, ValueError):
            codes = []
        names, bound = set(), _bound_names(source)
        while codes:
            c = codes.pop()
            names |= set(c.co_names)
            codes += [k for k in c.co_consts if isinstance(k, types.CodeType)]
        for n in sorted(names - bound):
            if n not in g or n in prelude:
                continue
            v, code = g[n], _code_of(g[n])
            if isinstance(v, types.ModuleType):
                prelude[n] = f"import {v.__name__} as {n}"
            elif code is not None and not os.path.isfile(code.co_filename) and linecache.getlines(code.co_filename):
                visit("".join(linecache.getlines(code.co_filename)), f"<cell {code.co_filename}>")
            elif isinstance(v, (bool, int, float, str, type(None))):
                prelude[n] = f"{n} = {v!r}"
            elif isinstance(getattr(v, "__module__", None), str) and "<" not in getattr(v, "__qualname__", "<") \
                    and "." not in v.__qualname__:
                prelude[n] = f"from {v.__module__} import {v.__qualname__} as {n}"
        cells.append((source, label))

    sources = [judged_source(part) for part in parts]
    for src in sources:
        if src is not None:
            visit(src, "<exercise cell>")
    source = next((src for src in sources if src is not None), None)
    steps = [{"kind": "code", "source": line, "label": "<kernel>", "exercise": ex_id} for line in prelude.values()]
    steps += [{"kind": "code", "source": nbk.strip_magics(src), "label": label,
               **({"exercise": ex_id} if label == "<exercise cell>" else {})} for src, label in cells]
    names = [next((k for k in [getattr(part, "__name__", None), *g] if isinstance(k, str) and g.get(k) is part), None)
             for part in parts]
    name = None if None in names else names[0] if len(parts) == 1 and parts[0] is obj else f"({', '.join(names)},)"
    if name is None and source is not None:
        name = next((step[2] for step in nbk.split_checks(source) if step[0] == "capture" and step[1] == ex_id), None)
    steps.append({"kind": "capture", "id": ex_id, "expr": name or "None"})
    return steps


_zygote = None


def zygote():
    """This kernel's sandbox zygote (:class:`.runner.Zygote`), started on first use — in a notebook's kernel,
    when ``attn_course.grading`` is imported (the setup cell): it imports torch while the learner reads."""
    global _zygote
    if _zygote is None:
        import atexit

        from .runner import Zygote
        _zygote = Zygote().start()
        atexit.register(_zygote.close)
    return _zygote


CHECK_TIMEOUT = 60.0                       # seconds one check() may run in the sandbox
OPEN_CHECK_TIMEOUT = 1800.0                # an open exercise trains the learner's design (the capstone): longer


def _run(ex: Exercise, obj: Any) -> CheckResult:
    from .runner import Options, _case_results, refused_rules, run_child
    result = CheckResult(ex.id, float(ex.points), held_out=in_nbgrader_autograde())
    source = judged_source(obj)
    cases = held_out_cases(ex, exercise_seed(ex, source)) if result.held_out else self_check_cases(ex)
    limit = OPEN_CHECK_TIMEOUT if ex.kind == "open" else CHECK_TIMEOUT
    out = run_child(program_of(ex.id, obj), {ex.id: cases}, Options(timeout=limit), zygote=zygote())
    result.captured = [line[:300] for line in dict.fromkeys(out.output_tail.splitlines()) if line.strip()][:20]
    if ex.id not in out.answers:
        why = "ran past the time limit" if out.timed_out else "crashed the sandbox"
        result.cases = [CaseResult(c.name, False, f"your code {why}") for c in cases]
        return result
    status, tensors = out.answers[ex.id]
    if status.get("cell_refused"):                  # the cell itself was refused (an import, a thread): no cases ran
        rule = refused_rules(status)
        result.status, result.forbidden = "forbidden", rule.split("; ")
        result.cases = [CaseResult(c.name, False, f"refused by the sandbox: {status.get('cell_error') or rule}")
                        for c in cases]
        return result
    if status.get("capture_error"):
        result.cases = [CaseResult(c.name, False, f"the object to check was not found: {status['capture_error']}")
                        for c in cases]
        return result
    rows = _case_results(ex, cases, status, tensors)
    if rows and all(r["hint"] == "not attempted" for r in rows):
        result.status = "not attempted"
        return result
    result.cases = [CaseResult(r["name"], r["ok"], r["hint"]) for r in rows]
    rules = refused_rules(status)
    if rules:
        result.status, result.forbidden = "forbidden", rules.split("; ")
        return result
    result.score = ex.score(result.n_passed, len(result.cases))
    return result


def _points(p: float) -> str:
    return f"{p:g} point" + ("" if p == 1 else "s")


def _report_lines(ex: Exercise, result: CheckResult) -> list[tuple[str, str]]:
    """The report as ``(kind, text)`` lines; kind is "title", "ok", "fail", "note" or "verdict"."""
    if result.held_out:
        title = (f"Exercise {ex.id} — {ex.title} ({_points(ex.points)}), graded by nbgrader on held-out "
                 f"inputs.")
    else:
        title = (f"Self-check of exercise {ex.id} — {ex.title} ({_points(ex.points)}). "
                 f"This is a self-check, not your grade.")
    lines = [("title", title)]
    lines += [("note", f"your code wrote this while it was checked: {text}") for text in result.captured]
    lines += [("fail", f"⚠ {text}") for text in result.unreachable]
    if result.status == "not attempted":
        lines.append(("fail", "… not attempted yet: replace `raise NotImplementedError(...)` with your code, "
                              "run that cell, then this one."))
        return lines
    for c in result.cases:
        lines.append(("ok", f"✓ {c.name}" + (f": {c.message}" if c.message else "")) if c.ok
                     else ("fail", f"✗ {c.name}: {c.message}"))
    if result.status == "forbidden":
        lines.append(("fail", f"✗ the sandbox refused your code ({'; '.join(result.forbidden)}), which this "
                              f"exercise forbids: write it by hand. The grader gives 0 points for it."))
        return lines
    n, total = result.n_passed, len(result.cases)
    verdict = "all cases passed" if n == total else f"{n}/{total} cases passed"
    if result.held_out:
        lines.append(("verdict", f"{verdict}: {result.score:g}/{ex.points:g} points."))
    else:
        lines.append(("verdict", f"{verdict}: {result.score:g}/{ex.points:g} points if the grader agrees "
                                 f"(it runs the same checks on fresh inputs)."))
    return lines


def _report(ex: Exercise, result: CheckResult) -> str:
    return "\n".join(text if kind == "title" else f"  {text}" for kind, text in _report_lines(ex, result))


_COLOURS = {"ok": "#1a7f37", "fail": "#cf222e", "note": "#9a6700", "verdict": "inherit"}


class _Report:
    """The report as a displayable object: HTML in a notebook, the plain-text report elsewhere."""

    def __init__(self, ex: Exercise, result: CheckResult):
        self.ex, self.result = ex, result

    def __repr__(self) -> str:
        return _report(self.ex, self.result)

    def _repr_html_(self) -> str:
        rows = []
        for kind, text in _report_lines(self.ex, self.result):
            if kind == "title":
                continue
            weight = "bold" if kind == "verdict" else "normal"
            rows.append(f'<li style="color: {_COLOURS[kind]}; font-weight: {weight}">{html.escape(text)}</li>')
        title = html.escape(_report_lines(self.ex, self.result)[0][1])
        return (f'<div class="attn-course-check"><div>{title}</div>'
                f'<ul style="list-style: none; margin: 0.2em 0; padding-left: 1em">{"".join(rows)}</ul></div>')


def _show(ex: Exercise, result: CheckResult) -> None:
    """Display the report (HTML + text) in IPython; print the text anywhere else. Never to stderr."""
    shell = None
    try:
        from IPython import get_ipython
        shell = get_ipython()
    except ImportError:
        pass
    if shell is not None:
        from IPython.display import display
        display(_Report(ex, result))
    else:
        print(_report(ex, result))


@contextlib.contextmanager
def _quiet(captured: list[str]):
    """Nothing this process writes to ``sys.stderr`` or warns while checking reaches stderr: it is collected
    (deduplicated, one line each) into ``captured`` (the learner's code runs in the child, whose output is
    collected the same way)."""
    py_err = io.StringIO()
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(py_err):
            warnings.simplefilter("always")
            yield
    finally:
        texts = [f"{w.category.__name__}: {w.message}" for w in caught] + [py_err.getvalue()]
        for text in dict.fromkeys(" ".join(t.split()) for t in texts):
            if text:
                captured.append(text if len(text) <= 300 else text[:297] + "...")


def _unreachable(exercise_id: str, obj: Any) -> list[str]:
    """Warnings for answers the grader cannot see as check() does (see :mod:`.reach`); never raises."""
    from . import reach
    out = []
    try:
        missing = reach.names_the_grader_lacks(obj, exercise_id, judged_source(obj))
        if missing:
            names = ", ".join(f"`{n}`" for n in missing)
            out.append(f"your answer uses {names}, defined in another cell. The grader runs only this exercise's "
                       f"cell (with the notebook's own cells), so there {names} would not exist (NameError) and "
                       f"these points would be lost: move {'it' if len(missing) == 1 else 'them'} into this cell.")
        if reach.exercise_cell_missing(exercise_id):
            out.append(f"this notebook file has no cell marked as exercise {exercise_id} (was it deleted and "
                       f"re-typed?). The grader finds your answer by that mark: paste your code into the original "
                       f"exercise cell (a fresh copy of this notebook has it) and save.")
    except Exception:                              # a warning helper must never break the self-check
        pass
    return out


def check(exercise_id: str, obj: Any) -> CheckResult:
    """Self-check ``obj`` against exercise ``exercise_id``: shows a report and returns a :class:`CheckResult`
    (shown by IPython as its score, the number nbgrader reads).

    Never raises for the learner's mistakes (wrong values, exceptions, stubs) and writes nothing to
    stderr (what the learner's code writes there, and warnings, appear in the report); the global torch
    RNG state is left as it was. Under ``nbgrader autograde`` the cases are held out
    (:func:`held_out_seed`).
    """
    try:
        ex = get(exercise_id)
    except KeyError as exc:
        print(f"✗ {exc.args[0]}")
        return CheckResult(str(exercise_id), 0.0, status="unknown exercise")
    captured: list[str] = []
    with torch.random.fork_rng(devices=[]), _quiet(captured):
        result = _run(ex, obj)
    result.captured = [text for text in dict.fromkeys(result.captured + captured)]
    result.unreachable = _unreachable(exercise_id, obj)
    _show(ex, result)
    return result


if "ipykernel" in sys.modules:
    zygote()
