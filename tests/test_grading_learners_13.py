"""Lesson 13 as a class of learners would meet it (issue 24), beyond tests/test_grading_learners.py:

* a cell that HARD-CODES the answers the self-check shows gets full marks from ``check()`` but nothing on the
  grader's held-out inputs (drawn as the grader draws them: ``held_out_cases(ex, held_out_seed(cell))``);
* the real bulk grader (sandboxed child, runtime guard, the ring of 13.6 driven inside it) agrees with
  ``check()`` exercise by exercise on lesson 13's learner cells.
"""
import pytest
import torch

from attn_course.grading import check
from attn_course.grading.exercises import get
from attn_course.grading.selfcheck import SELF_CHECK_SEED, held_out_cases, held_out_seed, judge_case, self_check_cases
from learner_cells import CELLS
from test_grading_learners import ROOT, _submission, check_cell, run_cell

CLOSED_FORM = ["13_ring_schedule", "13_zigzag_positions", "13_ring_bytes", "13_causal_blocks"]


def lookup_cell(ex_id: str) -> str:
    """A cell that answers from a table of the self-check's cases (filled by a correct cell), 0 elsewhere."""
    name, correct, _ = CELLS[ex_id]
    right = run_cell(correct)[name]
    table = {}

    def record(*args):
        value = right(*args)
        table[args] = value.tolist() if isinstance(value, torch.Tensor) else value
        return value

    ex = get(ex_id)
    for case in self_check_cases(ex):
        ex.answer(record, case)
    return f"TABLE = {table!r}\n\ndef {name}(*args):\n    return TABLE.get(args, 0)\n"


@pytest.mark.parametrize("ex_id", CLOSED_FORM)
def test_hard_coded_answers_pass_the_self_check_but_not_the_grader(ex_id, monkeypatch, capsys):
    source = lookup_cell(ex_id)
    assert check_cell(ex_id, source).score == get(ex_id).points          # what the learner sees: full marks
    ex, fn = get(ex_id), run_cell(source)[CELLS[ex_id][0]]
    graded = [judge_case(ex, ex.answer(fn, case), ex.expected(case), case)
              for case in held_out_cases(ex, held_out_seed(source))]   # the grader's cases for this cell
    assert not any(r.ok for r in graded), [(r.name, r.ok) for r in graded]
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")                # check() under nbgrader: same cases
    result = check_cell(ex_id, source)
    capsys.readouterr()
    assert result.held_out and result.score == 0


@pytest.mark.parametrize("n, hint", [(0, "without their log-sum-exps"), (9, "attends to the ONE shard it is given"),
                                     (10, "attends to the ONE shard it is given"), (13, "nothing else travels with it")])
def test_every_ring_loop_case_exercises_the_point(n, hint, capsys):
    """A sum of the blocks, every shard seen so far re-attended at each step, the grader's private shard lists
    read at step 0, and shards riding along in the state fail on every case, causal or not."""
    source, named = CELLS["13_ring_loop"][2][n]
    assert named == hint
    result = check_cell("13_ring_loop", source)
    capsys.readouterr()
    assert result.cases and not any(c.ok for c in result.cases) and result.score == 0
    assert all(hint in c.message for c in result.cases), [c.message for c in result.cases]


def test_grader_agrees_with_check_on_lesson_13(tmp_path, capsys):
    """The sandboxed grader drives the ring (13.6) like check() does: correct cells get full marks,
    the first misconception of each exercise misses them with its hint, points equal exercise by exercise."""
    from attn_course.grading.runner import Options, grade_batch
    stem = next(p.stem for p in (ROOT / "solutions").glob("13_*.ipynb"))
    subs, expected = tmp_path / "subs", {}
    subs.mkdir()
    for which in ("correct", "wrong"):
        sources = _submission(stem, which, subs / f"{which}_13.ipynb")
        expected[f"{which}_13"] = {i: check_cell(i, s) for i, s in sources.items()}
    capsys.readouterr()
    # check_settings=False: the solutions' own run (calibrate) is test_grading_notebooks.py's, for every lesson
    reports = grade_batch([subs], tmp_path / "out", Options(timeout=120, jobs=2, seed=SELF_CHECK_SEED),
                          root=ROOT, progress=False, check_settings=False)
    assert len(reports) == 2
    for r in reports:
        assert r["error"] is None, r["error"]
        want = expected[r["student_id"]]
        assert set(r["exercises"]) == set(want) and "13_ring_loop" in want
        assert {i: e["points"] for i, e in r["exercises"].items()} == {i: c.score for i, c in want.items()}
        if r["student_id"] == "correct_13":
            assert r["total"] == r["max_score"] == 14
        else:
            for i, e in r["exercises"].items():
                assert e["points"] < e["max_points"], (i, e)
                text = " ".join(c["hint"] for c in e["cases"]) + " ".join(e["notes"])
                hint = CELLS[i][2][0][1]
                assert (hint in text) if hint != "FORBIDDEN" else ("which this exercise forbids" in text), (i, text)
