"""Exercises 2.4, 5.3 and 7.4 no longer ask for what the lesson prints (review 01-07: E02.4, E05.3, E07.4): the
lesson's own formula, copied, misses full marks with a hint that says why, in ``check()`` and in the bulk
grader alike; the learner's own derivation (tests/learner_cells.py, written in another style than the
solution) gets full marks in both."""
import sys
from pathlib import Path

import nbformat
import pytest

from attn_course.grading import notebook as nbk
from attn_course.grading.runner import Options, grade_batch
from attn_course.grading.selfcheck import SELF_CHECK_SEED
from learner_cells import CELLS
from test_grading_learners import check_cell

ROOT = Path(__file__).resolve().parents[1]
COPIED = {"02_mha_flops": ("02_multi_head_attention", "lesson's count"),
          "05_rank_one_scale": ("05_temporal_attention", "one-period factor"),
          "07_cache_elements": ("07_tensor_product_attention", "constant head factors are weights")}


@pytest.mark.parametrize("ex_id", sorted(COPIED))
def test_the_lesson_s_formula_copied_misses_full_marks(ex_id, capsys):
    source, hint = CELLS[ex_id][2][0]
    assert hint == COPIED[ex_id][1]                       # the first mistake cell is the copied formula
    result = check_cell(ex_id, source)
    out = capsys.readouterr().out
    assert result.score == 0 and all(hint in c.message for c in result.cases if not c.ok), out
    assert check_cell(ex_id, CELLS[ex_id][1]).score == result.max_score


def _this_checkout_python(tmp_path) -> str:
    """A Python for the grader's child that imports THIS checkout's ``attn_course`` (``python -I`` alone would
    import the installed one, which in a second worktree is another checkout's)."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f"""#!/bin/sh
for last; do :; done
exec {sys.executable} -I -c "import sys, runpy; sys.path.insert(0, {str(ROOT)!r}); \\
runpy.run_module('attn_course.grading._child', run_name='__main__', alter_sys=True)" "$last"
""")
    wrapper.chmod(0o755)
    return str(wrapper)


def test_the_bulk_grader_agrees(tmp_path, capsys):
    subs = tmp_path / "subs"
    subs.mkdir()
    want = {}
    for ex_id, (stem, _) in COPIED.items():
        for which, source in (("correct", CELLS[ex_id][1]), ("copied", CELLS[ex_id][2][0][0])):
            nb = nbformat.read(ROOT / "exercises" / f"{stem}.ipynb", as_version=4)
            for cell in nb.cells:
                if nbk.grade_id(cell) == ex_id:
                    cell.source = source
            nbformat.write(nb, str(subs / f"{which}_{stem}.ipynb"))
            want[f"{which}_{stem}"] = (ex_id, check_cell(ex_id, source).score)
    capsys.readouterr()
    reports = grade_batch([subs], tmp_path / "out", Options(timeout=120, jobs=1, seed=SELF_CHECK_SEED,
                                                              python=_this_checkout_python(tmp_path)), root=ROOT,
                          progress=False, check_settings=False)   # calibrate: test_grading_notebooks.py's
    assert len(reports) == 6
    for r in reports:
        assert r["error"] is None, r["error"]
        ex_id, points = want[r["student_id"]]
        e = r["exercises"][ex_id]
        assert e["points"] == points, (r["student_id"], e)
        assert (points == e["max_points"]) == r["student_id"].startswith("correct"), (r["student_id"], e)
