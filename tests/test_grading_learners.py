"""Grading validity (issue 18): learner-style submissions written for this suite (tests/learner_cells.py),
judged as a learner's notebook would be — by ``check()`` on the whole cell, and for three lessons by the
real bulk grader, which must agree with ``check()`` exercise by exercise.

Correct work in another style gets full marks (docstrings, comments and variables that name forbidden
APIs, a cell-level comparison against SDPA); each misconception misses full marks with the hint that
names it; a forbidden shortcut or an untiled "tiled" forward gets 0.
"""
import itertools
import linecache
import math
import shutil
from pathlib import Path

import nbformat
import pytest
import torch

from attn_course.grading import check
from attn_course.grading import notebook as nbk
from attn_course.grading.exercises import get, lesson16, registry
from attn_course.grading.runner import Options, grade_batch
from attn_course.grading.selfcheck import SELF_CHECK_SEED
from learner_cells import ALSO_CORRECT, CELLS

ROOT = Path(__file__).resolve().parents[1]
_cells = itertools.count()


def run_cell(source: str) -> dict:
    """Execute ``source`` as a notebook cell: its text is in ``linecache`` under a name that is not a file
    (as IPython does), in a namespace holding what the notebooks' setup cells define."""
    name = f"<learner-cell-{next(_cells)}>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    ns = {"__name__": "__main__", "torch": torch, "math": math}
    exec(compile(source, name, "exec"), ns)
    return ns


def check_cell(ex_id: str, source: str):
    fn_name = CELLS[ex_id][0]
    return check(ex_id, eval(fn_name, run_cell(source)))


def test_every_exercise_is_covered():
    ids = {i for i in registry() if i[:2].isdigit()}
    assert set(CELLS) == ids, sorted(ids - set(CELLS))
    assert all(CELLS[i][2] for i in CELLS)


@pytest.mark.parametrize("ex_id", sorted(CELLS))
def test_correct_work_in_another_style_gets_full_marks(ex_id, capsys):
    result = check_cell(ex_id, CELLS[ex_id][1])
    out = capsys.readouterr().out
    assert result.status == "checked" and result.passed, out
    assert result.score == result.max_score == get(ex_id).points


@pytest.mark.parametrize("ex_id, n", [(i, n) for i in sorted(ALSO_CORRECT) for n in range(len(ALSO_CORRECT[i]))])
def test_correct_variants_get_full_marks(ex_id, n, capsys):
    result = check_cell(ex_id, ALSO_CORRECT[ex_id][n])
    out = capsys.readouterr().out
    assert result.status == "checked" and result.passed, out
    assert result.score == result.max_score == get(ex_id).points


WRONG = [(ex_id, n) for ex_id in sorted(CELLS) for n in range(len(CELLS[ex_id][2]))]


@pytest.mark.parametrize("ex_id, n", WRONG)
def test_misconception_misses_full_marks_with_its_hint(ex_id, n, capsys, monkeypatch):
    source, hint = CELLS[ex_id][2][n]
    if ex_id == "16_capstone" and hint != "is not below the bar":     # a rule other than the loss's: 5 training
        monkeypatch.setitem(lesson16.RECIPE, "steps", 5)             # steps (the loss point then fails too)
    result = check_cell(ex_id, source)
    out = capsys.readouterr().out
    assert result.score < result.max_score, out
    if hint == "FORBIDDEN":        # refused by the sandbox, or made useless by the step-driven design: 0 either way
        assert result.score == 0 and (result.status == "forbidden" or not any(c.ok for c in result.cases)), out
        assert result.status != "forbidden" or "which this exercise forbids" in out
        return
    failed = [c.message for c in result.cases if not c.ok]
    assert failed and any(hint in m for m in failed), out


@pytest.mark.parametrize("ex_id, n, hint", [
    ("03_expand_kv", 0, ".repeat tiles the stack"),                 # no case with H_kv = 1 or G = 1
    ("03_gqa_attention", 0, "blog post's grouping"),                 # broadcast errors are named too
    ("04_split_cross_attention", 0, "257"),                         # no case has 257 image tokens
    ("08_causal_tiles", 0, "T(T+1)/2"),                             # no case with block_q = block_k
    ("01_causal_padding_mask", 0, "off by one"),
    ("08_tiled_forward", 2, "fold the tile into the state it is given"),  # a stash of tiles: every case
])
def test_every_case_exercises_the_point(ex_id, n, hint, capsys):
    result = check_cell(ex_id, CELLS[ex_id][2][n][0])
    capsys.readouterr()
    assert result.cases and not any(c.ok for c in result.cases) and result.score == 0
    assert all(hint in c.message for c in result.cases), [c.message for c in result.cases]


