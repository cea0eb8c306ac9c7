"""Lesson 15's experiments: the recall measure against a hand-built case, the noise demo against its
closed form, and the tiny LM's three kinds (the softmax control differs from the gated model in the gate only)."""
import math

import pytest
import torch

from attn_course.demos.openmodels import OpenLM, attention_stats, common_noise_mass, recall_accuracy
from attn_course.demos.textlm import TextData


def test_delta_rule_overwrites_and_linear_attention_sums():
    # with orthonormal keys (N <= d_k drawn, then checked) the delta rule recalls every updated key exactly
    assert recall_accuracy(4, 64, "delta", writes=3, seed=0) == 1.0
    # linear attention returns the sum of a key's values: over seeds it picks the latest far less often
    lin = sum(recall_accuracy(8, 64, "linear", writes=2, seed=s) for s in range(5)) / 5
    assert lin < 0.8
    # written once, near-orthogonal keys: plain sums recall everything
    assert recall_accuracy(8, 64, "linear", writes=1, seed=0) == 1.0
    with pytest.raises(ValueError, match="rule must be"):
        recall_accuracy(4, 8, "softmax")


def test_common_noise_mass_matches_its_closed_form():
    g = torch.Generator().manual_seed(3)
    z = torch.randn(16, generator=g, dtype=torch.float64) * 0.5
    s1 = z.clone()
    s1[0] += 2.0
    p1, p2 = torch.softmax(s1, 0), torch.softmax(z, 0)
    d = (p1 - 0.8 * p2).clamp_min(0)
    single, diff = common_noise_mass(16, signal=2.0, noise=0.5, lam=0.8, seed=3)
    assert math.isclose(single, p1[0].item(), abs_tol=1e-15) and math.isclose(diff, (d[0] / d.sum()).item(), abs_tol=1e-15)


def test_open_lm_kinds_and_stats():
    torch.manual_seed(0)
    data = TextData(text="the quick brown fox jumps over the lazy dog. " * 40, seq_len=16, batch_size=4)
    idx = torch.randint(0, 128, (2, 16))
    soft, gated = OpenLM("softmax", d_model=16, num_heads=2), OpenLM("gated", d_model=16, num_heads=2)
    gated.load_state_dict(soft.state_dict(), strict=True)            # same parameters: the gate is the only difference
    assert soft(idx).shape == (2, 16, 128)
    assert not torch.allclose(soft(idx), gated(idx))
    sink = OpenLM("sink", d_model=16, num_heads=2)
    st = attention_stats(sink, data, seq_len=16, batch_size=4)
    assert 0 < st["sink"] < 1 and 0 < st["first_token"] < 1 and st["max_act"] > 0
    assert attention_stats(soft, data, seq_len=16, batch_size=4)["sink"] == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="kind must be one of"):
        OpenLM("linear")


def test_nothing_to_read_targets_by_hand():
    from attn_course.demos.openmodels import NONE, nothing_to_read_batch
    x, y = nothing_to_read_batch(torch.Generator().manual_seed(0), L=12, batch_size=64)
    for xb, yb in zip(x, y):
        digits = [(i, int(t)) for i, t in enumerate(xb) if 1 <= t <= 10]
        assert len(digits) <= 1
        want = [NONE] * 12
        if digits:
            i, d = digits[0]
            want[i:] = [d] * (12 - i)
        assert yb.tolist() == want
    assert 0.5 < (x <= 10).any(1).double().mean() < 0.9         # most sequences, not all, hold a digit
