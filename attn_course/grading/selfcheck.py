"""``check(exercise_id, obj)``: the learner's instant self-check, run in the notebook's own process.

It draws the exercise's cases from a fixed seed (so its report is the same on every run), applies the
learner's object, compares with the reference and shows one line per case (✓/✗ and, for a wrong answer,
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
import io
import os
import secrets
import sys
import tempfile
import traceback
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch

from .exercises import get
from .guard import RuntimeGuard, judged_source
from .spec import Case, Exercise, validate

__all__ = ["check", "CheckResult", "CaseResult", "judge_case", "describe_exception", "case_seed",
           "held_out_seed", "exercise_seed", "held_out_cases", "self_check_cases", "in_nbgrader_autograde"]

SELF_CHECK_SEED = 20240601
NBGRADER_ENV = "NBGRADER_EXECUTION"          # nbgrader sets it to "autograde" (or "validate") for the kernel
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))       # .../attn_course
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


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
    forbidden: list[str] = field(default_factory=list)    # forbidden APIs the learner's code used
    details: list[str] = field(default_factory=list)      # where: "line 3: `F.softmax` (torch.nn.functional.softmax)"
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


def describe_exception(exc: BaseException) -> str:
    """One friendly line: ``TypeError: message (line 3, in attention)``, pointing at the learner's code."""
    text = " ".join(str(exc).split())
    if len(text) > 240:
        text = text[:237] + "..."
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames
            if not os.path.abspath(f.filename).startswith((_PKG_DIR + os.sep, _TORCH_DIR + os.sep))
            and "site-packages" not in f.filename]
    if mine:
        line += f" (line {mine[-1].lineno}, in {mine[-1].name})"
    return line


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


def _run(ex: Exercise, obj: Any) -> CheckResult:
    result = CheckResult(ex.id, float(ex.points), held_out=in_nbgrader_autograde())
    source = judged_source(obj)
    findings = ex.static_findings(source) if ex.static_forbidden else []
    found = {f.api for f in findings}
    cases = held_out_cases(ex, exercise_seed(ex, source)) if result.held_out else self_check_cases(ex)
    for case in cases:
        want = ex.expected(case)
        guard = RuntimeGuard(ex.forbidden)
        try:
            with guard:
                got = ex.answer(obj, case)
        except NotImplementedError:
            result.status = "not attempted"
            result.cases = []
            return result
        except (Exception, SystemExit) as exc:     # the learner's mistake, reported in one line
            result.cases.append(CaseResult(case.name, False, ex.explain_error(case, describe_exception(exc))))
            found |= guard.violations
            continue
        found |= guard.violations
        result.cases.append(judge_case(ex, got, want, case))
    if found:
        result.status = "forbidden"
        result.forbidden = sorted(found)
        result.details = [str(f) for f in findings]
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
        apis = ", ".join(result.forbidden)
        where = "; ".join(result.details)
        lines.append(("fail", f"✗ your code uses {apis}" + (f" ({where})" if where else " (while it runs)")
                      + ", which this exercise forbids: write it by hand. The grader gives 0 points for it."))
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
    """Nothing reaches stderr inside: ``sys.stderr`` writes, native writes to file descriptor 2 and
    warnings are collected (deduplicated, each shortened to one line) into ``captured``."""
    py_err = io.StringIO()
    fd_err = None
    saved_fd = None
    try:
        sys.stderr.flush()
    except Exception:
        pass
    try:                                             # native code (C++ warnings, printf) writes to fd 2
        fd_err = tempfile.TemporaryFile()
        saved_fd = os.dup(2)
        os.dup2(fd_err.fileno(), 2)
    except (OSError, ValueError, AttributeError):
        if fd_err is not None:
            fd_err.close()
        fd_err, saved_fd = None, None
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(py_err):
            warnings.simplefilter("always")
            yield
    finally:
        native = b""
        if saved_fd is not None:
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            fd_err.seek(0)
            native = fd_err.read(1 << 16)
            fd_err.close()
        seen = set()
        texts = [f"{w.category.__name__}: {w.message}" for w in caught]
        texts += [py_err.getvalue(), native.decode("utf-8", "replace")]
        for text in texts:
            text = " ".join(text.split())
            if text and text not in seen:
                seen.add(text)
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
    result.captured = captured
    result.unreachable = _unreachable(exercise_id, obj)
    _show(ex, result)
    return result
