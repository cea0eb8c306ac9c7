"""attn-course bench (attention suite): the side-by-side table has the right columns, memory is measured,
the lessons' names (bench.measure, time_call, ...) keep working."""
import json

import pytest

from attn_course import bench


def _row(mode, causal, L, t, mem):
    """A measured row: t and mem map method -> seconds / bytes."""
    return {"mode": mode, "causal": causal, "L": L,
            **{m: {"time_s": t[m], "mem_bytes": mem[m]} for m in bench.METHODS}}


def test_format_table_columns_and_ratios():
    rows = [_row("fwd", False, 512, {"naive": 0.2, "flash": 0.1, "sdpa": 0.05},
                 {"naive": 64 * 2**20, "flash": 2**20, "sdpa": 2**20})]
    text = bench.format_table(rows)
    header, sep, line = text.splitlines()[:3]
    assert [c.strip() for c in header.strip("|").split("|")] == list(bench.COLUMNS)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:3] == ["fwd", "no", "512"]
    assert cells[3:6] == ["200", "100", "50"]                       # ms
    assert cells[6:9] == ["64", "1.0", "1.0"]                       # MiB
    assert cells[9:] == ["0.50", "2.00", "0.02"]                    # flash/naive time, flash/sdpa time, mem


def test_errors_are_listed_not_fatal():
    rows = [{"mode": "fwd", "causal": True, "L": 64, "naive": {"error": "timed out after 1 s"},
             "flash": {"time_s": 0.01, "mem_bytes": 0}, "sdpa": {"time_s": 0.01, "mem_bytes": 0}}]
    text = bench.format_table(rows)
    assert "| fwd | yes | 64 | — | 10 | 10 |" in text
    assert "not measured: fwd causal=True L=64 naive: timed out after 1 s" in text


def test_check_targets():
    ok = [_row("fwd", False, 4096, {"naive": 1.0, "flash": 0.8, "sdpa": 0.5}, {"naive": 100, "flash": 4, "sdpa": 4}),
          _row("fwd", True, 4096, {"naive": 1.0, "flash": 0.4, "sdpa": 0.3}, {"naive": 100, "flash": 4, "sdpa": 4}),
          _row("fwd+bwd", False, 2048, {"naive": 1.0, "flash": 2.0, "sdpa": 1.0}, {"naive": 100, "flash": 19, "sdpa": 9})]
    assert all(passed for _, _, passed in bench.check_targets(ok))
    slow = [dict(r) for r in ok]
    slow[0] = _row("fwd", False, 4096, {"naive": 1.0, "flash": 1.1, "sdpa": 0.6}, {"naive": 100, "flash": 6, "sdpa": 4})
    failed = [d for d, _, passed in bench.check_targets(slow) if not passed]
    assert failed == ["forward, L=4096: flash memory <= 5% of naive", "forward, L=4096: flash time <= 1.0x naive"]
    missing = bench.check_targets(ok[:1])
    assert [v for _, v, _ in missing[3:]] == [None, None] and not any(p for _, _, p in missing[3:])


@pytest.mark.parametrize("method", bench.METHODS)
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_measure_in_process(method, mode):
    r = bench.measure(method, L=48, mode=mode, causal=True, heads=2, dim=8, block=16, repeats=2)
    assert set(r) == {"method", "L", "mode", "causal", "device", "dtype", "times_s", "time_s", "min_s", "max_s",
                      "mem_bytes", "first_call_s"}
    assert len(r["times_s"]) == 2 and r["time_s"] > 0 and r["mem_bytes"] >= 0
    assert r["min_s"] <= r["time_s"] <= r["max_s"]


def test_measure_defaults_follow_the_device(monkeypatch):
    """No GPU here: the defaults resolve to CPU/fp32 with 7 repeats; with CUDA reported available they
    resolve to cuda/fp16 (checked on the resolved arguments, since no kernel can run)."""
    r = bench.measure("sdpa", L=32, heads=1, dim=8)
    assert (r["device"], r["dtype"], len(r["times_s"])) == ("cpu", "float32", 7)
    seen = {}

    def fake(suite, row, methods, args):
        seen.update(args)
        return {m: {"time_s": 1.0} for m in methods}
    monkeypatch.setattr(bench.attention, "measure_row", fake)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert bench.default_device() == "cuda"
    bench.measure("flash", L=32)
    assert (seen["device"], seen["dtype"], seen["repeats"], seen["warmup"], seen["threads"], seen["sdpa_backend"]) \
        == ("cuda", "float16", 7, 1, 1, None)


