"""TransformerBlock against an independent fp64 per-head formula; causality, masks, QK-norm, RoPE conventions."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from attn_course import RMSNorm, TransformerBlock
from attn_course.rope import interleave_perm


def _rms(x, g, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def _rope_complex(x, base=10000.0):
    """RoPE in the complex form (Su et al. 2021, §3.2.2) on neighbour pairs, fp64: x (..., L, d)."""
    L, d = x.shape[-2:]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    rot = torch.polar(torch.ones(L, d // 2, dtype=torch.float64), torch.arange(L, dtype=torch.float64)[:, None] * theta)
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * rot).flatten(-2)


def _reference(blk, x, *, causal=True, window=None, interleaved=False, bias=None):
    """Per-head loop in fp64 written from the equations (pre-norm, RMSNorm, QK-norm, RoPE, SwiGLU)."""
    P = {n: p.detach().double() for n, p in blk.named_parameters()}
    x = x.double()
    B, L, D = x.shape
    H, Hkv, dh = blk.num_heads, blk.num_kv_heads, blk.head_dim
    h = _rms(x, P["norm1.weight"])
    perm = interleave_perm(dh)
    heads = []
    for i in range(H):
        j = i // (H // Hkv)
        q = h @ P["attn.q_proj.weight"][i * dh:(i + 1) * dh].T
        k = h @ P["attn.k_proj.weight"][j * dh:(j + 1) * dh].T
        v = h @ P["attn.v_proj.weight"][j * dh:(j + 1) * dh].T
        if "q_norm.weight" in P:
            q, k = _rms(q, P["q_norm.weight"]), _rms(k, P["k_norm.weight"])
        if blk.rope:
            if interleaved:
                q, k = _rope_complex(q), _rope_complex(k)
            else:     # half-split = interleaved after the channel permutation
                inv = torch.argsort(perm)
                q, k = _rope_complex(q[..., perm])[..., inv], _rope_complex(k[..., perm])[..., inv]
        s = q @ k.transpose(-1, -2) / math.sqrt(dh)
        if bias is not None:
            s = s + bias[i].double()
        ii, jj = torch.arange(L)[:, None], torch.arange(L)[None, :]
        allowed = torch.ones(L, L, dtype=torch.bool)
        if causal:
            allowed &= jj <= ii
        if window is not None:
            allowed &= (ii - jj).abs() < window
        s = s.masked_fill(~allowed, float("-inf"))
        heads.append(torch.softmax(s, -1) @ v)
    y = x + torch.cat(heads, -1) @ P["attn.out_proj.weight"].T
    u = _rms(y, P["norm2.weight"])
    return y + (F.silu(u @ P["ffn.w1.weight"].T) * (u @ P["ffn.w3.weight"].T)) @ P["ffn.w2.weight"].T


def _randomise(blk, gen):
    with torch.no_grad():
        for p in blk.parameters():          # gains away from 1 so a wrong norm axis would show
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() == 1 else p.shape[-1] ** -0.5)
                    + (1.0 if p.dim() == 1 else 0.0))
    return blk


CONFIGS = [dict(num_heads=4), dict(num_heads=4, num_kv_heads=2), dict(num_heads=4, num_kv_heads=1, qk_norm=True),
           dict(num_heads=2, qk_norm=True, window=3), dict(num_heads=4, rope=False), dict(num_heads=4, window=2, rope=False)]


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("causal", [True, False])
def test_matches_fp64_reference(cfg, causal):
    gen = torch.Generator().manual_seed(0)
    blk = _randomise(TransformerBlock(16, ffn_dim=24, **cfg), gen).eval()
    x = torch.randn(3, 7, 16, generator=gen)
    assert_close(blk(x, is_causal=causal).double(), _reference(blk, x, causal=causal, window=cfg.get("window")),
                 atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_fast_and_explicit_paths_agree(cfg):
    gen = torch.Generator().manual_seed(1)
    blk = _randomise(TransformerBlock(16, **cfg), gen).eval()
    h = torch.randn(2, 9, 16, generator=gen)
    for causal in (True, False):
        fast, none = blk.attend(h, is_causal=causal)
        slow, w = blk.attend(h, is_causal=causal, need_weights=True)
        assert none is None and w.shape == (2, blk.num_heads, 9, 9)
        assert_close(fast, slow, atol=1e-5, rtol=1e-4)
        assert_close(w.sum(-1), torch.ones(2, blk.num_heads, 9))
        if causal:
            assert (w.triu(1) == 0).all()


@pytest.mark.parametrize("cfg", CONFIGS)
def test_causality_future_tokens_never_change_the_past(cfg):
    gen = torch.Generator().manual_seed(2)
    blk = _randomise(TransformerBlock(16, **cfg), gen).eval()
    x = torch.randn(2, 10, 16, generator=gen)
    for t in range(10):
        x2 = x.clone()
        x2[:, t:] = torch.randn(2, 10 - t, 16, generator=gen)
        y, y2 = blk(x), blk(x2)
        assert_close(y[:, :t], y2[:, :t], atol=1e-6, rtol=1e-5)
        assert not torch.allclose(y[:, t:], y2[:, t:])
    # and without causality the past does change (token 1 lies inside every window)
    x2 = x.clone()
    x2[:, 1] += 1.0
    assert not torch.allclose(blk(x, is_causal=False)[:, 0], blk(x2, is_causal=False)[:, 0])


def test_window_limits_the_receptive_field_of_one_block():
    gen = torch.Generator().manual_seed(3)
    blk = _randomise(TransformerBlock(16, 4, window=3), gen).eval()
    x = torch.randn(1, 12, 16, generator=gen)
    x2 = x.clone()
    x2[:, 4] += 1.0                           # token 4 is seen by queries 4, 5, 6 only (i - j < 3)
    changed = (blk(x) - blk(x2)).abs().amax(-1)[0] > 1e-6
    assert changed.tolist() == [4 <= i <= 6 for i in range(12)]


def test_masks_combine_with_causality_bool_and_float():
    gen = torch.Generator().manual_seed(4)
    blk = _randomise(TransformerBlock(16, 4), gen).eval()
    x = torch.randn(2, 6, 16, generator=gen)
    keep = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    keep[0, ..., 4:] = False                  # padding on the first sequence
    _, w = blk.attend(blk.norm1(x), attn_mask=keep, need_weights=True)
    assert (w.triu(1) == 0).all() and (w[0, ..., 4:] == 0).all()
    assert_close(blk(x, attn_mask=keep), blk(x, attn_mask=keep, is_causal=True))
    bias = torch.randn(4, 6, 6, generator=gen)          # e.g. ALiBi: added, and the future still hidden
    assert_close(blk(x, attn_mask=bias).double(), _reference(blk, x, bias=bias), atol=1e-5, rtol=1e-4)


def test_qk_norm_logits_invariant_to_scaling_the_projections():
    gen = torch.Generator().manual_seed(5)
    blk = _randomise(TransformerBlock(16, 4, qk_norm=True), gen).eval()
    plain = _randomise(TransformerBlock(16, 4, qk_norm=False), torch.Generator().manual_seed(5)).eval()
    h = torch.randn(2, 8, 16, generator=gen)

    def logits(b):
        q, k, _ = b.qkv(h)
        return q @ k.transpose(-2, -1)

    before, before_plain = logits(blk), logits(plain)
    for b in (blk, plain):
        with torch.no_grad():
            b.attn.q_proj.weight.mul_(7.0)
            b.attn.k_proj.weight.mul_(3.0)
    assert_close(logits(blk), before, atol=1e-4, rtol=1e-4)   # RMSNorm(c·v) = RMSNorm(v) (up to eps)
    assert_close(logits(plain), 21.0 * before_plain, atol=1e-4, rtol=1e-4)   # without it they scale by 7·3


def test_qk_norm_modules_and_parameter_count():
    d, H, Hkv, f = 32, 4, 2, 40
    blk = TransformerBlock(d, H, Hkv, ffn_dim=f, qk_norm=True)
    dh = d // H
    expected = d * d + 2 * d * Hkv * dh + d * d + 3 * d * f + 2 * d + 2 * dh   # q, k+v, o, SwiGLU, 2 norms, qk-norm
    assert sum(p.numel() for p in blk.parameters()) == expected
    assert isinstance(blk.q_norm, RMSNorm) and blk.q_norm.weight.shape == (dh,)
    off = TransformerBlock(d, H, Hkv, ffn_dim=f)
    assert isinstance(off.q_norm, torch.nn.Identity) and isinstance(off.k_norm, torch.nn.Identity)
    assert sum(p.numel() for p in off.parameters()) == expected - 2 * dh
    assert TransformerBlock(d, H).num_kv_heads == H                     # defaults to multi-head
    assert TransformerBlock(96, 4).ffn_dim == 256                        # 2/3 of 4·96, multiple of 8


def test_interleaved_checkpoint_conversion_by_permuting_projection_rows():
    """A half-split checkpoint becomes an interleaved one by permuting q/k rows within each head (and
    the QK-norm gains): the block's output is unchanged."""
    gen = torch.Generator().manual_seed(6)
    half = _randomise(TransformerBlock(32, 4, 2, qk_norm=True), gen).eval()
    inter = TransformerBlock(32, 4, 2, qk_norm=True, rope_interleaved=True).eval()
    sd = {k: v.clone() for k, v in half.state_dict().items()}
    perm = interleave_perm(half.head_dim)
    for name, heads in (("attn.q_proj.weight", 4), ("attn.k_proj.weight", 2)):
        w = sd[name].view(heads, half.head_dim, -1)
        sd[name] = w[:, perm].reshape(-1, w.shape[-1])
    for name in ("q_norm.weight", "k_norm.weight"):
        sd[name] = sd[name][perm]
    x = torch.randn(2, 9, 32, generator=gen)
    inter.load_state_dict(half.state_dict())
    assert not torch.allclose(inter(x), half(x), atol=1e-3)          # the raw checkpoint does not transfer
    inter.load_state_dict(sd)
    assert_close(inter(x), half(x), atol=1e-5, rtol=1e-4)
    assert_close(inter(x).double(), _reference(inter, x, interleaved=True), atol=1e-5, rtol=1e-4)


