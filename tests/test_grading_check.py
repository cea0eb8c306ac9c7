"""``check()``, the learner's self-check; the forbidden-API guard; partial credit."""
import functools
import math
import time

import pytest
import torch

from attn_course.grading import check
from attn_course.grading.exercises import get, registry
from attn_course.grading.guard import RuntimeGuard, static_violations
from attn_course.grading.spec import FORBID_COURSE, FORBID_SDPA, Exercise


def attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return w @ v, w


def test_passing_solution_report(capsys):
    result = check("01_attention_by_hand", attention)
    out = capsys.readouterr().out
    assert "This is a self-check, not your grade." in out
    assert out.count("✓") == 5 and "✗" not in out
    assert result.passed and result.score == 3 == result.max_score and result.status == "checked"


def test_output_is_deterministic(capsys):
    check("01_causal_padding_mask", lambda lengths, L: torch.zeros(len(lengths), 1, L, L, dtype=torch.bool))
    first = capsys.readouterr().out
    check("01_causal_padding_mask", lambda lengths, L: torch.zeros(len(lengths), 1, L, L, dtype=torch.bool))
    assert capsys.readouterr().out == first


def test_stub_is_not_attempted(capsys):
    def stub(q, k, v, mask=None):
        raise NotImplementedError("Exercise 01_attention_by_hand: your code here")
    result = check("01_attention_by_hand", stub)
    out = capsys.readouterr().out
    assert "not attempted yet" in out and "Traceback" not in out
    assert not result.passed and result.score == 0 and result.status == "not attempted"


@pytest.mark.parametrize("obj, error", [
    (lambda q, k, v, mask=None: q @ k, "RuntimeError"),
    (lambda q, k, v, mask=None: q.nonexistent(), "AttributeError"),
    (lambda q, k, v, mask=None: 1 / 0, "ZeroDivisionError"),
    (None, "TypeError: 'NoneType' object is not callable"),
    (lambda q, k, v, mask=None: __import__("sys").exit(3), "SystemExit"),
])
def test_learner_exceptions_become_one_line(capsys, obj, error):
    result = check("01_attention_by_hand", obj)
    out = capsys.readouterr().out
    assert "Traceback" not in out
    lines = [line for line in out.splitlines() if error in line]
    assert len(lines) == 5                         # one line per case
    assert not result.passed and result.score == 0


def test_exception_location(capsys):
    def mine(q, k, v, mask=None):
        raise TypeError("bad")
    check("01_attention_by_hand", mine)
    out = capsys.readouterr().out
    assert "TypeError: bad (line" in out and ", in mine)" in out


def test_unknown_id_does_not_raise(capsys):
    result = check("99_nope", attention)
    assert "unknown exercise id '99_nope'" in capsys.readouterr().out
    assert result.status == "unknown exercise" and not result.passed


def test_partial_credit_and_hint(capsys):
    result = check("01_attention_by_hand", lambda q, k, v, m=None: attention(q, k, v, None))
    out = capsys.readouterr().out
    assert result.n_passed == 2 and result.score == 1.0       # 2/5 of 3 points, rounded down to 0.5
    assert "ignores the mask" in out


@pytest.mark.parametrize("cheat", [
    lambda q, k, v, mask=None: (torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                                attention(q, k, v, mask)[1]),
    lambda q, k, v, mask=None: (functools.partial(torch.nn.functional.scaled_dot_product_attention, q)(
        k, v, attn_mask=mask), attention(q, k, v, mask)[1]),
    lambda q, k, v, mask=None: __import__("attn_course").attention(q, k, v, attn_mask=mask),
    lambda q, k, v, mask=None: (torch.nn.MultiheadAttention(q.shape[-1], 1), attention(q, k, v, mask))[1],
])
def test_forbidden_apis_are_caught_at_run_time(capsys, cheat):
    result = check("01_attention_by_hand", cheat)
    out = capsys.readouterr().out
    assert result.status == "forbidden" and result.score == 0 and not result.passed
    assert "which this exercise forbids" in out


def test_check_is_fast():
    for ex_id in registry():
        if ex_id.startswith("01_"):
            t0 = time.perf_counter()
            check(ex_id, None)
            assert time.perf_counter() - t0 < 2.0
    t0 = time.perf_counter()
    check("01_attention_by_hand", attention)
    assert time.perf_counter() - t0 < 2.0


def test_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    check("01_attention_by_hand", lambda q, k, v, mask=None: (torch.rand(1), torch.rand(1)))
    assert torch.equal(torch.rand(3), expected)


def test_result_shows_as_its_score_for_nbgrader():
    """In IPython a check cell's value is the score: nbgrader reads that number (text/plain) as the
    partial credit of the autograder-test cell; the report itself was shown by check()."""
    from IPython.core.formatters import DisplayFormatter
    from nbgrader.utils import get_partial_grade
    result = check("01_predict_shapes", lambda q, k, v: ((*q[:3], v[3]), (*q[:3], k[2])))
    assert repr(result) == "CheckResult('01_predict_shapes': 3/3 cases, 1/1 points, checked)"
    partial = check("01_attention_by_hand", lambda q, k, v, m=None: attention(q, k, v, None))
    stub = check("01_attention_by_hand", lambda q, k, v, m=None: (_ for _ in ()).throw(NotImplementedError()))
    for r, score in ((result, 1.0), (partial, partial.score), (stub, 0.0)):
        data, _ = DisplayFormatter().format(r)
        assert data["text/plain"] == f"{score:g}"
        assert get_partial_grade({"data": data}, r.max_score) == score
    assert 0 < partial.score < partial.max_score


