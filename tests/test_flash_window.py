"""flash_attention(window=W): equal to attention/SDPA with masks.sliding_window_mask (fwd and grads, odd
lengths, causal and not), and the tiles wholly outside the band are never computed, forward or backward."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from attn_course import attention, masks
from attn_course.flash import band_tile_mask, flash_attention, flash_attention_backward, flash_attention_forward


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _qkv(B, H, L, E, dtype=torch.float64, Ev=None, Lk=None):
    g = torch.Generator().manual_seed(L * 31 + E)
    Lk = L if Lk is None else Lk
    return [torch.randn(B, H, n, e, generator=g, dtype=dtype).requires_grad_()
            for n, e in ((L, E), (Lk, E), (Lk, Ev or E))]


def _band(Lq, Lk, W, causal):
    """Brute-force (Lq, Lk) band: i - j < W, and j <= i (causal) or j - i < W."""
    m = torch.zeros(Lq, Lk, dtype=torch.bool)
    for i in range(Lq):
        for j in range(Lk):
            m[i, j] = (0 <= i - j < W) if causal else abs(i - j) < W
    return m


@pytest.mark.parametrize("L, W, bq, bk", [(37, 5, 8, 8), (37, 16, 8, 4), (50, 1, 16, 16), (33, 40, 8, 8),
                                          (29, 7, 5, 11), (64, 17, 16, 16), (1, 3, 4, 4)])
@pytest.mark.parametrize("causal", [True, False])
def test_window_matches_dense_mask_forward_and_grads(L, W, bq, bk, causal):
    q, k, v = _qkv(2, 3, L, 8, Ev=6)
    mask = masks.sliding_window_mask(L, W, causal=causal)
    assert torch.equal(mask, _band(L, L, W, causal))
    out = flash_attention(q, k, v, is_causal=causal, window=W, block_q=bq, block_k=bk)
    ref, _ = attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    go = torch.randn_like(out)
    g1 = torch.autograd.grad(out, (q, k, v), go)
    g2 = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), (q, k, v), go)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("Lq, Lk, causal", [(13, 29, True), (29, 13, False), (20, 9, True)])
def test_window_rectangular_is_top_left_aligned(Lq, Lk, causal):
    q, k, v = _qkv(1, 2, Lq, 4, Lk=Lk)
    W = 6
    out = flash_attention(q, k, v, is_causal=causal, window=W, block_q=4, block_k=8)
    mask = _band(Lq, Lk, W, causal)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    empty = ~mask.any(-1)                         # rows with no visible key: zeros (SDPA gives NaN there)
    torch.testing.assert_close(out[..., ~empty, :], want[..., ~empty, :], atol=1e-10, rtol=1e-10)
    assert torch.equal(out[..., empty, :], torch.zeros_like(out[..., empty, :]))


def test_window_low_precision_and_functional_api():
    q, k, v = _qkv(1, 2, 45, 16, dtype=torch.float32)
    mask = masks.sliding_window_mask(45, 9)
    for dt, tol in ((torch.float16, 3e-3), (torch.bfloat16, 2e-2)):
        out = flash_attention(q.to(dt), k.to(dt), v.to(dt), is_causal=True, window=9, block_q=8, block_k=8)
        assert out.dtype == dt
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.testing.assert_close(out.float(), want, atol=tol, rtol=tol)
    out, lse = flash_attention_forward(q, k, v, is_causal=True, window=9, block_q=8, block_k=16)
    s = (q @ k.transpose(-2, -1) / math.sqrt(16)).masked_fill(~mask, -math.inf)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), atol=1e-5, rtol=1e-5)
    go = torch.randn_like(out)
    dq, dk, dv = flash_attention_backward(q, k, v, out, lse, go, is_causal=True, window=9, block_q=8, block_k=16)
    want = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), (q, k, v), go)
    for a, b in zip((dq, dk, dv), want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_window_bad_values():
    q, k, v = _qkv(1, 1, 8, 4)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="window"):
            flash_attention(q, k, v, window=bad)


class _CountBmm(TorchDispatchMode):
    """Counts the tiles whose scores are computed: one aten.bmm S = Q_i K_jᵀ per tile in forward, two
    (S recomputed and dP = dO V_jᵀ) per tile in backward."""
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.bmm.default:
            self.n += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("L, W, b, causal", [(100, 20, 16, True), (160, 20, 16, False), (192, 32, 32, True),
                                             (70, 3, 8, False)])
def test_tiles_outside_the_band_are_never_computed(L, W, b, causal):
    band = _band(L, L, W, causal)
    nb = math.ceil(L / b)
    needed = sum(bool(band[i * b:(i + 1) * b, j * b:(j + 1) * b].any()) for i in range(nb) for j in range(nb))
    assert needed < nb * nb / 2                                   # the point: most tiles are empty
    q, k, v = _qkv(1, 1, L, 4)
    with _CountBmm() as fwd:
        out = flash_attention(q, k, v, is_causal=causal, window=W, block_q=b, block_k=b)
    assert fwd.n == needed
    with _CountBmm() as bwd:
        out.sum().backward()
    assert bwd.n == 2 * needed


def test_band_tile_mask():
    for q0, q1, k0, k1, W, c in [(8, 16, 0, 8, 4, True), (8, 16, 8, 16, 20, True), (0, 8, 8, 16, 3, False),
                                 (16, 24, 8, 16, 30, False), (16, 24, 8, 16, 9, True)]:
        m = band_tile_mask(q0, q1, k0, k1, c, W)
        want = _band(q1, k1, W, c)[q0:q1, k0:k1]
        assert (m is None and bool(want.all())) or torch.equal(m, want)
