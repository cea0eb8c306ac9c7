"""attn-course bench --suite notebooks: a notebook executed headless, its wall time recorded with the machine
(the recording format of the other suites), a failing notebook recorded without stopping the run, the table
and the targets."""
import json

import nbformat
import pytest

from attn_course import cli
from attn_course.bench import notebooks


def _notebook(path, *sources):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def test_runs_notebooks_headless_and_records_times_with_the_machine(tmp_path, capsys):
    _notebook(tmp_path / "notebooks" / "01_small.ipynb", "import time, pathlib", "time.sleep(0.5)",
              "assert pathlib.Path('01_small.ipynb').exists()")             # run in the notebook's folder
    _notebook(tmp_path / "exercises" / "01_small.ipynb", "raise ValueError('a learner stub')")
    out = tmp_path / "times.json"
    rc = cli.main(["bench", "--suite", "notebooks", "--root", str(tmp_path), "--json", str(out), "--quiet",
                   "--check"])
    assert rc == 1                                                       # the exercise notebook failed
    data = json.loads(out.read_text())
    assert data["suite"] == "notebooks" and data["args"]["taskset_one_core"] is False
    for key in ("cpu", "cores", "torch", "threads", "load_avg_start", "load_avg_end"):
        assert key in data["machine"], key
    lesson, exercise = data["rows"]
    assert lesson["notebook"] == "notebooks/01_small.ipynb" and "error" not in lesson
    assert lesson["cells"] == 3 and lesson["wall_s"] >= 0.5 + lesson["kernel_start_s"] > 0.5
    assert lesson["shutdown_s"] > 0 and exercise["shutdown_s"] > 0          # recorded apart from the wall time
    assert len(lesson["load_avg_before"]) == 3 and len(lesson["load_avg_after"]) == 3
    assert exercise["notebook"] == "exercises/01_small.ipynb" and "a learner stub" in exercise["error"]
    text = capsys.readouterr().out
    assert "| notebooks/01_small.ipynb |" in text and "machine: " in text and "total: " in text
    assert "PASS  lessons (notebooks/) <= 60 s" in text and "FAIL  exercises (exercises/) <= 15 s" in text


def test_targets_and_discovery(tmp_path):
    rows = [{"notebook": "notebooks/01_a.ipynb", "wall_s": 40.0}, {"notebook": "exercises/01_a.ipynb", "wall_s": 9.0}]
    assert [(v, ok) for _, v, ok in notebooks.check_notebooks(rows)] == [(40.0, False), (40.0, True), (9.0, True)]
    assert all(v is None and not ok for _, v, ok in notebooks.check_notebooks([]))
    for f in ("notebooks/02_b.ipynb", "notebooks/01_a.ipynb", "exercises/01_a.ipynb", "solutions/01_a.ipynb",
              "notebooks/scratch.ipynb"):
        _notebook(tmp_path / f, "1")
    names = lambda ps: [p.relative_to(tmp_path).as_posix() for p in ps]
    assert names(notebooks.find_notebooks(tmp_path)) == ["notebooks/01_a.ipynb", "notebooks/02_b.ipynb",
                                                         "exercises/01_a.ipynb"]
    assert names(notebooks.find_notebooks(tmp_path, solutions=True))[-1] == "solutions/01_a.ipynb"
    with pytest.raises(SystemExit, match="no notebooks found"):
        cli.main(["bench", "--suite", "notebooks", "--root", str(tmp_path / "empty"), "--quiet"])


def test_taskset_one_core_pins_the_kernel_and_restores_the_affinity(tmp_path):
    import os
    nb = _notebook(tmp_path / "notebooks" / "01_cores.ipynb", "import os, torch",
                   "assert len(os.sched_getaffinity(0)) == 1 and torch.get_num_threads() == 1")
    before = os.sched_getaffinity(0)
    record = notebooks.run_notebooks([nb], root=tmp_path, one_core=True, path=tmp_path / "t.json")
    assert os.sched_getaffinity(0) == before
    assert record["machine"]["threads"] == 1 and record["args"]["taskset_one_core"] is True
    assert "error" not in record["rows"][0], record["rows"][0]


def test_rounds_run_interleaved_and_record_each_run_and_the_median(tmp_path, capsys):
    a = _notebook(tmp_path / "notebooks" / "01_a.ipynb", "import time", "time.sleep(0.3)")
    b = _notebook(tmp_path / "notebooks" / "02_b.ipynb", "1 + 1")
    seen = []
    record = notebooks.run_notebooks([a, b], root=tmp_path, rounds=3, progress=seen.append, path=tmp_path / "t.json")
    assert seen == [f"notebooks: {n} (round {k} of 3)" for k in (1, 2, 3)
                    for n in ("notebooks/01_a.ipynb", "notebooks/02_b.ipynb")]          # round-major: interleaved
    assert record["args"]["rounds"] == 3
    saved = json.loads((tmp_path / "t.json").read_text())["rows"]
    for row in (record["rows"], saved):
        ra, rb = row
        walls = sorted(r["wall_s"] for r in ra["rounds"])
        assert len(ra["rounds"]) == len(rb["rounds"]) == 3 and ra["wall_s"] == walls[1] >= 0.3   # the median
        assert ra["cells"] == 2 and "error" not in ra and all("load_avg_before" in r for r in ra["rounds"])
    text = notebooks.format_notebooks(record["rows"])
    assert f"| notebooks/01_a.ipynb | {walls[1]:.1f} ({walls[0]:.1f}–{walls[2]:.1f}) |" in text
    with pytest.raises(ValueError, match="rounds must be a positive integer, got 0"):
        notebooks.run_notebooks([a], root=tmp_path, rounds=0)
    with pytest.raises(SystemExit, match="--rounds must be at least 1, got 0"):
        cli.main(["bench", "--suite", "notebooks", "--root", str(tmp_path), "--rounds", "0", "--quiet"])


def test_a_round_that_fails_marks_the_row(tmp_path):
    nb = _notebook(tmp_path / "notebooks" / "01_flaky.ipynb", "import pathlib",
                   "p = pathlib.Path('seen')\nfirst = not p.exists()\np.touch()\nassert first, 'second run'")
    (row,) = notebooks.run_notebooks([nb], root=tmp_path, rounds=2)["rows"]
    assert "error" not in row["rounds"][0] and "second run" in row["rounds"][1]["error"]
    assert "second run" in row["error"]
    assert [ok for _, _, ok in notebooks.check_notebooks([row])][:2] == [False, False]   # the lessons' targets
