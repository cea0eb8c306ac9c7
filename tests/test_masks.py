"""attn_course.masks: shapes, polarity (True = may attend), agreement with SDPA and nn.MultiheadAttention."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attn_course import attention, masks


@pytest.mark.parametrize("lq, lk", [(1, 1), (4, 4), (3, 7), (7, 3)])
def test_causal_mask_matches_sdpa_is_causal(lq, lk):
    m = masks.causal_mask(lq, lk)
    assert m.shape == (lq, lk) and m.dtype == torch.bool
    for i in range(lq):
        for j in range(lk):
            assert bool(m[i, j]) == (j <= i)                       # top-left aligned
    q, k, v = torch.randn(2, 2, lq, 8), torch.randn(2, 2, lk, 8), torch.randn(2, 2, lk, 8)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True))
    torch.testing.assert_close(attention(q, k, v, attn_mask=m)[0], attention(q, k, v, is_causal=True)[0])


def test_causal_mask_square_default_and_device():
    torch.testing.assert_close(masks.causal_mask(5), masks.causal_mask(5, 5))
    assert masks.causal_mask(3, device="meta").device.type == "meta"


def test_padding_mask_shape_and_values():
    m = masks.padding_mask([3, 0, 5], 5)
    assert m.shape == (3, 1, 1, 5) and m.dtype == torch.bool
    assert m[:, 0, 0].int().tolist() == [[1, 1, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
    torch.testing.assert_close(masks.padding_mask(torch.tensor([3, 0, 5]), 5), m)


def test_padding_mask_ignores_padded_keys():
    """Output for the real tokens equals attention over the unpadded sequence alone."""
    lengths, L = [2, 4], 4
    q, k, v = torch.randn(3, 2, 2, L, 8).unbind(0)
    out, w = attention(q, k, v, attn_mask=masks.padding_mask(lengths, L))
    short, _ = attention(q[0], k[0, :, :2], v[0, :, :2])
    torch.testing.assert_close(out[0], short)
    assert torch.all(w[0, ..., 2:] == 0)
    torch.testing.assert_close(out[1], attention(q[1], k[1], v[1])[0])


def test_padding_mask_is_the_inverse_of_mha_key_padding_mask():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 8)
    keep = masks.padding_mask([3, 5], 5)                           # (B, 1, 1, L), True = real
    out_mha, w_mha = mha(x, x, x, key_padding_mask=~keep[:, 0, 0], average_attn_weights=False)
    W_q, W_k, W_v = mha.in_proj_weight.chunk(3)
    b_q, b_k, b_v = mha.in_proj_bias.chunk(3)
    split = lambda t: t.view(2, 5, 2, 4).transpose(1, 2)           # (B, H, L, hd)
    out, w = attention(split(x @ W_q.T + b_q), split(x @ W_k.T + b_k), split(x @ W_v.T + b_v), attn_mask=keep)
    torch.testing.assert_close(w, w_mha)
    torch.testing.assert_close(mha.out_proj(out.transpose(1, 2).reshape(2, 5, 8)), out_mha)


def test_causal_polarity_is_opposite_to_mha():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 1, batch_first=True).eval()
    x = torch.randn(1, 4, 8)
    keep = masks.causal_mask(4)
    _, w_right = mha(x, x, x, attn_mask=~keep)
    assert torch.all(w_right[0].triu(1) == 0)
    _, w_wrong = mha(x, x, x, attn_mask=keep)                      # reads True as blocked: anti-causal
    assert torch.all(w_wrong[0, :3].tril() == 0)


@pytest.mark.parametrize("L, window", [(6, 1), (6, 3), (5, 5), (4, 10)])
@pytest.mark.parametrize("causal", [True, False])
def test_sliding_window_mask_definition(L, window, causal):
    m = masks.sliding_window_mask(L, window, causal=causal)
    assert m.shape == (L, L) and m.dtype == torch.bool
    for i in range(L):
        for j in range(L):
            want = (j <= i and i - j < window) if causal else abs(i - j) < window
            assert bool(m[i, j]) == want
    assert torch.all(m.diagonal())                                 # a query always sees itself


def test_sliding_window_limits():
    torch.testing.assert_close(masks.sliding_window_mask(5, 5), masks.causal_mask(5))
    torch.testing.assert_close(masks.sliding_window_mask(5, 1, causal=False), torch.eye(5, dtype=torch.bool))


def test_combine_is_logical_and_with_broadcasting():
    c = masks.causal_mask(4)
    p = masks.padding_mask([2, 4], 4)
    m = masks.combine(c, None, p)
    assert m.shape == (2, 1, 4, 4)
    torch.testing.assert_close(m, c & p)
    assert masks.combine(None, None) is None
    assert masks.combine(c) is c


@pytest.mark.parametrize("call, match", [
    (lambda: masks.causal_mask(0), r"q_len must be a positive integer, got 0"),
    (lambda: masks.causal_mask(3, -1), r"k_len must be a positive integer, got -1"),
    (lambda: masks.causal_mask(2.5), r"q_len must be a positive integer, got 2.5"),
    (lambda: masks.padding_mask([1, 6], 5), r"every length must be in \[0, max_len=5\], got \[1, 6\]"),
    (lambda: masks.padding_mask([-1], 5), r"every length must be in \[0, max_len=5\], got \[-1\]"),
    (lambda: masks.padding_mask([1.5], 5), r"lengths must be a 1-D sequence of integers, got torch.float32"),
    (lambda: masks.padding_mask([[1, 2]], 5), r"lengths must be a 1-D sequence of integers, got torch.int64 of shape \(1, 2\)"),
    (lambda: masks.padding_mask([1], 0), r"max_len must be a positive integer, got 0"),
    (lambda: masks.sliding_window_mask(4, 0), r"window must be a positive integer, got 0"),
    (lambda: masks.combine(torch.ones(2, 2)), r"combine expects boolean masks, got torch.float32"),
])
def test_value_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
