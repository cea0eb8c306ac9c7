"""attn-course bench --suite linear: columns and ratios, targets, CLI routing, the in-place naive baseline."""
import json

import pytest
import torch
import torch.nn.functional as F

from attn_course import cli
from attn_course.bench import linear as bench_linear


def _row(causal, L, t, mem):
    return {"causal": causal, "L": L, **{m: {"time_s": t[m], "mem_bytes": mem[m]} for m in t}}


def test_table_columns_and_ratios():
    rows = [_row(False, 4096, {"linear": 0.1, "sdpa": 1.0, "naive": 2.0}, {"linear": 2**20, "sdpa": 2**20, "naive": 64 * 2**20}),
            _row(False, 8192, {"linear": 0.2, "sdpa": 4.0, "naive": 8.0}, {"linear": 2**21, "sdpa": 2**21, "naive": 256 * 2**20})]
    header, _, first, second = bench_linear.format_table(rows).splitlines()[:4]
    assert [c.strip() for c in header.strip("|").split("|")] == list(bench_linear.COLUMNS)
    cells = [c.strip() for c in second.strip("|").split("|")]
    assert cells == ["no", "8192", "200", "4000", "8000", "2.0", "2.0", "256", "0.050", "0.008", "2.00"]
    assert first.strip("|").split("|")[-1].strip() == "—"                 # no previous L to compare with


def test_check_targets():
    ok = [_row(False, 4096, {"linear": 0.1, "sdpa": 1.0, "naive": 2.0}, {"linear": 1, "sdpa": 1, "naive": 100}),
          _row(False, 8192, {"linear": 0.2, "sdpa": 4.0, "naive": 8.0}, {"linear": 1, "sdpa": 1, "naive": 100}),
          _row(True, 8192, {"linear": 0.4, "sdpa": 2.0, "naive": 8.0}, {"linear": 9, "sdpa": 1, "naive": 100})]
    assert all(p for _, _, p in bench_linear.check_targets(ok))
    bad = [ok[0], _row(False, 8192, {"linear": 0.3, "sdpa": 1.0, "naive": 8.0}, {"linear": 1, "sdpa": 1, "naive": 100}),
           _row(True, 8192, {"linear": 0.4, "sdpa": 2.0, "naive": 8.0}, {"linear": 11, "sdpa": 1, "naive": 100})]
    assert [p for _, _, p in bench_linear.check_targets(bad)] == [False, False, False]
    assert [v for _, v, _ in bench_linear.check_targets(ok[:1])] == [None, None, None]
    # a time that does not grow with L is noise, not a growth law: the growth target is two-sided
    faster = [_row(False, 4096, {"linear": 0.3, "sdpa": 1.0, "naive": 2.0}, {"linear": 1, "sdpa": 1, "naive": 100}),
              _row(False, 8192, {"linear": 0.2, "sdpa": 4.0, "naive": 8.0}, {"linear": 1, "sdpa": 1, "naive": 100})]
    growth = [(v, p) for d, v, p in bench_linear.check_targets(faster) if "grows" in d]
    assert growth == [(pytest.approx(2 / 3), False)]


def test_growth_comes_from_the_same_rounds_when_measured():
    """With linear_half (linear attention at L/2, timed in the row's rounds) the growth column is that ratio,
    whatever the previous row measured at another moment."""
    rows = [_row(False, 4096, {"linear": 0.5, "sdpa": 1.0, "naive": 2.0, "linear_half": 0.26},
                 {"linear": 1, "sdpa": 1, "naive": 100, "linear_half": 1}),
            _row(False, 8192, {"linear": 0.2, "sdpa": 4.0, "naive": 8.0, "linear_half": 0.1},
                 {"linear": 1, "sdpa": 1, "naive": 100, "linear_half": 1})]
    growth = [t["linear time ×(L/2→L)"] for t in bench_linear.table_rows(rows)]
    assert growth == [pytest.approx(0.5 / 0.26), pytest.approx(2.0)]
    assert [ok for d, _, ok in bench_linear.check_targets(rows) if "grows" in d] == [True]


def test_linear_half_is_linear_attention_on_the_first_half():
    q, k, v = (torch.randn(1, 2, 64, 8, dtype=torch.float64) for _ in range(3))
    from attn_course import linear_attention
    for causal in (False, True):
        torch.testing.assert_close(bench_linear._method("linear_half")(q, k, v, causal),
                                   linear_attention(q[:, :, :32], k[:, :, :32], v[:, :, :32], is_causal=causal))


@pytest.mark.parametrize("causal", [False, True])
def test_naive_baseline_is_softmax_attention(causal):
    q, k, v = (torch.randn(1, 2, 37, 8, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(bench_linear._naive(q, k, v, causal),
                               F.scaled_dot_product_attention(q, k, v, is_causal=causal))


@pytest.mark.parametrize("method", bench_linear.METHODS)
def test_measure_in_process(method):
    r = bench_linear.measure(method, L=64, causal=True, heads=2, dim=8, repeats=2)
    assert len(r["times_s"]) == 2 and r["time_s"] > 0 and r["mem_bytes"] >= 0


def test_cli_routes_the_suite(tmp_path, capsys):
    """`attn-course bench --suite linear` reaches bench_linear in fresh processes; naive's L×L shows up in RSS,
    linear attention's memory (its inputs' size) is a fraction of it."""
    out = tmp_path / "b.json"
    code = cli.main(["bench", "--suite", "linear", "--lengths", "2048", "--causal", "no", "--methods", "linear",
                     "naive", "--repeats", "1", "--quiet", "--device", "cpu", "--json", str(out)])
    assert code == 0
    assert "| no | 2048 |" in capsys.readouterr().out
    (row,) = json.loads(out.read_text())["rows"]
    assert row["naive"]["mem_bytes"] >= 120 * 2**20                     # 8 heads × 2048² fp32 = 128 MiB
    assert row["linear"]["mem_bytes"] < 0.25 * row["naive"]["mem_bytes"]
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--suite", "nonsense"])
    assert exc.value.code == 2


def test_the_shipped_run_meets_the_targets():
    args, rows = bench_linear.load_recorded()
    assert (args["batch"], args["heads"], args["dim"], args["dtype"]) == (1, 8, 64, "float32")
    assert args["repeats"] >= 7 and args["threads"] == 1
    assert {(r["causal"], r["L"]) for r in rows} == {(c, L) for c in (False, True) for L in (1024, 2048, 4096, 8192)}
    for r in rows:
        for m in bench_linear.METHODS:
            assert r[m]["time_s"] > 0 and r[m]["mem_bytes"] >= 0
    assert all(ok for _, _, ok in bench_linear.check_targets(rows))
