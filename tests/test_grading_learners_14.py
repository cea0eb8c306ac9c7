"""Lesson 14 as a class of learners would meet it (issue 34), beyond tests/test_grading_learners.py (which runs
every cell of tests/learner_cells_14.py through ``check()``):

* a cell that HARD-CODES the answers the self-check shows gets full marks from ``check()`` but nothing on the
  grader's held-out inputs (drawn as the grader draws them: ``held_out_cases(ex, held_out_seed(cell))``);
* gathering what the block reader handed out into one tensor fails every case of the paged decode step, with the
  size message;
* the real bulk grader (sandboxed child, runtime guard, the tensor-size watch) agrees with ``check()``
  exercise by exercise on lesson 14's learner cells.
"""
import pytest
import torch

from attn_course.grading.exercises import get, registry
from attn_course.grading.selfcheck import SELF_CHECK_SEED, held_out_cases, held_out_seed, judge_case, self_check_cases
from learner_cells import CELLS
from test_grading_learners import ROOT, _submission, check_cell, run_cell

COMPUTE = {"14_pool_blocks": "pool_blocks", "14_shared_prefix_blocks": "shared_prefix_blocks"}


def hard_coded_cell(ex_id: str) -> str:
    """Answers the self-check's cases from a table (keyed by the arguments as passed), 0 for anything else."""
    ex = get(ex_id)
    table = {}
    for case in self_check_cases(ex):
        args = tuple(tuple(v) if isinstance(v, list) else v for v in case.params.values())
        table[args] = int(ex.expected(case)["blocks"])
    params = ", ".join(f"p{i}" for i in range(len(next(iter(table)))))
    key = ", ".join(f"tuple(p{i}) if isinstance(p{i}, list) else p{i}" for i in range(len(next(iter(table)))))
    return (f"\nANSWERS = {table!r}\n\ndef {COMPUTE[ex_id]}({params}):\n"
            f"    return ANSWERS.get(({key},), 0)\n")


def test_every_compute_exercise_of_14_is_covered():
    assert {i for i, ex in registry().items() if i[:2] == "14" and ex.kind == "compute"} == set(COMPUTE)


@pytest.mark.parametrize("ex_id", sorted(COMPUTE))
def test_hard_coded_answers_pass_the_self_check_but_not_the_grader(ex_id, monkeypatch, capsys):
    source = hard_coded_cell(ex_id)
    assert check_cell(ex_id, source).score == get(ex_id).points          # what the learner sees: full marks
    ex, fn = get(ex_id), run_cell(source)[COMPUTE[ex_id]]
    graded = [judge_case(ex, ex.answer(fn, case), ex.expected(case), case)
              for case in held_out_cases(ex, held_out_seed(source))]
    assert not any(r.ok for r in graded), [(r.name, r.ok) for r in graded]
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")                # check() under nbgrader: same cases
    result = check_cell(ex_id, source)
    capsys.readouterr()
    assert result.held_out and result.score == 0


def test_gathering_fails_every_case_of_the_paged_decode(capsys):
    source, hint = CELLS["14_paged_decode"][2][4]
    assert hint == "gathered into one tensor"
    result = check_cell("14_paged_decode", source)
    capsys.readouterr()
    assert result.cases and not any(c.ok for c in result.cases) and result.score == 0
    assert all(hint in c.message for c in result.cases), [c.message for c in result.cases]


def test_grader_agrees_with_check_on_lesson_14(tmp_path, capsys):
    """Correct cells get full marks, the first misconception of each exercise misses them with its hint, and
    the points equal check()'s exercise by exercise."""
    from attn_course.grading.runner import Options, grade_batch
    stem = "14_serving_attention"
    subs, expected = tmp_path / "subs", {}
    subs.mkdir()
    for which in ("correct", "wrong"):
        sources = _submission(stem, which, subs / f"{which}_14.ipynb")
        expected[f"{which}_14"] = {i: check_cell(i, s) for i, s in sources.items()}
    capsys.readouterr()
    # check_settings=False: the solutions' own run (calibrate) is test_grading_notebooks.py's, for every lesson
    reports = grade_batch([subs], tmp_path / "out", Options(timeout=120, jobs=2, seed=SELF_CHECK_SEED),
                          root=ROOT, progress=False, check_settings=False)
    assert len(reports) == 2
    for r in reports:
        assert r["error"] is None, r["error"]
        want = expected[r["student_id"]]
        assert set(r["exercises"]) == set(want) == {"14_pool_blocks", "14_shared_prefix_blocks", "14_paged_decode",
                                                    "14_split_kv"}
        assert {i: e["points"] for i, e in r["exercises"].items()} == {i: c.score for i, c in want.items()}
        if r["student_id"] == "correct_14":
            assert r["total"] == r["max_score"] == 10
        else:
            for i, e in r["exercises"].items():
                assert e["points"] < e["max_points"], (i, e)
                text = " ".join(c["hint"] for c in e["cases"]) + " ".join(e["notes"])
                assert CELLS[i][2][0][1] in text, (i, text)
