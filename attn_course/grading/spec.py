"""How an exercise is described: the contract between exercise sets, ``check()`` and the bulk grader.

An exercise is a trusted Python object (it lives in the installed package, never in a notebook):

* ``cases(gen)``      — draws the inputs, in the *grader's* process (or the self-check's), from ``gen``.
* ``answer(obj, case)`` — applies the learner's object to one case's inputs and returns a dict of plain
  tensors. This is the only method that touches learner code; in bulk grading it runs inside the
  sandboxed child and its result crosses the process boundary as safetensors (no pickle).
* ``expected(case)``  — the reference answer, computed by the grader from the case's inputs.
* ``judge(got, want, case)`` — compares, and on failure names the likely misconception (``hint``).

``got`` has already been validated against ``want``: same keys, tensors, same dtype and shape (the grader
does that, see :func:`validate`), so ``judge`` may assume both are well-formed tensors.

An exercise set for lesson NN is a module ``attn_course/grading/exercises/lessonNN.py`` exposing
``EXERCISES: list[Exercise]``; ids are unique across the course and start with the lesson number
(``"01_attention_by_hand"``). Nothing else needs registering.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

__all__ = ["Case", "Verdict", "Exercise", "validate", "close", "matches", "first_match", "diagnose",
           "FORBID_SDPA", "FORBID_COURSE", "randint", "choice", "draw", "distinct"]

# Names for the ``forbidden`` tuple: dotted APIs (attribute chains) or whole modules.
FORBID_SDPA = ("torch.nn.functional.scaled_dot_product_attention",
               "torch.nn.MultiheadAttention", "torch.nn.functional.multi_head_attention_forward")
FORBID_COURSE = ("attn_course",)


@dataclass(frozen=True)
class Case:
    """One graded case: ``inputs`` are tensors drawn by the grader, ``params`` plain JSON values."""
    name: str
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)


KINDS = ("build", "compute", "predict", "debug", "open")
"""The kinds of exercise (contract, ``Exercise.kind``): build — the learner writes the lesson's algorithm;
compute — a quantity (bytes, FLOPs, counts); predict — shapes or outcomes; debug — find and fix a bug;
open — a design of the learner's own, graded on measured outcomes within a stated budget."""


@dataclass(frozen=True)
class Verdict:
    ok: bool
    hint: str = ""        # for a wrong answer: the likely misconception, in one friendly sentence
    note: str = ""        # for a right answer (capstone): what was measured, shown beside the ✓ (e.g. the loss)


