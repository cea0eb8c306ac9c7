"""Exercise set 01: the reference solutions pass every case; each common mistake fails with its hint."""
import math

import pytest
import torch
import torch.nn.functional as F

from attn_course.grading.exercises import get
from exercise_kit import assert_all_pass, assert_hint, results


# ---- 01_attention_by_hand ----------------------------------------------------------------------------

def attn(q, k, v, mask=None, *, dim=-1, scale=True, invert=False, fix_nan=True, multiply=False):
    scores = q @ k.transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    if mask is not None:
        if multiply:
            scores = scores * mask
        else:
            scores = scores.masked_fill(mask if invert else ~mask, float("-inf"))
    w = torch.softmax(scores, dim=dim)
    if fix_nan:
        w = torch.nan_to_num(w, nan=0.0)
    return w @ v, w


def test_attention_reference_passes():
    assert_all_pass("01_attention_by_hand", attn)


def test_attention_matches_sdpa_reference():
    """The exercise's reference agrees with PyTorch's fused kernel (fully masked rows: zero)."""
    ex = get("01_attention_by_hand")
    for case in ex.cases(torch.Generator().manual_seed(0)):
        i = case.inputs
        want = ex.expected(case)
        ref = F.scaled_dot_product_attention(i["q"], i["k"], i["v"], attn_mask=i.get("mask"))
        torch.testing.assert_close(want["out"], torch.nan_to_num(ref), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mistake, hint", [
    (dict(dim=-2), "softmax over dim=-2"),
    (dict(scale=False), "without the 1/√d_k scale"),
    (dict(invert=True), "your mask is inverted"),
    (dict(invert=True, fix_nan=False), "your mask is inverted"),
    (dict(multiply=True), "multiplying the scores by the mask"),
])
def test_attention_mistakes_hinted(mistake, hint):
    assert_hint("01_attention_by_hand", lambda q, k, v, m=None: attn(q, k, v, m, **mistake), hint)


def test_attention_scale_by_d_hinted():
    def by_d(q, k, v, mask=None):
        out, w = attn(q * math.sqrt(q.shape[-1]) / q.shape[-1], k, v, mask)
        return out, w
    assert_hint("01_attention_by_hand", by_d, "scaled by 1/d_k")


def test_attention_ignoring_mask_hinted():
    res = results("01_attention_by_hand", lambda q, k, v, m=None: attn(q, k, v, None))
    assert [ok for ok, _ in res] == [True, True, False, False, False]
    assert all("ignores the mask" in msg for ok, msg in res if not ok)


def test_attention_nan_on_fully_masked_row_hinted():
    res = results("01_attention_by_hand", lambda q, k, v, m=None: attn(q, k, v, m, fix_nan=False))
    assert [ok for ok, _ in res] == [True, True, True, True, False]
    assert "got NaN" in res[-1][1]


def test_attention_wrong_return_reported():
    res = results("01_attention_by_hand", lambda q, k, v, m=None: (attn(q, k, v, m)[0], None))
    assert all(not ok and "weights: expected a torch.Tensor, got NoneType" in msg for ok, msg in res)


# ---- 01_causal_padding_mask --------------------------------------------------------------------------

def make_mask(lengths, L, *, causal="tril", keys=True, queries=False, invert=False):
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    c = {"tril": j <= i, "triu": j >= i, "strict": j < i, "none": torch.ones(L, L, dtype=torch.bool)}[causal]
    real = torch.arange(L) < lengths[:, None]                                # (B, L)
    m = c[None].expand(len(lengths), L, L)
    if keys:
        m = m & real[:, None, :]
    if queries:
        m = m & real[:, :, None]
    m = m[:, None]
    return ~m if invert else m


def test_mask_reference_passes():
    assert_all_pass("01_causal_padding_mask", make_mask)


@pytest.mark.parametrize("mistake, hint", [
    (dict(invert=True), "inverted"),
    (dict(keys=False), "only the causal part"),
    (dict(causal="none"), "only the padding part"),
    (dict(causal="triu"), "upside down"),
    (dict(causal="strict"), "the diagonal is hidden"),
    (dict(queries=True), "rows of padded queries"),
])
def test_mask_mistakes_hinted(mistake, hint):
    res = results("01_causal_padding_mask", lambda lengths, L: make_mask(lengths, L, **mistake))
    assert not all(ok for ok, _ in res)
    assert all(hint in msg for ok, msg in res if not ok), res


def test_mask_wrong_dtype_and_shape_reported():
    res = results("01_causal_padding_mask", lambda lengths, L: make_mask(lengths, L).long())
    assert all("expected dtype torch.bool" in msg for _, msg in res)
    res = results("01_causal_padding_mask", lambda lengths, L: make_mask(lengths, L)[:, 0])
    assert all("expected shape" in msg for _, msg in res)


# ---- 01_predict_shapes -------------------------------------------------------------------------------

def test_shapes_reference_passes():
    assert_all_pass("01_predict_shapes", lambda q, k, v: ((*q[:3], v[3]), (*q[:3], k[2])))


@pytest.mark.parametrize("fn, hint", [
    (lambda q, k, v: ((*q[:3], q[3]), (*q[:3], k[2])), "comes from the values (Ev)"),
    (lambda q, k, v: ((*q[:3], v[3]), (*q[:2], k[2], q[2])), "one row per query and one column per key"),
    (lambda q, k, v: ((*q[:2], k[2], v[3]), (*q[:3], k[2])), "one row per query (Lq)"),
])
def test_shapes_mistakes_hinted(fn, hint):
    assert_hint("01_predict_shapes", fn, hint)


# ---- 01_fix_the_bug ----------------------------------------------------------------------------------

def fixed(q, k, v, mask, *, bugs=()):
    scores = q @ k.transpose(-2, -1)
    if "scale" not in bugs:
        scores = scores / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(mask if "polarity" in bugs else ~mask, float("-inf"))
    return torch.softmax(scores, dim=-2 if "dim" in bugs else -1) @ v


def test_fix_reference_passes():
    assert_all_pass("01_fix_the_bug", fixed)


@pytest.mark.parametrize("bugs", [("scale",), ("polarity",), ("dim",), ("scale", "dim"),
                                  ("scale", "polarity", "dim")])
def test_fix_remaining_bugs_named(bugs):
    names = {"scale": "scale is missing", "polarity": "polarity is inverted", "dim": "dim=-2"}
    res = results("01_fix_the_bug", lambda q, k, v, m: fixed(q, k, v, m, bugs=bugs))
    assert not any(ok for ok, _ in res)
    for _, msg in res:
        assert msg.startswith("still buggy")
        assert [b for b in names if names[b] in msg] == list(bugs), msg


# ---- 01_score_std ------------------------------------------------------------------------------------

def test_std_reference_and_simulation_pass():
    assert_all_pass("01_score_std", lambda d: (math.sqrt(d), 1.0))

    def simulate(d):
        g = torch.Generator().manual_seed(d)
        q, k = torch.randn(2, 20_000, d, generator=g)
        s = (q * k).sum(-1)
        return float(s.std()), float((s / math.sqrt(d)).std())
    assert_all_pass("01_score_std", simulate)


@pytest.mark.parametrize("fn, hint", [
    (lambda d: (d, 1.0), "variance"),
    (lambda d: (math.sqrt(d), 1 / math.sqrt(d)), "divides the std by √d_k"),
    (lambda d: (1.0, 1.0), "variance d_k"),
])
def test_std_mistakes_hinted(fn, hint):
    assert_hint("01_score_std", fn, hint)
