"""An instructor's mistakes are refused, not charged to learners; the folder is the student; error rows and
feedback agree on what a submission was out of."""
import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attn_course.grading.runner import Options, SettingsError, collect, grade_batch

ROOT = Path(__file__).resolve().parents[1]
STEM = "01_scaled_dot_product_attention"
SOLUTION = ROOT / "solutions" / f"{STEM}.ipynb"


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "attn_course.grading.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def touch(path: Path, text: str = "{}") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_folder_is_the_student_whatever_the_file_is_called(tmp_path):
    subs = tmp_path / "class"
    for rel in ("alice/01_scaled_dot_product_attention.ipynb", "carol/Copy of 01_scaled_dot_product_attention.ipynb",
                "dan/01_scaled_dot_product_attention (1).ipynb", "bob/hw2/lesson09.ipynb",
                "erin/01_scaled_dot_product_attention.ipynb", "erin/02_multi_head_attention.ipynb", "frank.ipynb"):
        touch(subs / rel)
    got = {s.path.relative_to(subs).as_posix(): s.student_id for s in collect([subs])}
    assert got == {"alice/01_scaled_dot_product_attention.ipynb": "alice",
                   "carol/Copy of 01_scaled_dot_product_attention.ipynb": "carol",
                   "dan/01_scaled_dot_product_attention (1).ipynb": "dan",
                   "bob/hw2/lesson09.ipynb": "bob",
                   "erin/01_scaled_dot_product_attention.ipynb": f"erin/{STEM}",
                   "erin/02_multi_head_attention.ipynb": "erin/02_multi_head_attention",
                   "frank.ipynb": "frank"}


@pytest.mark.parametrize("flag,value,words", [("--timeout", "0", "at least 1"), ("--jobs", "0", "at least 1"),
                                             ("--jobs", "-3", "at least 1"), ("--memory", "50", "at least 256"),
                                             ("--timeout", "abc", "not a number")])
def test_bad_settings_are_refused_before_grading(tmp_path, flag, value, words):
    r = cli("grade", SOLUTION, "--out", tmp_path / "out", flag, value, "--root", ROOT)
    assert r.returncode == 2 and words in r.stderr and flag in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(sys.platform != "linux", reason="the sandbox's memory limit is enforced on Linux only")
def test_settings_that_fail_the_courses_own_solutions_grade_nobody(tmp_path):
    """256 MiB of address space cannot even import torch: a perfect notebook would get 0, so nothing is graded."""
    with pytest.raises(SettingsError, match="course's own solutions"):
        grade_batch([SOLUTION], tmp_path / "out", Options(memory_mb=256), root=ROOT, progress=False)
    assert not (tmp_path / "out").exists()
    r = cli("grade", SOLUTION, "--out", tmp_path / "out2", "--memory", "256", "--root", ROOT)
    assert r.returncode == 2 and "nothing was graded" in r.stderr and "raise --timeout / --memory" in r.stderr


def test_wrong_places_get_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("x")
    r = cli("grade", SOLUTION, "--out", tmp_path / "file", "--root", ROOT)
    assert r.returncode == 2 and "is a file" in r.stderr and "Traceback" not in r.stderr
    r = cli("grade", SOLUTION, "--out", tmp_path / "out", "--root", tmp_path)
    assert r.returncode == 2 and "--root" in r.stderr and "Traceback" not in r.stderr
    r = cli("release", "--check", "--root", tmp_path)
    assert r.returncode == 2 and "no solutions/" in r.stderr and "up to date" not in r.stdout


def test_error_rows_say_the_same_out_of_in_csv_and_feedback(tmp_path):
    subs = tmp_path / "subs"
    shutil.copy(SOLUTION, touch(subs / "alice.ipynb"))
    touch(subs / f"{STEM}_broken.ipynb", "{not json")                 # names lesson 01: out of 9
    touch(subs / "gina.ipynb", json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    grade_batch([subs], tmp_path / "out", Options(timeout=120), root=ROOT, progress=False)
    with open(tmp_path / "out" / "grades.csv", newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert rows["alice"]["max_score"] == rows[f"{STEM}_broken"]["max_score"] == rows["gina"]["max_score"] == "9"
    assert "Score: 0 / 9" in (tmp_path / "out" / f"{STEM}_broken.feedback.md").read_text()
    # a mixed batch: a file that names no lesson has no known out-of, and its feedback does not invent one
    shutil.copy(ROOT / "solutions" / "02_multi_head_attention.ipynb", subs / "bob.ipynb")
    grade_batch([subs], tmp_path / "out2", Options(timeout=120), root=ROOT, progress=False, check_settings=False)
    with open(tmp_path / "out2" / "grades.csv", newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert rows["gina"]["max_score"] == "" and rows[f"{STEM}_broken"]["max_score"] == "9"
    text = (tmp_path / "out2" / "gina.feedback.md").read_text()
    assert "Score: 0\n" in text and "/ 0" not in text


def test_grading_nothing_is_an_error_naming_the_folder(tmp_path):
    """Review 2026-11-26 (instructor §4): an empty or wrong folder printed "graded 0 submission(s)", exited 0 and
    wrote a header-only grades.csv. Now: exit 2, the folder named, nothing written."""
    from attn_course.grading.runner import NothingToGrade
    empty = tmp_path / "empty"
    empty.mkdir()
    zipped = tmp_path / "zipped"
    touch(zipped / "alice.zip", "PK")
    touch(zipped / ".ipynb_checkpoints" / "alice-checkpoint.ipynb")        # hidden: not a submission
    for folder, words in ((empty, "it is empty"), (zipped, "extract the archives first")):
        r = cli("grade", folder, "--out", tmp_path / "out", "--root", ROOT)
        assert r.returncode == 2, r.stderr
        assert str(folder) in r.stderr and "no notebook to grade" in r.stderr and words in r.stderr
        assert "graded 0" not in r.stderr and "Traceback" not in r.stderr
        assert not (tmp_path / "out").exists()
    # one good folder beside an empty one is still a mistake worth stopping for
    shutil.copy(SOLUTION, touch(tmp_path / "class" / "alice.ipynb"))
    with pytest.raises(NothingToGrade, match="empty"):
        grade_batch([tmp_path / "class", empty], tmp_path / "out", root=ROOT, progress=False)
    assert not (tmp_path / "out").exists()
