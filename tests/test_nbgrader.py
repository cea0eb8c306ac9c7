"""nbgrader as a real client: an instructor's course directory, ``generate_assignment``, ``validate``,
``autograde`` and ``export`` run by the installed nbgrader (dev extra) on lesson 01, and the points it
records equal ``attn-course grade``'s for the same submitted files, exercise by exercise.

Three students submit in nbgrader's layout ``submitted/<student>/<assignment>/<notebook>.ipynb`` (with
nbgrader's ``timestamp.txt`` beside each notebook):

* ``correct``: the solutions' cells, one of them with a debug print to stderr and a warning (nbgrader
  gives 0 to a test cell that writes to stderr, so check() must keep them out of it);
* ``unsolved``: the released notebook untouched (must fail ``nbgrader validate``);
* ``partly_wrong``: three exercises replaced by known misconceptions from tests/learner_cells.py;
* ``crash_hang`` (review 2026-11-26, instructor §3): 1.1 hangs (``while True``), 1.2 kills the kernel
  (``os._exit(3)``), 1.4 raises, 1.3 and 1.5 are right. Plain nbgrader waited out the timeout, then "Kernel
  died": no grade at all; with the course's config (docs/grading.md, read from there) it gets 2/9 like
  ``attn-course grade``.
"""
import csv
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from attn_course.grading import notebook as nbk
from attn_course.grading.exercises import registry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from learner_cells import CELLS  # noqa: E402

STEM = "01_scaled_dot_product_attention"
HANG_S = 30          # the cell timeout (nbgrader) and --timeout (attn-course grade) here: a hang costs this much
ASSIGNMENT = "lesson01"
WRONG = ("01_attention_by_hand", "01_causal_padding_mask", "01_predict_shapes")   # partly_wrong's misconceptions
NOISY = "01_fix_the_bug"                                                          # correct, but noisy on stderr
CRASH_HANG = {"01_attention_by_hand": "    while True:\n        pass\n",
              "01_causal_padding_mask": "    import os\n    os._exit(3)\n",
              "01_fix_the_bug": "    raise RuntimeError('I give up')\n"}


def docs_config(root: Path) -> str:
    """The nbgrader_config.py of docs/grading.md, step 1, for a course directory at ``root``."""
    text = (ROOT / "docs" / "grading.md").read_text()
    block = re.search(r"1\. \*Course directory and config\.\*.*?```python\n(.*?)```", text, re.S).group(1)
    block = "\n".join(line[3:] if line.startswith("   ") else line for line in block.splitlines())
    assert 'c.CourseDirectory.root = "/path/to/course"' in block and "autograde_preprocessors()" in block
    return (block.replace('"/path/to/course"', repr(str(root)))
            + f'\nc.CourseDirectory.db_url = "sqlite:///{root}/gradebook.db"\n')


def nbgrader(args, cwd, env, timeout=300):
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    print(f"nbgrader {' '.join(args)}: {time.monotonic() - t0:.1f} s (exit {proc.returncode})")
    return proc


def submit(released: Path, course: Path, student: str, cells: dict[str, str]) -> Path:
    """``released`` with the exercise cells in ``cells`` replaced, as nbgrader's collect step leaves it."""
    nb = nbformat.read(str(released), as_version=4)
    for cell in nb.cells:
        gid = nbk.grade_id(cell)
        if gid in cells:
            cell.source = cells[gid]
    target = course / "submitted" / student / ASSIGNMENT / released.name
    target.parent.mkdir(parents=True)
    nbformat.write(nb, str(target))
    (target.parent / "timestamp.txt").write_text("2026-11-23 12:00:00.000000 UTC\n")
    return target


