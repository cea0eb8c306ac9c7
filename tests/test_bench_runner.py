"""The benchmark runner shared by the three suites: interleaved rounds at a fixed thread count, the recording
format (round trip, the machine recorded), targets, the command line's help, and failures that cost one cell."""
import json

import pytest
import torch

from attn_course import bench
from attn_course.bench import runner
from attn_course import cli


def _fake_suite(log, *, fail=(), skip=()):
    """A suite whose methods append (method, phase, threads) to ``log`` instead of computing."""
    def build(method, row, args, device):
        if method in fail:
            raise RuntimeError(f"{method} cannot run at L={row['L']}")
        return runner.Case(lambda: log.append((method, torch.get_num_threads())), {"extra": method})
    return runner.Suite(
        name="fake", methods=("a", "b", "c"), rows=lambda args: [{"L": L} for L in args["lengths"]], build=build,
        check=lambda rows: [], format=lambda rows: "", quick={"lengths": [1]}, full={"lengths": [1, 2]},
        recorded=bench.RECORDED_CPU, row_label=str, header=str,
        skip=lambda m, row, args: "skipped here" if (m, row["L"]) in skip else None)


def test_a_row_measures_memory_per_method_then_times_all_methods_interleaved_at_fixed_threads(three_threads):
    log = []
    before = torch.get_num_threads()
    cells = runner.measure_row(_fake_suite(log), {"L": 1}, ["a", "b", "c"],
                               {"device": "cpu", "repeats": 7, "warmup": 1, "threads": 1})
    calls = [m for m, _ in log]
    # per method: the first call, then one call whose peak memory is measured
    assert calls[:6] == ["a", "a", "b", "b", "c", "c"]
    # compare(): one warm-up call each, then 7 rounds, round r starting at method r mod 3
    assert calls[6:9] == ["a", "b", "c"]
    rounds = [calls[9 + 3 * r: 12 + 3 * r] for r in range(7)]
    assert rounds[:3] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]] and len(calls) == 9 + 21
    assert {t for _, t in log} == {1} and torch.get_num_threads() == before
    for m in "abc":
        c = cells[m]
        assert len(c["times_s"]) == 7 and c["min_s"] <= c["time_s"] <= c["max_s"]
        assert c["extra"] == m and c["mem_bytes"] >= 0 and c["first_call_s"] >= 0


def test_a_failing_method_costs_its_cell_and_skips_are_recorded():
    log = []
    rows = runner.run_suite(_fake_suite(log, fail={"b"}, skip={("c", 2)}),
                            {"lengths": [1, 2], "device": "cpu", "repeats": 2, "warmup": 0, "threads": 1},
                            in_process=True)
    assert [r["L"] for r in rows] == [1, 2]
    assert rows[0]["b"]["error"] == "RuntimeError: b cannot run at L=1" and "time_s" in rows[0]["a"]
    assert rows[1]["c"] == {"method": "c", "error": "skipped here"}
    assert ("c", 1) in [(m, 1) for m, _ in log] and all(m != "b" for m, _ in log)


def test_a_crashed_row_process_is_retried_one_method_per_process(monkeypatch):
    calls = []

    def worker(cmd, timeout):
        job = json.loads(cmd[-1])
        calls.append(job["methods"])
        if len(job["methods"]) > 1:
            return {"error": "exit -9: killed"}
        return {job["methods"][0]: {"time_s": 0.5, "mem_bytes": 1}}
    monkeypatch.setattr(runner, "_run_worker", worker)
    rows = runner.run_suite("linear", {"lengths": [64], "causal": "no", "device": "cpu"}, timeout=5,
                            methods=["linear", "sdpa", "naive"])
    assert calls == [["linear", "sdpa", "naive"], ["linear"], ["sdpa"], ["naive"]]
    assert rows == [{"causal": False, "L": 64, **{m: {"method": m, "time_s": 0.5, "mem_bytes": 1}
                                                   for m in ("linear", "sdpa", "naive")}}]


