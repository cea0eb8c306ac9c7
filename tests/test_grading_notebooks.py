"""Generic checks over every exercise set (discovered, so new lessons are covered automatically):
notebook metadata agrees with the registry; grading a solutions notebook gives full marks and grading
its released exercises notebook gives zero."""
import shutil
from pathlib import Path

import pytest

from attn_course.grading import notebook as nbk
from attn_course.grading.exercises import registry
from attn_course.grading.release import lint
from attn_course.grading.runner import Options, grade_batch

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
STEMS = [p.stem for p in SOLUTIONS]


def test_there_are_exercise_sets():
    assert "01_scaled_dot_product_attention" in STEMS


@pytest.mark.parametrize("stem", STEMS)
def test_notebook_agrees_with_registry(stem):
    nb = nbk.read(ROOT / "solutions" / f"{stem}.ipynb")
    assert lint(nb, stem) == []
    ids = list(nbk.exercise_cells(nb))
    if stem.startswith("16_"):                           # the capstone: one open exercise
        assert ids == ["16_capstone"]
    else:
        assert 4 <= len(ids) <= 8, ids                   # 09 has 8: six small exercises and two build-its
    assert all(i.startswith(stem[:3]) for i in ids)
    assert (ROOT / "exercises" / f"{stem}.ipynb").exists()


def test_every_registered_exercise_is_in_a_notebook():
    in_notebooks = {gid for p in SOLUTIONS for gid in nbk.exercise_cells(nbk.read(p))}
    assert set(registry()) <= in_notebooks


def test_solutions_get_full_marks_and_stubs_zero(tmp_path, monkeypatch):
    """One batch (one expensive run, also under pytest-xdist) of every released exercises notebook (ex_NN) but the
    capstone's (16: graded, with its solution, by tests/test_exercises_16.py::test_grade_ranks_a_class_end_to_end):
    each gets zero, every exercise "not attempted". Before grading anyone, grade_batch grades the course's own
    solutions/ notebook of every lesson in the batch (runner.calibrate, under the same options): those reports,
    read here as they are made, must be full marks — so each solution is graded once, not again as a copy."""
    from attn_course.grading import runner
    made, grade = {}, runner.grade_submission
    runs = []

    def keep(sub, course, opts):
        runs.append((sub.student_id, sub.path.stem))
        made[runs[-1]] = report = grade(sub, course, opts)
        return report

    monkeypatch.setattr(runner, "grade_submission", keep)
    # the capstone (16) is not in this batch: its solution trains a model (the real recipe), and
    # tests/test_exercises_16.py::test_grade_ranks_a_class_end_to_end already grades it first (the calibration)
    # and its released stub (bob), with these same checks on both reports — graded once in the suite, not twice
    stems = [s for s in STEMS if not s.startswith("16_")]
    assert len(stems) == len(STEMS) - 1
    for stem in stems:
        shutil.copy(ROOT / "exercises" / f"{stem}.ipynb", tmp_path / f"ex_{stem}.ipynb")
    reports = grade_batch([tmp_path], tmp_path / "out", Options(timeout=120, jobs=2), root=ROOT, progress=False)
    graded = {r["student_id"]: r for r in reports}
    # each solution graded once (the calibration), each stub once
    assert sorted(runs) == sorted([("course solutions", s) for s in stems] + [(f"ex_{s}", f"ex_{s}") for s in stems])
    for stem in stems:
        r = made["course solutions", stem]
        assert r["error"] is None and r["lesson"] == stem, (stem, r["error"])
        bad = {i: (e["notes"], e["cases"]) for i, e in r["exercises"].items() if e["points"] != e["max_points"]}
        assert not bad, (stem, bad)
        assert r["total"] == r["max_score"] > 0
        r = graded[f"ex_{stem}"]
        assert r["error"] is None and r["lesson"] == stem and r["total"] == 0, (stem, r["error"])
        assert all(e["status"] == "not attempted" for e in r["exercises"].values()), (stem, r["exercises"])


@pytest.mark.parametrize("stem", STEMS)
def test_every_released_stub_is_not_attempted_in_check(stem, capsys):
    """Every exercise cell of the released notebook, run as a learner would and passed to check(): 0 points,
    "not attempted" (the grader's side is test_solutions_get_full_marks_and_stubs_zero; the solutions' own
    check cells are compared by nbval)."""
    from attn_course.grading import check
    from learner_cells import CELLS                       # id -> (the function the cell defines, ...)
    from test_grading_learners import run_cell
    cells = nbk.exercise_cells(nbk.read(ROOT / "exercises" / f"{stem}.ipynb"))
    assert cells
    for ex_id, cell in cells.items():
        ns = run_cell(nbk.source_of(cell))
        result = check(ex_id, eval(CELLS[ex_id][0], dict(ns)))          # a name, or a pair such as 9.7's
        assert result.status == "not attempted" and result.score == 0, (ex_id, result)
    capsys.readouterr()
