"""flash_attention: equal to SDPA (outputs, logsumexp, gradients), linear memory, causal tile skipping."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import attn_course
from attn_course.flash import (LOG2E, causal_tile_mask, flash_attention, flash_attention_backward,
                               flash_attention_forward, online_softmax_finish, online_softmax_step)

TOL = {torch.float64: dict(atol=1e-10, rtol=1e-10), torch.float32: dict(atol=2e-5, rtol=2e-5),
       torch.float16: dict(atol=3e-3, rtol=3e-3), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tiles: intra-op threads only add synchronisation (and stall on a shared machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _qkv(shape_q, Lk, Ev=None, dtype=torch.float64, grad=True):
    *lead, Lq, E = shape_q
    q = torch.randn(*lead, Lq, E, dtype=dtype)
    k = torch.randn(*lead, Lk, E, dtype=dtype)
    v = torch.randn(*lead, Lk, Ev or E, dtype=dtype)
    return [t.requires_grad_(grad) for t in (q, k, v)]


def _lse_reference(q, k, is_causal, scale=None):
    """logsumexp of the scaled (masked) scores, computed directly in fp64."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q.double() @ k.double().transpose(-2, -1)) * scale
    if is_causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    return torch.logsumexp(s, dim=-1)


def test_top_level_name():
    assert attn_course.flash_attention is flash_attention


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Lq,Lk,block_q,block_k", [
    (37, 53, 16, 8), (53, 37, 8, 16), (64, 64, 64, 64), (5, 100, 7, 13), (1, 1, 64, 64), (33, 33, 32, 32),
    (19, 19, 1, 3)])
def test_fp64_matches_sdpa_outputs_lse_and_grads(Lq, Lk, block_q, block_k, is_causal):
    q, k, v = _qkv((2, 3, Lq, 8), Lk, Ev=6)
    out = flash_attention(q, k, v, is_causal=is_causal, block_q=block_q, block_k=block_k)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(out, ref, **TOL[torch.float64])
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL[torch.float64])
    _, lse = flash_attention_forward(q, k, v, is_causal=is_causal, block_q=block_q, block_k=block_k)
    torch.testing.assert_close(lse, _lse_reference(q, k, is_causal), **TOL[torch.float64])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("is_causal", [False, True])
def test_low_precision_matches_sdpa(dtype, is_causal):
    q, k, v = _qkv((2, 2, 45, 16), 45, dtype=dtype)
    out = flash_attention(q, k, v, is_causal=is_causal, block_q=16, block_k=32)
    assert out.dtype == dtype
    # reference: the same inputs in fp64, rounded to dtype once (what fp32 accumulation should achieve)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q64, k64, v64, is_causal=is_causal)
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])
    g = torch.randn(out.shape, dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v), g.to(dtype))
    want = torch.autograd.grad(ref, (q64, k64, v64), g)
    for a, b in zip(got, want):
        assert a.dtype == dtype
        torch.testing.assert_close(a.double(), b, atol=TOL[dtype]["atol"] * 5, rtol=TOL[dtype]["rtol"] * 5)


@pytest.mark.parametrize("is_causal", [False, True])
def test_logsumexp_equals_sdpa_cpu_flash_kernel(is_causal):
    """SDPA's CPU flash kernel returns its logsumexp too (a private op): ours must agree with it."""
    q, k, v = _qkv((2, 3, 37, 16), 37, dtype=torch.float32, grad=False)
    ref_out, ref_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal)
    out, lse = flash_attention_forward(q, k, v, is_causal=is_causal, block_q=16, block_k=8)
    torch.testing.assert_close(lse, ref_lse, **TOL[torch.float32])
    torch.testing.assert_close(out, ref_out, **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_logsumexp_is_fp32(dtype):
    q, k, v = _qkv((1, 2, 30, 8), 30, dtype=dtype, grad=False)
    _, lse = flash_attention_forward(q, k, v, block_q=8, block_k=8)
    assert lse.dtype == torch.float32
    torch.testing.assert_close(lse.double(), _lse_reference(q, k, False), atol=1e-5, rtol=1e-5)


def test_custom_scale_and_three_dim_inputs():
    q, k, v = _qkv((4, 21, 8), 17)                        # (N, L, E): no head axis
    out = flash_attention(q, k, v, scale=0.3, block_q=5, block_k=4)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.3), **TOL[torch.float64])


