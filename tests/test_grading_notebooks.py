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
    assert 4 <= len(ids) <= 7, ids          # lesson 11: six exercises and its build-it exercise (issue 25)
    assert all(i.startswith(stem[:3]) for i in ids)
    assert (ROOT / "exercises" / f"{stem}.ipynb").exists()


def test_every_registered_exercise_is_in_a_notebook():
    in_notebooks = {gid for p in SOLUTIONS for gid in nbk.exercise_cells(nbk.read(p))}
    assert set(registry()) <= in_notebooks


def test_solutions_get_full_marks_and_stubs_zero(tmp_path):
    """One batch (one expensive run, also under pytest-xdist): every solutions notebook (sol_NN) gets
    full marks, every released exercises notebook (ex_NN) gets zero, every exercise "not attempted"."""
    subs = tmp_path
    for stem in STEMS:
        shutil.copy(ROOT / "solutions" / f"{stem}.ipynb", subs / f"sol_{stem}.ipynb")
        shutil.copy(ROOT / "exercises" / f"{stem}.ipynb", subs / f"ex_{stem}.ipynb")
    reports = grade_batch([subs], subs / "out", Options(timeout=120, jobs=2), root=ROOT, progress=False)
    graded = {r["student_id"]: r for r in reports}
    for stem in STEMS:
        r = graded[f"sol_{stem}"]
        assert r["error"] is None and r["lesson"] == stem, (stem, r["error"])
        bad = {i: (e["notes"], e["cases"]) for i, e in r["exercises"].items() if e["points"] != e["max_points"]}
        assert not bad, (stem, bad)
        assert r["total"] == r["max_score"] > 0
        r = graded[f"ex_{stem}"]
        assert r["error"] is None and r["lesson"] == stem and r["total"] == 0, (stem, r["error"])
        assert all(e["status"] == "not attempted" for e in r["exercises"].values()), (stem, r["exercises"])
