"""Held-out grading, lessons 11 and 12 (issue 24): a learner who HARD-CODES the answers to the cases the self-check
shows (its printed parameters, with the numbers worked out once) gets full marks from ``check()`` — and not from
the grader, which draws other cases from the learner's cell (``held_out_seed``): neither through ``check()``
under nbgrader autograde, nor through the grader's own drawing and judging, nor in the sandboxed bulk grader."""
from pathlib import Path

import nbformat
import pytest
import torch

from attn_course.grading import check
from attn_course.grading import notebook as nbk
from attn_course.grading.exercises import get
from attn_course.grading.runner import Options, grade_batch
from attn_course.grading.selfcheck import held_out_cases, held_out_seed, judge_case, self_check_cases
from test_grading_learners import run_cell

ROOT = Path(__file__).resolve().parents[1]

# the compute exercises of lessons 11 and 12, with the function name their cell defines
COMPUTE = {"11_block_params": "block_params", "12_cache_bytes": "mla_cache_bytes",
           "12_shared_rope_key": "rope_key_costs"}


def hard_coded_cell(ex_id: str) -> str:
    """A cell that answers the self-check's cases from a table (parameters as the self-check prints them,
    answers computed once) and returns 0 for anything else."""
    ex = get(ex_id)
    table = {}
    for case in self_check_cases(ex):
        want = [v for v in ex.expected(case).values()][0]
        table[tuple(case.params.values())] = int(want) if want.numel() == 1 else tuple(want.tolist())
    assert all(c.params for c in self_check_cases(ex)), "a closed-form exercise: its cases are parameters"
    params = ", ".join(f"p{i}" for i in range(len(next(iter(table)))))
    zero = "0" if ex_id != "12_shared_rope_key" else "(0, 0, 0.0, 0.0)"
    return (f"\nANSWERS = {table!r}\n\ndef {COMPUTE[ex_id]}({params}):\n"
            f"    return ANSWERS.get(({params},), {zero})\n")


def test_every_compute_exercise_of_11_and_12_is_covered():
    from attn_course.grading.exercises import registry
    compute = {i for i, ex in registry().items() if i[:2] in ("11", "12") and ex.kind == "compute"}
    assert compute == set(COMPUTE)


@pytest.mark.parametrize("ex_id", sorted(COMPUTE))
def test_hard_coded_answers_pass_the_self_check_but_not_the_grader(ex_id, monkeypatch, capsys):
    source = hard_coded_cell(ex_id)
    fn = run_cell(source)[COMPUTE[ex_id]]
    ex = get(ex_id)

    result = check(ex_id, fn)                                     # the self-check: the cases it shows
    assert result.status == "checked" and result.score == ex.points, capsys.readouterr().out

    # the grader's code path: cases drawn from the cell's held-out seed, answered and judged as runner does
    cases = held_out_cases(ex, held_out_seed(source))
    verdicts = [judge_case(ex, ex.answer(fn, c), ex.expected(c), c) for c in cases]
    assert not any(v.ok for v in verdicts), verdicts
    assert ex.score(sum(v.ok for v in verdicts), len(verdicts)) == 0

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")        # check() as nbgrader autograde runs it
    result = check(ex_id, fn)
    out = capsys.readouterr().out
    assert result.held_out and result.score == 0 and "held-out inputs" in out, out


def test_the_bulk_grader_gives_hard_coded_answers_nothing(tmp_path):
    """One batch: the released notebooks of lessons 11 and 12 with the hard-coded cells in their compute
    exercises; the sandboxed grader gives those exercises 0 (and the untouched stubs 0)."""
    subs = tmp_path / "subs"
    subs.mkdir()
    for stem in ("11_positions_normalisation_and_the_block", "12_multi_head_latent_attention"):
        nb = nbformat.read(ROOT / "exercises" / f"{stem}.ipynb", as_version=4)
        for cell in nb.cells:
            if nbk.grade_id(cell) in COMPUTE:
                cell.source = hard_coded_cell(nbk.grade_id(cell))
        nbformat.write(nb, str(subs / f"{stem}.ipynb"))
    # check_settings=False: the solutions' own run (calibrate) is test_grading_notebooks.py's, for every lesson
    reports = grade_batch([subs], tmp_path / "out", Options(timeout=120, jobs=2), root=ROOT, progress=False,
                          check_settings=False)
    assert len(reports) == 2
    for r in reports:
        assert r["error"] is None, r["error"]
        graded = {i: e for i, e in r["exercises"].items() if i in COMPUTE}
        assert graded and all(e["status"] == "graded" and e["points"] == 0 for e in graded.values()), graded
        assert all(not c["ok"] for e in graded.values() for c in e["cases"]), graded
        assert r["total"] == 0
