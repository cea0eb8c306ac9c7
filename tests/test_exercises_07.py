"""Exercise set 07: the reference solutions pass every case; each common mistake fails with its hint."""
import math

import pytest
import torch
import torch.nn.functional as F

from attn_course import TensorProductAttention, kv_cache_bytes
from attn_course.rope import apply_rope
from attn_course.tpa import combine_factors

from attn_course.grading.exercises import get
from exercise_kit import assert_all_pass, assert_hint, results


# ---- 07_tpa_combine ----------------------------------------------------------------------------------

def combine(a, b, H, R, *, head_major=True, scale="R"):
    Bs, L, _ = a.shape
    A = a.view(Bs, L, H, R) if head_major else a.view(Bs, L, R, H).transpose(-2, -1)
    out = torch.einsum("blhr,blrd->blhd", A, b.view(Bs, L, R, -1))
    return out / {"R": R, "sqrtR": math.sqrt(R), "none": 1}[scale]


def test_combine_reference_passes_and_matches_package():
    assert_all_pass("07_tpa_combine", combine)
    ex = get("07_tpa_combine")
    for case in ex.cases(torch.Generator().manual_seed(0)):          # the exercise agrees with the package
        a, b, H, R = case.inputs["a"], case.inputs["b"], case.params["H"], case.params["R"]
        Bs, L, _ = a.shape
        torch.testing.assert_close(ex.expected(case)["out"],
                                   combine_factors(a.view(Bs, L, H, R), b.view(Bs, L, R, -1)))


@pytest.mark.parametrize("mistake, hint", [
    (dict(scale="none"), "without dividing by R"),
    (dict(scale="sqrtR"), "not 1/√R"),
    (dict(head_major=False), "head-major"),
    (dict(head_major=False, scale="none"), "the scale 1/R is missing too"),
])
def test_combine_mistakes_hinted(mistake, hint):
    assert_hint("07_tpa_combine", lambda a, b, H, R: combine(a, b, H, R, **mistake), hint)


# ---- 07_rope -----------------------------------------------------------------------------------------