def test_nbgrader_grades_equal_attn_course_grade(tmp_path, monkeypatch):
    t_start = time.monotonic()
    # nbgrader's gradebook runs the `alembic` program: the venv's bin/ must be on PATH (as when activated)
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    course = tmp_path / "course"
    (course / "source" / ASSIGNMENT).mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / f"{STEM}.ipynb", course / "source" / ASSIGNMENT / f"{STEM}.ipynb")
    # the docs' block as written, its 60 s cell timeout lowered to HANG_S: the hanging submission waits it out
    (course / "nbgrader_config.py").write_text(docs_config(course) + f"c.ExecutePreprocessor.timeout = {HANG_S}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "NBGRADER"))}
    env.update(JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter_config"), JUPYTER_DATA_DIR=str(tmp_path / "jupyter_data"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "jupyter_runtime"), JUPYTER_PLATFORM_DIRS="1",
               OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    reg = registry()
    solutions = nbk.exercise_cells(nbk.read(ROOT / "solutions" / f"{STEM}.ipynb"))
    ids = list(solutions)
    max_score = sum(reg[i].points for i in ids)

    # 1. generate_assignment: solution regions stubbed, check cells locked autograder tests with points
    proc = nbgrader(["generate_assignment", ASSIGNMENT, "--create"], course, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    released = course / "release" / ASSIGNMENT / f"{STEM}.ipynb"
    rel = nbformat.read(str(released), as_version=4)
    tests = {c.metadata.nbgrader.grade_id: c for c in rel.cells
             if c.get("metadata", {}).get("nbgrader", {}).get("grade")}
    assert set(tests) == {f"{i}_test" for i in ids}
    assert all(c.metadata.nbgrader.locked and c.metadata.nbgrader.points == reg[c.metadata.nbgrader.grade_id[:-5]].points
               for c in tests.values())
    assert all("raise NotImplementedError()" in nbk.source_of(c) and nbk.BEGIN not in nbk.source_of(c)
               for c in nbk.exercise_cells(rel).values())

    # 2. three submissions in nbgrader's layout
    debug = ("import sys, warnings\n"
             "print('debugging fixed_attention', file=sys.stderr)\n"
             "warnings.warn('a warning from my cell', UserWarning)\n")
    noisy = solutions[NOISY].source.replace("    ### BEGIN SOLUTION\n", "    ### BEGIN SOLUTION\n"
                                            + "".join("    " + line + "\n" for line in debug.splitlines()), 1)
    assert noisy != solutions[NOISY].source
    correct = {i: nbk.source_of(c) for i, c in solutions.items()} | {NOISY: noisy}
    partly = {i: nbk.source_of(c) for i, c in solutions.items()} | {i: CELLS[i][2][0][0] for i in WRONG}
    crash_hang = {i: nbk.source_of(c) for i, c in solutions.items()}
    for i, body in CRASH_HANG.items():
        crash_hang[i] = crash_hang[i].replace("    ### BEGIN SOLUTION\n", "    ### BEGIN SOLUTION\n" + body, 1)
        assert crash_hang[i] != nbk.source_of(solutions[i])
    paths = {"correct": submit(released, course, "correct", correct),
             "unsolved": submit(released, course, "unsolved", {}),
             "partly_wrong": submit(released, course, "partly_wrong", partly),
             "crash_hang": submit(released, course, "crash_hang", crash_hang)}

    # 3. validate: the unsolved notebook fails, the correct one passes (stderr noise included). One nbgrader
    # process validates both (each in a kernel of its own), in this order, printing one verdict per notebook.
    proc = nbgrader(["validate", str(paths["unsolved"]), str(paths["correct"])], course, env)
    failed, success = "VALIDATION FAILED ON 5 CELL(S)", "Success! Your notebook passes all the tests."
    assert proc.stdout.count("VALIDATION FAILED") == proc.stdout.count(failed) == 1, proc.stdout + proc.stderr
    assert proc.stdout.count("Success!") == proc.stdout.count(success) == 1, proc.stdout + proc.stderr
    assert proc.stdout.index(failed) < proc.stdout.index(success), proc.stdout + proc.stderr   # unsolved, correct

    # 4. autograde and export
    t0 = time.monotonic()
    proc = nbgrader(["autograde", ASSIGNMENT, "--create"], course, env, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Removing failed assignment" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    print(f"nbgrader autograde, 4 submissions (one hangs for the whole {HANG_S} s cell timeout): {time.monotonic() - t0:.0f} s")
    proc = nbgrader(["export", "--to", str(tmp_path / "nbgrader_grades.csv")], course, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(tmp_path / "nbgrader_grades.csv", newline="") as f:
        exported = {row["student_id"]: row for row in csv.DictReader(f)}
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course}/gradebook.db") as gb:
        nbgrader_points = {}
        for student in paths:
            nb = gb.find_submission_notebook(STEM, ASSIGNMENT, student)
            nbgrader_points[student] = {g.name[:-len("_test")]: float(g.score) for g in nb.grades}
            assert {g.name: float(g.max_score) for g in nb.grades} == {f"{i}_test": reg[i].points for i in ids}
            assert not any(g.needs_manual_grade for g in nb.grades)

    # 5. attn-course grade on the same submitted/ folder (student ids from the folders, timestamp.txt ignored)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "attn_course.grading.cli", "grade", str(course / "submitted"),
                           "--out", str(tmp_path / "attn_grades"), "--jobs", "2", "--timeout", str(HANG_S), "--quiet",
                           "--root", str(ROOT)], capture_output=True, text=True, timeout=600)
    print(f"attn-course grade: {time.monotonic() - t0:.1f} s")
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "attn_grades" / "grades.csv", newline="") as f:
        ours = {row["student_id"]: row for row in csv.DictReader(f)}
    assert set(ours) == set(paths), ours.keys()

    print(f"\n{'student':<14}" + "".join(f"{i[3:]:>22}" for i in ids) + f"{'total':>8}  (nbgrader = attn-course grade)")
    for student in paths:
        got = nbgrader_points[student]
        row = ours[student]
        assert got == {i: float(row[i]) for i in ids}, (student, got, row)
        assert float(exported[student]["raw_score"]) == float(row["total"]) == sum(got.values())
        assert float(exported[student]["max_score"]) == float(row["max_score"]) == max_score
        print(f"{student:<14}" + "".join(f"{got[i]:>22g}" for i in ids) + f"{sum(got.values()):>5g}/{max_score:g}")
    assert nbgrader_points["correct"] == {i: float(reg[i].points) for i in ids}
    assert nbgrader_points["unsolved"] == {i: 0.0 for i in ids}
    partly = nbgrader_points["partly_wrong"]
    assert all(partly[i] < reg[i].points for i in WRONG) and all(partly[i] == reg[i].points for i in ids
                                                                  if i not in WRONG)
    # the crash and the hang cost their own exercises only, under both graders: 1.3 and 1.5 right = 2 of 9
    assert nbgrader_points["crash_hang"] == {i: (0.0 if i in CRASH_HANG else float(reg[i].points)) for i in ids}
    assert sum(nbgrader_points["crash_hang"].values()) == 2.0

    # the autograded notebook: test cells hold the report (display) and the score (execute_result), no
    # stderr; the cases are held out (not the self-check's) and the very cases attn-course grade drew
    import json
    graded = nbformat.read(str(course / "autograded" / "correct" / ASSIGNMENT / f"{STEM}.ipynb"), as_version=4)
    ours_json = json.loads((tmp_path / "attn_grades" / "correct.json").read_text())["exercises"]
    self_check = nbformat.read(str(ROOT / "solutions" / f"{STEM}.ipynb"), as_version=4)
    self_check_text = "".join(o.data.get("text/plain", "") for c in self_check.cells if c.cell_type == "code"
                              for o in c.outputs if o.output_type == "display_data")
    for cell in graded.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
            ex_id = cell.metadata.nbgrader.grade_id[:-len("_test")]
            kinds = [(o.output_type, o.get("name")) for o in cell.outputs]
            assert ("stream", "stderr") not in kinds and ("error", None) not in kinds, cell.outputs
            assert kinds[-1] == ("execute_result", None), kinds
            report = "".join(o.data["text/plain"] for o in cell.outputs if o.output_type == "display_data")
            assert "held-out inputs" in report, report
            names = [c["name"] for c in ours_json[ex_id]["cases"]]
            assert names and all(f"✓ {name}" in report for name in names), (ex_id, names, report)
            if ex_id == "01_predict_shapes":                  # its case names are the random shapes drawn
                assert not any(name in self_check_text for name in names), names
            if ex_id == NOISY:
                assert "debugging fixed_attention" in report and "a warning from my cell" in report, report
    print(f"whole nbgrader round trip: {time.monotonic() - t_start:.1f} s")