def test_measure_pins_sdpa_backends():
    """MATH materialises the L×L weights, the fused CPU kernel does not; a wrong name is a ValueError."""
    r = bench.measure("sdpa", L=64, heads=1, dim=8, repeats=1, sdpa_backend="math")
    assert r["time_s"] > 0
    import torch
    q = torch.randn(1, 2, 256, 16)
    fused = bench.largest_tensor_created(bench._method("sdpa", 128, "flash"), q, q, q, False)
    math_ = bench.largest_tensor_created(bench._method("sdpa", 128, "math"), q, q, q, False)
    assert math_ == 2 * 256 * 256 * 4 and fused < math_ / 8
    with pytest.raises(ValueError, match="sdpa_backend must be one of"):
        bench.measure("sdpa", L=16, sdpa_backend="fastest")
    with pytest.raises(ValueError, match="method must be one of"):
        bench.measure("xformers", L=16)
    with pytest.raises(ValueError, match="repeats=0"):
        bench.measure("naive", L=16, repeats=0)


def test_time_call_warms_up_then_takes_the_median(monkeypatch):
    calls = []
    ticks = iter([0.0, 1.0, 1.0, 4.0, 4.0, 6.0])                  # durations 1, 3, 2
    monkeypatch.setattr(bench.runner.time, "perf_counter", lambda: next(ticks))
    r = bench.time_call(lambda: calls.append(1), repeats=3, warmup=2)
    monkeypatch.undo()
    assert len(calls) == 5 and r["times_s"] == [1.0, 3.0, 2.0] and r["time_s"] == 2.0 and r["min_s"] == 1.0
    with pytest.raises(ValueError, match="repeats=0"):
        bench.time_call(lambda: None, repeats=0)


def test_cli_passes_repeats_warmup_and_backend(monkeypatch, capsys):
    seen = {}

    def fake(suite, args, **kw):
        seen.update(args)
        return []
    monkeypatch.setattr(bench.cli, "run_suite", fake)
    assert bench.main(["--lengths", "64", "--device", "cpu", "--quiet", "--sdpa-backend", "math"]) == 0
    assert (seen["repeats"], seen["warmup"], seen["threads"], seen["sdpa_backend"], seen["dtype"]) == \
        (7, 1, 1, "math", "float32")
    assert "median of 7 interleaved rounds after 1 warm-up, 1 thread(s)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--warmup and --threads must be >= 0"):
        bench.main(["--warmup", "-1"])


def test_main_end_to_end_measures_quadratic_memory_of_naive(tmp_path, capsys):
    """Fresh processes: naive's L×L scores and weights (2 × 8·1024² fp32 = 64 MiB) show up in RSS;
    flash's extra memory is its output (8·1024·64 fp32 = 2 MiB) and a few tiles, far below one L×L matrix."""
    out = tmp_path / "bench.json"
    code = bench.main(["--lengths", "1024", "--modes", "fwd", "--causal", "no", "--methods", "naive", "flash",
                       "--repeats", "1", "--quiet", "--device", "cpu", "--json", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "| fwd | no | 1024 |" in text and "| — |" in text            # sdpa column not measured
    (row,) = json.loads(out.read_text())["rows"]
    assert "mem_bytes" in row["naive"] and "mem_bytes" in row["flash"], row
    naive, flash = row["naive"]["mem_bytes"], row["flash"]["mem_bytes"]
    assert naive >= 60 * 2**20, naive
    assert flash < 8 * 2**20, (flash, naive)              # measured 3.3 MiB; one L×L matrix is 32 MiB


def test_bad_arguments_exit():
    with pytest.raises(SystemExit):
        bench.main(["--modes", "sideways"])
    with pytest.raises(SystemExit, match="--repeats must be positive"):
        bench.main(["--repeats", "0"])


def test_the_shipped_reference_run_is_complete_and_meets_the_cpu_targets():
    """The recording lesson 08 prints covers the whole grid of `--full` (L 512..4096, fwd and fwd+bwd, causal
    and not, three methods, each with a time and a memory) and meets the course's CPU targets."""
    args, rows = bench.load_recorded()
    assert (args["batch"], args["heads"], args["dim"], args["dtype"], args["block"]) == (1, 8, 64, "float32", 128)
    assert args["repeats"] >= 7 and args["threads"] == 1
    grid = {(r["mode"], r["causal"], r["L"]) for r in rows}
    assert grid == {(m, c, L) for m in ("fwd", "fwd+bwd") for c in (False, True) for L in (512, 1024, 2048, 4096)}
    for r in rows:
        for m in bench.METHODS:
            assert r[m]["time_s"] > 0 and r[m]["mem_bytes"] >= 0, (r["mode"], r["causal"], r["L"], m)
    assert all(ok for _, _, ok in bench.check_targets(rows))


def test_median_time_warms_up_counts_runs_and_takes_the_median():
    import time as _time

    from attn_course.bench import median_time
    delays = iter([0.05, 0.0, 0.02, 0.01])               # warm-up run, then 3 timed runs (median 0.01)
    calls = []

    def fn(x, y=0):
        calls.append((x, y))
        _time.sleep(next(delays))

    t = median_time(fn, 1, y=2, repeats=3, warmup=1)
    assert calls == [(1, 2)] * 4                          # 1 warm-up + 3 timed, arguments passed through
    assert 0.005 < t < 0.02                               # the median, not the slow warm-up or the max
    with pytest.raises(ValueError, match="repeats"):
        median_time(fn, repeats=0)
