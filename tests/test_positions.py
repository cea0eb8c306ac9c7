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


def test_sinusoidal_shift_is_one_fixed_rotation_for_every_position():
    """PE(p + δ) = R(δ) PE(p) with R block-diagonal 2×2 rotations by δ·ω_i (fp64, from the paper's ω_i)."""
    d, delta = 12, 5
    pe = sinusoidal_embedding(torch.arange(30), d, dtype=torch.float64)
    blocks = []
    for i in range(d // 2):
        a = delta * 10000.0 ** (-2 * i / d)
        blocks.append(torch.tensor([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]], dtype=torch.float64))
    R = torch.block_diag(*blocks)
    assert_close(pe[delta:], pe[:-delta] @ R.T)
    assert not torch.allclose(pe[delta:], pe[:-delta], atol=1e-3)      # a rotation, not the identity


def test_sinusoidal_follows_the_positions_device():
    pos = torch.arange(6, device="meta")
    assert sinusoidal_embedding(pos, 8).device.type == "meta"
    assert sinusoidal_embedding(6, 8, device="meta").device.type == "meta"
