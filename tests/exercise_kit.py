"""Testing an exercise set: run a candidate answer through the same judging path as ``check()``.

Every ``tests/test_exercises_NN.py`` uses these: the reference solution passes every case for several
seeds, and each common mistake, written as a function, fails with the hint that names it.
"""
import torch

from attn_course.grading.exercises import get
from attn_course.grading.selfcheck import judge_case


def results(ex_id, fn, seed=0):
    """``[(ok, message)]`` per case. A mistake may crash on some case: that case fails with the error."""
    ex = get(ex_id)
    out = []
    for case in ex.cases(torch.Generator().manual_seed(seed)):
        try:
            got = ex.answer(fn, case)
        except Exception as exc:
            out.append((False, ex.explain_error(case, f"{type(exc).__name__}: {exc}")))
            continue
        r = judge_case(ex, got, ex.expected(case), case)
        out.append((r.ok, r.message))
    return out


def assert_all_pass(ex_id, fn, seeds=(0, 1, 2)):
    for seed in seeds:
        res = results(ex_id, fn, seed)
        assert res and all(ok for ok, _ in res), res


def assert_hint(ex_id, fn, hint, *, ignore=(), every=True):
    """Some case fails with ``hint``. With ``every``, each failing case names it too, except failures
    whose message starts with one of ``ignore`` (a shape/validation error or a crash that the mistake
    causes on some cases before any value could be judged)."""
    res = results(ex_id, fn)
    assert not all(ok for ok, _ in res), res
    judged = [msg for ok, msg in res if not ok and not msg.startswith(tuple(ignore))]
    assert judged and any(hint in msg for msg in judged), res
    if every:
        assert all(hint in msg for msg in judged), res
