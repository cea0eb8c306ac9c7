"""Exercise set 12: the reference solutions (and alternatives in another style) pass every case; each
common mistake fails with the hint that names it; the references agree with attn_course.mla."""
import math

import pytest
import torch

from attn_course import MultiHeadLatentAttention, kv_cache_bytes
from attn_course.grading.exercises import get
from attn_course.mla import MLACache
from attn_course.rope import apply_rope
from exercise_kit import assert_all_pass, assert_hint


# ---- 12_cache_bytes ----------------------------------------------------------------------------------

def mla_cache_bytes(seq_len, batch_size, num_layers, num_heads, kv_lora_rank, qk_rope_head_dim, bytes_per_element,
                    *, per_token=None, layers=True, batch=True, nbytes=True):
    per = kv_lora_rank + qk_rope_head_dim if per_token is None else per_token(num_heads, kv_lora_rank, qk_rope_head_dim)
    return (per * seq_len * (batch_size if batch else 1) * (num_layers if layers else 1)
            * (bytes_per_element if nbytes else 1))


def test_cache_bytes_reference_and_package_pass():
    assert_all_pass("12_cache_bytes", mla_cache_bytes)
    dtypes = {2: torch.float16, 4: torch.float32}
    assert_all_pass("12_cache_bytes", lambda seq_len, batch_size, num_layers, num_heads, kv_lora_rank,
                    qk_rope_head_dim, bytes_per_element: kv_cache_bytes(
                        "mla", seq_len=seq_len, batch_size=batch_size, num_layers=num_layers, num_heads=num_heads,
                        head_dim=1, kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim,
                        dtype=dtypes[bytes_per_element]))


@pytest.mark.parametrize("mistake, hint", [
    (dict(per_token=lambda H, dc, dr: dc + H * dr), "shared by all heads"),
    (dict(per_token=lambda H, dc, dr: dc), "rotated rope key is cached too"),
    (dict(per_token=lambda H, dc, dr: 2 * dc + dr), "not counted twice"),
    (dict(per_token=lambda H, dc, dr: 2 * (dc + dr)), "do not double it"),
    (dict(nbytes=False), "multiply by bytes_per_element"),
    (dict(layers=False), "multiply by num_layers"),
    (dict(batch=False), "multiply by batch_size"),
])
def test_cache_bytes_mistakes_hinted(mistake, hint):
    assert_hint("12_cache_bytes", lambda *a, **k: mla_cache_bytes(*a, **k, **mistake), hint)


# ---- 12_absorb_query ---------------------------------------------------------------------------------

def absorb_query(q_nope, kv_b_weight, qk_nope_head_dim, *, v_first=False, channel_major=False, scale=1.0):
    H, dn = q_nope.shape[1], qk_nope_head_dim
    dc = kv_b_weight.shape[1]
    dv = kv_b_weight.shape[0] // H - dn
    if channel_major:
        Wc = kv_b_weight.view(dn + dv, H, dc)
        W_UK = (Wc[dv:] if v_first else Wc[:dn]).transpose(0, 1)
    else:
        W = kv_b_weight.view(H, dn + dv, dc)
        W_UK = W[:, dv:] if v_first else W[:, :dn]
    return torch.einsum("bhld,hdc->bhlc", q_nope, W_UK) * scale


def absorb_query_loops(q_nope, kv_b_weight, qk_nope_head_dim):
    """Another style: per head, slice the rows by hand and multiply by the transpose."""
    H, dn = q_nope.shape[1], qk_nope_head_dim
    rows = kv_b_weight.shape[0] // H
    return torch.stack([q_nope[:, h] @ kv_b_weight[h * rows: h * rows + dn] for h in range(H)], dim=1)


def test_absorb_reference_and_alternative_pass():
    assert_all_pass("12_absorb_query", absorb_query)
    assert_all_pass("12_absorb_query", absorb_query_loops)


def test_absorbed_query_reproduces_the_module_scores():
    """q_latent · c_kv equals q_nope · k_nope with k_nope = W_UK c_kv from MultiHeadLatentAttention."""
    torch.manual_seed(0)
    m = MultiHeadLatentAttention(16, 3, kv_lora_rank=10, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=6).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    pos = torch.arange(5)
    q_nope, _ = m.queries(x, pos)
    c_kv, _ = m.latents(x, pos)
    k_nope = m.kv_b_proj(c_kv).view(2, 5, 3, 10)[..., :4].transpose(1, 2)          # (B, H, S, d_nope)
    q_lat = absorb_query(q_nope, m.kv_b_proj.weight, 4)
    torch.testing.assert_close(q_lat @ c_kv[:, None].transpose(-2, -1), q_nope @ k_nope.transpose(-2, -1))


