"""The bulk grader against hostile submissions (crash, hang, memory, fork, tampering, fake success,
objects pretending to be tensors, forbidden APIs): each earns 0 on the exercise it attacks, the batch
completes, honest work keeps full marks, error rows are reported, the CSV is the grader's own."""
import csv
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

from attn_course.grading.runner import Options, grade_batch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("hostile_generate", ROOT / "tests" / "hostile" / "generate.py")
generate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generate)


def run_batch(base):
    subs, pids = base / "submissions", base / "pids"
    pids.mkdir(parents=True)
    expected = generate.build(subs, pids)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "attn_course.grading.cli", "grade", str(subs), "--out", "out", "--jobs", "2",
         "--timeout", "30", "--memory", "3072", "--quiet", "--root", str(ROOT)],
        cwd=base, capture_output=True, text=True, timeout=900)
    elapsed = time.monotonic() - t0
    rows = {}
    with open(base / "out" / "grades.csv", newline="") as f:
        for row in csv.DictReader(f):
            rows[row["student_id"]] = row
    return {"expected": expected, "rows": rows, "out": base / "out", "pids": pids, "proc": proc,
            "elapsed": elapsed, "subs": subs, "base": base}


def check_batch_completes(graded):
    assert graded["proc"].returncode == 0, graded["proc"].stderr
    # notes.txt lies in the submissions folder: a folder contributes its notebooks only
    assert set(graded["rows"]) == set(graded["expected"]) - {"notes"}
    assert (graded["subs"] / "notes.txt").is_file()
    print(f"\nhostile batch of {len(graded['rows'])} files graded in {graded['elapsed']:.1f} s (--jobs 2)")


STUDENTS = ["crasher", "hog", "cheater", "forbidden", "reader", "honest_noisy", "solution_copy", "untouched"]


def check_points_per_exercise(graded, student):
    want = graded["expected"][student]
    row = graded["rows"][student]
    got = {i: float(row[i]) for i in generate.IDS}
    assert got == {i: float(p) for i, p in want.items()}, json.loads(
        (graded["out"] / f"{student}.json").read_text())["exercises"]
    assert float(row["total"]) == sum(want.values())
    assert float(row["max_score"]) == 9


ERRORS = [("broken", "invalid JSON"), ("empty", "no exercise of this course")]


def check_error_rows(graded, student, reason):
    row = graded["rows"][student]
    assert all(float(row[i]) == 0 for i in generate.IDS) and float(row["total"]) == 0
    report = json.loads((graded["out"] / f"{student}.json").read_text())
    assert reason in report["error"]
    assert reason in (graded["out"] / f"{student}.feedback.md").read_text()
    assert f"{student}: " in graded["proc"].stderr


def check_csv_is_the_graders_own(graded):
    """The cheater wrote grades.csv into its cwd, the parent folder and the grader's --out folder."""
    text = (graded["out"] / "grades.csv").read_text()
    assert "cheater,100" not in text
    assert text.splitlines()[0] == "student_id," + ",".join(generate.IDS) + ",total,max_score"
    assert not (graded["base"] / "grades.csv").exists()
    assert json.loads((graded["out"] / "cheater.json").read_text())["total"] == 0


def check_forked_processes_are_killed(graded):
    # the sandbox refuses os.fork (the hog's cell is refused by "no threads or processes", check_feedback_explains);
    # whatever did start must not outlive the batch
    pids = [int(p.name) for p in graded["pids"].iterdir()]
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if "State:\tZ" not in state:
            alive.append(pid)
    assert not alive


def check_feedback_explains(graded):
    out = graded["out"]
    crasher = (out / "crasher.feedback.md").read_text()
    assert "crashed the grading process" in crasher
    hog = json.loads((out / "hog.json").read_text())["exercises"]
    assert "ran past the time limit" in " ".join(hog["01_fix_the_bug"]["notes"])
    assert any("RuntimeError" in c["hint"] for c in hog["01_causal_padding_mask"]["cases"])
    forbidden = json.loads((out / "forbidden.json").read_text())["exercises"]
    for ex_id in ("01_attention_by_hand", "01_fix_the_bug", "01_causal_padding_mask"):
        assert forbidden[ex_id]["status"] == "forbidden", forbidden[ex_id]
    assert "rule: no fused attention kernels" in " ".join(forbidden["01_fix_the_bug"]["notes"])   # the sandbox
    assert "rule: no course modules" in " ".join(forbidden["01_causal_padding_mask"]["notes"])  # the sandbox
    reader = json.loads((out / "reader.json").read_text())["exercises"]
    assert "rule: no course modules" in " ".join(reader["01_attention_by_hand"]["notes"])        # the sandbox
    assert "rule: no threads or processes" in " ".join(reader["01_fix_the_bug"]["notes"])
    assert "rule: no threads or processes" in " ".join(hog["01_attention_by_hand"]["notes"])     # os.fork
    assert reader["01_causal_padding_mask"]["status"] == "forbidden"      # the grader's reference, called
    cheater = json.loads((out / "cheater.json").read_text())["exercises"]
    assert "not a torch.Tensor" in cheater["01_fix_the_bug"]["cases"][0]["hint"]
    assert "not a torch.Tensor" in cheater["01_causal_padding_mask"]["cases"][0]["hint"]
    honest = (out / "honest_noisy.feedback.md").read_text()
    assert "✗" not in honest and honest.count("✓") == 18


def check_regrading_gives_the_same_grades(graded, tmp_path):
    subs = [graded["subs"] / "cheater.ipynb", graded["subs"] / "untouched.ipynb", graded["subs"] / "broken.ipynb"]
    reports = grade_batch(subs, tmp_path, Options(timeout=30, memory_mb=3072, jobs=2), root=ROOT, progress=False)
    again = {r["student_id"]: r for r in reports}
    for student in ("cheater", "untouched", "broken"):
        first = json.loads((graded["out"] / f"{student}.json").read_text())
        second = json.loads((tmp_path / f"{student}.json").read_text())
        first.pop("submission"), second.pop("submission")
        assert first == second
        assert again[student]["total"] == float(graded["rows"][student]["total"])


def test_hostile_batch(tmp_path):
    """One batch (one expensive run, also under pytest-xdist), then every property of it."""
    graded = run_batch(tmp_path / "batch")
    check_batch_completes(graded)
    for student in STUDENTS:
        check_points_per_exercise(graded, student)
    for student, reason in ERRORS:
        check_error_rows(graded, student, reason)
    check_csv_is_the_graders_own(graded)
    check_forked_processes_are_killed(graded)
    check_feedback_explains(graded)
    check_regrading_gives_the_same_grades(graded, tmp_path / "again")
    # a non-notebook named on the command line is graded as given: an error row
    reports = grade_batch([graded["subs"] / "notes.txt"], tmp_path / "named", Options(timeout=30), root=ROOT,
                          progress=False)
    assert [r["student_id"] for r in reports] == ["notes"] and "not a notebook" in reports[0]["error"]