@dataclass
class Exercise:
    """Base class; subclass it or pass functions. ``points`` is for the whole exercise.

    Partial credit: points * (cases passed / cases) rounded down to 0.5, unless ``all_or_nothing``
    (see :meth:`score`).
    """
    id: str
    points: float
    title: str
    expects: str                                    # what the learner hands to check(), e.g. "a function attn(q, k, v, mask)"
    cases_fn: Callable[[torch.Generator], list[Case]] | None = None
    answer_fn: Callable[[Any, Case], dict[str, torch.Tensor]] | None = None
    expected_fn: Callable[[Case], dict[str, torch.Tensor]] | None = None
    judge_fn: Callable[[dict, dict, Case], Verdict] | None = None
    forbidden: tuple[str, ...] = ()                 # torch APIs refused while the learner's object runs, by the
    #   sandbox's dispatcher rule (.sandbox.learner_call): the fused-attention names (FORBID_SDPA) switch on "no
    #   fused attention kernels" (always on in a build), others (softmax, ...) are refused by their aten op names;
    #   FORBID_COURSE holds everywhere (no course module exists in the sandbox)
    all_or_nothing: bool = False
    # Optional, added by the grading-validity review (issue 18); every existing set works without them:
    error_hint_fn: Callable[[Case, str], str | None] | None = None   # names the mistake behind an exception
    #   the learner's code raised on this case (e.g. a broadcast error that a known wrong grouping causes)
    kind: str = ""                                  # (contract) one of KINDS: what the exercise asks the learner
    #   to do — build the lesson's algorithm, compute a quantity, predict an outcome, debug code, or an open design
    # The capstone (an "open" exercise, lesson 16): measured numbers for the leaderboard.
    measure_fn: Callable[[dict, Case], dict] | None = None   # (got, case) -> {name: number or bool}: what the
    #   grader measured on this case (kept in the report; booleans are budget checks, all True = within budget)
    rank_by: str = ""                               # the measured name ``attn-course grade`` ranks a class by in
    #   leaderboard.csv / leaderboard.md (ascending); "" = no leaderboard
    rank_noise: str = ""                            # the measured name holding the ± noise of ``rank_by`` (e.g. two
    #   standard errors): two rows closer than their noises combined are marked "within noise" on the leaderboard.
    #   An exercise with ``rank_by`` gives the whole class ONE seed (selfcheck.exercise_seed), never one per cell.
    time_factor: float = 0.0                        # > 0: the grader's time limit for this lesson is this many
    #   times the course's own solution's run, measured at grade time (runner.calibrate), at least --timeout

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"exercise {self.id!r}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    def cases(self, gen: torch.Generator) -> list[Case]:
        return self.cases_fn(gen)

    def answer(self, obj: Any, case: Case) -> dict[str, torch.Tensor]:
        """Apply the learner's object to ``case`` (in the sandbox: :func:`.sandbox.learner_call` holds)."""
        return self.answer_fn(obj, case)

    def explain_error(self, case: Case, error: str) -> str:
        """The one-line error the learner's code raised on ``case``, with the named mistake if
        ``error_hint_fn`` recognises it."""
        hint = self.error_hint_fn(case, error) if self.error_hint_fn is not None else None
        return f"{error} — {hint}" if hint else error

    def expected(self, case: Case) -> dict[str, torch.Tensor]:
        return self.expected_fn(case)

    def judge(self, got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], case: Case) -> Verdict:
        if self.judge_fn is not None:
            return self.judge_fn(got, want, case)
        return Verdict(all(close(got[k], want[k]) for k in want))

    def score(self, passed: int, total: int) -> float:
        """Points for ``passed`` of ``total`` cases: all or nothing, or proportional rounded *down* to 0.5
        (so failing a case never rounds up to full marks)."""
        if total <= 0 or passed <= 0:
            return 0.0
        if passed >= total:
            return float(self.points)
        if self.all_or_nothing:
            return 0.0
        return math.floor(2 * self.points * passed / total + 1e-9) / 2