@pytest.mark.parametrize("mistake, hint", [
    (dict(v_first=True), "[k_nope | v]"),
    (dict(channel_major=True), "head-major"),
    (dict(channel_major=True, v_first=True), "puts W_UK first"),
])
def test_absorb_mistakes_hinted(mistake, hint):
    assert_hint("12_absorb_query", lambda q, W, dn: absorb_query(q, W, dn, **mistake), hint)


def test_absorb_scale_mistake_hinted():
    assert_hint("12_absorb_query", lambda q, W, dn: absorb_query(q, W, dn, scale=1 / math.sqrt(dn)),
                "leave the softmax scale out")


# ---- 12_shared_rope_key ------------------------------------------------------------------------------

def rope_key_costs(num_heads, head_dim, kv_lora_rank, qk_rope_head_dim, *, width=2, per_head="right"):
    shared = kv_lora_rank + qk_rope_head_dim
    ph = {"right": kv_lora_rank + num_heads * qk_rope_head_dim,
          "latent_per_head": num_heads * shared,
          "no_latent": num_heads * qk_rope_head_dim}[per_head]
    return shared, ph, shared / (width * head_dim), ph / (width * head_dim)


def rope_key_costs_tensor(num_heads, head_dim, kv_lora_rank, qk_rope_head_dim):
    """Another style: both designs as (latent, rope keys) counts, one tensor expression."""
    counts = torch.tensor([[kv_lora_rank, 1], [kv_lora_rank, num_heads]], dtype=torch.float64)
    per_token = counts @ torch.tensor([1.0, qk_rope_head_dim], dtype=torch.float64)
    return torch.cat((per_token, per_token / (2 * head_dim)))


def test_shared_rope_key_reference_and_deepseek_values():
    assert_all_pass("12_shared_rope_key", rope_key_costs)
    assert_all_pass("12_shared_rope_key", rope_key_costs_tensor)
    assert rope_key_costs(128, 128, 512, 64) == (576, 8704, 2.25, 34.0)     # DeepSeek-V2: 2.25 groups (§2.1.3)


def test_shared_rope_key_matches_measured_cache():
    """The 'shared' count is what MLACache holds per token."""
    m = MultiHeadLatentAttention(16, 4, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4)
    cache = MLACache()
    with torch.no_grad():
        m(torch.randn(1, 5, 16), cache=cache)
    assert cache.nbytes() // (5 * 4) == rope_key_costs(4, 4, 8, 2)[0]


@pytest.mark.parametrize("mistake, hint", [
    (dict(width=1), "divide by 2·head_dim"),
    (dict(per_head="latent_per_head"), "not H·(d_c + d_R)"),
    (dict(per_head="no_latent"), "still caches the latent"),
])
def test_shared_rope_key_mistakes_hinted(mistake, hint):
    assert_hint("12_shared_rope_key", lambda *a: rope_key_costs(*a, **mistake), hint)


# ---- 12_fix_buggy_mla --------------------------------------------------------------------------------

def mla_weights(c_kv, k_rope, q_nope, q_rope, W_UK, *, rope_latent=False, nope_scale=False, causal=True,
                interleaved=False):
    S, H = c_kv.shape[1], q_nope.shape[1]
    if rope_latent:
        c_kv = apply_rope(c_kv)
    k_nope = torch.einsum("bsc,hdc->bhsd", c_kv, W_UK)
    q = torch.cat((q_nope, apply_rope(q_rope, interleaved=interleaved)), dim=-1)
    k = torch.cat((k_nope, apply_rope(k_rope, interleaved=interleaved)[:, None].expand(-1, H, -1, -1)), dim=-1)
    d = q_nope.shape[-1] if nope_scale else q.shape[-1]
    s = q @ k.transpose(-2, -1) / math.sqrt(d)
    if causal:
        s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    return s.softmax(-1)


def mla_weights_absorbed(c_kv, k_rope, q_nope, q_rope, W_UK):
    """Another style: absorb W_UK into the query and score against the latent (never forming k_nope)."""
    S, dn, dr = c_kv.shape[1], q_nope.shape[-1], q_rope.shape[-1]
    q_lat = torch.einsum("bhld,hdc->bhlc", q_nope, W_UK)
    s = q_lat @ c_kv[:, None].transpose(-2, -1) + apply_rope(q_rope) @ apply_rope(k_rope)[:, None].transpose(-2, -1)
    s = s / math.sqrt(dn + dr)
    return s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)


def test_fix_reference_and_alternative_pass():
    assert_all_pass("12_fix_buggy_mla", mla_weights)
    assert_all_pass("12_fix_buggy_mla", mla_weights_absorbed)