def test_gradcheck():
    q, k, v = _qkv((1, 2, 7, 4), 9)
    assert torch.autograd.gradcheck(lambda *t: flash_attention(*t, is_causal=True, block_q=3, block_k=2),
                                    (q, k, v))


def test_explicit_backward_equals_autograd():
    q, k, v = _qkv((2, 2, 23, 8), 29)
    out, lse = flash_attention_forward(q, k, v, is_causal=True, block_q=8, block_k=4)
    g = torch.randn_like(out)
    dq, dk, dv = flash_attention_backward(q, k, v, out, lse, g, is_causal=True, block_q=8, block_k=4)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    want = torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip((dq, dk, dv), want):
        torch.testing.assert_close(a, b, **TOL[torch.float64])


def test_online_softmax_over_tiles_equals_softmax():
    """Folding key tiles one at a time (scores in base 2) reproduces softmax(S) V and logsumexp(S)."""
    S = torch.randn(3, 5, 12, dtype=torch.float64) * 4
    V = torch.randn(3, 12, 7, dtype=torch.float64)
    m = torch.full((3, 5, 1), -math.inf, dtype=torch.float64)
    l, acc = torch.zeros(3, 5, 1, dtype=torch.float64), torch.zeros(3, 5, 7, dtype=torch.float64)
    for j in range(0, 12, 5):
        m, l, acc = online_softmax_step(m, l, acc, S[..., j:j + 5] * LOG2E, V[:, j:j + 5])
    out, lse = online_softmax_finish(m, l, acc)
    torch.testing.assert_close(out, torch.softmax(S, -1) @ V)
    torch.testing.assert_close(lse, torch.logsumexp(S, -1))


def test_fully_masked_tile_and_row_give_zeros_not_nan():
    S = torch.randn(1, 2, 4, dtype=torch.float64)
    S[0, 0] = -math.inf                                   # row 0: this tile is fully masked
    V = torch.randn(1, 4, 3, dtype=torch.float64)
    m = torch.full((1, 2, 1), -math.inf, dtype=torch.float64)
    l, acc = torch.zeros(1, 2, 1, dtype=torch.float64), torch.zeros(1, 2, 3, dtype=torch.float64)
    m, l, acc = online_softmax_step(m, l, acc, S * LOG2E, V)
    assert m[0, 0].item() == -math.inf and l[0, 0].item() == 0 and torch.all(acc[0, 0] == 0)
    out, lse = online_softmax_finish(m, l, acc)
    assert torch.all(out[0, 0] == 0) and lse[0, 0].item() == -math.inf
    torch.testing.assert_close(out[0, 1], torch.softmax(S[0, 1], -1) @ V[0])
    # a later visible tile still works after a fully masked one
    S2 = torch.randn(1, 2, 4, dtype=torch.float64)
    m, l, acc = online_softmax_step(m, l, acc, S2 * LOG2E, V)
    out, _ = online_softmax_finish(m, l, acc)
    full = torch.cat([S, S2], -1)
    torch.testing.assert_close(out, torch.softmax(full, -1) @ torch.cat([V, V], 1))


def test_empty_keys_give_zero_output_and_grad():
    q, k, v = _qkv((1, 1, 3, 4), 0)
    out = flash_attention(q, k, v)
    assert torch.equal(out, torch.zeros_like(out))
    (gq,) = torch.autograd.grad(out.sum(), (q,))
    assert torch.equal(gq, torch.zeros_like(gq))


def test_causal_tile_mask():
    assert causal_tile_mask(8, 16, 0, 8) is None                       # below the diagonal: fully visible
    m = causal_tile_mask(4, 8, 4, 8)
    assert torch.equal(m, torch.ones(4, 4, dtype=torch.bool).tril())
    torch.testing.assert_close(causal_tile_mask(0, 3, 1, 4), torch.ones(3, 4, dtype=torch.bool).tril()[:, 1:])