def close(got: torch.Tensor, want: torch.Tensor, *, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    """Tolerant equality for already-validated tensors (NaN never equals anything)."""
    if got.shape != want.shape:
        return False
    if want.dtype == torch.bool or not want.is_floating_point():
        return bool(torch.equal(got, want))
    return bool(torch.allclose(got.double(), want.double(), atol=atol, rtol=rtol))


def validate(got: Any, want: dict[str, torch.Tensor]) -> str | None:
    """Return None if ``got`` is a dict with exactly ``want``'s keys, each a real ``torch.Tensor`` of the
    same dtype and shape; otherwise a short learner-facing reason. Never trusts ``got``'s methods."""
    if type(got) is not dict:
        return f"expected a dict of tensors, got {type(got).__name__}"
    if set(got) != set(want):
        return f"expected entries {sorted(want)}, got {sorted(map(str, got))}"
    for key, w in want.items():
        g = got[key]
        if type(g) is not torch.Tensor:
            return f"{key}: expected a torch.Tensor, got {type(g).__name__}"
        if g.dtype != w.dtype:
            return f"{key}: expected dtype {w.dtype}, got {g.dtype}"
        if tuple(g.shape) != tuple(w.shape):
            return f"{key}: expected shape {tuple(w.shape)}, got {tuple(g.shape)}"
    return None


def matches(got: Any, cand: Any, *, atol: float = 1e-4, rtol: float = 1e-3) -> bool:
    """Does ``got`` reproduce a candidate answer? Tensors are compared with a tolerance (NaN matches
    NaN); a dict candidate is compared on its own keys; a ``None`` candidate (a mistake that does not
    apply to this case) never matches."""
    if cand is None:
        return False
    if isinstance(cand, dict):
        return all(matches(got[key], c, atol=atol, rtol=rtol) for key, c in cand.items())
    return got.shape == cand.shape and bool(
        torch.allclose(got.double(), cand.double(), atol=atol, rtol=rtol, equal_nan=True))


def first_match(got: Any, candidates, *, same: Callable[[Any, Any], bool] = matches) -> str | None:
    """The hint of the first ``(hint, predicted answer)`` candidate that ``got`` reproduces, else None.

    This is how exercises *detect* a misconception: compute what each common mistake would return on
    the case's inputs and name the one the learner's answer equals."""
    for hint, cand in candidates:
        if same(got, cand):
            return hint
    return None


def diagnose(got: Any, candidates, default: str, *, same: Callable[[Any, Any], bool] = matches) -> Verdict:
    """A failing :class:`Verdict` naming the detected misconception (see :func:`first_match`), or ``default``."""
    return Verdict(False, first_match(got, candidates, same=same) or default)


# ---- drawing held-out cases ------------------------------------------------------------------------------
# Every exercise's cases depend on the generator it is given: the self-check and the grader draw from
# different seeds, so the grader never grades on the cases the self-check shows
# (:func:`~attn_course.grading.selfcheck.held_out_cases` also redraws any case that happens to coincide).

def randint(gen: torch.Generator, lo: int, hi: int) -> int:
    """A uniform integer in ``[lo, hi]`` (both included) from ``gen``."""
    return int(torch.randint(lo, hi + 1, (1,), generator=gen))


def choice(gen: torch.Generator, seq):
    """A uniform element of ``seq`` from ``gen``."""
    return seq[randint(gen, 0, len(seq) - 1)]


def draw(gen: torch.Generator, make: Callable[[torch.Generator], Any], ok: Callable[[Any], bool] = lambda x: True,
         tries: int = 200):
    """``make(gen)`` until ``ok`` accepts it — e.g. until every mistake a judge names gives a value different
    from the answer and from the other mistakes on it, so that each hint can be told apart."""
    for _ in range(tries):
        x = make(gen)
        if ok(x):
            return x
    raise RuntimeError(f"no acceptable case in {tries} draws: widen the ranges of {make}")


def distinct(*values) -> bool:
    """True when no two of ``values`` are equal (the answer and the values of the mistakes a judge names)."""
    return len(set(values)) == len(values)


# ---- lesson 12 (absorbed MLA decode): a size limit named in the exercise's own words ----------------------

class Materialised(Exception):
    """The learner's code created a tensor that the algorithm promises never to form (e.g. MLA's per-head keys)."""


def limit_numel(answer_fn: Callable[[Any, Case], dict], limit_fn: Callable[[Case], int],
                message_fn: Callable[[Case, tuple, int], str]) -> Callable[[Any, Case], dict]:
    """``answer_fn`` that fails the case with :class:`Materialised` — its message ``message_fn(case, shape,
    limit)`` names what a tensor of that ``shape`` is — when any op of the learner's call wrote a tensor of
    ``limit_fn(case)`` elements or more (:class:`~.budget.Trace`'s ``largest``; a view, ``expand`` too, writes
    nothing)."""
    def answer(obj, case):
        from .budget import Trace
        limit = limit_fn(case)
        with Trace() as trace:
            got = answer_fn(obj, case)
        if trace.largest >= limit:
            raise Materialised(message_fn(case, trace.largest_shape, limit))
        return got
    return answer
