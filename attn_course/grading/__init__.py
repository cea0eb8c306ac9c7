"""Graded exercises: the learner's self-check, the release tool and the instructor's sandboxed grader.

* ``check(exercise_id, obj)`` — instant self-check in the notebook (:mod:`.selfcheck`).
* ``attn-course release [--check]`` — build ``exercises/`` from ``solutions/`` (:mod:`.release`).
* ``attn-course grade SUBMISSION... --out DIR`` — bulk grading in a sandbox (:mod:`.runner`).

Exercises are described by :mod:`.spec` and registered in :mod:`.exercises` (one ``lessonNN`` module each).
"""
from . import exercises, spec
from .selfcheck import CheckResult, check

__all__ = ["check", "CheckResult", "spec", "exercises"]
