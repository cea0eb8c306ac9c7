"""Exercise set 13: reference solutions and other correct styles pass; each mistake fails with its hint."""
from functools import partial

import torch

import exercise_kit
from exercise_kit import assert_all_pass

assert_hint = partial(exercise_kit.assert_hint, every=False)


# ---- 13_merge_partials ----

def merge_ok(out1, lse1, out2, lse2):
    lse = torch.logaddexp(lse1, lse2)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return torch.exp(lse1 - safe)[..., None] * out1 + torch.exp(lse2 - safe)[..., None] * out2, lse


def merge_ok_max_style(out1, lse1, out2, lse2):
    """Another correct style: subtract the max, as lesson 08's online softmax does."""
    m = torch.maximum(lse1, lse2)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    a, b = torch.exp(lse1 - m_safe), torch.exp(lse2 - m_safe)
    den = a + b
    out = (a[..., None] * out1 + b[..., None] * out2) / torch.where(den == 0, torch.ones_like(den), den)[..., None]
    return out, m + torch.log(den)


def merge_average(out1, lse1, out2, lse2):
    return (out1 + out2) / 2, torch.logaddexp(lse1, lse2)


def merge_naive_exp(out1, lse1, out2, lse2):
    a, b = torch.exp(lse1), torch.exp(lse2)
    return (a[..., None] * out1 + b[..., None] * out2) / (a + b)[..., None], torch.log(a + b)


def merge_lse_max(out1, lse1, out2, lse2):
    return merge_ok(out1, lse1, out2, lse2)[0], torch.maximum(lse1, lse2)


def test_merge_partials():
    assert_all_pass("13_merge_partials", merge_ok)
    assert_all_pass("13_merge_partials", merge_ok_max_style)
    assert_hint("13_merge_partials", merge_average, "you averaged the two outputs")
    assert_hint("13_merge_partials", merge_naive_exp, "NaN")
    assert_hint("13_merge_partials", merge_lse_max, "not the max")


# ---- 13_ring_schedule ----

def test_ring_schedule():
    assert_all_pass("13_ring_schedule", lambda r, t, P: (r - t) % P)
    assert_all_pass("13_ring_schedule", lambda r, t, P: (r + P - t) % P)
    assert_hint("13_ring_schedule", lambda r, t, P: (r + t) % P, "wrong direction", every=True)
    assert_hint("13_ring_schedule", lambda r, t, P: r - t, "modulo P")


# ---- 13_zigzag_positions ----

def zigzag_ok(rank, world, L):
    c = L // (2 * world)
    return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange((2 * world - 1 - rank) * c, (2 * world - rank) * c)])


def zigzag_list_style(rank, world, L):
    chunks = torch.arange(L).chunk(2 * world)
    return [int(i) for i in chunks[rank]] + [int(i) for i in chunks[-1 - rank]]


def test_zigzag_positions():
    assert_all_pass("13_zigzag_positions", zigzag_ok)
    assert_all_pass("13_zigzag_positions", zigzag_list_style)
    assert_hint("13_zigzag_positions", lambda r, P, L: torch.arange(r * L // P, (r + 1) * L // P), "contiguous layout",
                every=True)
    assert_hint("13_zigzag_positions", lambda r, P, L: zigzag_ok(r, P, L).flip(0).reshape(2, -1).flip(1).reshape(-1),
                "wrong order", every=True)
    c = lambda L, P: L // (2 * P)  # noqa: E731
    assert_hint("13_zigzag_positions", lambda r, P, L: torch.cat([torch.arange(r * c(L, P), (r + 1) * c(L, P)),
                                                                  torch.arange((P - 1 - r) * c(L, P), (P - r) * c(L, P))]),
                "2P−1−r, not P−1−r")


# ---- 13_ring_bytes ----

def test_ring_bytes():
    ok = lambda world, batch, heads, seq_len, head_dim, elem_bytes: (world - 1) * 2 * batch * heads * (seq_len // world) * head_dim * elem_bytes  # noqa: E731,E501
    assert_all_pass("13_ring_bytes", ok)
    assert_all_pass("13_ring_bytes", lambda P, B, H, L, E, nbytes: 2 * (P - 1) * B * H * L * E * nbytes // P)
    assert_hint("13_ring_bytes", lambda P, *a: ok(P, *a) * P // (P - 1), "P hops", every=True)
    assert_hint("13_ring_bytes", lambda *a: ok(*a) // 2, "both K and V", every=True)
    assert_hint("13_ring_bytes", lambda P, *a: ok(P, *a) * P, "L/P positions", every=True)


# ---- 13_causal_blocks ----

def blocks_ok(rank, src, world):
    return 2 if src < rank else 1 if src == rank else 0


def test_causal_blocks():
    assert_all_pass("13_causal_blocks", blocks_ok)
    assert_all_pass("13_causal_blocks", lambda r, s, P: {True: 2, False: int(s == r)}[s < r])
    assert_hint("13_causal_blocks", lambda r, s, P: 2 if s > r else 1 if s == r else 0, "LATER ranks", every=True)
    assert_hint("13_causal_blocks", lambda r, s, P: 2 if s <= r else 0, "causal on its diagonal", every=True)
    assert_hint("13_causal_blocks", lambda r, s, P: 2 if s < r else 1, "skip them instead", every=True)