def test_the_worker_process_measures_a_real_row():
    """One fresh process (python -m attn_course.bench --worker) per row, as attn-course bench runs it."""
    args = {"lengths": [128], "causal": "yes", "batch": 1, "heads": 2, "dim": 8, "device": "cpu", "repeats": 2,
            "warmup": 1, "threads": 1, "dtype": "float32"}
    (row,) = runner.run_suite("linear", args, timeout=120)
    assert row["causal"] is True and row["L"] == 128
    for m in ("linear", "sdpa", "naive"):
        assert len(row[m]["times_s"]) == 2 and row[m]["mem_bytes"] >= 0, row[m]


def test_recording_format_round_trip_with_the_machine(tmp_path):
    machine = runner.machine_info("cpu", 1)
    assert {"cpu", "cores", "torch", "threads", "cpu_capability", "date", "load_avg_start"} <= set(machine)
    assert machine["torch"] == torch.__version__ and machine["threads"] == 1 and len(machine["load_avg_start"]) == 3
    rows = [{"L": 1024, "flash_window": {"time_s": 0.1, "times_s": [0.1] * 7, "min_s": 0.1, "max_s": 0.1}}]
    path = tmp_path / "run.json"
    runner.save_record(path, "sparse", {"lengths": [1024], "repeats": 7}, machine, rows)
    data = runner.load_record(path)
    assert data == {"format": runner.FORMAT, "suite": "sparse", "args": {"lengths": [1024], "repeats": 7},
                    "machine": machine, "rows": rows}
    assert bench.load_recorded(path) == ({"lengths": [1024], "repeats": 7}, rows)
    old = tmp_path / "old.json"                                  # written before the format had a version
    old.write_text(json.dumps({"args": {"repeats": 7}, "rows": []}))
    assert runner.load_record(old) == {"format": 1, "suite": None, "machine": {}, "args": {"repeats": 7}, "rows": []}
    assert "torch " + torch.__version__ in runner.describe_machine(machine)


def test_rows_are_reported_as_they_finish():
    log, seen = [], []
    runner.run_suite(_fake_suite(log), {"lengths": [1, 2, 3], "device": "cpu", "repeats": 1, "warmup": 0},
                     in_process=True, on_row=lambda rows: seen.append([r["L"] for r in rows]))
    assert seen == [[1], [1, 2], [1, 2, 3]]


