"""The shipped GPU record (attn_course/data/gpu_h200.json) that lessons 08 and 09 print: internally consistent
with its own timings, and read back by attn_course.bench.gpu as tools/gpu_bench.py wrote it."""
import json

import pytest

from attn_course.bench import gpu

REC = gpu.load_gpu_record()


def test_record_holds_every_section_of_one_run_on_one_device():
    assert set(REC) == {"env", "flash_check", "flash_perf", "flash_sweep", "sparse", "ring"}
    env = REC["env"]["result"]
    assert env["device"] == "NVIDIA H200" and env["capability"] == "9.0"
    assert not any("error" in r for r in REC["flash_perf"]["result"])


@pytest.mark.parametrize("name", ["triton", "sdpa_flash"])
def test_tflops_follow_from_the_medians_and_the_flop_count(name):
    """TFLOP/s = 4·B·H·L²·d (halved when causal) / time; the backward counts 2.5× the forward's FLOPs."""
    for r in REC["flash_perf"]["result"]:
        flops = 4 * r["B"] * r["H"] * r["L"] ** 2 * r["d"] * (0.5 if r["causal"] else 1.0)
        m = r[name]
        assert m["fwd_tflops"] == pytest.approx(flops / (m["fwd"]["ms"] * 1e-3) / 1e12, rel=1e-9)
        assert m["bwd_tflops"] == pytest.approx(2.5 * flops / (m["bwd"]["ms"] * 1e-3) / 1e12, rel=1e-9)
        assert m["fwd"]["p10_ms"] <= m["fwd"]["ms"] <= m["fwd"]["p90_ms"]
        assert r["B"] * r["L"] == 16384 and r["H"] * r["d"] == 2048          # the FlashAttention-2 paper's sizes


def test_table_and_summary_are_the_rows_ratios():
    rows = REC["flash_perf"]["result"]
    table = gpu.flash_table(rows, 4096).splitlines()
    at = [r for r in rows if r["L"] == 4096]
    assert len(table) == 2 + len(at) == 10
    for line, r in zip(table[2:], at):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[5] == f"{r['triton']['fwd_tflops'] / r['sdpa_flash']['fwd_tflops']:.2f}×"
        assert cells[8] == f"{r['triton']['bwd_tflops'] / r['sdpa_flash']['bwd_tflops']:.2f}×"
    s = gpu.flash_summary(rows)
    ratios = [r["triton"]["fwd_tflops"] / r["sdpa_flash"]["fwd_tflops"] for r in rows]
    assert s["fwd"] == pytest.approx((min(ratios), max(ratios))) and s["lengths"] == [1024, 2048, 4096, 8192, 16384]


def test_every_correctness_row_is_within_its_own_bounds():
    for r in REC["flash_check"]["result"]:
        t, f = r["triton"], r["sdpa_flash"]
        worst = max(t[c] / max(f[c], 1e-6) for c in ("out", "dq", "dk", "dv"))
        assert r["worst_err_ratio_vs_flash"] == pytest.approx(worst)
        assert r["ok"] == (t["finite"] and worst < 3.0 and max(t[c] for c in ("out", "dq", "dk", "dv")) < 2e-2)


def test_combine_reads_a_run_folder(tmp_path):
    for name in ("env", "ring"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"section": name, "seconds": 1.5, "result": {"x": name}}))
    assert gpu.combine(tmp_path) == {"env": {"seconds": 1.5, "result": {"x": "env"}},
                                     "ring": {"seconds": 1.5, "result": {"x": "ring"}}}


def test_summary_spread_and_ties_follow_the_percentiles():
    rows = REC["flash_perf"]["result"]
    s = gpu.flash_summary(rows)
    widest = max((m[ph]["p90_ms"] - m[ph]["p10_ms"]) / m[ph]["ms"]
                 for r in rows for m in (r["triton"], r["sdpa_flash"]) for ph in ("fwd", "bwd"))
    assert s["spread"] == pytest.approx(widest)
    for r in rows:   # a tie: neither forward's 10th percentile lies beyond the other's 90th
        t, f = r["triton"]["fwd"], r["sdpa_flash"]["fwd"]
        tied = not (t["p90_ms"] < f["p10_ms"] or f["p90_ms"] < t["p10_ms"])
        assert (r in s["fwd_ties"]) == tied
    assert all(0.95 < r["fwd_ratio"] < 1.05 for r in s["fwd_ties"])      # ties sit where the medians agree