def test_report_is_html_in_a_notebook():
    from attn_course.grading.exercises import get
    from attn_course.grading.selfcheck import _Report
    ex = get("01_attention_by_hand")
    result = check("01_attention_by_hand", lambda q, k, v, m=None: attention(q, k, v, None))
    html = _Report(ex, result)._repr_html_()
    assert html.count("<li") == len(result.cases) + 1
    assert "✓ no mask, one head" in html and "✗ causal mask" in html
    assert "ignores the mask" in html and "&lt;" not in repr(_Report(ex, result))


def test_nothing_reaches_stderr(capfd):
    """nbgrader gives 0 to a test cell with stderr output: the learner's prints to stderr, native writes
    to file descriptor 2 and warnings are captured by check() and listed in its report instead."""
    import os
    import sys
    import warnings

    def noisy(q, k, v, mask=None):
        print("debug: shapes", tuple(q.shape), file=sys.stderr)
        os.write(2, b"native noise\n")
        warnings.warn("my own warning", UserWarning)
        torch.tensor(torch.tensor([1.0]))         # torch's own UserWarning ("To copy construct ...")
        return attention(q, k, v, mask)

    result = check("01_attention_by_hand", noisy)
    out, err = capfd.readouterr()
    assert err == ""
    assert result.passed and result.score == 3
    assert "debug: shapes" in out and "native noise" in out and "UserWarning: my own warning" in out
    assert "UserWarning: To copy construct from a tensor" in out
    assert out.count("my own warning") == 1                    # deduplicated across the cases
    print("after", file=sys.stderr)                              # stderr works again afterwards
    os.write(2, b"fd after\n")
    assert capfd.readouterr().err == "after\nfd after\n"


def _recording(calls):
    def my_attention(q, k, v, mask=None):
        calls.append(q.clone())
        return attention(q, k, v, mask)
    return my_attention


def test_nbgrader_autograde_draws_held_out_inputs(monkeypatch, capsys):
    """Under nbgrader autograde (NBGRADER_EXECUTION=autograde) the cases are not the self-check's, and
    the same submission always gets the same ones: those attn-course grade draws for that cell."""
    import inspect

    from attn_course.grading.selfcheck import SELF_CHECK_SEED, case_seed, held_out_seed
    ex = get("01_attention_by_hand")
    seen, held, again = [], [], []
    fn = _recording(seen)
    check("01_attention_by_hand", fn)
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")       # validating: the learner's own cases
    validated = []
    r = check("01_attention_by_hand", _recording(validated))
    assert not r.held_out and all(torch.equal(a, b) for a, b in zip(seen, validated))
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    r1 = check("01_attention_by_hand", _recording(held))
    r2 = check("01_attention_by_hand", _recording(again))
    out = capsys.readouterr().out
    assert r1.held_out and r1.passed and r1.score == r2.score == 3
    assert "score on held-out inputs" in r1._repr_html_() and "self-check score" in r._repr_html_()
    assert "held-out inputs" in out and "not your grade" in out     # the self-check runs said so, not these
    assert len(held) == len(seen) == 5
    assert not any(a.shape == b.shape and torch.equal(a, b) for a, b in zip(held, seen))   # fresh inputs
    assert all(torch.equal(a, b) for a, b in zip(held, again))                             # deterministic
    source = inspect.getsource(_recording([]))                  # what judged_source() finds: my_attention
    want = ex.cases(torch.Generator().manual_seed(case_seed(ex.id, held_out_seed(source))))
    assert all(torch.equal(a, c.inputs["q"]) for a, c in zip(held, want))
    assert held_out_seed(source) != SELF_CHECK_SEED
    assert held_out_seed(source + "\n\n") == held_out_seed(source.replace("\n", "  \r\n"))
    assert held_out_seed(source) != held_out_seed(source.replace("clone()", "clone() "  + "* 1"))


# ---- guard -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("source, found", [
    ("y = F.scaled_dot_product_attention(q, k, v)", ["torch.nn.functional.scaled_dot_product_attention"]),
    ("from torch.nn.functional import scaled_dot_product_attention as s", ["torch.nn.functional.scaled_dot_product_attention"]),
    ("m = nn.MultiheadAttention(8, 2)", ["torch.nn.MultiheadAttention"]),
    ("import attn_course.masks", ["attn_course"]),
    ("from attn_course import attention", ["attn_course"]),
    ("f = getattr(F, 'scaled_dot_product_attention')", ["torch.nn.functional.scaled_dot_product_attention"]),
    ("x = 1  # scaled_dot_product_attention would be easier", []),
    ("def my_attention(q, k, v):\n    return q @ k", []),
    ("this is not python (", []),
])
def test_static_violations(source, found):
    assert static_violations(source, FORBID_SDPA + FORBID_COURSE) == found


def test_runtime_guard_allows_plain_torch_and_restores_profile():
    import sys
    q = torch.randn(1, 1, 3, 4)
    with RuntimeGuard(FORBID_SDPA + FORBID_COURSE) as g:
        attention(q, q, q)
    assert g.violations == set() and sys.getprofile() is None


def test_score_rounds_down_to_half_points():
    ex = Exercise("x", 3, "t", "e", kind="compute")
    assert [ex.score(n, 5) for n in range(6)] == [0, 0.5, 1.0, 1.5, 2.0, 3.0]
    assert Exercise("y", 1, "t", "e", kind="compute").score(5, 6) == 0.5
    assert Exercise("z", 2, "t", "e", all_or_nothing=True, kind="compute").score(2, 3) == 0
    assert get("01_score_std").score(4, 4) == 1
