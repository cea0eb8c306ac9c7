"""Learner functions are called positionally, in the order the prompt's signature gives: the parameter
names are the learner's (a renamed parameter never costs a point), in check() and the grader alike (both
call ``Exercise.answer``)."""
import inspect

import pytest
import torch

from attn_course.grading.exercises import registry


class _Called(Exception):
    pass


def spy(calls):
    def learner(*args, **kwargs):
        calls.append((args, kwargs))
        raise _Called
    return learner


@pytest.mark.parametrize("ex_id", sorted(registry()))
def test_no_exercise_calls_the_learner_with_keywords(ex_id):
    ex = registry()[ex_id]
    case = ex.cases(torch.Generator().manual_seed(0))[0]
    calls = []
    try:
        ex.answer(spy(calls), case)
    except Exception:                               # _Called, or an exercise that needs a class/module
        pass
    for args, kwargs in calls:
        assert not kwargs, f"{ex_id} passes {sorted(kwargs)} by name: call the learner's function positionally"


def test_renamed_parameters_get_full_marks():
    """A closed-form exercise answered by a function whose parameter names differ from the prompt's."""
    from exercise_kit import assert_all_pass

    def bytes_renamed(a, b, c, d, e, f, g):         # cache_bytes(num_layers, num_heads, num_kv_heads, ...)
        return 2 * a * c * d * e * f * g
    assert_all_pass("03_kv_cache_bytes", bytes_renamed)
    assert list(inspect.signature(bytes_renamed).parameters) == list("abcdefg")