def test_cli_json_writes_the_recording_format(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert cli.main(["bench", "--suite", "linear", "--lengths", "128", "--causal", "no", "--heads", "1", "--dim", "8",
                     "--repeats", "2", "--quiet", "--device", "cpu", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "[linear]" in text and "machine: " in text and "spread: " in text
    data = runner.load_record(out)
    assert data["format"] == runner.FORMAT and data["suite"] == "linear" and data["args"]["threads"] == 1
    assert "load_avg_end" in data["machine"] and data["rows"][0]["linear"]["times_s"]


def test_help_lists_the_suites_and_the_defaults(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for needle in ("--suite {attention,sparse,linear,flash,notebooks,all}", "default: attention", "--full", "--repeats",
                   "(default: 7)", "--threads", "default: 1;", "--warmup", "sparse suite", "--window",
                   "default: 256", "1.5 to 5 minutes", "about 23 minutes", "attention 512 1024 2048 4096;"):
        assert needle in text, needle
    for shim in ("bench_sparse", "bench_linear"):                   # one entry: the shims are gone
        with pytest.raises(ImportError):
            __import__(f"attn_course.{shim}")


def test_the_console_script_dispatches_every_command(capsys):
    """attn_course.cli is the console script; grading's CLI knows only release and grade (grading imports
    neither bench nor ring)."""
    import subprocess
    import sys
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert all(c in text for c in ("release", "grade", "ring", "bench"))
    code = ("import sys, attn_course.grading.cli; "
            "print(sorted(m for m in sys.modules if m.startswith(('attn_course.bench', 'attn_course.ring'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
    from attn_course.grading import cli as grading_cli
    with pytest.raises(SystemExit):
        grading_cli.main(["bench"])


def test_bad_arguments_name_the_value():
    with pytest.raises(SystemExit, match="unknown method"):
        cli.main(["bench", "--suite", "sparse", "--methods", "flash", "--quiet"])
    with pytest.raises(SystemExit, match="--methods needs one --suite"):
        cli.main(["bench", "--suite", "all", "--methods", "naive"])
    with pytest.raises(SystemExit, match="--timeout must be positive"):
        cli.main(["bench", "--timeout", "0"])
    with pytest.raises(SystemExit, match="--lengths must be positive"):
        cli.main(["bench", "--lengths", "0"])
    with pytest.raises(SystemExit, match="--window must be positive"):
        cli.main(["bench", "--suite", "sparse", "--window", "0"])


def test_targets_can_be_two_sided_and_unmeasured_rows_never_pass():
    targets = [("grows about 2x", ("k",), "growth", 1.5, 2.5), ("at most 1", ("k",), "ratio", None, 1.0)]
    assert runner.evaluate_targets(targets, {("k",): {"growth": 2.0, "ratio": 0.5}}) == \
        [("grows about 2x", 2.0, True), ("at most 1", 0.5, True)]
    assert [ok for _, _, ok in runner.evaluate_targets(targets, {("k",): {"growth": 0.9, "ratio": 1.5}})] == [False, False]
    assert runner.evaluate_targets(targets, {}) == [("grows about 2x", None, False), ("at most 1", None, False)]


def test_check_skips_targets_outside_the_grid_and_fails_measured_misses(monkeypatch, capsys):
    rows = {"fast": [{"mode": "fwd", "causal": False, "L": 4096,
                      **{m: {"time_s": t, "mem_bytes": b} for m, t, b in
                         (("naive", 1.0, 100), ("flash", 2.0, 1), ("sdpa", 0.5, 1))}}]}
    monkeypatch.setattr(bench.cli, "run_suite", lambda suite, args, **kw: rows["fast"])
    code = bench.main(["--device", "cpu", "--quiet", "--check"])
    out = capsys.readouterr().out
    assert code == 1 and "FAIL  forward, L=4096: flash time <= 1.0x naive  (measured 2.000)" in out
    assert "SKIP  forward+backward, L=2048: flash memory <= 20% of naive  (not in this run's grid)" in out


@pytest.mark.parametrize("name", ["attention", "sparse", "linear"])
def test_shipped_recordings_carry_their_method_and_machine(name):
    """Re-recorded with the runner: format 2, one thread, >= 7 interleaved rounds, spread per cell, the machine
    and its load average; every target of the suite met; no growth target contradicted by the table."""
    suite = bench.SUITES[name]
    data = runner.load_record(suite.recorded)
    assert data["format"] == runner.FORMAT and data["suite"] == name
    assert data["args"]["threads"] == 1 and data["args"]["repeats"] >= 7 and data["args"]["lengths"] == \
        suite.full["lengths"]
    m = data["machine"]
    assert m["cores"] >= 1 and m["torch"] and len(m["load_avg_start"]) == 3 and len(m["load_avg_end"]) == 3
    for r in data["rows"]:
        for method in suite.methods:
            c = r[method]
            if "error" in c:
                assert name == "sparse" and method == "naive" and r["L"] > data["args"]["naive_max"], (r, method)
                continue
            assert len(c["times_s"]) == data["args"]["repeats"] and c["min_s"] <= c["time_s"] <= c["max_s"]
    assert all(ok for _, _, ok in suite.check(data["rows"])), suite.check(data["rows"])


@pytest.mark.skipif(not runner._reset_peak_rss(), reason="needs Linux's resettable peak RSS (/proc/self/clear_refs)")
def test_rss_rise_counts_an_allocation_the_heap_could_serve_from_memory_freed_before():
    """In-process measurements (lesson 08's memory cell) follow bigger ones: glibc keeps freed memory
    resident and serves later allocations from it, which measured textbook attention's two 2 MiB L×L
    tensors at L=256 as 0 bytes after the lesson's cell had run once (a fresh process, as a kernel is).
    The runner gives those pages back to the OS first."""
    import subprocess
    import sys
    script = ("from attn_course import bench\n"
              "for m in ('naive', 'flash', 'sdpa'):\n"
              "    for L in (256, 512, 1024):\n"
              "        bench.measure(m, L=L, repeats=1, device='cpu')\n"
              "print(bench.measure('naive', L=256, repeats=1, device='cpu')['mem_bytes'])\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    small = int(r.stdout.split()[-1])
    assert small >= 3 * 2**20, small                                        # S and P: 8 × 256² × 4 B = 2 MiB each
