"""check() warns about answers the bulk grader cannot see as it does: a helper from another cell
(NameError in the grader) and an exercise cell that lost its nbgrader mark (deleted and re-typed)."""
import json
import linecache
import math
import shutil
from pathlib import Path

import torch

from attn_course.grading import check, reach

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "solutions" / "01_scaled_dot_product_attention.ipynb"
EX = "01_attention_by_hand"


def cell(source: str, name: str, ns: dict) -> dict:
    """Run ``source`` as IPython runs a notebook cell: compiled under a name that is no file on disk, its
    text kept in linecache (that is where check() reads the exercise cell from)."""
    filename = f"<ipython-input-{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), ns)
    return ns


HELPER = "def _scores(q, k):\n    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
ANSWER = """def my_attention(q, k, v, mask=None):
    scores = _scores(q, k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
    return weights @ v, weights
"""


def test_a_helper_from_another_cell_is_named(monkeypatch):
    monkeypatch.chdir(ROOT)
    ns = cell(HELPER, "helper", {"math": math, "torch": torch})
    cell(ANSWER, "answer", ns)
    assert reach.names_the_grader_lacks(ns["my_attention"], EX, linecache.cache["<ipython-input-answer>"][2] and
                                        "".join(linecache.cache["<ipython-input-answer>"][2])) == ["_scores"]
    r = check(EX, ns["my_attention"])
    assert r.passed and r.unreachable and "`_scores`" in r.unreachable[0] and "NameError" in r.unreachable[0]
    # the same helper inside the exercise cell: nothing to warn about
    ns2 = cell(HELPER + ANSWER, "both", {"math": math, "torch": torch})
    assert check(EX, ns2["my_attention"]).unreachable == []


def test_names_the_trusted_notebook_defines_are_fine(monkeypatch):
    monkeypatch.chdir(ROOT)
    ns = cell(ANSWER.replace("_scores(q, k)", "q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])"), "plain",
              {"math": math, "torch": torch})
    assert reach.names_the_grader_lacks(ns["my_attention"], EX, "".join(linecache.cache["<ipython-input-plain>"][2])) == []


def test_outside_a_checkout_nothing_is_claimed(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(reach, "_solutions_notebook", lambda exercise_id: None)
    ns = cell(HELPER, "helper2", {"math": math, "torch": torch})
    cell(ANSWER, "answer2", ns)
    assert reach.names_the_grader_lacks(ns["my_attention"], EX, ANSWER) == []


def test_a_deleted_and_retyped_exercise_cell_is_noticed(monkeypatch, tmp_path):
    nb = json.loads(SOLUTION.read_text())
    monkeypatch.setenv("JPY_SESSION_NAME", str(SOLUTION))
    assert not reach.exercise_cell_missing(EX)
    for c in nb["cells"]:
        if c["metadata"].get("nbgrader", {}).get("grade_id") == EX:
            del c["metadata"]["nbgrader"]
    retyped = tmp_path / "mine.ipynb"
    retyped.write_text(json.dumps(nb))
    monkeypatch.setenv("JPY_SESSION_NAME", str(retyped))
    assert reach.exercise_cell_missing(EX)
    assert not reach.exercise_cell_missing("01_causal_padding_mask")
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "gone.ipynb"))
    assert not reach.exercise_cell_missing(EX)                 # unreadable: nothing is claimed
    monkeypatch.delenv("JPY_SESSION_NAME")
    assert not reach.exercise_cell_missing(EX)


def test_released_exercise_cells_cannot_be_deleted():
    from attn_course.grading import notebook as nbk
    for path in sorted((ROOT / "exercises").glob("*.ipynb")):
        cells = nbk.exercise_cells(nbk.read(path))
        assert cells and all(c["metadata"].get("deletable") is False for c in cells.values()), path.name