def test_fix_reference_matches_the_module():
    torch.manual_seed(0)
    m = MultiHeadLatentAttention(16, 2, kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=3).double()
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    q = m.q_proj(x).view(1, 5, 2, 8).transpose(1, 2)
    c_raw, k_raw = m.kv_a_proj_with_mqa(x).split((6, 4), dim=-1)
    W_UK = m.kv_b_proj.weight.view(2, 7, 6)[:, :4]
    got = mla_weights(m.kv_a_layernorm(c_raw), k_raw, q[..., :4], q[..., 4:], W_UK)
    torch.testing.assert_close(got, m(x, is_causal=True, need_weights=True)[1])


@pytest.mark.parametrize("mistake, hint", [
    (dict(rope_latent=True, nope_scale=True), "both bugs are still there"),
    (dict(rope_latent=True), "RoPE must not touch the latent"),
    (dict(nope_scale=True), "one bug left"),
    (dict(causal=False), "causal mask is missing"),
    (dict(interleaved=True), "half-split"),
])
def test_fix_mistakes_hinted(mistake, hint):
    assert_hint("12_fix_buggy_mla", lambda *a: mla_weights(*a, **mistake), hint)


# ---- 12_absorbed_decode (build) ----------------------------------------------------------------------

def _rope_at(t, position):
    """apply_rope on t (..., d) at one integer position or at positions (S,) over the second-to-last axis."""
    if isinstance(position, int):
        return apply_rope(t.unsqueeze(-2), torch.tensor([position])).squeeze(-2)
    return apply_rope(t, position)


def absorbed_decode(q_nope, q_rope, c_kv, k_rope, kv_b_weight, *, scale="full", rope_latent=False, q_pos="last",
                    rerotate_k=False, rope_part=True, split="head"):
    """The absorbed step with the common mistakes as switches (never forms per-head keys or values)."""
    B, H, dn = q_nope.shape
    S, dr = k_rope.shape[1:]
    dc = c_kv.shape[-1]
    if split == "channel":
        W = kv_b_weight.view(-1, H, dc).transpose(0, 1)
    elif split == "view":
        W = kv_b_weight.reshape(H, dc, -1).transpose(1, 2)
    else:
        W = kv_b_weight.view(H, -1, dc)
    W_UK, W_UV = (W[:, -dn:], W[:, :-dn]) if split == "v_first" else (W[:, :dn], W[:, dn:])
    if rope_latent:
        c_kv = _rope_at(c_kv, torch.arange(S))
    if rerotate_k:
        k_rope = _rope_at(k_rope, torch.arange(S))
    q_r = q_rope if q_pos is None else _rope_at(q_rope, S - 1 if q_pos == "last" else S)
    s = torch.einsum("bhc,bsc->bhs", torch.einsum("bhd,hdc->bhc", q_nope, W_UK), c_kv)
    if rope_part:
        s = s + torch.einsum("bhr,bsr->bhs", q_r, k_rope)
    width = {"full": dn + dr, "nope": dn, "latent": dc + dr}[scale]
    p = (s / math.sqrt(width)).softmax(-1)
    return torch.einsum("bhc,hvc->bhv", torch.einsum("bhs,bsc->bhc", p, c_kv), W_UV)


def naive_decode(q_nope, q_rope, c_kv, k_rope, kv_b_weight, *, values_only=False):
    """Per-head keys and values from the cache (the naive path): right numbers, wrong algorithm."""
    B, H, dn = q_nope.shape
    S, dr = k_rope.shape[1:]
    W = kv_b_weight.view(H, -1, c_kv.shape[-1])
    W_UK, W_UV = W[:, :dn], W[:, dn:]
    v = torch.einsum("bsc,hvc->bhsv", c_kv, W_UV)                                 # per-head values (B, H, S, dv)
    if values_only:                                                                # keys absorbed, values not
        content = torch.einsum("bhc,bsc->bhs", torch.einsum("bhd,hdc->bhc", q_nope, W_UK), c_kv)
    else:
        content = torch.einsum("bhd,bhsd->bhs", q_nope, torch.einsum("bsc,hdc->bhsd", c_kv, W_UK))
    s = content + torch.einsum("bhr,bsr->bhs", _rope_at(q_rope, S - 1), k_rope)
    return torch.einsum("bhs,bhsv->bhv", (s / math.sqrt(dn + dr)).softmax(-1), v)


def decode_case_from_module(m, x):
    """The inputs of 12_absorbed_decode for the LAST token of x, taken from a MultiHeadLatentAttention."""
    from attn_course.grading.spec import Case
    S = x.shape[1]
    q = m.q_proj(x[:, -1:]).view(x.shape[0], m.num_heads, -1)                      # (B, H, d_nope + d_R), unrotated
    c_kv, k_rope = m.latents(x, torch.arange(S))
    return Case("module", {"q_nope": q[..., :m.qk_nope_head_dim], "q_rope": q[..., m.qk_nope_head_dim:],
                           "c_kv": c_kv, "k_rope": k_rope, "kv_b_weight": m.kv_b_proj.weight.detach()})