def rope(x, positions, *, interleaved=False, sign=1.0, two=True, ignore_positions=False):
    d = x.shape[-1]
    if ignore_positions:
        positions = torch.arange(x.shape[-2])
    theta = 10000.0 ** (-(2 if two else 1) * torch.arange(d // 2) / d)
    ang = positions[:, None] * theta
    cos, sin = ang.cos(), sign * ang.sin()
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)
    cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    return x * cos + torch.cat((-x[..., d // 2:], x[..., : d // 2]), -1) * sin


def test_rope_reference_passes_and_matches_package():
    assert_all_pass("07_rope", rope)
    assert_all_pass("07_rope", apply_rope)


@pytest.mark.parametrize("mistake, hint", [
    (dict(interleaved=True), "paired neighbours"),
    (dict(sign=-1.0), "rotate the wrong way"),
    (dict(two=False), "base^(-i/d)"),
    (dict(ignore_positions=True), "ignored the given positions"),
])
def test_rope_mistakes_hinted(mistake, hint):
    assert_hint("07_rope", lambda x, p: rope(x, p, **mistake), hint)


# ---- 07_which_factors_rope ---------------------------------------------------------------------------

def rotated_qkv(A_q, B_q, A_k, B_k, A_v, B_v, start, *, rotate="qk", zero_start=False, rank_axis=False):
    L = A_q.shape[1]
    pos = torch.arange(0 if zero_start else start, (0 if zero_start else start) + L)

    def rot(B):
        return apply_rope(B) if rank_axis else apply_rope(B.transpose(1, 2), pos).transpose(1, 2)
    Bs = {"q": B_q, "k": B_k, "v": B_v}
    return tuple(combine_factors(A, rot(Bs[n]) if n in rotate else Bs[n])
                 for n, A in zip("qkv", (A_q, A_k, A_v)))


def test_which_factors_reference_passes():
    assert_all_pass("07_which_factors_rope", rotated_qkv)


def test_which_factors_agrees_with_module():
    """The exercise's reference is what TensorProductAttention computes from the same factors."""
    torch.manual_seed(0)
    m = TensorProductAttention(16, 4, 8, 6, 2, 2)
    x = torch.randn(2, 5, 16)
    f = m.factors(x, torch.arange(3, 8))
    raw = {n: rearr for n, rearr in (("B_q", m.W_B_q(x).view(2, 5, 6, 8)), ("B_k", m.W_B_k(x).view(2, 5, 2, 8)))}
    q, k, _ = rotated_qkv(f["A_q"], raw["B_q"], f["A_k"], raw["B_k"], f["A_v"], f["B_v"], 3)
    torch.testing.assert_close(q, combine_factors(f["A_q"], f["B_q"]))
    torch.testing.assert_close(k, combine_factors(f["A_k"], f["B_k"]))


@pytest.mark.parametrize("mistake, hint", [
    (dict(rotate="qkv"), "values get no RoPE"),
    (dict(rotate=""), "not rotated at all"),
    (dict(rotate="k"), "only K is rotated"),
    (dict(rotate="q"), "only Q is rotated"),
    (dict(rank_axis=True), "rotated along the rank axis"),
    (dict(zero_start=True), "must start at `start`"),
])
def test_which_factors_mistakes_hinted(mistake, hint):
    assert_hint("07_which_factors_rope", lambda *a: rotated_qkv(*a, **mistake), hint)


# ---- 07_cache_elements -------------------------------------------------------------------------------

def tpa_cache_elements(seq_lens, num_heads, head_dim, k_rank, v_rank, constant_heads):
    return sum(seq_lens) * (k_rank + v_rank) * ((0 if constant_heads else num_heads) + head_dim)


def test_cache_reference_passes_and_agrees_with_kv_cache_bytes():
    """Independent counts: contextual TPA per sequence from kv_cache_bytes("tpa"); constant head factors as the
    lesson's GQA-as-TPA — B_k, B_v are R_k + R_v token factors of width d_h, i.e. a GQA cache with R kv heads."""
    assert_all_pass("07_cache_elements", tpa_cache_elements)

    def counted(lens, H, d, rk, rv, const):
        if not const:
            return sum(kv_cache_bytes("tpa", seq_len=n, num_heads=H, head_dim=d, k_rank=rk, v_rank=rv) for n in lens) // 2
        return sum(kv_cache_bytes("gqa", seq_len=n, num_heads=rk * rv, num_kv_heads=r, head_dim=d) for n in lens
                   for r in (rk, rv)) // 4                  # one GQA cache holds K and V: each rank once
    assert_all_pass("07_cache_elements", counted)


def test_cache_seed_numbers():
    """The seed's example: the correct TPA cache is 311,296 elements, not 589,824 (nor 622,592)."""
    assert tpa_cache_elements([1024], 12, 64, 2, 2, False) == 311_296


@pytest.mark.parametrize("mistake, hint", [
    (lambda n, H, d, rk, rv, c: 2 * tpa_cache_elements(n, H, d, rk, rv, c), "counted keys and values twice"),
    (lambda n, H, d, rk, rv, c: sum(n) * 2 * H * d, "that is the MHA cache"),
    (lambda n, H, d, rk, rv, c: tpa_cache_elements(n, H, d, rk, 0, c), "the values' factors"),
    (lambda n, H, d, rk, rv, c: tpa_cache_elements([max(n)] * len(n), H, d, rk, rv, c), "add the lengths"),
    (lambda n, H, d, rk, rv, c: tpa_cache_elements(n, H, d, rk, rv, False), "constant head factors are weights"),
])
def test_cache_mistakes_hinted(mistake, hint):
    assert_hint("07_cache_elements", mistake, hint, every=False)


# ---- 07_fix_seed_attention ---------------------------------------------------------------------------

def fixed_attention(Q, K, V, *, causal=True, scale=True, seed=False):
    if seed:
        return (Q @ K.transpose(2, 3) / math.sqrt(Q.shape[-1])).softmax(-1) @ V
    q, k, v = (t.transpose(1, 2) for t in (Q, K, V))
    s = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-1], s.shape[-1], dtype=torch.bool).tril(), float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2)


def test_fix_reference_passes_and_matches_sdpa():
    assert_all_pass("07_fix_seed_attention", fixed_attention)
    ex = get("07_fix_seed_attention")
    for case in ex.cases(torch.Generator().manual_seed(0)):
        q, k, v = (case.inputs[n].transpose(1, 2) for n in "QKV")
        torch.testing.assert_close(ex.expected(case)["out"],
                                   F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2))


@pytest.mark.parametrize("mistake, hint", [
    (dict(seed=True), "still the seed's computation"),
    (dict(causal=False), "without the causal mask"),
    (dict(scale=False), "scale is missing"),
    (dict(causal=False, scale=False), "no causal mask and no 1/√d_h"),
])
def test_fix_mistakes_hinted(mistake, hint):
    assert_hint("07_fix_seed_attention", lambda Q, K, V: fixed_attention(Q, K, V, **mistake), hint)


def test_forbidden_apis_declared():
    assert "attn_course" in get("07_fix_seed_attention").forbidden
    assert "torch.nn.functional.scaled_dot_product_attention" in get("07_fix_seed_attention").forbidden
    assert "attn_course" in get("07_rope").forbidden


