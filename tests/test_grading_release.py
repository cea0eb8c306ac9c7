"""``attn-course release [--check]`` and the notebook helpers it is built on."""
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from attn_course.grading import notebook as nbk
from attn_course.grading import release as release_mod
from attn_course.grading.release import release, release_notebook, render

ROOT = Path(__file__).resolve().parents[1]

SOLUTION = '''def f(x):
    """Doc."""
    y = 1
    ### BEGIN SOLUTION
    z = x + y
    return z
    ### END SOLUTION

class A:
    def g(self):
        ### BEGIN SOLUTION
        return 2
        ### END SOLUTION'''


def test_stub_keeps_lines_outside_regions_and_indentation():
    stub = nbk.stub_source(SOLUTION, "01_x")
    assert stub == '''def f(x):
    """Doc."""
    y = 1
    raise NotImplementedError("Exercise 01_x: your code here")

class A:
    def g(self):
        raise NotImplementedError("Exercise 01_x: your code here")'''
    compile(stub, "<stub>", "exec")


@pytest.mark.parametrize("bad, message", [
    ("### BEGIN SOLUTION\nx = 1", "never closed"),
    ("x = 1\n### END SOLUTION", "without"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "inside another"),
])
def test_unbalanced_markers_raise(bad, message):
    with pytest.raises(ValueError, match=message):
        nbk.stub_source(bad, "01_x")


def test_split_checks():
    src = 'import torch\nx = 1\ncheck("01_a", f)\ny = 2\ncheck("01_b", g.h)'
    assert nbk.split_checks(src) == [("code", "import torch\nx = 1"), ("capture", "01_a", "f"),
                                     ("code", "y = 2"), ("capture", "01_b", "g.h")]
    assert nbk.split_checks("%time x = 1\nprint(x)") == [("code", "pass\nprint(x)")]
    assert nbk.split_checks('check(name, f)') == [("code", "check(name, f)")]      # not a literal id


def _toy_notebook():
    ex_meta = {"nbgrader": {"grade_id": "01_attention_by_hand", "solution": True, "grade": False,
                            "locked": False, "points": 3, "schema_version": 3, "task": False}}
    ex = new_code_cell(SOLUTION, metadata=ex_meta, execution_count=3,
                       outputs=[new_output("stream", name="stdout", text="hi\n")])
    chk = new_code_cell('check("01_attention_by_hand", f)', execution_count=4,
                        outputs=[new_output("stream", name="stdout", text="✓\n")])
    other = new_code_cell("print(1)", execution_count=5, outputs=[new_output("stream", name="stdout", text="1\n")])
    md = new_markdown_cell("Prose ### BEGIN SOLUTION? no, just prose.")
    answer = new_markdown_cell("Explain:\n### BEGIN SOLUTION\nbecause.\n### END SOLUTION")
    return new_notebook(cells=[md, ex, chk, other, answer], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})


def test_release_notebook():
    nb = _toy_notebook()
    before = nbformat.writes(nb)
    out = release_notebook(nb)
    assert nbformat.writes(nb) == before                         # input untouched
    md, ex, chk, other, answer = out.cells
    assert ex.source == nbk.stub_source(SOLUTION, "01_attention_by_hand")
    assert ex.outputs == [] and ex.execution_count is None
    assert ex.metadata == {**nb.cells[1].metadata, "deletable": False}     # as nbgrader's release
    assert chk.outputs == [] and chk.execution_count is None and chk.source == nb.cells[2].source
    assert other == nb.cells[3] and md == nb.cells[0] and out.metadata == nb.metadata
    assert answer.source == "Explain:\nYOUR ANSWER HERE"
    assert render(out) == render(release_notebook(nb))           # deterministic


def test_release_and_check_on_a_copy(tmp_path, capsys):
    (tmp_path / "solutions").mkdir()
    nbformat.write(_toy_notebook(), str(tmp_path / "solutions" / "01_toy.ipynb"))
    assert release(tmp_path, check=True) == 1                    # exercises/ missing: stale
    assert release(tmp_path) == 0
    assert release(tmp_path, check=True) == 0
    target = tmp_path / "exercises" / "01_toy.ipynb"
    target.write_text(target.read_text().replace("Prose", "Edited prose"))
    assert release(tmp_path, check=True) == 1
    assert "stale: exercises/01_toy.ipynb" in capsys.readouterr().out
    assert release(tmp_path) == 0 and release(tmp_path, check=True) == 0
    (tmp_path / "exercises" / "99_orphan.ipynb").write_text("{}")
    assert release(tmp_path, check=True) == 1
    assert "orphan: exercises/99_orphan.ipynb" in capsys.readouterr().out
    assert release(tmp_path) == 0 and not (tmp_path / "exercises" / "99_orphan.ipynb").exists()


