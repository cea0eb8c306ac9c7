"""attn-course bench --suite sparse: every method computes the windowed attention (checked against SDPA
with the dense mask inside the worker), tables and target checks, and the CLI dispatch."""
import json

import pytest
import torch

from attn_course import bench
from attn_course import cli
from attn_course.bench.sparse import (RECORDED_SPARSE_CPU, SPARSE_METHODS, check_sparse, format_sparse,
                                      load_recorded_sparse, measure_sparse)


@pytest.mark.parametrize("method", [m for m in SPARSE_METHODS if m != "flex"])   # flex: see test_sparse
def test_measure_sparse_is_correct_and_reports(method):
    r = measure_sparse(method, L=300, window=64, heads=2, dim=16, block=64, repeats=2, threads=1)
    assert r["time_s"] > 0 and len(r["times_s"]) == 2 and r["mem_bytes"] >= 0
    assert r["max_err"] < 1e-4                     # vs SDPA with the window mask (or is_causal for *_causal)
    assert r["mask_bytes"] == (300 * 300 if method in ("naive", "sdpa_mask") else 0)


def test_tables_and_targets_on_synthetic_rows():
    cell = lambda t, **kw: {"time_s": t, "mem_bytes": 0, **kw}
    rows = [{"L": 4096, "naive": {"error": "skipped"}, "sdpa_mask": cell(1.0, mask_bytes=4096 ** 2),
             "sdpa_causal": cell(0.5), "flex": cell(0.2, mask_bytes=1000, first_call_s=9.0),
             "flash_window": cell(0.3), "flash_causal": cell(1.0)}]
    text = format_sparse(rows)
    assert "| 4096 |" in text and "0.30 | 0.20 |" in text and "16384" in text and "not measured" in text
    assert [ok for _, _, ok in check_sparse(rows)] == [True, True]
    rows[0]["flex"]["time_s"] = 0.5
    assert [ok for _, _, ok in check_sparse(rows)] == [True, False]
    assert all(v is None and not ok for _, v, ok in check_sparse([{"L": 1024}]))


def test_recorded_run_is_complete_and_meets_the_targets():
    args, rows = load_recorded_sparse(RECORDED_SPARSE_CPU)
    assert args["window"] == 256 and args["block"] == 128 and args["heads"] == 8 and args["dim"] == 64
    assert args["repeats"] >= 7 and args["threads"] == 1
    assert [r["L"] for r in rows] == [1024, 2048, 4096, 8192]
    assert all(ok for _, _, ok in check_sparse(rows))
    for r in rows:
        for m in SPARSE_METHODS:
            if "error" not in r[m]:
                assert r[m]["max_err"] < 1e-4, (r["L"], m)


def test_cli_dispatches_the_sparse_suite(tmp_path, capsys):
    out = tmp_path / "run.json"
    rc = cli.main(["bench", "--suite", "sparse", "--lengths", "256", "--methods", "sdpa_mask", "flash_window",
                     "--window", "32", "--heads", "1", "--dim", "8", "--block", "64", "--repeats", "1",
                     "--quiet", "--json", str(out)])
    assert rc == 0
    assert "flash_window ms" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["rows"][0]["flash_window"]["max_err"] < 1e-4
