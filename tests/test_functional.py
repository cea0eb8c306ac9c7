"""attention() against torch's SDPA: shapes, masks, causal rectangles, scale, GQA, dtypes, forward and backward."""
import math

import pytest
import torch
import torch.nn.functional as F

from attn_course import attention
from attn_course.functional import masked_softmax, repeat_kv

SHAPES = [  # (batch dims, Hq, Hkv, Lq, Lk, E, Ev)
    ((2,), 3, 3, 5, 7, 8, 4),
    ((1,), 1, 1, 1, 9, 16, 16),
    ((3,), 2, 2, 6, 6, 4, 6),
    ((2, 2), 2, 2, 4, 3, 8, 8),      # two leading batch dims
    ((), 4, 4, 8, 5, 8, 8),          # (H, L, E) without a batch dim
]


def _qkv(batch, hq, hkv, lq, lk, e, ev, dtype=torch.float64, requires_grad=True):
    q = torch.randn(*batch, hq, lq, e, dtype=dtype)
    k = torch.randn(*batch, hkv, lk, e, dtype=dtype)
    v = torch.randn(*batch, hkv, lk, ev, dtype=dtype)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def _grads(out, inputs, g):
    return torch.autograd.grad((out * g).sum(), inputs)


def _assert_parity(q, k, v, atol=1e-10, rtol=1e-10, **kw):
    """Outputs and gradients of attention() equal SDPA's on the same inputs."""
    out, w = attention(q, k, v, **kw)
    ref = F.scaled_dot_product_attention(q, k, v, **kw)
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)
    g = torch.randn_like(out)
    for a, b in zip(_grads(out, (q, k, v), g), _grads(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol)
    return out, w


@pytest.mark.parametrize("shape", SHAPES)
def test_parity_no_mask(shape):
    out, w = _assert_parity(*_qkv(*shape))
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mask_shape", ["full", "LqLk", "key_padding"])
def test_parity_bool_mask(shape, mask_shape):
    batch, hq, _, lq, lk = shape[:5]
    full = (*batch, hq, lq, lk)
    mshape = {"full": full, "LqLk": (lq, lk), "key_padding": (*batch, 1, 1, lk)}[mask_shape]
    mask = torch.rand(mshape) > 0.4
    mask[..., 0] = True                                     # every row keeps at least one key
    q, k, v = _qkv(*shape)
    _, w = _assert_parity(q, k, v, attn_mask=mask)
    assert torch.all(w.detach()[~mask.expand(full)] == 0)


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_parity_float_mask(shape):
    batch, hq, _, lq, lk = shape[:5]
    mask = torch.randn(lq, lk, dtype=torch.float64)
    mask[:, -1] = float("-inf")
    _assert_parity(*_qkv(*shape), attn_mask=mask)


@pytest.mark.parametrize("lq, lk", [(5, 5), (3, 7), (7, 3), (1, 4), (4, 1)])
def test_parity_causal_rectangles(lq, lk):
    """is_causal is top-left aligned when Lq != Lk (query i sees keys j <= i), as in SDPA."""
    q, k, v = _qkv((2,), 2, 2, lq, lk, 8, 8)
    _, w = _assert_parity(q, k, v, is_causal=True)
    i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
    assert torch.all(w.detach()[..., j > i] == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


def test_causal_ignores_the_future():
    """Perturbing keys/values at positions > i leaves the output of query i unchanged."""
    q, k, v = _qkv((1,), 2, 2, 6, 6, 8, 8, requires_grad=False)
    out, _ = attention(q, k, v, is_causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[..., 4:, :] += 5.0
    v2[..., 4:, :] -= 3.0
    out2, _ = attention(q, k2, v2, is_causal=True)
    torch.testing.assert_close(out2[..., :4, :], out[..., :4, :])
    assert not torch.allclose(out2[..., 4:, :], out[..., 4:, :])


@pytest.mark.parametrize("scale", [0.1, 1.0, 2.5])
def test_parity_scale(scale):
    _assert_parity(*_qkv((2,), 2, 2, 4, 6, 8, 8), scale=scale)


def test_default_scale_is_inverse_sqrt_E():
    q, k, v = _qkv((1,), 1, 1, 3, 4, 16, 2, requires_grad=False)
    _, w = attention(q, k, v)
    torch.testing.assert_close(w, torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1))


@pytest.mark.parametrize("hq, hkv", [(4, 2), (6, 3), (8, 1), (4, 4)])
@pytest.mark.parametrize("kw", [{}, {"is_causal": True}])
def test_parity_gqa(hq, hkv, kw):
    q, k, v = _qkv((2,), hq, hkv, 5, 5, 8, 8)
    _assert_parity(q, k, v, enable_gqa=True, **kw)


def test_gqa_query_head_i_uses_kv_head_i_div_nrep():
    q, k, v = _qkv((1,), 6, 2, 4, 5, 8, 8, requires_grad=False)
    out, w = attention(q, k, v, enable_gqa=True)
    for i in range(6):
        o_i, w_i = attention(q[:, i:i + 1], k[:, i // 3: i // 3 + 1], v[:, i // 3: i // 3 + 1])
        torch.testing.assert_close(out[:, i:i + 1], o_i)
        torch.testing.assert_close(w[:, i:i + 1], w_i)


def test_repeat_kv_is_interleave_not_tile():
    x = torch.arange(3.0).view(1, 3, 1, 1)
    assert repeat_kv(x, 2).flatten().tolist() == [0, 0, 1, 1, 2, 2]
    assert repeat_kv(x, 1) is x


def _fp64_reference(q, k, v, **kw):
    """SDPA in fp64 on the same (low-precision) values, with fp64 gradients."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    kw = {n: (m.double() if isinstance(m, torch.Tensor) and m.is_floating_point() else m) for n, m in kw.items()}
    return (q64, k64, v64), F.scaled_dot_product_attention(q64, k64, v64, **kw)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"attn_mask": "bool"}, {"attn_mask": "float"}])
def test_low_precision_forward_backward(dtype, tol, kw):
    q, k, v = _qkv((2,), 2, 2, 6, 6, 16, 8, dtype=dtype)
    if kw.get("attn_mask") == "bool":
        kw = {"attn_mask": torch.ones(6, 6, dtype=torch.bool).tril()}
    elif kw.get("attn_mask") == "float":
        kw = {"attn_mask": torch.randn(6, 6).to(dtype)}
    out, w = attention(q, k, v, **kw)
    assert out.dtype == w.dtype == dtype
    ins64, ref = _fp64_reference(q, k, v, **kw)
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    g = torch.randn_like(ref)
    got = _grads(out, (q, k, v), g.to(dtype))
    want = _grads(ref, ins64, g.to(dtype).double())
    for a, b in zip(got, want):
        assert a.dtype == dtype
        torch.testing.assert_close(a.double(), b, atol=4 * tol, rtol=4 * tol)


def test_low_precision_softmax_accumulates_in_fp32():
    """Many keys with tiny, equal weights: an fp16 softmax sum would round; fp32 accumulation does not."""
    L = 4096
    q = torch.zeros(1, 1, 1, 8, dtype=torch.float16)
    k = torch.zeros(1, 1, L, 8, dtype=torch.float16)
    v = torch.ones(1, 1, L, 8, dtype=torch.float16)
    out, w = attention(q, k, v)
    assert torch.all(out == 1)
    assert w.float().sum().item() == pytest.approx(1.0, abs=1e-3)


def test_fp64_stays_fp64():
    q, k, v = _qkv((1,), 1, 1, 3, 3, 4, 4)
    out, w = attention(q, k, v)
    assert out.dtype == w.dtype == torch.float64


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_fully_masked_rows_are_zero_forward_and_backward(mask_kind):
    q, k, v = _qkv((2,), 2, 2, 4, 5, 8, 8)
    keep = torch.ones(4, 5, dtype=torch.bool)
    keep[1] = False                                            # query 1 sees no key
    mask = keep if mask_kind == "bool" else torch.zeros(4, 5, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    out, w = attention(q, k, v, attn_mask=mask)
    assert torch.all(out[..., 1, :] == 0) and torch.all(w[..., 1, :] == 0)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    torch.testing.assert_close(w[..., [0, 2, 3], :].sum(-1), torch.ones(2, 2, 3, dtype=torch.float64))
    (out.sum() + w.sum()).backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.all(q.grad[..., 1, :] == 0)
    # the other rows match SDPA with the same mask, where SDPA is well-defined
    ref = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), attn_mask=keep)
    torch.testing.assert_close(out.detach(), ref)


def test_fully_masked_batch_element():
    """A padding mask with length 0 (empty sequence) gives a zero output, not NaN."""
    q, k, v = _qkv((2,), 1, 1, 3, 3, 4, 4, requires_grad=False)
    keep = torch.tensor([True, True, True, False, False, False]).view(2, 1, 1, 3)
    out, w = attention(q, k, v, attn_mask=keep)
    assert torch.all(out[1] == 0) and torch.all(w[1] == 0)
    torch.testing.assert_close(out[0], attention(q[0], k[0], v[0])[0])


def test_masked_softmax_matches_softmax_and_zeroes_empty_rows():
    s = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(masked_softmax(s), torch.softmax(s, -1))
    s2 = s.detach().clone()
    s2[1] = float("-inf")
    s2.requires_grad_()
    p = masked_softmax(s2)
    assert torch.all(p[1] == 0)
    p.sum().backward()
    assert torch.isfinite(s2.grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_huge_logits_do_not_overflow(dtype):
    q = torch.tensor([[[[100.0, 0.0], [-100.0, 50.0]]]], dtype=dtype)
    k = torch.tensor([[[[100.0, 0.0], [0.0, 100.0], [-100.0, 0.0]]]], dtype=dtype)
    v = torch.eye(3, dtype=dtype)[None, None]
    out, w = attention(q, k, v, scale=1.0)                    # scores up to 1e4
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    expected = torch.softmax(q.double() @ k.double().transpose(-1, -2), -1)   # one-hot rows
    torch.testing.assert_close(w.double(), expected, atol=1e-3, rtol=0)


def test_dropout_is_applied_to_a_copy_of_the_weights():
    """Weights are returned pre-dropout; with V = I the output IS the dropped weights: 0 or w / (1 - p)."""
    torch.manual_seed(0)
    L, p = 64, 0.5
    q, k = torch.randn(1, 2, L, 8), torch.randn(1, 2, L, 8)
    v = torch.eye(L).expand(1, 2, L, L)
    _, w_ref = attention(q, k, v)
    out, w = attention(q, k, v, dropout_p=p)
    torch.testing.assert_close(w, w_ref)                      # pre-dropout
    kept = out != 0
    torch.testing.assert_close(out[kept], w[kept] / (1 - p))
    frac = kept.float().mean().item()
    assert 0.4 < frac < 0.6
    out0, _ = attention(q, k, v, dropout_p=0.0)
    torch.testing.assert_close(out0, w_ref)


def test_no_hard_coded_device_for_meta_tensors():
    """Shape logic (incl. the causal mask) follows the inputs' device: runs on 'meta' without data."""
    q = torch.empty(2, 3, 5, 8, device="meta")
    out, w = attention(q, q, q, is_causal=True)
    assert out.device.type == "meta" and w.shape == (2, 3, 5, 5)


@pytest.mark.parametrize("call, match", [
    (lambda q, k, v: attention([1.0], k, v), r"query must be a torch.Tensor, got list"),
    (lambda q, k, v: attention(q, k[0, 0, 0], v), r"key must have shape \(\.\.\., L, E\), got \(8,\)"),
    (lambda q, k, v: attention(q, k, v.long()), r"value must be a floating-point tensor, got dtype torch.int64"),
    (lambda q, k, v: attention(q, k[0], v[0]), r"same number of dimensions.*\(2, 4, 5, 8\).*\(4, 6, 8\)"),
    (lambda q, k, v: attention(q, k.double(), v), r"share a dtype"),
    (lambda q, k, v: attention(q, k[..., :4], v), r"query E=8 .* key E=4"),
    (lambda q, k, v: attention(q, k, v[..., :3, :]), r"key and value must agree.*\(2, 4, 6, 8\).*\(2, 4, 3, 8\)"),
    (lambda q, k, v: attention(q, k[:, :2], v[:, :2]), r"query has 4 heads but key/value have 2; pass enable_gqa=True"),
    (lambda q, k, v: attention(q, k[:, :3], v[:, :3], enable_gqa=True),
     r"number of query heads 4 is not divisible by number of key/value heads 3"),
    (lambda q, k, v: attention(q, k[:1], v[:1]), r"batch dimensions differ: query \(2, 4, 5, 8\), key \(1, 4, 6, 8\)"),
    (lambda q, k, v: attention(q, k, v, attn_mask=torch.ones(5, 6, dtype=torch.bool), is_causal=True),
     r"either attn_mask or is_causal"),
    (lambda q, k, v: attention(q, k, v, attn_mask=[[True]]), r"attn_mask must be a torch.Tensor, got list"),
    (lambda q, k, v: attention(q, k, v, attn_mask=torch.ones(5, 6, dtype=torch.long)),
     r"attn_mask must be bool .* got torch.int64"),
    (lambda q, k, v: attention(q, k, v, attn_mask=torch.ones(6, 5, dtype=torch.bool)),
     r"attn_mask of shape \(6, 5\) does not broadcast .* \(2, 4, 5, 6\) = \(\.\.\., Lq=5, Lk=6\)"),
    (lambda q, k, v: attention(q, k, v, attn_mask=torch.ones(3, 2, 4, 5, 6, dtype=torch.bool)),
     r"attn_mask of shape \(3, 2, 4, 5, 6\) does not broadcast"),
    (lambda q, k, v: attention(q, k, v, dropout_p=1.5), r"dropout.*1.5"),
])
def test_value_errors_name_the_sizes(call, match):
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    with pytest.raises(ValueError, match=match):
        call(q, k, v)


def test_weights_are_the_textbook_formula():
    """Independent fp64 formula: softmax(QKᵀ/√E + M) with a float mask."""
    q, k, v = _qkv((2,), 2, 2, 3, 4, 8, 5, requires_grad=False)
    m = torch.randn(3, 4, dtype=torch.float64)
    out, w = attention(q, k, v, attn_mask=m)
    want = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8) + m, dim=-1)
    torch.testing.assert_close(w, want)
    torch.testing.assert_close(out, want @ v)


EMPTY = [(0, 5), (4, 0), (0, 0)]   # (Lq, Lk): no queries, no keys, neither


@pytest.mark.parametrize("lq, lk", EMPTY)
@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"attn_mask": "bool"}, {"attn_mask": "float"}],
                         ids=["no-mask", "causal", "bool-mask", "float-mask"])
