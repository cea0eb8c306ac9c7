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


def test_threads_are_fixed_during_and_restored_after():
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