@pytest.mark.parametrize("absorb", [False, True])
def test_decode_reference_is_the_module_forward_at_the_last_position(absorb):
    """The reference (the naive path in fp64) equals MultiHeadLatentAttention's full causal forward at the
    last position, heads side by side before o_proj (o_proj set to the identity)."""
    torch.manual_seed(0)
    H, dv = 3, 5
    m = MultiHeadLatentAttention(H * dv, H, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=6,
                                 v_head_dim=dv).double()
    with torch.no_grad():
        m.o_proj.weight.copy_(torch.eye(H * dv))
        x = torch.randn(2, 7, H * dv, dtype=torch.float64)
        case = decode_case_from_module(m, x)
        want = m(x, is_causal=True, absorb=absorb)[0][:, -1].view(2, H, dv)
        torch.testing.assert_close(get("12_absorbed_decode").expected(case)["out"], want)
        torch.testing.assert_close(absorbed_decode(*case.inputs.values()), want)


def test_decode_reference_and_solution_style_pass():
    assert_all_pass("12_absorbed_decode", absorbed_decode)


def _naive_per_head():
    """The naive step one head at a time (review 08-13 H12-1): the learner cell of tests/learner_cells_12.py."""
    from learner_cells_12 import _NAIVE_PER_HEAD
    ns = {"torch": torch, "math": math}
    exec(_NAIVE_PER_HEAD, ns)
    return ns["absorbed_decode"]


naive_per_head = _naive_per_head()


@pytest.mark.parametrize("fn", [lambda *a: naive_decode(*a), lambda *a: naive_decode(*a, values_only=True),
                                naive_per_head], ids=["naive", "values_up_projected", "naive_per_head"])
def test_decode_up_projecting_the_cache_fails_every_case_on_its_flops(fn):
    """The property: the naive step — all heads at once, one head at a time, or only the values up-projected —
    computes the right numbers but counts well over 1.5× the absorbed step's FLOPs; every case fails, naming it."""
    from exercise_kit import results
    for seed in (0, 1, 2):
        res = results("12_absorbed_decode", fn, seed)
        assert res and not any(ok for ok, _ in res), res
        assert all("rule: trace budget — counted FLOPs" in msg and "up-projected" in msg for _, msg in res), res
    ex = get("12_absorbed_decode")                              # the numbers themselves are right
    case = ex.cases(torch.Generator().manual_seed(0))[0]
    torch.testing.assert_close(fn(*case.inputs.values()), ex.expected(case)["out"], atol=1e-4, rtol=1e-3)


def test_decode_flop_budget_is_the_absorbed_count():
    """The reference's counted FLOPs are the closed form 2·B·H·(d_c(d_nope + d_v) + S(2d_c + d_R)), and the naive
    step's are at least twice it on every case (so 1.5× separates them with room)."""
    from attn_course.grading.exercises.lesson12 import _dec_reference, _dec_sizes, counted_flops
    ex = get("12_absorbed_decode")
    for seed in range(10):
        for case in ex.cases(torch.Generator().manual_seed(seed)):
            B, H, S, dn, dr, dv, dc = _dec_sizes(case)
            ref = counted_flops(_dec_reference, *case.inputs.values())[1]
            assert ref == 2 * B * H * (dc * (dn + dv) + S * (2 * dc + dr))
            assert counted_flops(naive_per_head, *case.inputs.values())[1] >= 2 * ref


@pytest.mark.parametrize("mistake, hint", [
    (dict(scale="nope"), "not 1/sqrt(d_nope)"),
    (dict(scale="latent"), "does not change the scale"),
    (dict(rope_latent=True), "RoPE must not touch the latent"),
    (dict(q_pos=None), "you left it unrotated"),
    (dict(q_pos="next"), "(not S)"),
    (dict(rerotate_k=True), "already rotated at its own position"),
    (dict(rope_part=False), "the rope part is missing"),
    (dict(split="v_first"), "you took [v | k_nope]"),
    (dict(split="channel"), "(d_nope + d_v, H)"),
    (dict(split="view"), "where a transpose was needed"),
])
def test_decode_mistakes_hinted(mistake, hint):
    assert_hint("12_absorbed_decode", lambda *a: absorbed_decode(*a, **mistake), hint)


def test_decode_forbids_the_package():
    assert get("12_absorbed_decode").forbidden == ("attn_course",)
    assert get("12_absorbed_decode").kind == "build"