# ---- 07_tpa_decode_step: the reference equals the module's cached forward; mistakes are named -------------
def tpa_decode_step(x, cache, w, H, *, pos_shift=0, rotate="qk", scale=True, head_major=True, rerotate=False,
                    sqrt_d=True, front=False):
    B, S = cache["A_k"].shape[:2]
    d = cache["B_k"].shape[-1]

    def A(W):
        a = x @ W.T
        R = a.shape[-1] // H
        return a.view(B, 1, H, R) if head_major else a.view(B, 1, R, H).transpose(-1, -2)

    def Bf(W, rot):
        b = x @ W.T
        b = b.view(B, 1, b.shape[-1] // d, d)
        return apply_rope(b.transpose(1, 2), torch.tensor([S + pos_shift])).transpose(1, 2) if rot else b

    new = {"A_k": A(w["W_A_k"]), "B_k": Bf(w["W_B_k"], "k" in rotate), "A_v": A(w["W_A_v"]),
           "B_v": Bf(w["W_B_v"], "v" in rotate)}
    old = dict(cache)
    if rerotate:
        old["B_k"] = apply_rope(old["B_k"].transpose(1, 2), torch.arange(S)).transpose(1, 2)
    c = {k: torch.cat([new[k], old[k]] if front else [old[k], new[k]], 1) for k in new}
    comb = lambda a, b: torch.einsum("blhr,blrd->blhd", a, b) / (a.shape[-1] if scale else 1)  # noqa: E731
    q = comb(A(w["W_A_q"]), Bf(w["W_B_q"], True))
    K, V = comb(c["A_k"], c["B_k"]), comb(c["A_v"], c["B_v"])
    p = (torch.einsum("bqhd,bshd->bhqs", q, K) / (math.sqrt(d) if sqrt_d else 1)).softmax(-1)
    return torch.einsum("bhqs,bshd->bqhd", p, V).reshape(B, 1, -1) @ w["W_o"].T, c


def test_decode_step_reference_passes_and_equals_the_full_causal_forward():
    assert_all_pass("07_tpa_decode_step", tpa_decode_step)
    torch.manual_seed(0)
    m = TensorProductAttention(12, 3, 8, 4, 2, 3)
    x = torch.randn(2, 6, 12)
    full, _ = m(x, is_causal=True)
    f = m.factors(x[:, :5])                                            # the cache of the first 5 tokens
    cache = {k: f[k] for k in ("A_k", "B_k", "A_v", "B_v")}
    w = {n: getattr(m, n).weight for n in ("W_A_q", "W_B_q", "W_A_k", "W_B_k", "W_A_v", "W_B_v")}
    out, new = tpa_decode_step(x[:, 5:], cache, w | {"W_o": m.out_proj.weight}, 3)
    torch.testing.assert_close(out, full[:, 5:], atol=1e-5, rtol=1e-4)
    f6 = m.factors(x)
    for k in cache:                                                   # what is cached: the factors, B_k rotated
        torch.testing.assert_close(new[k], f6[k], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kw, hint", [
    ({"pos_shift": -1}, "sits at position S"), ({"rotate": "q"}, "into the cache ROTATED"),
    ({"rotate": "qkv"}, "values get no RoPE"), ({"scale": False}, "1/R scale is missing"),
    ({"head_major": False}, "head-major"), ({"rerotate": True}, "never the cache again"),
    ({"sqrt_d": False}, "divide q·k by √d_h"), ({"front": True}, "at the END of the cache"),
])
def test_decode_step_mistakes_hinted(kw, hint):
    assert_hint("07_tpa_decode_step", lambda *a: tpa_decode_step(*a, **kw), hint)


def test_decode_step_caching_full_keys_fails_on_what_is_cached():
    def cache_full_k(x, cache, w, H):
        out, c = tpa_decode_step(x, cache, w, H)
        c["B_k"] = torch.einsum("blhr,blrd->blhd", c["A_k"], c["B_k"]) / c["A_k"].shape[-1]   # (B, S+1, H, d_h)
        return out, c
    res = results("07_tpa_decode_step", cache_full_k)
    assert not any(ok for ok, _ in res), res
    assert all("holds the per-head keys" in m for _, m in res), res    # named whether or not R_k = H (G-3)


def test_decode_step_reference_is_the_package_module():
    """The grader's reference (the paper's equations, float64) equals attn_course.TensorProductAttention over a
    TPACache holding the case's factors — an independent check; the grading module itself never imports it."""
    from attn_course.tpa import TPACache
    ex = get("07_tpa_decode_step")
    for case in ex.cases(torch.Generator().manual_seed(3)):
        i = {k: v.double() for k, v in case.inputs.items()}
        H, (B, S, _, Rk), Rv, d, D = case.params["H"], i["A_k"].shape, i["A_v"].shape[-1], i["B_k"].shape[-1], i["x"].shape[-1]
        m = TensorProductAttention(D, H, d, i["W_A_q"].shape[0] // H, Rk, Rv).double()
        m.load_state_dict({f"{k}.weight": i[k] for k in ("W_A_q", "W_B_q", "W_A_k", "W_B_k", "W_A_v", "W_B_v")}
                          | {"out_proj.weight": i["W_o"]})
        cache = TPACache()
        cache.update(*(i[k] for k in ("A_k", "B_k", "A_v", "B_v")))
        with torch.no_grad():
            out, _ = m(i["x"], cache=cache)
        want = ex.expected(case)
        torch.testing.assert_close(want["out"], out.float(), atol=1e-5, rtol=1e-4)
        for k in ("A_k", "B_k", "A_v", "B_v"):
            torch.testing.assert_close(want[k], getattr(cache, k).float(), atol=1e-5, rtol=1e-4)
