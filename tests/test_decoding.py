"""split_kv_attention (flash-decoding): equal to SDPA in fp64 for any number of splits, each split keeps
only (out, lse), the merge is exact, bad input raises ValueError naming the sizes."""
import math

import pytest
import torch
import torch.nn.functional as F

from attn_course.decoding import merge_splits, split_bounds, split_kv_attention, split_partials

TOL64 = dict(atol=1e-10, rtol=1e-10)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here at one thread (conftest's ``one_thread``)."""


def _qkv(lead, Lq, Lk, E=8, Ev=6, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*lead, Lq, E, generator=g, dtype=dtype), torch.randn(*lead, Lk, E, generator=g, dtype=dtype),
            torch.randn(*lead, Lk, Ev, generator=g, dtype=dtype))


@pytest.mark.parametrize("lead", [(), (3,), (2, 4)])
@pytest.mark.parametrize("Lq,Lk", [(1, 1), (1, 97), (1, 256), (5, 33), (7, 7)])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 8, 64])
def test_fp64_equals_sdpa(lead, Lq, Lk, num_splits):
    q, k, v = _qkv(lead, Lq, Lk)
    out = split_kv_attention(q, k, v, num_splits)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), **TOL64)


def test_scale_and_large_logits():
    q, k, v = _qkv((2,), 1, 50)
    out = split_kv_attention(q * 30, k, v, 4, scale=0.7)   # logits in the hundreds: exp would overflow naively
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q * 30, k, v, scale=0.7), **TOL64)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 2e-2), (torch.float16, 3e-3)])
def test_low_precision_close_to_fp64(dtype, tol):
    q, k, v = _qkv((2, 2), 1, 300)
    out = split_kv_attention(q.to(dtype), k.to(dtype), v.to(dtype), 5)
    assert out.dtype == dtype
    ref = F.scaled_dot_product_attention(*(t.to(dtype).double() for t in (q, k, v)))
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)


def test_each_split_is_the_softmax_over_its_own_keys():
    q, k, v = _qkv((2,), 3, 40)
    out, lse = split_partials(q, k, v, 3)
    assert out.shape == (3, 2, 3, 6) and lse.shape == (3, 2, 3)
    for s, (a, b) in enumerate(split_bounds(40, 3)):
        torch.testing.assert_close(out[s], F.scaled_dot_product_attention(q, k[..., a:b, :], v[..., a:b, :]), **TOL64)
        ref_lse = torch.logsumexp(q @ k[..., a:b, :].transpose(-1, -2) / math.sqrt(8), dim=-1)
        torch.testing.assert_close(lse[s], ref_lse, **TOL64)
    o, m = merge_splits(out, lse)
    torch.testing.assert_close(m, torch.logsumexp(q @ k.transpose(-1, -2) / math.sqrt(8), dim=-1), **TOL64)


def test_split_bounds_cover_the_keys_once():
    for Lk, S in [(10, 3), (10, 10), (3, 8), (0, 2), (256, 16)]:
        b = split_bounds(Lk, S)
        assert len(b) == S and b[0][0] == 0 and b[-1][1] == Lk
        assert all(b[i][1] == b[i + 1][0] for i in range(S - 1)) and all(e >= s for s, e in b)
    assert split_bounds(10, 3) == [(0, 4), (4, 8), (8, 10)]


def test_more_splits_than_keys_and_empty():
    q, k, v = _qkv((2,), 1, 3)
    torch.testing.assert_close(split_kv_attention(q, k, v, 8), F.scaled_dot_product_attention(q, k, v), **TOL64)
    q, k, v = _qkv((2,), 2, 0)
    out = split_kv_attention(q, k, v, 4)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))   # no keys: zeros, as SDPA
    assert not out.isnan().any()
    q, k, v = _qkv((2,), 0, 5)
    assert split_kv_attention(q, k, v, 2).shape == (2, 0, 6)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_num_splits(bad):
    q, k, v = _qkv((), 1, 4)
    with pytest.raises(ValueError, match="num_splits"):
        split_kv_attention(q, k, v, bad)


def test_bad_shapes_name_sizes():
    q, k, v = _qkv((2,), 1, 4)
    with pytest.raises(ValueError, match=r"E=8.*E=5"):
        split_kv_attention(q, k[..., :5], v, 2)
    with pytest.raises(ValueError, match=r"\(2, 4, 8\).*\(2, 3, 6\)"):
        split_kv_attention(q, k, v[:, :3], 2)
    with pytest.raises(ValueError, match="leading"):
        split_kv_attention(q, k[:1], v[:1], 2)
    with pytest.raises(ValueError, match="scale"):
        split_kv_attention(q, k, v, 2, scale=float("nan"))
    with pytest.raises(ValueError, match="out .* lse"):
        merge_splits(torch.zeros(2, 3, 4), torch.zeros(2, 4))
