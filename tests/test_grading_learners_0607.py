"""The build exercises of lessons 06 and 07 (issue 32: CBAM assembled from its weights, one TPA decode step from
the factor cache) through the sandboxed bulk grader: learner-style cells (tests/learner_cells_0607.py) get from
the grader what check() gives them — full marks for the correct cell in another style, less for each named
mistake, with the mistake's hint — on the grader's own held-out cases."""
from pathlib import Path

import nbformat
import pytest

from attn_course.grading import notebook as nbk
from attn_course.grading.exercises import get
from attn_course.grading.runner import Options, grade_batch
from learner_cells_0607 import CELLS
from test_grading_learners import check_cell

ROOT = Path(__file__).resolve().parents[1]
BUILDS = {"06_cbam_forward": "06_spatial_and_channel_attention", "07_tpa_decode_step": "07_tensor_product_attention"}


def test_the_new_builds_are_builds():
    assert all(get(i).kind == "build" for i in BUILDS) and set(CELLS) == set(BUILDS)


@pytest.mark.parametrize("ex_id", sorted(BUILDS))
def test_hints_are_told_apart(ex_id, capsys):
    """Every mistake cell names its own mistake on at least one case, and no mistake scores full marks."""
    for source, hint in CELLS[ex_id][2]:
        result = check_cell(ex_id, source)
        out = capsys.readouterr().out
        assert result.score < result.max_score, out


def test_the_bulk_grader_agrees(tmp_path):
    """One batch, two notebooks per lesson: the correct learner cell, and the first named mistake."""
    subs = tmp_path / "subs"
    subs.mkdir()
    for ex_id, stem in BUILDS.items():
        for which in ("correct", "wrong"):
            nb = nbformat.read(ROOT / "exercises" / f"{stem}.ipynb", as_version=4)
            for cell in nb.cells:
                if nbk.grade_id(cell) == ex_id:
                    cell.source = CELLS[ex_id][1] if which == "correct" else CELLS[ex_id][2][0][0]
            nbformat.write(nb, str(subs / f"{which}_{stem}.ipynb"))
    # check_settings=False: the solutions' own run (calibrate) is test_grading_notebooks.py's, for every lesson
    reports = grade_batch([subs], tmp_path / "out", Options(timeout=120, jobs=2), root=ROOT, progress=False,
                          check_settings=False)
    assert len(reports) == 4
    for r in reports:
        assert r["error"] is None, r["error"]
        ex_id = next(i for i in BUILDS if BUILDS[i] == r["lesson"])
        e = r["exercises"][ex_id]
        if r["student_id"].startswith("correct"):
            assert e["points"] == e["max_points"] == get(ex_id).points, e
        else:
            assert e["points"] < e["max_points"], e
            assert any(CELLS[ex_id][2][0][1] in c["hint"] for c in e["cases"] if not c["ok"]), e
