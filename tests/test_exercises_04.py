"""Exercise set 04: the reference solutions pass every case; each common mistake fails with its hint."""
import math

import pytest
import torch
from torch import nn

from exercise_kit import assert_all_pass, assert_hint, results

IGNORE = ("out:", "RuntimeError", "expected")   # failures before any value is judged


def _assert_hint(ex_id, fn, hint):
    assert_hint(ex_id, fn, hint, ignore=IGNORE)


# ---- 04_cross_attend --------------------------------------------------------------------------------------

def cross(x, context, w_q, w_k, w_v, num_heads, keep=None, *, swap=False, invert=False, ignore_mask=False,
          scale_d_model=False, one_head=False, view_bug=False, dim=-1, linear_layout=False):
    if linear_layout:
        w_q, w_k, w_v = w_q.T, w_k.T, w_v.T
    if swap:
        x, context = context, x
    B, Lq, d = x.shape
    H = 1 if one_head else num_heads
    Q, K, V = x @ w_q, context @ w_k, context @ w_v

    def split(t):
        if view_bug:
            return t.view(B, H, t.shape[1], d // H)
        return t.view(B, t.shape[1], H, d // H).transpose(1, 2)

    Q, K, V = split(Q), split(K), split(V)
    s = Q @ K.transpose(-2, -1) / math.sqrt(d if scale_d_model else d // H)
    if keep is not None and not ignore_mask:
        m = keep if not invert else ~keep
        s = s.masked_fill(~m[:, None, None, :], float("-inf"))
    w = torch.softmax(s, dim=dim)
    return (w @ V).transpose(1, 2).reshape(B, Lq, d)


def test_cross_reference_passes():
    assert_all_pass("04_cross_attend", cross)


def test_cross_matches_nn_multihead_attention_without_out_proj():
    """The reference is what nn.MultiheadAttention computes before its output projection."""
    def via_mha(x, context, w_q, w_k, w_v, num_heads, keep=None):
        d, c = w_q.shape[1], w_k.shape[0]
        m = nn.MultiheadAttention(d, num_heads, kdim=c, vdim=c, bias=False, batch_first=True)
        with torch.no_grad():
            if m._qkv_same_embed_dim:
                m.in_proj_weight.copy_(torch.cat([w_q.T, w_k.T, w_v.T]))
            else:
                m.q_proj_weight.copy_(w_q.T), m.k_proj_weight.copy_(w_k.T), m.v_proj_weight.copy_(w_v.T)
            m.out_proj.weight.copy_(torch.eye(d))
        return m(x, context, context, key_padding_mask=None if keep is None else ~keep, need_weights=False)[0]
    assert_all_pass("04_cross_attend", via_mha)


@pytest.mark.parametrize("kwargs,hint", [
    (dict(swap=True), "queries come from the context"),
    (dict(invert=True), "your mask is inverted"),
    (dict(ignore_mask=True), "ignores the padding"),
    (dict(scale_d_model=True), "1/√d_model"),
    (dict(one_head=True), "single-head attention"),
    (dict(view_bug=True), "cut the wrong way"),
    (dict(dim=-2), "dim=-2"),
])
def test_cross_mistakes(kwargs, hint):
    _assert_hint("04_cross_attend", lambda *a: cross(*a, **kwargs), hint)


def test_cross_linear_layout_is_named_on_every_case():
    """Review 01-07, L04-B: x @ W.T gets the layout named — by value where the weights are square, and from the
    matmul's shape error where the context width differs from d_model."""
    res = results("04_cross_attend", lambda *a: cross(*a, linear_layout=True))
    assert not any(ok for ok, _ in res) and all("nn.Linear's layout" in m for _, m in res), res


# ---- 04_mha_key_padding -------------------------------------------------------------------------------------

def test_key_padding_reference_and_mistakes():
    assert_all_pass("04_mha_key_padding", lambda lengths, L: torch.arange(L) >= lengths[:, None])
    _assert_hint("04_mha_key_padding", lambda lengths, L: torch.arange(L) < lengths[:, None], "inverted")
    _assert_hint("04_mha_key_padding", lambda lengths, L: torch.arange(L) > lengths[:, None], "off by one")
    res = results("04_mha_key_padding", lambda lengths, L: (torch.arange(L) >= lengths[:, None])[:, None, None])
    assert not any(ok for ok, _ in res) and "shape" in res[0][1]


# ---- 04_predict_shapes --------------------------------------------------------------------------------------

def test_shapes_reference_and_mistakes():
    assert_all_pass("04_predict_shapes", lambda B, Lq, Lk, d, c, H: ((B, Lq, d), (B, H, Lq, Lk)))
    _assert_hint("04_predict_shapes", lambda B, Lq, Lk, d, c, H: ((B, Lq, d), (B, H, Lk, Lq)), "one row per query")
    _assert_hint("04_predict_shapes", lambda B, Lq, Lk, d, c, H: ((B, Lk, d), (B, H, Lq, Lk)), "its length is Lq")
    _assert_hint("04_predict_shapes", lambda B, Lq, Lk, d, c, H: ((B, Lq, c), (B, H, Lq, Lk)), "width is d_model")


# ---- 04_split_cross_attention -------------------------------------------------------------------------------

def attend(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ v


def split(q, k, v, n):
    return attend(q, k[..., :n, :], v[..., :n, :]) + attend(q, k[..., n:, :], v[..., n:, :])


def test_split_reference_passes():
    assert_all_pass("04_split_cross_attention", split)


@pytest.mark.parametrize("fn,hint", [
    (lambda q, k, v, n: attend(q, k, v), "one softmax over all"),
    (lambda q, k, v, n: split(q, k, v, k.shape[-2] - n), "image tokens come first"),
])
def test_split_mistakes(fn, hint):
    _assert_hint("04_split_cross_attention", fn, hint)


def test_split_hard_coded_257():
    """A hard-coded 257 fails every case (none has 257 image tokens); where the context is longer than 257
    tokens the hint names the 257, where it is shorter (a split at 257 = one joint softmax) it names both."""
    res = results("04_split_cross_attention", lambda q, k, v, n: split(q, k, v, 257))
    assert [ok for ok, _ in res] == [False, False, False, False]
    assert all("257" in msg for _, msg in res), res
