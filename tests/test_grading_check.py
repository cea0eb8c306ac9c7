"""``check()``, the learner's self-check: reports, partial credit, the sandbox's refusals. Every answer is a
learner-style cell (its text in ``linecache``, as IPython keeps it): check() rebuilds the cell in its sandbox."""
import time

import pytest
import torch

from attn_course.grading import check
from attn_course.grading.exercises import get, registry
from attn_course.grading.spec import Exercise
from test_grading_learners import run_cell

ATTENTION = """
def attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return w @ v, w
"""


def cell(body: str = "", name: str = "attention"):
    """The function ``name`` of a learner's cell: :data:`ATTENTION`, then ``body``."""
    return run_cell(ATTENTION + body)[name]


def answer(expr: str, args: str = "q, k, v, mask=None"):
    """A learner's cell whose ``answer(args)`` returns ``expr`` (which may call ``attention``)."""
    return cell(f"\ndef answer({args}):\n    return {expr}\n", "answer")


attention = cell()


def test_passing_solution_report(capsys):
    result = check("01_attention_by_hand", attention)
    out = capsys.readouterr().out
    assert "This is a self-check, not your grade." in out
    assert out.count("✓") == 5 and "✗" not in out
    assert result.passed and result.score == 3 == result.max_score and result.status == "checked"


def test_output_is_deterministic(capsys):
    check("01_causal_padding_mask", answer("torch.zeros(len(lengths), 1, L, L, dtype=torch.bool)", "lengths, L"))
    first = capsys.readouterr().out
    check("01_causal_padding_mask", answer("torch.zeros(len(lengths), 1, L, L, dtype=torch.bool)", "lengths, L"))
    assert capsys.readouterr().out == first


def test_stub_is_not_attempted(capsys):
    stub = cell('def stub(q, k, v, mask=None):\n    raise NotImplementedError("your code here")\n', "stub")
    result = check("01_attention_by_hand", stub)
    out = capsys.readouterr().out
    assert "not attempted yet" in out and "Traceback" not in out
    assert not result.passed and result.score == 0 and result.status == "not attempted"


@pytest.mark.parametrize("expr, error", [
    ("q @ k", "RuntimeError"),
    ("q.nonexistent()", "AttributeError"),
    ("1 / 0", "ZeroDivisionError"),
    (None, "TypeError: 'NoneType' object is not callable"),
    ("__import__('sys').exit(3)", "SystemExit"),
])
def test_learner_exceptions_become_one_line(capsys, expr, error):
    result = check("01_attention_by_hand", expr and answer(expr))
    out = capsys.readouterr().out
    assert "Traceback" not in out
    lines = [line for line in out.splitlines() if error in line]
    assert len(lines) == 5                         # one line per case
    assert not result.passed and result.score == 0


def test_exception_location(capsys):
    check("01_attention_by_hand", cell('def mine(q, k, v, mask=None):\n    raise TypeError("bad")\n', "mine"))
    out = capsys.readouterr().out
    assert "TypeError: bad (line" in out and ", in mine)" in out


def test_unknown_id_does_not_raise(capsys):
    result = check("99_nope", attention)
    assert "unknown exercise id '99_nope'" in capsys.readouterr().out
    assert result.status == "unknown exercise" and not result.passed


def test_partial_credit_and_hint(capsys):
    result = check("01_attention_by_hand", answer("attention(q, k, v, None)"))
    out = capsys.readouterr().out
    assert result.n_passed == 2 and result.score == 1.0       # 2/5 of 3 points, rounded down to 0.5
    assert "ignores the mask" in out


@pytest.mark.parametrize("cheat, rule", [
    ("torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)", "no fused attention kernels"),
    ("__import__('functools').partial(torch.ops.aten.scaled_dot_product_attention, q)(k, v, attn_mask=mask)",
     "no fused attention kernels"),
    ("torch._C._nn.scaled_dot_product_attention(q, k, v, attn_mask=mask)", "no fused attention kernels"),
    ("torch.nn.MultiheadAttention(q.shape[-1], 1, batch_first=True)(q[0], k[0], v[0])[0][None]",
     "no fused attention kernels"),
    ("__import__('attn_course').attention(q, k, v, attn_mask=mask)[0]", "no course modules"),
    ("__import__('attn_course.functional').functional.attention(q, k, v, mask)[0]", "no course modules"),
])
def test_forbidden_apis_are_refused_by_the_sandbox(capsys, cheat, rule):
    result = check("01_attention_by_hand", answer(f"({cheat}, attention(q, k, v, mask)[1])"))
    out = capsys.readouterr().out
    assert result.status == "forbidden" and result.score == 0 and not result.passed, out
    assert "which this exercise forbids" in out and f"rule: {rule}" in out, out


def test_the_cell_may_compare_with_sdpa_outside_the_answer(capsys):
    """The rules hold while the learner's object runs: the cell itself may call SDPA (e.g. to test itself)."""
    result = check("01_attention_by_hand", cell("q = torch.randn(1, 1, 3, 4)\n"
                                                "torch.nn.functional.scaled_dot_product_attention(q, q, q)\n"))
    assert result.passed and result.score == 3, capsys.readouterr().out


def test_check_is_cheap():
    """A warm check() (the kernel's zygote has imported torch) costs little CPU time, here and in the child:
    CPU time, since wall time on a shared machine says little."""
    from attn_course.grading.selfcheck import zygote
    check("01_attention_by_hand", attention)
    for ex_id in [i for i in registry() if i.startswith("01_")] + ["01_attention_by_hand"]:
        t0 = time.process_time()
        check(ex_id, None if ex_id != "01_attention_by_hand" else attention)
        assert time.process_time() - t0 + zygote().cpu_s < 1.5, (ex_id, time.process_time() - t0, zygote().cpu_s)


