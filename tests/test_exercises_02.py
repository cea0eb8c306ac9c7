"""Exercise set 02: the reference solutions pass every case; each common mistake fails with its hint."""
import math
from functools import partial

import pytest
import torch

import exercise_kit
from exercise_kit import assert_all_pass

# some cases cannot tell two mistakes apart, so a mistake need only be named on the cases that can
assert_hint = partial(exercise_kit.assert_hint, every=False)


# --- split / merge -----------------------------------------------------------------------------------

def split_ok(x, H):
    B, L, D = x.shape
    return x.view(B, L, H, D // H).transpose(1, 2)


def split_interleaved(x, H):
    return x.view(*x.shape[:2], -1, H).permute(0, 3, 1, 2)


def test_split_heads():
    assert_all_pass("02_split_heads", split_ok)
    assert_hint("02_split_heads", lambda x, H: x.reshape(x.shape[0], H, x.shape[1], -1), "x.view(B, H, L, d_h)")
    assert_hint("02_split_heads", split_interleaved, "every H-th feature")


def test_merge_heads():
    assert_all_pass("02_merge_heads", lambda y: y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1))
    assert_hint("02_merge_heads", lambda y: y.reshape(y.shape[0], y.shape[2], -1), "without moving the head axis")
    assert_hint("02_merge_heads", lambda y: y.permute(0, 2, 3, 1).reshape(y.shape[0], y.shape[2], -1), "interleaved")


# --- mha_forward -------------------------------------------------------------------------------------

def make_mha(scale_by="d_h", transpose=True, causal_mask=True, heads=None, split=split_ok):
    def mha_forward(x, W_q, W_k, W_v, W_o, num_heads, causal):
        H = num_heads if heads is None else heads
        B, L, D = x.shape
        proj = (lambda W: x @ W.T) if transpose else (lambda W: x @ W)
        q, k, v = (split(proj(W), H) for W in (W_q, W_k, W_v))
        s = q @ k.transpose(-2, -1) / math.sqrt({"d_h": D // H, "d_model": D, "none": 1}[scale_by])
        if causal and causal_mask:
            s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        y = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, L, D)
        return y @ W_o.T if transpose else y @ W_o
    return mha_forward


def test_mha_forward():
    assert_all_pass("02_mha_forward", make_mha())
    assert_hint("02_mha_forward", make_mha(scale_by="d_model"), "√d_model")
    assert_hint("02_mha_forward", make_mha(transpose=False), "x @ W.T")
    assert_hint("02_mha_forward", make_mha(causal_mask=False), "causal mask is missing")
    assert_hint("02_mha_forward", make_mha(heads=1), "ONE head")
    assert_hint("02_mha_forward", make_mha(scale_by="none"), "not scaled")
    assert_hint("02_mha_forward", make_mha(split=split_interleaved), "every H-th feature")


# --- flops -------------------------------------------------------------------------------------------

def _mha_flops(B, L, d, H, dh, proj=4, per_mac=2, products=2):
    return per_mac * (proj * B * L * d * H * dh + products * B * H * L * L * dh)


@pytest.mark.parametrize("fn,fragment", [
    (lambda B, L, d, H, dh: 8 * B * L * d * d + 4 * B * L * L * d, "lesson's count for heads of width d_model/H"),
    (lambda *a: _mha_flops(*a, proj=3), "W^O"),
    (lambda *a: _mha_flops(*a, per_mac=1), "multiply-add as 1"),
    (lambda *a: _mha_flops(*a, products=1), "only one of the two"),
    (lambda *a: _mha_flops(*a, products=0), "attention products are missing"),
    (lambda *a: _mha_flops(*a, proj=0), "projections are missing"),
])
def test_mha_flops(fn, fragment):
    assert_all_pass("02_mha_flops", _mha_flops)
    assert_hint("02_mha_flops", fn, fragment)
