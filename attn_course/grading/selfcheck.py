"""``check(exercise_id, obj)``: the learner's instant self-check, run in the notebook's own process.

It draws the exercise's cases from a fixed seed (so its printed report is the same on every run),
applies the learner's object, compares with the reference and prints one line per case (✓/✗ and, for a
wrong answer, the detected misconception). It never raises for the learner's mistakes: an exception in
the learner's code becomes one line (``TypeError: … (line 3, in attention)``), ``NotImplementedError``
means "not attempted yet". It is a self-check, not the grade: the instructor's grader
(:mod:`attn_course.grading.runner`) re-runs the same cases on fresh inputs in a sandbox.
"""
from __future__ import annotations

import os
import traceback
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch

from .exercises import get
from .guard import RuntimeGuard, judged_source
from .spec import Case, Exercise, validate

__all__ = ["check", "CheckResult", "CaseResult", "judge_case", "describe_exception", "case_seed"]

SELF_CHECK_SEED = 20240601
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))       # .../attn_course
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


def case_seed(exercise_id: str, base: int) -> int:
    """Seed of an exercise's case generator: ``base`` mixed with the id (different exercises differ)."""
    return (zlib.crc32(exercise_id.encode()) * 1_000_003 + int(base)) % (2**63 - 1)


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

    @property
    def n_passed(self) -> int:
        return sum(c.ok for c in self.cases)

    @property
    def passed(self) -> bool:
        return self.status == "checked" and bool(self.cases) and all(c.ok for c in self.cases)

    def __repr__(self) -> str:
        return (f"CheckResult({self.exercise_id!r}: {self.n_passed}/{len(self.cases)} cases, "
                f"{self.score:g}/{self.max_score:g} points, {self.status})")

    def _ipython_display_(self):
        """The report was already printed; showing the result again would only repeat it."""


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
    return CaseResult(case.name, bool(verdict.ok), "" if verdict.ok else (verdict.hint or "wrong values"))


def _run(ex: Exercise, obj: Any) -> CheckResult:
    result = CheckResult(ex.id, float(ex.points))
    findings = ex.static_findings(judged_source(obj)) if ex.static_forbidden else []
    found = {f.api for f in findings}
    gen = torch.Generator().manual_seed(case_seed(ex.id, SELF_CHECK_SEED))
    for case in ex.cases(gen):
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


def _report(ex: Exercise, result: CheckResult) -> str:
    lines = [f"Self-check of exercise {ex.id} — {ex.title} ({_points(ex.points)}). "
             f"This is a self-check, not your grade."]
    if result.status == "not attempted":
        lines.append("  … not attempted yet: replace `raise NotImplementedError(...)` with your code, "
                     "run that cell, then this one.")
        return "\n".join(lines)
    for c in result.cases:
        lines.append(f"  {'✓' if c.ok else '✗'} {c.name}" + ("" if c.ok else f": {c.message}"))
    if result.status == "forbidden":
        apis = ", ".join(result.forbidden)
        where = "; ".join(result.details)
        lines.append(f"  ✗ your code uses {apis}" + (f" ({where})" if where else " (while it runs)")
                     + ", which this exercise forbids: write it by hand. The grader gives 0 points for it.")
        return "\n".join(lines)
    n, total = result.n_passed, len(result.cases)
    verdict = "all cases passed" if n == total else f"{n}/{total} cases passed"
    lines.append(f"{verdict}: {result.score:g}/{ex.points:g} points if the grader agrees "
                 f"(it runs the same checks on fresh inputs).")
    return "\n".join(lines)


def check(exercise_id: str, obj: Any) -> CheckResult:
    """Self-check ``obj`` against exercise ``exercise_id``: prints a report and returns a :class:`CheckResult`.

    Never raises for the learner's mistakes (wrong values, exceptions, stubs); the global torch RNG state
    is left as it was.
    """
    try:
        ex = get(exercise_id)
    except KeyError as exc:
        print(f"✗ {exc.args[0]}")
        return CheckResult(str(exercise_id), 0.0, status="unknown exercise")
    with torch.random.fork_rng(devices=[]):
        result = _run(ex, obj)
    print(_report(ex, result))
    return result
