"""The shared work counter of the tiling exercises (``guard.Work``, review 08-14 M9-1): a product counts the same
however it is written — ``@``, ``einsum``, ``bmm`` or broadcast-multiply-and-sum — against the closed form
2 · (multiply-adds); elementwise scalings that are not reduced count nothing; ``largest`` is the largest block of
products formed at once. And ``TensorCallWatch`` counts an ``expand`` view by the elements it really holds."""
import math

import pytest
import torch

from attn_course.grading.guard import MatmulWork, TensorCallWatch, Work

B, H, L, D, DV = 2, 3, 7, 5, 4


def _qkv():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, H, L, D, generator=g, dtype=torch.float64),
            torch.randn(B, H, L, D, generator=g, dtype=torch.float64),
            torch.randn(B, H, L, DV, generator=g, dtype=torch.float64))


def attn_matmul(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D), -1) @ v


def attn_broadcast(q, k, v):
    s = (q[..., :, None, :] * k[..., None, :, :]).sum(-1) / math.sqrt(D)      # (B, H, L, L, D) -> (B, H, L, L)
    p = torch.softmax(s, -1)
    return (p[..., :, :, None] * v[..., None, :, :]).sum(-2)                 # (B, H, L, L, DV) -> (B, H, L, DV)


def attn_einsum(q, k, v):
    p = torch.softmax(torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(D), -1)
    return torch.einsum("bhij,bhjd->bhid", p, v)


def attn_vecdot(q, k, v):
    p = torch.softmax(torch.linalg.vecdot(q[..., :, None, :], k[..., None, :, :]) / math.sqrt(D), -1)
    return (p[..., None] * v[..., None, :, :]).sum(-2)


@pytest.mark.parametrize("attn", [attn_matmul, attn_broadcast, attn_einsum, attn_vecdot])
def test_every_spelling_of_attention_costs_the_same(attn):
    q, k, v = _qkv()
    with Work() as work:
        out = attn(q, k, v)
    ref = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D), -1) @ v
    torch.testing.assert_close(out, ref)
    assert work.flops == 2 * B * H * L * L * (D + DV)  # QKᵀ and P·V: 2 per multiply-add
    assert work.largest == B * H * L * L == math.prod(work.largest_shape)       # the (B·H, L, L) scores


def test_elementwise_scaling_without_a_reduction_costs_nothing():
    q, k, v = _qkv()
    with Work() as work:
        x = q * 3.0 / math.sqrt(D)
        y = (torch.rand(B, H, L, 1, dtype=torch.float64) * v).exp()
        z = torch.exp(q).sum(-1) + y.sum(-1).mean()      # sums of non-products
    assert work.flops == 0 and work.calls == 0 and x.shape == q.shape and z.shape == (B, H, L)


def test_a_product_reduced_through_a_view_and_a_cumsum_count():
    q, k, v = _qkv()
    with Work() as work:
        outer = torch.einsum("bhle,bhlf->bhlef", k, v)   # an outer product (a broadcast mul) ...
        states = outer.cumsum(2)                          # ... summed over positions
    assert work.flops == 2 * B * H * L * D * DV and states.shape == (B, H, L, D, DV)
    with Work() as work:
        (q[..., :, None, :] * k[..., None, :, :]).transpose(-1, -2).sum(-2)
    assert work.flops == 2 * B * H * L * L * D


def test_the_old_name_is_the_same_counter():
    assert MatmulWork is Work


def test_tensor_call_watch_counts_an_expand_view_once():
    c = torch.randn(B, 11, D)
    with TensorCallWatch() as watch:
        view = c[:, None].expand(B, H, 11, D)            # stride 0 on the head axis: nothing allocated
    assert watch.largest_numel == B * 11 * D and view.shape == (B, H, 11, D)
    with TensorCallWatch() as watch:
        c[:, None].expand(B, H, 11, D).contiguous()      # a copy: counted in full
    assert watch.largest_numel == B * H * 11 * D
