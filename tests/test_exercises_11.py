"""Exercise set 11: the reference solutions (and alternatives in another style) pass every case; each
common mistake fails with the hint that names it."""
import math

import pytest
import torch

from attn_course import TransformerBlock
from attn_course.norm import RMSNorm
from attn_course.positions import sinusoidal_embedding
from attn_course.rope import apply_rope, interleave_perm

from attn_course.grading.exercises import get
import exercise_kit
from exercise_kit import assert_all_pass, assert_hint, results


# ---- 11_sinusoidal -----------------------------------------------------------------------------------

def sinusoidal(positions, dim, *, swap=False, cat=False, two=True):
    i = torch.arange(dim // 2)
    omega = 1.0 / 10000 ** ((2 if two else 1) * i / dim)
    a = positions[:, None].float() * omega
    s, c = (a.cos(), a.sin()) if swap else (a.sin(), a.cos())
    if cat:
        return torch.cat((c, s), -1)
    pe = torch.zeros(len(positions), dim)
    pe[:, 0::2], pe[:, 1::2] = s, c
    return pe


def test_sinusoidal_reference_and_package_pass():
    assert_all_pass("11_sinusoidal", sinusoidal)
    assert_all_pass("11_sinusoidal", lambda p, d: sinusoidal_embedding(p, d))


@pytest.mark.parametrize("mistake, hint", [(dict(swap=True), "sin goes in the even"), (dict(cat=True), "tutorial's layout"),
                                           (dict(two=False), "not i/d")])
def test_sinusoidal_mistakes_hinted(mistake, hint):
    assert_hint("11_sinusoidal", lambda p, d: sinusoidal(p, d, **mistake), hint)


# ---- 11_rope_interleaved -----------------------------------------------------------------------------

def rope_interleaved(x, positions, *, half=False, sign=1.0, two=True, zero=False):
    d = x.shape[-1]
    if zero:
        positions = torch.arange(x.shape[-2])
    theta = 10000.0 ** (-(2 if two else 1) * torch.arange(d // 2) / d)
    ang = positions[:, None] * theta
    cos, sin = ang.cos(), sign * ang.sin()
    if half:
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)


def rope_complex(x, positions):            # another style: complex multiplication (a popular Chinese attention tutorial)
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2).double() / d)
    rot = torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64), positions[:, None].double() * theta)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * rot).flatten(-2).to(x.dtype)


def test_rope_reference_alternative_and_package_pass():
    assert_all_pass("11_rope_interleaved", rope_interleaved)
    assert_all_pass("11_rope_interleaved", rope_complex)
    assert_all_pass("11_rope_interleaved", lambda x, p: apply_rope(x, p, interleaved=True))


@pytest.mark.parametrize("mistake, hint", [(dict(half=True), "half-split"), (dict(sign=-1.0), "wrong way"),
                                           (dict(two=False), "10000^(−i/d)")])
def test_rope_mistakes_hinted(mistake, hint):
    assert_hint("11_rope_interleaved", lambda x, p: rope_interleaved(x, p, **mistake), hint)


def test_rope_ignoring_positions_hinted_where_they_matter():
    assert_hint("11_rope_interleaved", lambda x, p: rope_interleaved(x, p, zero=True), "ignored the given positions")


def test_rope_forbids_the_package():
    assert "attn_course" in get("11_rope_interleaved").forbidden


# ---- 11_convert_checkpoint ---------------------------------------------------------------------------