def test_rope_scores_depend_on_relative_position_only():
    blk = _randomise(TransformerBlock(16, 2), torch.Generator().manual_seed(7)).eval()
    tok = torch.randn(1, 1, 16).expand(1, 12, 16)                      # the same token at every position
    q, k, _ = blk.qkv(tok)
    s = q @ k.transpose(-2, -1)                                        # (1, H, 12, 12)
    for off in range(-5, 6):
        diag = torch.diagonal(s, offset=off, dim1=-2, dim2=-1)
        assert_close(diag, diag[..., :1].expand_as(diag), atol=1e-4, rtol=1e-4)


def test_fp16_bf16_keep_dtype():
    blk = TransformerBlock(16, 4, qk_norm=True)
    for dt in (torch.bfloat16, torch.float16):
        b = TransformerBlock(16, 4, qk_norm=True).to(dt)
        b.load_state_dict(blk.state_dict())
        x = torch.randn(2, 5, 16)
        y = b(x.to(dt))
        assert y.dtype == dt and torch.isfinite(y).all()
        assert_close(y.float(), blk(x), atol=0.1, rtol=0.05)


def test_value_errors_name_the_sizes():
    with pytest.raises(ValueError, match="d_model=30 is not divisible by num_heads=4"):
        TransformerBlock(30, 4)
    with pytest.raises(ValueError, match="num_heads=4 is not divisible by num_kv_heads=3"):
        TransformerBlock(16, 4, 3)
    with pytest.raises(ValueError, match="even head_dim"):
        TransformerBlock(12, 4)
    TransformerBlock(12, 4, rope=False)                                 # odd head_dim is fine without RoPE
    with pytest.raises(ValueError, match="window"):
        TransformerBlock(16, 4, window=0)
    with pytest.raises(ValueError, match="ffn_dim"):
        TransformerBlock(16, 4, ffn_dim=-1)
    blk = TransformerBlock(16, 4)
    with pytest.raises(ValueError, match="expected d_model=16"):
        blk(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match="3 dimensions"):
        blk(torch.randn(5, 16))
    with pytest.raises(ValueError, match="does not broadcast"):
        blk(torch.randn(2, 5, 16), attn_mask=torch.ones(4, 4, dtype=torch.bool))


def test_fully_masked_rows_give_zeros_not_nan_on_both_paths():
    gen = torch.Generator().manual_seed(8)
    blk = _randomise(TransformerBlock(16, 4), gen).eval()
    x = torch.randn(2, 5, 16, generator=gen)
    keep = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    keep[0, ..., :2] = False                   # with causality, queries 0 and 1 of sample 0 see no key
    h = blk.norm1(x)
    fast, _ = blk.attend(h, attn_mask=keep)
    slow, w = blk.attend(h, attn_mask=keep, need_weights=True)
    assert torch.isfinite(fast).all() and torch.isfinite(slow).all()
    assert (fast[0, :2] == 0).all() and (w[0, :, :2] == 0).all()
    assert_close(fast, slow, atol=1e-5, rtol=1e-4)
    assert torch.isfinite(blk(x, attn_mask=keep)).all()
