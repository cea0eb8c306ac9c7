"""Held-out inputs, lessons 09 and 10 (issue 24): a cell that HARD-CODES the answers the self-check shows — a
lookup table of the cases it prints — gets full marks from ``check()``, and nothing from the grader, which draws
other cases (the real bulk grader, and ``check()`` under nbgrader autograde, both seeded by the cell's text).

The hard-coded cells are built from the self-check's own cases and the grader's references, so they are
exactly what a learner could copy from the self-check's report."""
from pathlib import Path

import nbformat
import pytest

from attn_course.grading import check
from attn_course.grading import notebook as nbk
from attn_course.grading.exercises import get
from attn_course.grading.runner import Options, grade_batch
from attn_course.grading.selfcheck import held_out_cases, held_out_seed, self_check_cases
from learner_cells import CELLS
from test_grading_learners import run_cell

ROOT = Path(__file__).resolve().parents[1]

# the exercises whose cases are parameters only (a table can be keyed by them): the compute exercises of 09
# and 10, and 09's dilated mask
HARD_CODED = {"09_window_density": "window_density", "09_receptive_field": "receptive_field",
              "09_rolling_cache_bytes": "rolling_cache_bytes", "10_crossover": "crossover",
              "09_dilated_mask": "dilated_mask"}


def hard_coded_cell(ex_id: str) -> str:
    """``def fn(*args): return ANSWERS[args]`` with the expected answer of every self-check case."""
    ex = get(ex_id)
    answers = {}
    for case in self_check_cases(ex):
        (value,) = ex.expected(case).values()
        answers[tuple(case.params.values())] = value.tolist() if value.dim() else value.item()
    wrap = "torch.tensor(ANSWERS[args])" if ex_id == "09_dilated_mask" else "ANSWERS[args]"
    return (f"ANSWERS = {answers!r}   # copied from the self-check's report\n\n"
            f"def {HARD_CODED[ex_id]}(*args):\n    return {wrap}\n")


@pytest.mark.parametrize("ex_id", sorted(HARD_CODED))
def test_hard_coded_answers_fool_only_the_self_check(ex_id, monkeypatch, capsys):
    source = hard_coded_cell(ex_id)
    fn = run_cell(source)[HARD_CODED[ex_id]]
    shown = check(ex_id, fn)
    assert shown.passed and shown.score == get(ex_id).points            # the self-check is fooled
    # nbgrader autograde: check() draws the held-out cases the grader draws for this cell
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    graded = check(ex_id, fn)
    capsys.readouterr()
    assert graded.held_out and graded.score == 0 and not any(c.ok for c in graded.cases), graded.cases
    # and those cases are not the ones the table knows
    keys = {tuple(c.params.values()) for c in held_out_cases(get(ex_id), held_out_seed(source))}
    assert not keys & {tuple(c.params.values()) for c in self_check_cases(get(ex_id))}


def _submission(stem: str, path: Path, which: str) -> set[str]:
    """The released notebook with, in place of their stubs, the hard-coded cells (``which="table"``) or this
    suite's correct cells in another style (``"correct"``); the other exercises are left unsolved."""
    nb = nbformat.read(ROOT / "exercises" / f"{stem}.ipynb", as_version=4)
    ids = set()
    for cell in nb.cells:
        gid = nbk.grade_id(cell)
        if gid in HARD_CODED:
            cell.source = hard_coded_cell(gid) if which == "table" else CELLS[gid][1]
            ids.add(gid)
    nbformat.write(nb, str(path))
    return ids


def test_the_bulk_grader_gives_hard_coded_answers_nothing(tmp_path):
    """The real grader (sandboxed child, safetensors, references in the parent), one batch: the tables score 0
    on its held-out cases, while correct cells for the same exercises get full marks — so it is the held-out
    drawing, not a broken pipeline, that gives the tables nothing."""
    subs = tmp_path / "subs"
    subs.mkdir()
    wanted = {}
    for stem in ("09_sparse_and_sliding_window_attention", "10_linear_and_additive_attention"):
        for which in ("table", "correct"):
            wanted[f"{which}_{stem[:2]}"] = _submission(stem, subs / f"{which}_{stem[:2]}.ipynb", which)
    reports = grade_batch([subs], tmp_path / "out", Options(timeout=120, jobs=2), root=ROOT, progress=False,
                          check_settings=False)
    assert sorted(r["student_id"] for r in reports) == sorted(wanted)
    for r in reports:
        assert r["error"] is None, r["error"]
        ids = wanted[r["student_id"]]
        assert ids and ids <= set(r["exercises"])
        for ex_id in ids:
            e = r["exercises"][ex_id]
            want = e["max_points"] if r["student_id"].startswith("correct") else 0
            assert e["points"] == want, (r["student_id"], ex_id, e)


# the review's shortcuts for the step-driven builds (2026-11-28 review 08-13: H8-1, M8-2, H9-1, M10-1): each
# learner cell's index in CELLS[id][2]
SHORTCUTS = {"08_tiled_forward": 2, "08_backward_from_lse": 1, "08_tiled_backward": 5, "09_window_tiles": 7,
             "10_chunked_scan": 7}


def test_the_bulk_grader_agrees_with_check_on_the_step_driven_shortcuts(tmp_path, capsys):
    """One batch, drawn with the self-check's seed: the review's shortcuts for 8.2, 8.3, 8.6, 9.7 and 10.6 get
    the points check() gives them — below full marks — and the correct variants (8.6 zero-padded, 10.6 the
    token recurrence) full marks in both."""
    from attn_course.grading.selfcheck import SELF_CHECK_SEED
    from learner_cells import ALSO_CORRECT
    from test_grading_learners import check_cell
    cells = {"shortcut": {i: CELLS[i][2][n][0] for i, n in SHORTCUTS.items()},
             "variant": {"08_tiled_backward": ALSO_CORRECT["08_tiled_backward"][0],
                         "10_chunked_scan": ALSO_CORRECT["10_chunked_scan"][2]}}
    subs = tmp_path / "subs"
    subs.mkdir()
    want = {}
    for which, sources in cells.items():
        for stem in ("08_flash_attention_tiling", "09_sparse_and_sliding_window_attention",
                     "10_linear_and_additive_attention"):
            nb = nbformat.read(ROOT / "exercises" / f"{stem}.ipynb", as_version=4)
            mine = {}
            for cell in nb.cells:
                gid = nbk.grade_id(cell)
                if gid in sources:
                    cell.source = mine[gid] = sources[gid]
            if mine:
                nbformat.write(nb, str(subs / f"{which}_{stem[:2]}.ipynb"))
                want[f"{which}_{stem[:2]}"] = {i: check_cell(i, s).score for i, s in mine.items()}
    capsys.readouterr()
    reports = grade_batch([subs], tmp_path / "out", Options(timeout=120, jobs=2, seed=SELF_CHECK_SEED), root=ROOT,
                          progress=False, check_settings=False)
    assert sorted(r["student_id"] for r in reports) == sorted(want)
    for r in reports:
        assert r["error"] is None, r["error"]
        for ex_id, score in want[r["student_id"]].items():
            e = r["exercises"][ex_id]
            assert e["points"] == score, (r["student_id"], ex_id, e)
            full = r["student_id"].startswith("variant")
            assert (score == e["max_points"]) if full else (score < e["max_points"]), (r["student_id"], ex_id, e)
