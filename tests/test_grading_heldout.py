"""Every exercise is graded on inputs the self-check never shows: for each exercise, the grader's cases for
many held-out seeds share no case with the self-check's, and they vary with the seed."""
import pytest
import torch

from attn_course.grading.exercises import registry
from attn_course.grading.selfcheck import _case_key, held_out_cases, held_out_seed, self_check_cases


@pytest.mark.parametrize("ex_id", sorted(registry()))
def test_the_grader_never_grades_on_a_self_check_case(ex_id):
    ex = registry()[ex_id]
    shown = {_case_key(c) for c in self_check_cases(ex)}
    drawn = set()
    for n in range(12):
        cases = held_out_cases(ex, held_out_seed(f"learner cell {n}"))
        assert len(cases) == len(self_check_cases(ex))
        keys = {_case_key(c) for c in cases}
        assert not keys & shown
        drawn |= keys
    assert len(drawn) > len(shown), f"{ex_id}: the held-out cases hardly depend on the seed"


def test_a_case_equal_to_the_self_checks_is_redrawn():
    """An exercise with a small space of cases (a world size P in 2..4) still never grades on a shown one."""
    from attn_course.grading.spec import Case, Exercise, randint
    ex = Exercise("99_small", 1, "t", "f(P)", kind="compute", cases_fn=lambda g: [Case(f"P={p}", params={"P": p})
                                                                   for p in (randint(g, 2, 4), randint(g, 2, 4))])
    shown = {_case_key(c) for c in self_check_cases(ex)}
    for n in range(20):
        assert not {_case_key(c) for c in held_out_cases(ex, n)} & shown
    fixed = Exercise("99_fixed", 1, "t", "f()", kind="compute", cases_fn=lambda g: [Case("always the same", params={"x": 1})])
    with pytest.raises(ValueError, match="whatever the seed"):
        held_out_cases(fixed, 0)