def test_cli_release_check_on_the_course():
    """The repository's exercises/ are up to date (what `make test` runs first)."""
    proc = subprocess.run([sys.executable, "-m", "attn_course.grading.cli", "release", "--check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "up to date" in proc.stdout


def test_cli_release_check_detects_stale(tmp_path, capsys):
    from attn_course.grading.cli import main
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    shutil.copytree(ROOT / "exercises", tmp_path / "exercises")
    victim = sorted((tmp_path / "exercises").glob("*.ipynb"))[0]
    victim.write_text(victim.read_text().replace("raise NotImplementedError", "pass  # edited by hand", 1))
    assert main(["release", "--check", "--root", str(tmp_path)]) == 1
    assert f"stale: exercises/{victim.name}" in capsys.readouterr().out


def test_cli_bench_without_module_is_clear(monkeypatch, capsys):
    import importlib.util
    from attn_course import cli                     # the console script (grading.cli has release and grade only)
    if importlib.util.find_spec("attn_course.bench") is None:
        assert cli.main(["bench"]) == 2
        assert "attn_course.bench is not installed" in capsys.readouterr().err
    else:
        calls = []
        monkeypatch.setattr(importlib.import_module("attn_course.bench"), "main", lambda argv: calls.append(argv))
        assert cli.main(["bench", "--x", "1"]) == 0 and calls == [["--x", "1"]]



# ---- nbgrader metadata: points defined once, in the registry ----------------------------------------------

TEST_CELL = {"grade": True, "grade_id": "01_attention_by_hand_test", "locked": True, "points": 3,
             "schema_version": 3, "solution": False, "task": False}


def test_release_writes_nbgrader_test_cells(tmp_path, capsys):
    """The check cell becomes a locked autograder-test cell worth the Exercise's points (3 for
    01_attention_by_hand in lesson01.py); --check names every disagreement and release repairs it."""
    from attn_course.grading.exercises import get
    assert get("01_attention_by_hand").points == TEST_CELL["points"]
    (tmp_path / "solutions").mkdir()
    path = tmp_path / "solutions" / "01_toy.ipynb"
    nbformat.write(_toy_notebook(), str(path))
    assert release(tmp_path, check=True) == 1
    assert "check cell of 01_attention_by_hand has no nbgrader metadata" in capsys.readouterr().out
    assert release(tmp_path) == 0 and release(tmp_path, check=True) == 0
    for folder in ("solutions", "exercises"):
        nb = nbk.read(tmp_path / folder / "01_toy.ipynb")
        assert nb.cells[2].metadata["nbgrader"] == TEST_CELL
        assert nb.cells[1].metadata["nbgrader"]["points"] == 3 and nb.cells[1].metadata["nbgrader"]["solution"]
        assert "nbgrader" not in nb.cells[3].metadata
    capsys.readouterr()

    def edit(cell_no, change, message):
        nb = nbk.read(path)
        change(nb.cells[cell_no])
        nbformat.write(nb, str(path))
        assert release(tmp_path, check=True) == 1
        out = capsys.readouterr().out
        assert message in out and "stale: solutions/01_toy.ipynb" in out, out
        assert release(tmp_path) == 0 and release(tmp_path, check=True) == 0
        assert nbk.read(path).cells[2].metadata["nbgrader"] == TEST_CELL
        capsys.readouterr()

    edit(2, lambda c: c.metadata["nbgrader"].update(points=2), "points=2 (want 3)")
    edit(2, lambda c: c.metadata["nbgrader"].update(points=3.0), "points=3.0 (want 3)")
    edit(2, lambda c: c.metadata["nbgrader"].update(locked=False), "locked=False (want True)")
    edit(2, lambda c: c.metadata["nbgrader"].update(grade_id="x"), "grade_id='x' (want '01_attention_by_hand_test')")
    edit(2, lambda c: c.metadata["nbgrader"].update(solution=True), "solution=True (want False)")
    edit(1, lambda c: c.metadata["nbgrader"].update(points=5), "exercise cell 01_attention_by_hand: points=5")
    nb = nbk.read(path)
    nb.cells[2].source = 'check("01_attention_by_hand", f)\nprint("done")'
    nbformat.write(nb, str(path))
    assert release(tmp_path, check=True) == 1
    assert "must hold exactly one check(...) statement" in capsys.readouterr().out


def test_course_check_cells_are_nbgrader_tests():
    """Every check cell of solutions/ and exercises/ is a locked autograder test worth its exercise's
    points; a lesson's test cells add up to the lesson's points in the registry."""
    from attn_course.grading.exercises import registry
    reg = registry()
    for folder in ("solutions", "exercises"):
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            nb = nbk.read(path)
            tests = {}
            for cell in nb.cells:
                steps = nbk.split_checks(nbk.source_of(cell)) if cell.cell_type == "code" else []
                if any(s[0] == "capture" for s in steps):
                    assert len(steps) == 1, (path.name, cell.source)
                    meta = cell.metadata["nbgrader"]
                    assert meta["grade_id"] == f"{steps[0][1]}_test", (path.name, meta)
                    assert meta["grade"] and meta["locked"] and not meta["solution"], (path.name, meta)
                    tests[steps[0][1]] = meta["points"]
            lesson = {i: e.points for i, e in reg.items() if i.startswith(path.name[:3])}
            assert tests == lesson, (path.name, tests, lesson)


# ---- solution-only text never reaches exercises/ (issue 32; review 2026-11-26 08-14 H14-1) -----------------

DESIGN = "**Our design.** GQA with 2 KV heads, d_model 64: 108,928 parameters."


def _with_solution_only(nb):
    """The toy notebook plus a markdown cell with a solution-only region and a solution-only code cell."""
    nb = nbformat.from_dict(nbformat.from_dict(nb))
    nb.cells.append(new_markdown_cell(f"Explain your design here.\n\n{release_mod.MD_BEGIN}\n{DESIGN}\n"
                                      f"{release_mod.MD_END}\n\n## Summary"))
    nb.cells.append(new_code_cell("print(f(41), 'the reference answer, computed')", execution_count=6,
                                  metadata={"tags": [release_mod.SOLUTION_ONLY_TAG]},
                                  outputs=[new_output("stream", name="stdout", text="42 the reference answer, computed\n")]))
    return nb


def test_solution_only_cells_and_regions_are_not_released():
    nb = _with_solution_only(_toy_notebook())
    out = release_notebook(nb)
    assert len(out.cells) == len(nb.cells) - 1                   # the solution-only cell is gone
    assert out.cells[-1].source == "Explain your design here.\n\n## Summary"
    text = render(out)
    assert "108,928" not in text and "reference answer" not in text and "z = x + y" not in text
    assert release_mod.leaks(nb, out) == []


@pytest.mark.parametrize("plant", ["design pasted into exercises/", "check output kept in exercises/",
                                   "solution line pasted into exercises/", "mistyped marker"])
def test_a_planted_leak_fails_release_check(tmp_path, capsys, plant):
    """Solution-only text in a released notebook — pasted into exercises/ by hand, or left there by a marker
    that does not parse — fails ``release --check`` with a ``leak:`` line naming it."""
    nb = _with_solution_only(_toy_notebook())
    (tmp_path / "solutions").mkdir()
    sol = tmp_path / "solutions" / "01_toy.ipynb"
    nbformat.write(nb, str(sol))
    assert release(tmp_path) == 0 and release(tmp_path, check=True) == 0
    capsys.readouterr()
    target = tmp_path / "exercises" / "01_toy.ipynb"
    shipped = nbformat.read(str(target), as_version=4)
    if plant == "design pasted into exercises/":
        shipped.cells[-1].source += "\n\n" + DESIGN
        line = DESIGN
    elif plant == "check output kept in exercises/":
        shipped.cells[2].outputs = [new_output("stream", name="stdout", text="✓ every case passed: 3/3 points\n")]
        nb.cells[2].outputs = shipped.cells[2].outputs
        nbformat.write(nb, str(sol))
        release(tmp_path)
        capsys.readouterr()
        line = "✓ every case passed: 3/3 points"
    elif plant == "solution line pasted into exercises/":
        nb.cells[1].source = nb.cells[1].source.replace("z = x + y", "z = x + y  # the sum of x and y")
        nbformat.write(nb, str(sol))
        release(tmp_path)
        capsys.readouterr()
        shipped = nbformat.read(str(target), as_version=4)
        shipped.cells[0].source += "\n    z = x + y  # the sum of x and y"
        line = "z = x + y  # the sum of x and y"
    else:
        nb.cells[-2].source = nb.cells[-2].source.replace(release_mod.MD_END, "<!-- END SOLUTION-->")
        nbformat.write(nb, str(sol))
        assert release(tmp_path) == 1                            # release itself refuses too
        out = capsys.readouterr().out
        assert "malformed solution marker '<!-- END SOLUTION-->'" in out, out
        line = None
    if line is not None:
        nbformat.write(shipped, str(target))
    assert release(tmp_path, check=True) == 1
    out = capsys.readouterr().out
    want = "malformed solution marker" if line is None else f"leak: exercises/01_toy.ipynb: {line!r}"
    assert want in out, out


def test_the_capstone_releases_no_reference_design():
    """exercises/16_…: none of the course's design — its hyperparameters, its measured numbers, its explanation."""
    text = (ROOT / "exercises" / "16_capstone_tiny_language_model.ipynb").read_text()
    for secret in ("108,928", "kv_heads = 64, 2, 4, 2", "grouped-query\\nattention with 2 KV heads", "GQA decoder",
                   "The course's design", "512 bytes per token", "held-out loss 2"):
        assert secret not in text, secret
    sol = nbk.read(ROOT / "solutions" / "16_capstone_tiny_language_model.ipynb")
    assert release_mod.leaks(sol, release_notebook(sol)) == []
    assert "108,928" in render(sol) and "The course's design" in render(sol)      # what the strip removed
