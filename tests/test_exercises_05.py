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

def test_rank_one_scale():
    assert_all_pass("05_rank_one_scale", lambda L, n, d: math.sqrt(L) / (n * math.sqrt(d)))
    _assert_hint("05_rank_one_scale", lambda L, n, d: 1 / (n * math.sqrt(d)), "√L is missing")
    _assert_hint("05_rank_one_scale", lambda L, n, d: L / (n * math.sqrt(d)), "L instead of √L")
    _assert_hint("05_rank_one_scale", lambda L, n, d: math.sqrt(L) / n, "1/√d_h")
    _assert_hint("05_rank_one_scale", lambda L, n, d: math.sqrt(L) / (n * n * math.sqrt(d)), "‖t̄‖ appears once")


def test_rank_one_scale_matches_the_module():
    """The exercise's c is the factor of the real module's scores (independent check of the reference)."""
    from attn_course import TemporalAttention
    m = TemporalAttention(8, 1, 3).double().eval()
    x, t = torch.randn(1, 5, 8, dtype=torch.double), torch.randn(1, 1, 3, dtype=torch.double)
    with torch.no_grad():
        q, k, tb = m.q_proj(x)[0], m.k_proj(x)[0], m.t_proj(t)[0, 0]
    T = tb.expand(5, 8)
    S = q @ (T.T @ T / torch.linalg.norm(T)) @ k.T / math.sqrt(8)
    ex = get("05_rank_one_scale")
    case = Case("L=5", params={"L": 5, "t_norm": float(tb.norm()), "d_h": 8})
    c = ex.expected(case)["c"]
    torch.testing.assert_close(S, c * torch.outer(q @ tb, k @ tb))


# ---- 05_video_frames ------------------------------------------------------------------------------------------

def test_video_frames():
    assert_all_pass("05_video_frames", lambda x: rearrange(x, "b f n c -> (b n) f c"))
    _assert_hint("05_video_frames", lambda x: rearrange(x, "b f n c -> (b f) n c"), "spatial attention")
    _assert_hint("05_video_frames", lambda x: rearrange(x, "b f n c -> (b f) n c"), "without moving the frame axis")
    _assert_hint("05_video_frames", lambda x: x.reshape(x.shape[0] * x.shape[2], x.shape[1], x.shape[3]),
                "without moving the frame axis")
    _assert_hint("05_video_frames", lambda x: rearrange(x, "b f n c -> (n b) f c"), "(n b)")
