"""attn_course.timing: interleaved rounds, fixed threads restored, sentences printed from the measurement."""
import time

import pytest
import torch

from attn_course import timing


def test_rounds_are_interleaved_and_rotated():
    calls = []
    t = timing.compare({"a": lambda: calls.append("a"), "b": lambda: calls.append("b"),
                        "c": lambda: calls.append("c")}, repeats=3, warmup=1)
    assert calls[:3] == ["a", "b", "c"]                                  # warm-up
    assert calls[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]    # round r starts at method r
    assert all(len(x.times_s) == 3 for x in t.values())


def test_ratio_and_sentence_follow_the_measurement():
    t = timing.compare({"slow": lambda: time.sleep(0.02), "fast": lambda: time.sleep(0.002)}, repeats=5)
    assert timing.ratio(t, "fast", "slow") < 0.5
    assert all(r < 1 for r in timing.ratios(t, "fast", "slow"))
    s = timing.describe(t, "fast", "slow")
    assert s.startswith("fast took 0.") and "faster than slow in every round" in s
    assert "slower than fast in every round" in timing.describe(t, "slow", "fast")
    assert "median of 5" in str(t["slow"])


def test_threads_are_fixed_during_and_restored_after(three_threads):
    before = torch.get_num_threads()
    seen = []
    timing.compare({"x": lambda: seen.append(torch.get_num_threads())}, repeats=2, threads=1)
    assert set(seen) == {1} and torch.get_num_threads() == before


@pytest.mark.parametrize("kw", [dict(repeats=0), dict(warmup=-1), dict(threads=0)])
def test_bad_arguments_raise(kw):
    with pytest.raises(ValueError):
        timing.compare({"x": lambda: None}, **kw)
    with pytest.raises(ValueError):
        timing.compare({})


def test_describe_prints_two_significant_figures_when_the_rounds_disagree_widely():
    """A 17× spread of per-round ratios (6.94–120.08) makes "69.97×" a false precision: two figures only."""
    wide = {"a": timing.Timing("a", (6.94, 69.97, 120.08)), "b": timing.Timing("b", (1.0, 1.0, 1.0))}
    s = timing.describe(wide, "a", "b")
    assert "a took 70× b's time" in s and "per-round ratios 6.9–120)" in s, s
    narrow = {"a": timing.Timing("a", (0.62, 0.63, 0.66)), "b": timing.Timing("b", (1.0, 1.0, 1.0))}
    assert "took 0.63× b's time" in timing.describe(narrow, "a", "b") and "0.62–0.66" in timing.describe(narrow, "a", "b")
    assert timing._sig(0.01234) == "0.012" and timing._sig(1234.0) == "1200" and timing._two_decimals(69.97) == "70.0"


def test_ratio_cell_prints_the_range_and_flags_noise():
    steady = {"a": timing.Timing("a", (2.0, 2.2, 2.1)), "b": timing.Timing("b", (1.0, 1.0, 1.0))}
    assert timing.ratio_cell(steady, "a", "b") == "2.1x (2.0–2.2)"
    noisy = {"a": timing.Timing("a", (0.05, 2.0, 11.0)), "b": timing.Timing("b", (1.0, 1.0, 1.0))}
    assert timing.ratio_cell(noisy, "a", "b") == "noisy (0.050–11), re-run"