class _Recorder(TorchDispatchMode):
    """Records every op and the number of elements of every tensor it creates."""

    def __init__(self):
        super().__init__()
        self.numels, self.ops = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append(func.overloadpacket.__name__)
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                self.numels.append(t.numel())
        return out


def _largest_created(L, backward, is_causal, block=32):
    q, k, v = _qkv((1, 1, L, 8), L, grad=backward)
    rec = _Recorder()
    with rec:
        out = flash_attention(q, k, v, is_causal=is_causal, block_q=block, block_k=block)
        if backward:
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    return max(rec.numels)


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("is_causal", [False, True])
def test_largest_intermediate_grows_linearly(backward, is_causal):
    """Never an Lq×Lk tensor: the largest tensor created grows like L (×2 when L doubles), not L²."""
    sizes = [128, 256, 512]
    largest = [_largest_created(L, backward, is_causal) for L in sizes]
    for L, n in zip(sizes, largest):
        assert n < L * L // 8, (L, n)
    for a, b in zip(largest, largest[1:]):
        assert b <= 2 * a + 64, largest          # linear (a quadratic would give 4×)


def test_causal_skips_tiles_above_the_diagonal():
    def bmm_calls(is_causal, backward):
        q, k, v = _qkv((1, 1, 64, 4), 64, grad=backward)
        rec = _Recorder()
        with rec:
            out = flash_attention(q, k, v, is_causal=is_causal, block_q=16, block_k=16)
            if backward:
                torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        return sum(op in ("bmm", "baddbmm", "baddbmm_") for op in rec.ops)
    n = 64 // 16
    # forward: one S = QKᵀ and one P̃V per tile; 4×4 tiles, causal keeps 4·5/2 = 10
    assert bmm_calls(False, False) == 2 * n * n
    assert bmm_calls(True, False) == 2 * n * (n + 1) // 2
    # backward adds five matmuls per visited tile (S, dV, dP, dQ, dK)
    assert bmm_calls(True, True) - bmm_calls(True, False) == 5 * n * (n + 1) // 2


def test_does_not_save_probabilities_for_backward():
    q, k, v = _qkv((1, 2, 128, 8), 128)
    out = flash_attention(q, k, v, block_q=32, block_k=32)
    saved = [t.numel() for t in out.grad_fn.saved_tensors]
    assert max(saved) == 2 * 128 * 8        # q, k, v, O: L×E each; logsumexp: L — never L×L


@pytest.mark.parametrize("kwargs,match", [
    (dict(k=torch.randn(1, 2, 5, 6)), r"q and k must have the same embedding size E.*E=8.*E=6"),
    (dict(v=torch.randn(1, 2, 4, 8)), r"k and v must agree.*\(1, 2, 5, 8\).*\(1, 2, 4, 8\)"),
    (dict(k=torch.randn(1, 3, 5, 8), v=torch.randn(1, 3, 5, 8)), r"leading .*\(1, 2, 5, 8\).*\(1, 3, 5, 8\)"),
    (dict(v=torch.randn(1, 2, 5, 8, dtype=torch.float64)), r"share a dtype"),
    (dict(q=torch.ones(1, 2, 5, 8, dtype=torch.long)), r"floating-point.*torch.int64"),
    (dict(q=[1.0]), r"q must be a torch.Tensor"),
    (dict(q=torch.randn(8)), r"at least 2 dimensions.*\(8,\)"),
    (dict(block_q=0), r"block_q must be a positive integer, got 0"),
    (dict(block_k=2.5), r"block_k must be a positive integer, got 2.5"),
    (dict(scale=float("nan")), r"scale must be a finite number"),
])
def test_value_errors(kwargs, match):
    args = dict(q=torch.randn(1, 2, 5, 8), k=torch.randn(1, 2, 5, 8), v=torch.randn(1, 2, 5, 8))
    args.update(kwargs)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(ValueError, match=match):
        flash_attention(q, k, v, **args)
    with pytest.raises(ValueError, match=match):
        flash_attention_forward(q, k, v, **args)


# ---- the tuned forward (attn_course.flash_tuned) ----

from attn_course import flash_tuned  # noqa: E402
from attn_course.flash_tuned import flash_attention_tuned  # noqa: E402


