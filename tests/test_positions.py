"""Sinusoidal embeddings and ALiBi against the papers' formulas."""
import math

import pytest
import torch
from torch.testing import assert_close

from attn_course.positions import alibi_bias, alibi_slopes, sinusoidal_embedding


def test_sinusoidal_matches_vaswani_formula_elementwise():
    L, d = 7, 10
    pe = sinusoidal_embedding(L, d, dtype=torch.float64)
    for p in range(L):
        for i in range(d // 2):
            w = 10000.0 ** (-2 * i / d)
            assert math.isclose(pe[p, 2 * i].item(), math.sin(p * w), abs_tol=1e-12)
            assert math.isclose(pe[p, 2 * i + 1].item(), math.cos(p * w), abs_tol=1e-12)


def test_sinusoidal_seed_layout_is_a_permutation_and_relative_shift_is_linear():
    a = sinusoidal_embedding(torch.arange(5), 8, dtype=torch.float64)
    b = sinusoidal_embedding(torch.arange(5), 8, dtype=torch.float64, interleaved=False)
    assert_close(b, torch.cat((a[:, 1::2], a[:, 0::2]), dim=-1))
    # PE(p + k) is a fixed rotation of PE(p): the dot product depends on k only
    pe = sinusoidal_embedding(torch.arange(40), 16, dtype=torch.float64)
    assert_close(pe[3] @ pe[8], pe[20] @ pe[25])


def test_sinusoidal_bad_input():
    with pytest.raises(ValueError, match="dim=5"):
        sinusoidal_embedding(4, 5)


@pytest.mark.parametrize("H, expected", [
    (8, [2 ** -(i + 1) for i in range(8)]),                       # the paper: 1/2, 1/4, ..., 1/256
    (4, [2 ** -(2 * (i + 1)) for i in range(4)]),
])
def test_alibi_slopes_powers_of_two(H, expected):
    assert_close(alibi_slopes(H), torch.tensor(expected))


def test_alibi_slopes_other_head_counts_follow_the_paper_rule():
    s8, s16 = alibi_slopes(8), alibi_slopes(16)
    assert_close(alibi_slopes(12), torch.cat((s8, s16[0::2][:4])))
    assert len(alibi_slopes(1)) == 1 and alibi_slopes(1).item() == 2 ** -8


def test_alibi_bias_values_and_decode_alignment():
    bias = alibi_bias(2, 4)
    m = alibi_slopes(2)
    for h in range(2):
        for i in range(4):
            for j in range(4):
                assert math.isclose(bias[h, i, j].item(), -m[h].item() * (i - j), rel_tol=1e-6)
    assert_close(alibi_bias(2, 1, 4), bias[:, -1:, :])      # one decoded token = the last row