def test_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    check("01_attention_by_hand", answer("(torch.rand(1), torch.rand(1))"))
    assert torch.equal(torch.rand(3), expected)


def test_result_shows_as_its_score_for_nbgrader():
    """In IPython a check cell's value is the score: nbgrader reads that number (text/plain) as the
    partial credit of the autograder-test cell; the report itself was shown by check()."""
    from IPython.core.formatters import DisplayFormatter
    from nbgrader.utils import get_partial_grade
    result = check("01_predict_shapes", answer("((*q[:3], v[3]), (*q[:3], k[2]))", "q, k, v"))
    assert repr(result) == "CheckResult('01_predict_shapes': 3/3 cases, 1/1 points, checked)"
    partial = check("01_attention_by_hand", answer("attention(q, k, v, None)"))
    stub = check("01_attention_by_hand", answer("(_ for _ in ()).throw(NotImplementedError())"))
    for r, score in ((result, 1.0), (partial, partial.score), (stub, 0.0)):
        data, _ = DisplayFormatter().format(r)
        assert data["text/plain"] == f"{score:g}"
        assert get_partial_grade({"data": data}, r.max_score) == score
    assert 0 < partial.score < partial.max_score


def test_report_is_html_in_a_notebook():
    from attn_course.grading.exercises import get
    from attn_course.grading.selfcheck import _Report
    ex = get("01_attention_by_hand")
    result = check("01_attention_by_hand", answer("attention(q, k, v, None)"))
    html = _Report(ex, result)._repr_html_()
    assert html.count("<li") == len(result.cases) + 1
    assert "✓ no mask, one head" in html and "✗ causal mask" in html
    assert "ignores the mask" in html and "&lt;" not in repr(_Report(ex, result))


def test_nothing_reaches_stderr(capfd):
    """nbgrader gives 0 to a test cell with stderr output: the learner's prints to stderr, native writes
    to file descriptor 2 and warnings are captured by check() and listed in its report instead."""
    import os
    import sys
    noisy = cell("""
import os, sys, warnings
def noisy(q, k, v, mask=None):
    print("debug: shapes", tuple(q.shape), file=sys.stderr)
    os.write(2, b"native noise\\n")
    warnings.warn("my own warning", UserWarning)
    torch.tensor(torch.tensor([1.0]))         # torch's own UserWarning ("To copy construct ...")
    return attention(q, k, v, mask)
""", "noisy")
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


RECORDING = ATTENTION + """
def my_attention(q, k, v, mask=None):
    print("q", tuple(q.shape), q.flatten()[:3].tolist(), {tag!r})
    return attention(q, k, v, mask)
"""


def _recording(capsys, tag, env=None):
    """check() a cell that prints each case's q (its shape and first values); returns (result, those lines)."""
    result = check("01_attention_by_hand", run_cell(RECORDING.format(tag=tag))["my_attention"])
    return result, [line.split("q ", 1)[1] for line in capsys.readouterr().out.splitlines() if "q (" in line]


def test_nbgrader_autograde_draws_held_out_inputs(monkeypatch, capsys):
    """Under nbgrader autograde (NBGRADER_EXECUTION=autograde) the cases are not the self-check's, and
    the same submission always gets the same ones: those attn-course grade draws for that cell."""
    from attn_course.grading.selfcheck import SELF_CHECK_SEED, case_seed, held_out_seed
    ex = get("01_attention_by_hand")
    _, seen = _recording(capsys, "a")
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")       # validating: the learner's own cases
    r, validated = _recording(capsys, "a")
    assert not r.held_out and validated == seen
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    r1, held = _recording(capsys, "a")
    r2, again = _recording(capsys, "a")
    assert r1.held_out and r1.passed and r1.score == r2.score == 3
    assert "score on held-out inputs" in r1._repr_html_() and "self-check score" in r._repr_html_()
    assert len(held) == len(seen) == 5
    assert not set(held) & set(seen)                            # fresh inputs
    assert held == again                                        # deterministic
    source = RECORDING.format(tag="a")                          # what judged_source() finds: the whole cell
    want = ex.cases(torch.Generator().manual_seed(case_seed(ex.id, held_out_seed(source))))
    assert held == [f"{tuple(c.inputs['q'].shape)} {c.inputs['q'].flatten()[:3].tolist()} a" for c in want]
    assert held_out_seed(source) != SELF_CHECK_SEED
    assert held_out_seed(source + "\n\n") == held_out_seed(source.replace("\n", "  \r\n"))
    _, other = _recording(capsys, "b")                          # another cell: other inputs
    assert not {h[:-2] for h in held} & {o[:-2] for o in other}


def test_score_rounds_down_to_half_points():
    ex = Exercise("x", 3, "t", "e", kind="compute")
    assert [ex.score(n, 5) for n in range(6)] == [0, 0.5, 1.0, 1.5, 2.0, 3.0]
    assert Exercise("y", 1, "t", "e", kind="compute").score(5, 6) == 0.5
    assert Exercise("z", 2, "t", "e", all_or_nothing=True, kind="compute").score(2, 3) == 0
    assert get("01_score_std").score(4, 4) == 1


def test_importing_check_in_a_kernel_is_quick():
    """An exercise notebook's first cell imports check(); in a kernel that also starts the sandbox's zygote.
    Neither may import nbformat (its schema validator alone took ~3 s to import: every exercise notebook paid
    it), nor the release tool."""
    import subprocess
    import sys
    code = ("import sys, ipykernel, torch\n"
            "from attn_course.grading import check\n"
            "from attn_course.grading.selfcheck import zygote\n"
            "zygote().close()\n"
            "print(sorted(m for m in ('nbformat', 'jsonschema', 'attn_course.grading.release') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