@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_tuned_fp64_matches_sdpa_on_random_shapes(seed, is_causal, lazy):
    """Random (B, H, Lq, Lk, E, Ev) and tiles, L rarely a multiple of the tile; scores of scale up to 4 so
    that some later tiles raise the maximum (the lazy path's exact recompute); a tile budget that puts the
    B·H heads in groups of 1 to B·H (a last group smaller than the others included)."""
    g = torch.Generator().manual_seed(seed)
    B, H = (int(x) for x in torch.randint(1, 4, (2,), generator=g))
    Lq, Lk = (int(x) for x in torch.randint(1, 130, (2,), generator=g))
    E, Ev = (int(x) for x in torch.randint(1, 17, (2,), generator=g))
    bq, bk = (int(x) for x in torch.randint(1, 48, (2,), generator=g))
    q, k, v = (torch.randn(B, H, L, e, dtype=torch.float64, generator=g) * 2
               for L, e in ((Lq, E), (Lk, E), (Lk, Ev)))
    group = int(torch.randint(1, B * H + 1, (1,), generator=g))                  # heads per score tile
    tile_bytes = group * min(bq, Lq) * max(min(bk, Lk), min(bq, Lq) if is_causal else 0) * 8
    out = flash_attention_tuned(q, k, v, is_causal=is_causal, block_q=bq, block_k=bk, lazy_rescale=lazy,
                                tile_bytes=tile_bytes)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(out, ref, **TOL[torch.float64])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("is_causal", [False, True])
def test_tuned_low_precision_matches_sdpa(dtype, is_causal):
    q, k, v = _qkv((2, 3, 300, 16), 300, dtype=dtype, grad=False)
    out = flash_attention_tuned(q, k, v, is_causal=is_causal, block_q=64, block_k=96)
    assert out.dtype == dtype
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=is_causal).to(dtype)
    torch.testing.assert_close(out, ref, **TOL[dtype])


def test_tuned_processes_heads_in_groups_whose_tile_fits_the_budget():
    """tile_bytes = 2 tiles of fp64: 5 heads go through every key tile as 2 + 2 + 1 (three matmuls per tile)."""
    q, k, v = _qkv((1, 5, 32, 4), 32, grad=False)
    rec = _Recorder()
    with rec:
        out = flash_attention_tuned(q, k, v, block_q=16, block_k=8, tile_bytes=2 * 16 * 8 * 8)
    assert rec.ops.count("baddbmm") == 3 * 2 * 4                      # 3 groups × 2 query blocks × 4 key tiles
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), **TOL[torch.float64])


def test_tuned_default_tiles_and_custom_scale_and_three_dims():
    q, k, v = _qkv((3, 600, 8), 700, Ev=5, grad=False)
    out = flash_attention_tuned(q, k, v, scale=0.3)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.3), **TOL[torch.float64])


def test_tuned_lazy_rescale_recomputes_a_tile_whose_scores_outgrow_the_maximum(monkeypatch):
    """Scores that grow along the keys (key j ∝ j): every later tile overflows the first tile's maximum, so
    every tile takes the exact step — and the result still equals SDPA; random scores never do."""
    calls = []
    real = flash_tuned._exact_step
    monkeypatch.setattr(flash_tuned, "_exact_step", lambda *a, **kw: calls.append(kw["first"]) or real(*a, **kw))
    u = torch.randn(1, 1, 1, 8, dtype=torch.float64)
    q = u.expand(1, 1, 16, 8)
    k = u * torch.arange(64, dtype=torch.float64).view(1, 1, 64, 1) * 2
    v = torch.randn(1, 1, 64, 4, dtype=torch.float64)
    out = flash_attention_tuned(q, k, v, block_q=16, block_k=8)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), **TOL[torch.float64])
    assert calls.count(True) == 1 and calls.count(False) == 7          # 1 query block × 8 key tiles
    calls.clear()
    q, k, v = _qkv((1, 1, 16, 8), 64, grad=False)
    flash_attention_tuned(q, k, v, block_q=16, block_k=8)
    assert calls == [True]                                              # only the first tile: no rescale


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape_q,Lk", [((2, 3, 0, 4), 5), ((2, 3, 4, 4), 0), ((0, 3, 4, 4), 4), ((2, 3, 0, 4), 0)])
def test_tuned_empty_inputs_like_sdpa(shape_q, Lk, is_causal):
    q, k, v = _qkv(shape_q, Lk, Ev=3, grad=False)
    out = flash_attention_tuned(q, k, v, is_causal=is_causal)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref)


