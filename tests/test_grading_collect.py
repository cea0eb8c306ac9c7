"""``attn-course grade``: which files are submissions and whose they are (flat folder, nbgrader's
``submitted/<student>/<assignment>/<notebook>.ipynb``, one folder per student with shared file names)."""
import shutil
from pathlib import Path

from attn_course.grading.runner import Options, collect, grade_batch

ROOT = Path(__file__).resolve().parents[1]
STEM = "01_scaled_dot_product_attention"


def touch(path: Path, text: str = "{}") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def ids(subs, base):
    return {s.path.relative_to(base).as_posix(): s.student_id for s in subs}


def test_flat_folder(tmp_path):
    for name in ("alice.ipynb", "bob.ipynb", ".hidden.ipynb", ".ipynb_checkpoints/alice-checkpoint.ipynb",
                 "notes.txt"):
        touch(tmp_path / name)
    assert ids(collect([tmp_path]), tmp_path) == {"alice.ipynb": "alice", "bob.ipynb": "bob"}


def test_nbgrader_layout(tmp_path):
    """Student ids come from ``submitted/<student>/``; nbgrader's timestamp.txt is not a submission."""
    sub = tmp_path / "course" / "submitted"
    for student in ("alice", "bob", "carol"):
        touch(sub / student / "lesson01" / f"{STEM}.ipynb")
        touch(sub / student / "lesson01" / "timestamp.txt", "2026-11-23 12:00:00 UTC")
    touch(sub / "bob" / "lesson02" / "02_multi_head_attention.ipynb")
    want = {f"alice/lesson01/{STEM}.ipynb": "alice", f"bob/lesson01/{STEM}.ipynb": f"bob/{STEM}",
            f"carol/lesson01/{STEM}.ipynb": "carol",
            "bob/lesson02/02_multi_head_attention.ipynb": "bob/02_multi_head_attention"}
    assert ids(collect([sub]), sub) == want
    # the same, from the course folder, from a shell glob, and for one student alone
    assert ids(collect([tmp_path / "course"]), sub.parent) == {f"submitted/{k}": v for k, v in want.items()}
    glob = sorted(sub.glob(f"*/lesson01/{STEM}.ipynb"))
    assert [s.student_id for s in collect(glob)] == ["alice", "bob", "carol"]
    assert [s.student_id for s in collect([sub / "alice"])] == ["alice"]
    autograded = touch(tmp_path / "course" / "autograded" / "dave" / "lesson01" / f"{STEM}.ipynb")
    assert [s.student_id for s in collect([autograded])] == ["dave"]


def test_folders_per_student_with_shared_file_names(tmp_path):
    for student in ("alice", "bob"):
        touch(tmp_path / "class" / student / "hw" / "lesson01.ipynb")
        touch(tmp_path / "class" / student / "hw" / "README.md", "# notes")
    touch(tmp_path / "class" / "carol.ipynb")
    assert ids(collect([tmp_path / "class"]), tmp_path / "class") == {
        "alice/hw/lesson01.ipynb": "alice", "bob/hw/lesson01.ipynb": "bob", "carol.ipynb": "carol"}
    # a file name shared by folders that do not tell the students apart: still unique ids
    touch(tmp_path / "x" / "a" / "same.ipynb")
    touch(tmp_path / "y" / "a" / "same.ipynb")
    got = [s.student_id for s in collect([tmp_path / "x", tmp_path / "y"])]
    assert got == ["x", "y"]
    got = [s.student_id for s in collect([tmp_path / "x" / "a" / "same.ipynb"] * 2)]
    assert got == ["same", "same_2"]                            # the same file twice: nothing tells them apart


def test_grade_in_nbgrader_layout(tmp_path):
    """End to end: two students' identical released notebooks and one student's solutions notebook,
    graded from ``submitted/``: one row per student, no row for timestamp.txt."""
    sub = tmp_path / "submitted"
    for student, folder in (("alice", "solutions"), ("bob", "exercises")):
        target = sub / student / "lesson01" / f"{STEM}.ipynb"
        target.parent.mkdir(parents=True)
        shutil.copy(ROOT / folder / f"{STEM}.ipynb", target)
        (target.parent / "timestamp.txt").write_text("2026-11-23 12:00:00 UTC\n")
    # check_settings=False: the solutions' own run (calibrate) is test_grading_notebooks.py's, for every lesson
    reports = grade_batch([sub], tmp_path / "out", Options(timeout=120, jobs=2), root=ROOT, progress=False,
                          check_settings=False)
    got = {r["student_id"]: (r["error"], r["total"], r["max_score"]) for r in reports}
    assert got == {"alice": (None, 9.0, 9.0), "bob": (None, 0.0, 9.0)}
    rows = (tmp_path / "out" / "grades.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["alice", "bob"]
    assert (tmp_path / "out" / "alice.feedback.md").is_file() and (tmp_path / "out" / "bob.json").is_file()
