"""Exercise set 05: the reference solutions pass every case; each common mistake fails with its hint."""
import math

import pytest
import torch
from einops import rearrange

from attn_course.grading.spec import Case
from attn_course.temporal import time_matrix as course_time_matrix

from attn_course.grading.exercises import get
from exercise_kit import assert_all_pass, assert_hint, results

IGNORE = ("seq:", "M:", "weights:", "RuntimeError")   # failures before any value is judged


def _assert_hint(ex_id, fn, hint):
    assert_hint(ex_id, fn, hint, ignore=IGNORE)


# ---- 05_time_matrix -------------------------------------------------------------------------------------------

def tm(T, keep=None, *, norm="sample", use_keep=True, norm_first=False):
    Tm = T * keep[:, None, :, None] if keep is not None and use_keep else T
    src = T if norm_first else Tm
    n = {"sample": lambda: torch.linalg.matrix_norm(src, keepdim=True),
         "batch": lambda: src.norm(2.0),
         "squared": lambda: src.pow(2).sum((-2, -1), keepdim=True),
         "none": lambda: 1.0}[norm]()
    return Tm.transpose(-2, -1) @ Tm / n


def test_time_matrix_reference_passes():
    assert_all_pass("05_time_matrix", tm)
    # the package's own function agrees with the exercise's reference
    assert_all_pass("05_time_matrix",
                    lambda T, keep=None: course_time_matrix(T, None if keep is None else keep[:, None]))


@pytest.mark.parametrize("kwargs,hint", [
    (dict(norm="batch"), "norm of the whole batch"),
    (dict(norm="none"), "no normalisation"),
    (dict(norm="squared"), "‖T‖_F²"),
    (dict(use_keep=False), "padded rows are still in TᵀT"),
    (dict(norm_first=True), "still in the norm"),
])
def test_time_matrix_mistakes(kwargs, hint):
    _assert_hint("05_time_matrix", lambda T, keep=None: tm(T, keep, **kwargs), hint)


def test_time_matrix_wrong_product_is_a_shape_error():
    res = results("05_time_matrix",
                  lambda T, keep=None: T @ T.transpose(-2, -1) / torch.linalg.matrix_norm(T, keepdim=True))
    assert not any(ok for ok, _ in res) and all("shape" in msg for _, msg in res)


# ---- 05_temporal_weights --------------------------------------------------------------------------------------

def tw(q, k, T, *, added=False, scale=True, dim=-1, norm="sample", plain=False):
    n = torch.linalg.matrix_norm(T, keepdim=True) if norm == "sample" else (T.norm(2.0) if norm == "batch" else 1.0)
    M = T.transpose(-2, -1) @ T / n
    if plain:
        s = q @ k.transpose(-2, -1)
    elif added:
        s = q @ k.transpose(-2, -1) + T @ T.transpose(-2, -1) / n
    else:
        s = q @ M @ k.transpose(-2, -1)
    return torch.softmax(s / math.sqrt(q.shape[-1]) if scale else s, dim=dim)


def test_temporal_weights_reference_passes():
    assert_all_pass("05_temporal_weights", tw)


@pytest.mark.parametrize("kwargs,hint", [
    (dict(plain=True), "does not change your weights"),
    (dict(added=True), "must multiply"),       # "you added the time ... it multiplies", or "... must multiply"
    (dict(scale=False), "1/√d_h"),
    (dict(dim=-2), "dim=-2"),
    (dict(norm="none"), "not normalised"),
    (dict(norm="batch"), "norm of the whole batch"),
])
def test_temporal_weights_mistakes(kwargs, hint):
    _assert_hint("05_temporal_weights", lambda q, k, T: tw(q, k, T, **kwargs), hint)


# ---- 05_rank_one_scale ----------------------------------------------------------------------------------------

def _scales(L1, n1, L2, n2, d, norm=None):
    norm = math.sqrt(L1 * n1 ** 2 + L2 * n2 ** 2) if norm is None else norm
    return L1 / (norm * math.sqrt(d)), L2 / (norm * math.sqrt(d))


def test_rank_one_scale():
    assert_all_pass("05_rank_one_scale", _scales)
    rd = math.sqrt
    _assert_hint("05_rank_one_scale", lambda L1, n1, L2, n2, d: (rd(L1) / (n1 * rd(d)), rd(L2) / (n2 * rd(d))),
                 "one-period factor")
    _assert_hint("05_rank_one_scale", lambda L1, n1, L2, n2, d: _scales(L1, n1, L2, n2, d, L1 * n1 + L2 * n2),
                 "L1‖t̄1‖ + L2‖t̄2‖")
    _assert_hint("05_rank_one_scale",
                 lambda L1, n1, L2, n2, d: _scales(L1, n1, L2, n2, d, rd(L1) * n1 + rd(L2) * n2), "blocks' norms")
    _assert_hint("05_rank_one_scale", lambda L1, n1, L2, n2, d: tuple(c * rd(d) for c in _scales(L1, n1, L2, n2, d)),
                 "1/√d_h")
    _assert_hint("05_rank_one_scale", lambda *a: _scales(*a)[::-1], "swapped")


def test_rank_one_scale_matches_the_module():
    """The exercise's c1, c2 are the factors of the real module's scores (independent check of the reference):
    S = c1 (Q t̄1)(K t̄1)ᵀ + c2 (Q t̄2)(K t̄2)ᵀ."""
    from attn_course import TemporalAttention
    m = TemporalAttention(8, 1, 3).double().eval()
    x, t = torch.randn(1, 5, 8, dtype=torch.double), torch.randn(1, 2, 3, dtype=torch.double)
    with torch.no_grad():
        q, k, tb = m.q_proj(x)[0], m.k_proj(x)[0], m.t_proj(t)[0]          # tb (2, 8): the two periods
    T = torch.cat((tb[0].expand(2, 8), tb[1].expand(3, 8)))                 # L1 = 2 tokens, then L2 = 3
    S = q @ (T.T @ T / torch.linalg.norm(T)) @ k.T / math.sqrt(8)
    case = Case("two periods", params={"L1": 2, "n1": float(tb[0].norm()), "L2": 3, "n2": float(tb[1].norm()), "d_h": 8})
    c1, c2 = get("05_rank_one_scale").expected(case)["c"]
    torch.testing.assert_close(S, c1 * torch.outer(q @ tb[0], k @ tb[0]) + c2 * torch.outer(q @ tb[1], k @ tb[1]))


# ---- 05_video_frames ------------------------------------------------------------------------------------------

def test_video_frames():
    assert_all_pass("05_video_frames", lambda x: rearrange(x, "b f n c -> (b n) f c"))
    _assert_hint("05_video_frames", lambda x: rearrange(x, "b f n c -> (b f) n c"), "spatial attention")
    _assert_hint("05_video_frames", lambda x: rearrange(x, "b f n c -> (b f) n c"), "without moving the frame axis")
    _assert_hint("05_video_frames", lambda x: x.reshape(x.shape[0] * x.shape[2], x.shape[1], x.shape[3]),
                "without moving the frame axis")
    _assert_hint("05_video_frames", lambda x: rearrange(x, "b f n c -> (n b) f c"), "(n b)")