def test_tuned_skips_causal_tiles_and_masks_only_the_diagonal():
    """Causal: per query block of 16, the key tiles before it (8 wide) and one diagonal 16×16 tile."""
    q, k, v = _qkv((1, 1, 64, 4), 64, grad=False)
    for is_causal, tiles in ((False, 4 * 8), (True, sum(q0 // 8 + 1 for q0 in range(0, 64, 16)))):
        rec = _Recorder()
        with rec:
            flash_attention_tuned(q, k, v, is_causal=is_causal, block_q=16, block_k=8)
        assert rec.ops.count("baddbmm") == tiles                        # one S − m = Q Kᵀ − m per tile
        assert rec.ops.count("masked_fill_") == (4 if is_causal else 0)


def test_tuned_memory_is_one_tile_not_quadratic():
    """The largest tensor created: the output/Kᵀ (L × E) or the one score tile, whatever L is."""
    for L in (256, 1024):
        q, k, v = _qkv((1, 2, L, 8), L, grad=False)
        rec = _Recorder()
        with rec:
            flash_attention_tuned(q, k, v, block_q=32, block_k=64)
        assert max(rec.numels) == max(2 * L * 8, 2 * 32 * 64), (L, max(rec.numels))


def test_tuned_value_errors():
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match=r"q and k must have the same embedding size E.*E=8.*E=6"):
        flash_attention_tuned(q, torch.randn(1, 2, 5, 6), torch.randn(1, 2, 5, 6))
    with pytest.raises(ValueError, match=r"block_k must be a positive integer, got 0"):
        flash_attention_tuned(q, q, q, block_k=0)
    with pytest.raises(ValueError, match=r"forward-only"):
        flash_attention_tuned(q.clone().requires_grad_(), q, q)
    with torch.no_grad():
        flash_attention_tuned(q.clone().requires_grad_(), q, q)          # no graph to lose: fine


# ---- IO simulation (attn_course.iosim) ----

from attn_course import iosim  # noqa: E402


def test_naive_io_closed_form():
    N, d = 100, 8
    assert iosim.naive_io(N, d).total == 4 * N * d + 4 * N * N          # read Q, K, V, write O; S and P written and read


@pytest.mark.parametrize("N,d,bq,bk", [(100, 8, 30, 7), (64, 4, 16, 16), (1000, 32, 64, 128)])
def test_tiled_io_closed_form(N, d, bq, bk):
    io = iosim.tiled_io(N, d, block_q=bq, block_k=bk)
    assert io.reads == N * d + math.ceil(N / bq) * 2 * N * d
    assert io.writes == N * d + N


def test_fa1_order_closed_form():
    """Dao et al. 2022, Algorithm 1: O, ℓ, m initialised in HBM; K, V read once; Q_i, O_i, ℓ_i, m_i read and
    O_i, ℓ_i, m_i written once per (K/V block, query block)."""
    for N, d, bq, bk in [(100, 8, 30, 7), (64, 4, 16, 16), (1000, 32, 64, 128)]:
        io = iosim.tiled_io(N, d, block_q=bq, block_k=bk, order="fa1")
        Tc = math.ceil(N / bk)
        assert io.reads == 2 * N * d + Tc * (2 * N * d + 2 * N)
        assert io.writes == N * d + 2 * N + Tc * (N * d + 2 * N)


def test_backward_closed_forms():
    N, d = 100, 8
    # Algorithm 3: P, dP, dS are N×N; P read three times (steps 1, 3), dP once, dS twice
    assert iosim.naive_backward_io(N, d) == iosim.IOCount(reads=5 * N * N + 5 * N * d, writes=2 * N * N + 3 * N * d)
    for N, d, bq, bk in [(100, 8, 30, 7), (1000, 32, 64, 128)]:
        io = iosim.tiled_backward_io(N, d, block_q=bq, block_k=bk)
        Tc = math.ceil(N / bk)
        assert io.reads == 4 * N * d + Tc * (4 * N * d + 2 * N)
        assert io.writes == N + 3 * N * d + Tc * N * d


def _visible_tiles(N, bq, bk):
    """(query block start, query block end, key block start, key block end) of every tile a causal mask
    does not empty, found by brute force on the element mask."""
    mask = torch.ones(N, N, dtype=torch.bool).tril()
    return [(q0, min(q0 + bq, N), k0, min(k0 + bk, N)) for q0 in range(0, N, bq) for k0 in range(0, N, bk)
            if mask[q0:q0 + bq, k0:k0 + bk].any()]


@pytest.mark.parametrize("N,d,bq,bk", [(100, 8, 30, 7), (97, 4, 16, 32), (256, 16, 64, 64)])
def test_causal_counts_visit_only_nonempty_tiles(N, d, bq, bk):
    tiles = _visible_tiles(N, bq, bk)
    fa2 = iosim.tiled_io(N, d, block_q=bq, block_k=bk, is_causal=True, order="fa2")
    assert fa2.reads == N * d + sum(2 * (k1 - k0) * d for _, _, k0, k1 in tiles)
    assert fa2.writes == N * d + N
    fa1 = iosim.tiled_io(N, d, block_q=bq, block_k=bk, is_causal=True, order="fa1")
    assert fa1.reads == 2 * N * d + sum((2 * d + 2) * (q1 - q0) for q0, q1, _, _ in tiles)
    assert fa1.writes == N * d + 2 * N + sum((d + 2) * (q1 - q0) for q0, q1, _, _ in tiles)
    bwd = iosim.tiled_backward_io(N, d, block_q=bq, block_k=bk, is_causal=True)
    assert bwd.reads == 4 * N * d + sum((4 * d + 2) * (q1 - q0) for q0, q1, _, _ in tiles)
    assert bwd.writes == N + 3 * N * d + sum(d * (q1 - q0) for q0, q1, _, _ in tiles)


def test_blocks_for_sram_follow_the_papers_and_fit():
    d = 64
    assert iosim.blocks_for_sram(2**16, d) == (64, 256)                   # FA1: B_c = ⌈M/4d⌉, B_r = min(B_c, d)
    assert iosim.blocks_for_sram(2**16, d, order="fa2") == (256, 64)      # FA2 order: the outer query block grows
    assert iosim.blocks_for_sram(1000, d) == (4, 4)                        # ⌈1000/256⌉ = 4
    for M in (2**e for e in range(8, 23)):                                 # M >= 4d: one row of Q, K, V, O fits
        for order in iosim.ORDERS:
            bq, bk = iosim.blocks_for_sram(M, d, order)
            assert iosim.sram_elements(bq, bk, d) <= 1.25 * M + 2 * bq + 2 * d + 1


def test_both_orders_follow_n2d2_over_m_between_d_and_nd_and_the_mix_plateaus():
    """Theorem 2's Θ(N²d²/M) for d ≤ M ≤ Nd: with each paper's blocks the count over N²d²/M stays within
    a constant factor on [4d, Nd]; beyond Nd it floors at reading the inputs once. FA2's loop order with
    FA1's capped query block stops falling at M = 4d² (the artefact of an earlier version of the lesson)."""
    N, d = 1024, 16
    law = lambda M: N * N * d * d / M                                       # noqa: E731
    Ms = [2**e for e in range(8, 15)]                                       # 16d = 2^8 ... Nd = 2^14
    for order in iosim.ORDERS:
        r = []
        for M in Ms:
            bq, bk = iosim.blocks_for_sram(M, d, order)
            r.append(iosim.tiled_io(N, d, block_q=bq, block_k=bk, order=order).total / law(M))
        assert max(r) / min(r) < 1.3, (order, r)
        bq, bk = iosim.blocks_for_sram(64 * N * d, d, order)                # far beyond Nd: one block
        assert iosim.tiled_io(N, d, block_q=bq, block_k=bk, order=order).total < 8 * N * d
    mixed = []
    for M in (4 * d * d, 16 * d * d):
        bq, bk = iosim.blocks_for_sram(M, d, "fa1")                         # capped B_r used as FA2's outer block
        mixed.append(iosim.tiled_io(N, d, block_q=bq, block_k=bk, order="fa2").total)
    assert mixed[0] == mixed[1]                                             # 4x the SRAM, not one element less


def test_tiled_beats_naive_forward_and_backward_and_causal_halves():
    N, d = 4096, 64
    full = iosim.tiled_io(N, d, block_q=128, block_k=128).reads
    causal = iosim.tiled_io(N, d, block_q=128, block_k=128, is_causal=True).reads
    assert 0.5 < causal / full < 0.55
    assert iosim.tiled_io(N, d, block_q=128, block_k=128).total < iosim.naive_io(N, d).total
    bq, bk = iosim.blocks_for_sram(2**16, d)                                # backward: outer loop over K/V, FA1's blocks
    assert iosim.tiled_backward_io(N, d, block_q=bq, block_k=bk).total < iosim.naive_backward_io(N, d).total / 4


def test_iosim_value_errors():
    with pytest.raises(ValueError, match="block_q must be a positive integer, got 0"):
        iosim.tiled_io(10, 4, block_q=0, block_k=4)
    with pytest.raises(ValueError, match="M must be a positive integer"):
        iosim.blocks_for_sram(-1, 64)
    with pytest.raises(ValueError, match="order must be one of"):
        iosim.tiled_io(10, 4, block_q=2, block_k=2, order="fa3")
    with pytest.raises(ValueError, match="block_k must be a positive integer"):
        iosim.tiled_backward_io(10, 4, block_q=2, block_k=0)


# ---- tile explorer (attn_course.widgets.flash) ----

from attn_course.widgets.flash import FlashTileExplorer, tile_trace  # noqa: E402


def test_tile_trace_states():
    S = torch.randn(5, 11, dtype=torch.float64) * 2
    V = torch.randn(11, 3, dtype=torch.float64)
    states = tile_trace(S, V, block_k=4)
    assert [s.keys for s in states] == [(0, 4), (4, 8), (8, 11)]
    for st in states:                                         # each state = exact softmax over the keys seen
        k1 = st.keys[1]
        torch.testing.assert_close(st.partial, torch.softmax(S[:, :k1], -1) @ V[:k1])
        torch.testing.assert_close(st.m, S[:, :k1].amax(-1))
        torch.testing.assert_close(st.weights[:, :k1], torch.softmax(S[:, :k1], -1))
        assert torch.all(st.weights[:, k1:] == 0)
    for prev, st in zip(states, states[1:]):                  # α = exp(m_old − m_new) ≤ 1
        torch.testing.assert_close(st.alpha, torch.exp(prev.m - st.m))
    assert torch.all(states[0].alpha == 0)                    # nothing to rescale before the first tile


def test_explorer_update_and_widget():
    ex = FlashTileExplorer(block_k=4)
    state, fig = ex.update(step=99, query=2)                  # clamped to the last tile
    assert state.step == len(ex.states) == 3
    torch.testing.assert_close(state.partial, ex.final)
    assert any("query C" in ax.get_title() for ax in fig.axes)
    box = ex.widget()
    box.controls["step"].value = 2                            # redraws without a browser
    assert box.controls["step"].max == 3
    with pytest.raises(ValueError, match=r"S must have shape \(L=3, L=3\) for 3 tokens, got \(3, 4\)"):
        FlashTileExplorer(tokens="abc", S=torch.randn(3, 4), V=torch.randn(3, 2))
    with pytest.raises(ValueError, match="same Lk"):
        tile_trace(torch.randn(2, 5), torch.randn(4, 2), 2)


# ---- demo: the reversal model trained through flash_attention ----

def test_flash_demo_trains_like_attention():
    from attn_course.demos.flash import train_flash_reversal
    from attn_course.demos.reverse import train_reversal
    _, flash_res = train_flash_reversal(steps=20, progress=False)
    _, plain_res = train_reversal(steps=20, progress=False)
    assert max(abs(a - b) for a, b in zip(flash_res.losses, plain_res.losses)) < 1e-4
    assert flash_res.losses[-1] < flash_res.losses[0]