def test_empty_sequences_behave_like_sdpa(lq, lk, kw):
    """L = 0 or Lk = 0: SDPA returns an empty output, or a zero one when there are no keys; attention() must
    do the same (it used to raise IndexError in the softmax's row maximum), with weights (..., Lq, 0)."""
    q, k, v = _qkv((2,), 3, 3, lq, lk, 8, 5)
    if kw.get("attn_mask") == "bool":
        kw = {"attn_mask": torch.ones(lq, lk, dtype=torch.bool)}
    elif kw.get("attn_mask") == "float":
        kw = {"attn_mask": torch.zeros(lq, lk, dtype=torch.float64)}
    out, w = _assert_parity(q, k, v, **kw)          # outputs and gradients, against SDPA
    assert out.shape == (2, 3, lq, 5) and w.shape == (2, 3, lq, lk)
    if lq and not lk:
        assert torch.equal(out, torch.zeros_like(out))


def test_empty_keys_with_gqa_and_low_precision():
    q = torch.randn(1, 4, 3, 8, dtype=torch.bfloat16)
    k = v = torch.randn(1, 2, 0, 8, dtype=torch.bfloat16)
    out, w = attention(q, k, v, enable_gqa=True)
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert out.dtype == w.dtype == torch.bfloat16 and w.shape == (1, 4, 3, 0)
    torch.testing.assert_close(out, ref)
    assert masked_softmax(torch.randn(2, 3, 0)).shape == (2, 3, 0)