def test_sdpa_is_refused_only_while_the_function_runs(capsys):
    """1.4: the cell may compare with SDPA; a call inside the function is refused by the sandbox, with its rule."""
    result = check_cell("01_fix_the_bug", CELLS["01_fix_the_bug"][2][1][0])
    out = capsys.readouterr().out
    assert result.status == "forbidden" and "rule: no fused attention kernels" in out


# ---- the real grader agrees with check() -----------------------------------------------------------------

def _submission(stem: str, which: str, path: Path) -> dict[str, str]:
    """A released exercises notebook with this suite's cells (``which``: "correct" or "wrong", the first
    misconception) in its exercise cells; returns {exercise id: cell source}."""
    nb = nbformat.read(ROOT / "exercises" / f"{stem}.ipynb", as_version=4)
    sources = {}
    for cell in nb.cells:
        gid = nbk.grade_id(cell)
        if gid in CELLS:
            cell.source = CELLS[gid][1] if which == "correct" else CELLS[gid][2][0][0]
            sources[gid] = cell.source
    nbformat.write(nb, str(path))
    return sources


def test_grader_agrees_with_check(tmp_path, capsys):
    """One batch: for three lessons, a notebook of correct cells and one of misconceptions. Drawn with the
    self-check's seed, the grader's cases equal check()'s, so the points must be equal exercise by exercise;
    the correct notebooks get full marks (1.4's cell compares with SDPA), the others miss them everywhere."""
    stems = {p.stem[:2]: p.stem for p in (ROOT / "solutions").glob("0[1-8]_*.ipynb")}
    subs, expected = tmp_path / "subs", {}
    subs.mkdir()
    for lesson in ("01", "03", "08"):
        for which in ("correct", "wrong"):
            sources = _submission(stems[lesson], which, subs / f"{which}_{lesson}.ipynb")
            expected[f"{which}_{lesson}"] = {i: check_cell(i, s) for i, s in sources.items()}
    capsys.readouterr()
    # check_settings=False: the solutions' own run (calibrate) is test_grading_notebooks.py's, for every lesson
    reports = grade_batch([subs], tmp_path / "out", Options(timeout=120, jobs=2, seed=SELF_CHECK_SEED),
                          root=ROOT, progress=False, check_settings=False)
    for r in reports:
        assert r["error"] is None, r["error"]
        want = expected[r["student_id"]]
        got = {i: e["points"] for i, e in r["exercises"].items()}
        assert got == {i: c.score for i, c in want.items()}, (r["student_id"], r["exercises"])
        if r["student_id"].startswith("correct"):
            assert r["total"] == r["max_score"]
        else:
            assert all(e["points"] < e["max_points"] for e in r["exercises"].values()), r["exercises"]
            hints = {i: " ".join(c["hint"] for c in e["cases"]) + " ".join(e["notes"])
                     for i, e in r["exercises"].items()}
            for i, text in hints.items():
                hint = CELLS[i][2][0][1]
                assert (hint in text) if hint != "FORBIDDEN" else ("which this exercise forbids" in text), (i, text)


def test_a_cell_that_runs_flex_attention_under_the_guard_leaves_later_compiles_working(capsys):
    """A learner's answer that calls FlexAttention (it compiles, even in eager mode) runs under the guard's
    spies; what torch.compile cached there used to break every later flex_attention in the process ("Attempted
    to call function marked as skipped") — the lesson's own cells after a check(), and this test suite."""
    from attn_course import sparse
    from learner_cells_09 import _band
    cell = _band() + (
        "\nfrom torch.nn.attention.flex_attention import flex_attention\n"
        "_tiled = band_update\n"
        "def band_update(m, l, acc, q_i, k_j, v_j, q0, k0, window):\n"
        "    flex_attention(q_i, k_j, v_j)\n"
        "    return _tiled(m, l, acc, q_i, k_j, v_j, q0, k0, window)\n")
    assert check_cell("09_window_tiles", _band()).score == get("09_window_tiles").points
    result = check_cell("09_window_tiles", cell)
    assert result.status == "forbidden" and result.score == 0, result
    capsys.readouterr()
    q, k, v = (torch.randn(1, 1, 16, 8, dtype=torch.float64) for _ in range(3))
    out = sparse.flex(q, k, v, block_mask=sparse.block_mask(sparse.causal(), 16, block=8), compiled=False)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