def convert(w_q, w_k, num_heads, num_kv_heads, *, how="perm", k_heads=None, skip=None):
    def conv(w, heads):
        dh = w.shape[0] // heads
        p = torch.cat([torch.tensor([j, j + dh // 2]) for j in range(dh // 2)])
        if how == "inv":
            p = torch.argsort(p)
        if how == "global":
            n = w.shape[0]
            return w[torch.cat([torch.tensor([j, j + n // 2]) for j in range(n // 2)])]
        return torch.cat([w[h * dh:(h + 1) * dh][p] for h in range(heads)])
    q = w_q if skip == "q" else conv(w_q, num_heads)
    k = w_k if skip == "k" else conv(w_k, k_heads or num_kv_heads)
    return q, k


def convert_with_package(w_q, w_k, H, Hkv):
    dh = w_q.shape[0] // H
    p = interleave_perm(dh)
    return (w_q.view(H, dh, -1)[:, p].reshape(w_q.shape), w_k.view(Hkv, dh, -1)[:, p].reshape(w_k.shape))


def test_convert_reference_and_alternative_pass():
    assert_all_pass("11_convert_checkpoint", convert)
    assert_all_pass("11_convert_checkpoint", convert_with_package)


def test_convert_really_transfers_a_block():
    """The exercise's answer turns a half-split block into an interleaved one with identical outputs."""
    ex = get("11_convert_checkpoint")
    half = TransformerBlock(32, 4, 2).eval()
    inter = TransformerBlock(32, 4, 2, rope_interleaved=True).eval()
    sd = half.state_dict()
    case = type(ex.cases(torch.Generator().manual_seed(0))[0])(
        "block", {"w_q": sd["attn.q_proj.weight"], "w_k": sd["attn.k_proj.weight"]}, {"num_heads": 4, "num_kv_heads": 2})
    new = ex.expected(case)
    sd = dict(sd, **{"attn.q_proj.weight": new["w_q"], "attn.k_proj.weight": new["w_k"]})
    inter.load_state_dict(sd)
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(inter(x), half(x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mistake, hint, ignore", [
    (dict(how="inv"), "inverse permutation", ()),
    (dict(how="global"), "within each head", ()),
    (dict(k_heads="H"), "num_kv_heads heads", ("RuntimeError", "w_k: expected shape")),
    (dict(skip="k"), "keys need the same", ()),
    (dict(skip="q"), "queries need the same", ()),
])
def test_convert_mistakes_hinted(mistake, hint, ignore):
    def fn(wq, wk, H, Hkv):
        kw = dict(mistake)
        if kw.get("k_heads") == "H":
            kw["k_heads"] = H
        return convert(wq, wk, H, Hkv, **kw)
    assert_hint("11_convert_checkpoint", fn, hint, ignore=ignore)


# ---- 11_rmsnorm --------------------------------------------------------------------------------------

def rms_norm(x, weight, eps, *, mode="rms", dim=-1, gain=True):
    if mode == "layernorm":
        x0 = x - x.mean(dim, keepdim=True)
        y = x0 / torch.sqrt(x0.pow(2).mean(dim, keepdim=True) + eps)
    elif mode == "outside":
        y = x / (x.pow(2).mean(dim, keepdim=True).sqrt() + eps)
    elif mode == "var":
        y = x / torch.sqrt(x.var(dim, keepdim=True) + eps)
    else:
        y = x * torch.rsqrt(x.pow(2).mean(dim, keepdim=True) + eps)
    return y * weight if gain else y


def test_rmsnorm_reference_and_torch_pass():
    assert_all_pass("11_rmsnorm", rms_norm)

    def with_torch(x, w, eps):
        n = torch.nn.RMSNorm(x.shape[-1], eps=eps).to(x.dtype)
        with torch.no_grad():
            n.weight.copy_(w)
        return n(x).detach()
    assert_all_pass("11_rmsnorm", with_torch)

    def with_package(x, w, eps):
        n = RMSNorm(x.shape[-1], eps=eps).to(x.dtype)
        with torch.no_grad():
            n.weight.copy_(w)
        return n(x).detach()
    assert_all_pass("11_rmsnorm", with_package)


@pytest.mark.parametrize("mistake, hint", [
    (dict(mode="layernorm"), "that is LayerNorm"), (dict(mode="var"), "divided by the variance"),
    (dict(mode="outside"), "inside the square root"), (dict(dim=-2), "over the last axis"),
    (dict(gain=False), "multiply by the gain"),
])
def test_rmsnorm_mistakes_hinted(mistake, hint):
    assert_hint("11_rmsnorm", lambda x, w, eps: rms_norm(x, w, eps, **mistake), hint)


# ---- 11_block_params ---------------------------------------------------------------------------------

def block_params(d_model, num_heads, num_kv_heads, ffn_dim):
    dh = d_model // num_heads
    attn = d_model * d_model * 2 + 2 * d_model * num_kv_heads * dh
    return attn + 3 * d_model * ffn_dim + 2 * d_model + 2 * dh


def test_block_params_reference_and_counting_the_module_pass():
    assert_all_pass("11_block_params", block_params)
    assert_all_pass("11_block_params", lambda d_model, num_heads, num_kv_heads, ffn_dim: sum(
        p.numel() for p in TransformerBlock(d_model, num_heads, num_kv_heads, ffn_dim, qk_norm=True).parameters()))


@pytest.mark.parametrize("wrong, hint", [
    (lambda D, H, K, F: block_params(D, H, H, F), "num_kv_heads·head_dim"),
    (lambda D, H, K, F: block_params(D, H, K, F) - D * F, "three matrices"),
    (lambda D, H, K, F: block_params(D, H, K, F) - 2 * (D // H) + 2 * D, "not d_model"),
    (lambda D, H, K, F: block_params(D, H, K, F) - 2 * (D // H) + 2 * D, "over head_dim"),
    (lambda D, H, K, F: block_params(D, H, K, F) + 2 * (H - 1) * (D // H), "shared by all heads"),   # = 2·d_model
    (lambda D, H, K, F: block_params(D, H, K, F) - 2 * (D // H), "left out the QK-norm"),
    (lambda D, H, K, F: block_params(D, H, K, F) - 2 * D, "norm1, norm2"),
])
def test_block_params_mistakes_hinted(wrong, hint):
    assert_hint("11_block_params", lambda d_model, num_heads, num_kv_heads, ffn_dim: wrong(d_model, num_heads, num_kv_heads, ffn_dim), hint)


# ---- 11_fix_block_attention --------------------------------------------------------------------------

def _rope_half(t):
    L, d = t.shape[-2:]
    theta = 10000.0 ** (-torch.arange(0, d, 2) / d)
    a = torch.arange(L)[:, None] * theta
    cos, sin = torch.cat((a.cos(), a.cos()), -1), torch.cat((a.sin(), a.sin()), -1)
    return t * cos + torch.cat((-t[..., d // 2:], t[..., : d // 2]), -1) * sin


def attend(x, W_q, W_k, W_v, g_q, g_k, num_heads, *, bugs=()):
    B, L, D = x.shape
    dh = D // num_heads
    q, k, v = ((x @ W.T).view(B, L, num_heads, dh).transpose(1, 2) for W in (W_q, W_k, W_v))
    ax = -2 if "norm_axis" in bugs else -1
    q = q * torch.rsqrt(q.pow(2).mean(ax, keepdim=True) + 1e-6) * g_q
    k = k * torch.rsqrt(k.pow(2).mean(ax, keepdim=True) + 1e-6) * g_k
    if "rope_scores" in bugs:
        s = _rope_half(q @ k.transpose(-2, -1)) / math.sqrt(dh)
    else:
        s = _rope_half(q) @ _rope_half(k).transpose(-2, -1) / math.sqrt(dh)
    if "rope_v" in bugs:
        v = _rope_half(v)
    s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, D)


def attend_einsum(x, W_q, W_k, W_v, g_q, g_k, num_heads):   # another style: einsum and apply_rope
    from einops import rearrange
    q, k, v = (rearrange(x @ W.T, "b l (h d) -> b h l d", h=num_heads) for W in (W_q, W_k, W_v))
    q, k = RMSNorm(q.shape[-1])(q) * g_q, RMSNorm(k.shape[-1])(k) * g_k
    q, k = apply_rope(q), apply_rope(k)
    s = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1])
    L = s.shape[-1]
    w = s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    return rearrange(torch.einsum("bhij,bhjd->bhid", w, v), "b h l d -> b l (h d)").detach()


def test_fix_reference_and_alternative_pass():
    assert_all_pass("11_fix_block_attention", attend)
    assert_all_pass("11_fix_block_attention", attend_einsum)


@pytest.mark.parametrize("bugs", [("rope_v",), ("rope_scores",), ("norm_axis",), ("rope_v", "norm_axis"),
                                  ("rope_v", "rope_scores", "norm_axis")])
def test_fix_remaining_bugs_named(bugs):
    texts = {"rope_v": "applied to v", "rope_scores": "after the dot product", "norm_axis": "sequence axis"}
    fn = lambda *a: attend(*a, bugs=bugs)
    res = results("11_fix_block_attention", fn)
    assert not any(ok for ok, _ in res), res
    for _, msg in res:
        for b in bugs:
            assert texts[b] in msg, msg
        for b in set(texts) - set(bugs):
            assert texts[b] not in msg, msg


def test_fix_wan_style_joint_norm_hinted():
    def wan(x, W_q, W_k, W_v, g_q, g_k, H):          # the tutorial's norm_q = RMSNorm(dim) on the full width
        q, k = x @ W_q.T, x @ W_k.T
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) * g_q.repeat(H)
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + 1e-6) * g_k.repeat(H)
        return _wan_rest(q, k, x @ W_v.T, H)
    assert_hint("11_fix_block_attention", wan, "whole width")


def _wan_rest(q, k, v, H):
    B, L, D = q.shape
    q, k, v = (t.view(B, L, H, D // H).transpose(1, 2) for t in (q, k, v))
    s = _rope_half(q) @ _rope_half(k).transpose(-2, -1) / math.sqrt(D // H)
    s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, D)



def test_convert_grouped_kv_crash_is_named():
    """A shape error from splitting w_k into num_heads blocks names the GQA mistake, not only the exception."""
    ex = get("11_convert_checkpoint")
    case = ex.cases(torch.Generator().manual_seed(0))[1]
    msg = ex.explain_error(case, "RuntimeError: shape '[3, 5, -1]' is invalid for input of size 768")
    assert "num_kv_heads heads (GQA)" in msg and msg.startswith("RuntimeError")
    assert ex.explain_error(case, "ZeroDivisionError: division by zero") == "ZeroDivisionError: division by zero"
