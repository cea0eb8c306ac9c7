"""Exercise set 11: the reference solutions (and alternatives in another style) pass every case; each
common mistake fails with the hint that names it."""
import math

import pytest
import torch
import torch.nn.functional as F

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


# ---- 11_block_forward (build) ------------------------------------------------------------------------

def block_forward(x, weights, num_heads, num_kv_heads, eps, *, post_norm=False, residual=(True, True),
                  eps_outside=False, norm_dim=-1, interleaved=False, rope_v=False, causal=True, swap=False,
                  scale=True, tile_kv=False):
    """The pre-norm block by hand (explicit softmax attention), with the common mistakes as switches."""
    W = weights
    B, L, D = x.shape
    dh, G = D // num_heads, num_heads // num_kv_heads

    def norm(t, g):
        ms = t.pow(2).mean(norm_dim, keepdim=True)
        return t / (ms.sqrt() + eps if eps_outside else (ms + eps).sqrt()) * g

    def rope(t):
        return apply_rope(t, interleaved=interleaved)

    def attn(u):
        q = (u @ W["attn.q_proj.weight"].T).view(B, L, num_heads, dh).transpose(1, 2)
        k, v = ((u @ W[f"attn.{n}_proj.weight"].T).view(B, L, num_kv_heads, dh).transpose(1, 2) for n in "kv")
        q, k = rope(q), rope(k)
        if rope_v:
            v = rope(v)
        k, v = ((t.repeat(1, G, 1, 1) if tile_kv else t.repeat_interleave(G, 1)) for t in (k, v))
        s = q @ k.transpose(-2, -1) / (math.sqrt(dh) if scale else 1.0)
        if causal:
            s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        return (s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, D) @ W["attn.out_proj.weight"].T

    def ffn(u):
        a, b = u @ W["ffn.w1.weight"].T, u @ W["ffn.w3.weight"].T
        a, b = (b, a) if swap else (a, b)
        return (F.silu(a) * b) @ W["ffn.w2.weight"].T

    if post_norm:
        h = norm(x + attn(x), W["norm1.weight"])
        return norm(h + ffn(h), W["norm2.weight"])
    h = (x if residual[0] else 0) + attn(norm(x, W["norm1.weight"]))
    return (h if residual[1] else 0) + ffn(norm(h, W["norm2.weight"]))


def block_with_the_package(x, weights, num_heads, num_kv_heads, eps):
    """The module itself, loaded with the weights (what the grader compares with)."""
    block = TransformerBlock(x.shape[-1], num_heads, num_kv_heads, weights["ffn.w1.weight"].shape[0])
    block.norm1.eps = block.norm2.eps = eps
    block.load_state_dict(weights)
    with torch.no_grad():
        return block(x)


def test_block_forward_reference_alternative_and_package_pass():
    assert_all_pass("11_block_forward", block_forward)
    assert_all_pass("11_block_forward", block_with_the_package)


def test_block_forward_cases_are_grouped_and_every_mistake_differs():
    """Every case has 1 < num_kv_heads < num_heads (so the grouping matters), and no named mistake coincides
    with the block's output on any case (so each fails everywhere)."""
    from attn_course.grading.exercises import lesson11
    ex = get("11_block_forward")
    for seed in range(8):
        for case in ex.cases(torch.Generator().manual_seed(seed)):
            assert 1 < case.params["num_kv_heads"] < case.params["num_heads"]
            want = ex.expected(case)["y"]
            for kw in (dict(post_norm=True), dict(residual=(False, False)), dict(eps_outside=True),
                       dict(norm_axis=-2), dict(pairing="interleaved"), dict(rope_v=True), dict(swap_gate=True),
                       dict(causal=False), dict(scale=False), dict(tile_kv=True)):
                assert (lesson11._block(*lesson11._blk_args(case), **kw) - want).abs().max() > 1e-2, kw


@pytest.mark.parametrize("mistake, hint", [
    (dict(post_norm=True), "POST-norm"),
    (dict(residual=(False, False)), "residual connections are missing"),
    (dict(residual=(False, True)), "the attention's residual is missing"),
    (dict(residual=(True, False)), "the FFN's residual is missing"),
    (dict(eps_outside=True), "eps goes inside the square root"),
    (dict(norm_dim=-2), "not over the sequence"),
    (dict(interleaved=True), "interleaved RoPE convention"),
    (dict(rope_v=True), "do not rotate v"),
    (dict(swap=True), "gate and up are swapped"),
    (dict(causal=False), "causal mask is missing"),
    (dict(scale=False), "not scaled"),
    (dict(tile_kv=True), "repeat_interleave"),
])
def test_block_forward_mistakes_hinted(mistake, hint):
    assert_hint("11_block_forward", lambda *a: block_forward(*a, **mistake), hint)


def test_block_forward_ungrouped_kv_crash_is_named():
    def no_repeat(x, W, H, Hkv, eps):
        B, L, D = x.shape
        q = (x @ W["attn.q_proj.weight"].T).view(B, L, H, D // H).transpose(1, 2)
        k = (x @ W["attn.k_proj.weight"].T).view(B, L, Hkv, D // H).transpose(1, 2)
        return (q @ k.transpose(-2, -1)).sum(-1).transpose(1, 2).sum(-1, keepdim=True).expand(B, L, D)
    assert_hint("11_block_forward", no_repeat, "k and v have num_kv_heads heads")


def test_block_forward_forbids_the_package():
    assert get("11_block_forward").forbidden == ("attn_course",)
    assert get("11_block_forward").kind == "build"


@pytest.mark.parametrize("error", ["IndexError: index 4 is out of bounds for dimension 0 with size 4",
                                   "RuntimeError: stack expects each tensor to be equal size, but got [2] at entry 0 "
                                   "and [3] at entry 1"])
def test_convert_grouped_kv_index_and_stack_errors_are_named(error):
    """Issue 24: a per-head permutation built for num_heads heads and applied to w_k crashes with these errors
    (an index past the keys' rows; a head size that does not divide); the feedback names the GQA mistake."""
    ex = get("11_convert_checkpoint")
    case = ex.cases(torch.Generator().manual_seed(0))[0]
    assert "num_kv_heads heads (GQA)" in ex.explain_error(case, error)


def test_convert_keys_viewed_with_the_queries_head_size_named():
    def k_as_q(w_q, w_k, H, Hkv):
        dh = w_q.shape[0] // H
        p = torch.stack((torch.arange(dh // 2), torch.arange(dh // 2, dh)), -1).flatten()
        return w_q.view(H, dh, -1)[:, p].reshape(w_q.shape), w_k.view(H, dh, -1)[:, p].reshape(w_k.shape)
    assert_hint("11_convert_checkpoint", k_as_q, "num_kv_heads heads")
