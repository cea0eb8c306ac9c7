"""TensorProductAttention against an independent fp64 reference built from explicit outer products."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from attn_course import GroupedQueryAttention, TensorProductAttention, kv_cache_bytes
from attn_course.demos.tpa import tpa_from_gqa, with_constant_channel
from attn_course.rope import apply_rope
from attn_course.tpa import TPACache, attention_from_factors, combine_factors


def make(d_model=24, H=4, d=8, ranks=(3, 2, 2), rope=True, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return TensorProductAttention(d_model, H, d, *ranks, rope=rope).to(dtype)


def reference_qkv(m: TensorProductAttention, x: torch.Tensor):
    """Q, K, V (B, H, L, d) token by token as (1/R) Σ_r outer(a_r, b_r), RoPE applied to Q and K rows."""
    H, d = m.num_heads, m.head_dim
    out = []
    for W_A, W_B, R, rotate in ((m.W_A_q, m.W_B_q, m.q_rank, True), (m.W_A_k, m.W_B_k, m.k_rank, True),
                                (m.W_A_v, m.W_B_v, m.v_rank, False)):
        B_, L, _ = x.shape
        T = torch.zeros(B_, L, H, d, dtype=x.dtype)
        for b in range(B_):
            for t in range(L):
                a = (W_A.weight @ x[b, t]).reshape(H, R)       # head-major: row h holds a_1..a_R of head h
                bb = (W_B.weight @ x[b, t]).reshape(R, d)
                T[b, t] = sum(torch.outer(a[:, r], bb[r]) for r in range(R)) / R
        T = T.transpose(1, 2)                                    # (B, H, L, d)
        out.append(apply_rope(T) if (rotate and m.rope) else T)  # rotate the combined Q/K (combine-then-rotate)
    return out


def reference_forward(m, x, attn_mask=None, is_causal=False):
    q, k, v = reference_qkv(m, x)
    scores = q @ k.transpose(-2, -1) / math.sqrt(m.head_dim)
    if is_causal:
        attn_mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    w = scores.softmax(-1)
    y = (w @ v).transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
    return m.out_proj(y), w


def test_combine_factors_is_sum_of_outer_products_over_R():
    A, B = torch.randn(2, 3, 4, 5, dtype=torch.float64), torch.randn(2, 3, 5, 6, dtype=torch.float64)
    want = torch.zeros(2, 3, 4, 6, dtype=torch.float64)
    for b in range(2):
        for t in range(3):
            want[b, t] = sum(torch.outer(A[b, t, :, r], B[b, t, r]) for r in range(5)) / 5
    assert_close(combine_factors(A, B), want)


def test_rotate_then_combine_equals_combine_then_rotate():
    m = make()
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    f = m.factors(x)                                   # B_q, B_k rotated before combining
    q_ref, k_ref, _ = reference_qkv(m, x)              # rotated after combining
    assert_close(combine_factors(f["A_q"], f["B_q"]).transpose(1, 2), q_ref)
    assert_close(combine_factors(f["A_k"], f["B_k"]).transpose(1, 2), k_ref)


@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool", "float"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_forward_matches_reference(rope, mask_kind, need_weights):
    m = make(rope=rope)
    x = torch.randn(2, 6, 24, dtype=torch.float64)
    mask = {"none": None, "causal": None, "bool": torch.rand(2, 1, 6, 6) > 0.3,
            "float": torch.randn(1, 4, 6, 6, dtype=torch.float64)}[mask_kind]
    if mask_kind == "bool":
        mask[..., 0] = True                                      # every row keeps a key
    causal = mask_kind == "causal"
    y, w = m(x, attn_mask=mask, is_causal=causal, need_weights=need_weights)
    y_ref, w_ref = reference_forward(m, x, mask, causal)
    assert_close(y, y_ref)
    if need_weights:
        assert_close(w, w_ref)
    else:
        assert w is None


def test_output_width_need_not_equal_heads_times_head_dim():
    m = make(d_model=10, H=3, d=6)
    x = torch.randn(2, 5, 10, dtype=torch.float64)
    y, w = m(x, is_causal=True, need_weights=True)
    assert y.shape == (2, 5, 10) and w.shape == (2, 3, 5, 5)
    assert_close(y, reference_forward(m, x, is_causal=True)[0])


def test_scale_is_one_over_R_not_sqrt():
    m = make(ranks=(4, 4, 4), rope=False)
    x = torch.randn(1, 3, 24, dtype=torch.float64)
    f = m.factors(x)
    K = combine_factors(f["A_k"], f["B_k"])
    unscaled = torch.einsum("blhr,blrd->blhd", f["A_k"], f["B_k"])
    assert_close(K * 4, unscaled)


@pytest.mark.parametrize("prefill", [0, 1, 3])
def test_decode_with_factor_cache_equals_full_causal_forward(prefill):
    m = make()
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    full, _ = m(x, is_causal=True)
    cache = TPACache()
    outs = [m(x[:, :prefill], is_causal=True, cache=cache)[0]] if prefill else []
    for t in range(prefill, 7):
        outs.append(m(x[:, t:t + 1], is_causal=True, cache=cache)[0])
    assert_close(torch.cat(outs, dim=1), full)
    assert len(cache) == 7


def test_cache_stores_factors_with_rotated_B_k_and_predicted_bytes():
    m = make(d_model=24, H=4, d=8, ranks=(3, 2, 1))
    x = torch.randn(2, 5, 24, dtype=torch.float64)
    cache = TPACache()
    m(x[:, :2], is_causal=True, cache=cache)
    m(x[:, 2:], is_causal=True, cache=cache)
    assert cache.A_k.shape == (2, 5, 4, 2) and cache.B_k.shape == (2, 5, 2, 8)
    assert cache.A_v.shape == (2, 5, 4, 1) and cache.B_v.shape == (2, 5, 1, 8)
    raw_B_k = (x @ m.W_B_k.weight.T).reshape(2, 5, 2, 8).transpose(1, 2)          # (B, R, L, d)
    assert_close(cache.B_k, apply_rope(raw_B_k).transpose(1, 2))
    assert_close(cache.B_v, (x @ m.W_B_v.weight.T).reshape(2, 5, 1, 8))
    assert cache.nbytes() == kv_cache_bytes("tpa", seq_len=5, batch_size=2, num_heads=4, head_dim=8,
                                            k_rank=2, v_rank=1, dtype=torch.float64)
    assert cache.nbytes() == 2 * 5 * (2 + 1) * (4 + 8) * 8


def test_causality_future_never_changes_the_past():
    m = make()
    x = torch.randn(2, 8, 24, dtype=torch.float64)
    y, _ = m(x, is_causal=True)
    x2 = x.clone()
    x2[:, 5:] = torch.randn(2, 3, 24, dtype=torch.float64)
    y2, _ = m(x2, is_causal=True)
    assert_close(y2[:, :5], y[:, :5])
    assert not torch.allclose(y2[:, 5:], y[:, 5:])


@pytest.mark.parametrize("is_causal", [False, True])
def test_attention_from_factors_matches_materialised_path(is_causal):
    m = make()
    x = torch.randn(2, 6, 24, dtype=torch.float64)
    f = m.factors(x)
    out, w = attention_from_factors(**f, is_causal=is_causal)
    q, k, v = reference_qkv(m, x)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=is_causal))
    assert_close(w, m(x, is_causal=is_causal, need_weights=True)[1])


@pytest.mark.parametrize("H,Hkv", [(4, 4), (4, 2), (4, 1), (6, 3)])
def test_gqa_mqa_mha_are_non_contextual_tpa(H, Hkv):
    torch.manual_seed(0)
    gqa = GroupedQueryAttention(8 * H, H, Hkv).double()
    tpa = tpa_from_gqa(gqa)
    x = torch.randn(3, 7, 8 * H, dtype=torch.float64)
    want, w_want = gqa(x, is_causal=True, need_weights=True)
    got, w_got = tpa(with_constant_channel(x), is_causal=True, need_weights=True)
    assert_close(got[..., :-1], want)
    assert_close(got[..., -1], torch.zeros_like(got[..., -1]))
    assert_close(w_got, w_want)
    f = tpa.factors(with_constant_channel(x))               # the head factors are the same for every token
    assert_close(f["A_k"], f["A_k"][:1, :1].expand_as(f["A_k"]))


def seed_tpa_forward(m: TensorProductAttention, x: torch.Tensor):
    """The blog post's forward (rank-major views, no 1/R, scores (B,L,H,d)@(B,L,d,H)), on m's weights.

    Returns (output, its "attention weights", the per-token attention result before the final view)."""
    b, L, _ = x.shape
    H, d = m.num_heads, m.head_dim

    def qkv(W_A, W_B, R):
        A = W_A(x).view(b, L, R, H).transpose(1, 2)
        B = W_B(x).view(b, L, R, d).transpose(1, 2)
        return (A.unsqueeze(-1) * B.unsqueeze(-2)).sum(dim=1)             # (b, L, H, d)
    Q, K, V = qkv(m.W_A_q, m.W_B_q, m.q_rank), qkv(m.W_A_k, m.W_B_k, m.k_rank), qkv(m.W_A_v, m.W_B_v, m.v_rank)
    w = (Q @ K.transpose(2, 3) / math.sqrt(d)).softmax(-1)                  # (b, L, H, H)
    o = w @ V                                                               # (b, L, H, d)
    return m.out_proj(o.transpose(1, 2).contiguous().view(b, L, -1)), w, o


def test_seed_version_fails_the_reference_and_mixes_heads_not_positions():
    m = make(rope=False)
    x = torch.randn(2, 6, 24, dtype=torch.float64)
    y_seed, w_seed, o_seed = seed_tpa_forward(m, x)
    assert not torch.allclose(y_seed, m(x)[0], atol=1e-3)
    assert w_seed.shape == (2, 6, 4, 4)            # (B, L, H, H): every token's heads attend to each other
    # Changing every other token changes token 0's output in real attention but not in the seed's:
    # its softmax runs across the H heads of one token, never across the sequence.
    x2 = x.clone()
    x2[:, 1:] = torch.randn(2, 5, 24, dtype=torch.float64)
    assert not torch.allclose(m(x)[0][:, 0], m(x2)[0][:, 0])
    assert_close(seed_tpa_forward(m, x2)[2][:, 0], o_seed[:, 0])


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 1e-2), (torch.bfloat16, 5e-2)])
def test_low_precision_dtypes_run_and_agree(dtype, tol):
    m = make(dtype=torch.float32)
    x = torch.randn(2, 6, 24)
    y32, _ = m(x, is_causal=True)
    y, w = m.to(dtype)(x.to(dtype), is_causal=True, need_weights=True)
    assert y.dtype == dtype and w.dtype == dtype
    assert_close(y.float(), y32, atol=tol, rtol=tol)


def test_gradients_reach_every_factor_layer():
    m = make(dtype=torch.float32)
    m(torch.randn(2, 5, 24), is_causal=True)[0].square().sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_value_errors():
    with pytest.raises(ValueError, match="num_heads must be a positive integer, got 0"):
        TensorProductAttention(16, 0, 4)
    with pytest.raises(ValueError, match="q_rank must be a positive integer"):
        TensorProductAttention(16, 4, 4, q_rank=0)
    with pytest.raises(ValueError, match="even head_dim, got head_dim=5"):
        TensorProductAttention(16, 4, 5)
    TensorProductAttention(16, 4, 5, rope=False)                      # odd head_dim is fine without RoPE
    with pytest.raises(ValueError, match="dropout"):
        TensorProductAttention(16, 4, 4, dropout=1.5)
    m = TensorProductAttention(16, 4, 4)
    with pytest.raises(ValueError, match="last dimension 12.*d_model=16"):
        m(torch.randn(2, 3, 12))
    with pytest.raises(ValueError, match="3 dimensions"):
        m(torch.randn(3, 16))
    with pytest.raises(ValueError, match="not both"):
        m(torch.randn(1, 3, 16), attn_mask=torch.ones(3, 3, dtype=torch.bool), is_causal=True, cache=TPACache())
    with pytest.raises(ValueError, match=r"attn_mask of shape \(4, 4\) does not broadcast.*Lk=3"):
        m(torch.randn(1, 3, 16), attn_mask=torch.ones(4, 4, dtype=torch.bool))
    cache = TPACache()
    m(torch.randn(2, 3, 16), cache=cache)
    with pytest.raises(ValueError, match="cannot append A_k"):
        m(torch.randn(3, 1, 16), cache=cache)


def test_cache_explorer_numbers_and_figure():
    from attn_course.widgets.tpa import CacheExplorer

    ex = CacheExplorer()
    v = ex.compute(num_heads=12, head_dim=64, num_kv_heads=2, k_rank=2, v_rank=2, seq_len=1024)
    assert list(v.per_token.values()) == [2 * 12 * 64, 2 * 2 * 64, 2 * 64, (2 + 2) * (12 + 64)]
    # the lesson's honest note: at these settings TPA is smaller than MHA but larger than 2-kv-head GQA
    assert v.per_token["GQA (H_kv=2)"] < v.per_token["TPA (R_k=2, R_v=2)"] < v.per_token["MHA"]
    assert v.smallest == "MQA" and v.total_bytes["MHA"] == 2 * 12 * 64 * 1024 * 2
    v2 = ex.update(num_heads=32, head_dim=128, num_kv_heads=8, k_rank=1, v_rank=1)
    assert v2.per_token["TPA (R_k=1, R_v=1)"] == 2 * (32 + 128) < v2.per_token["GQA (H_kv=8)"] == 2 * 8 * 128
    assert v2.figure is not None
    box = ex.widget()
    box.controls["k_rank"].value = 5                      # redraws without error
    with pytest.raises(ValueError, match="num_heads=12 is not divisible by num_kv_heads=5"):
        ex.compute(num_heads=12, num_kv_heads=5)


def test_seed_cache_claim_versus_real_cache():
    """The blog post: '2·1024·(2+2)·(12+64) = 589824, about 63% saved'. The real cache: 311,296, 80.2% saved."""
    m = TensorProductAttention(16, 12, 64, 6, 2, 2)
    cache = TPACache()
    with torch.no_grad():
        m(torch.randn(1, 1024, 16), is_causal=True, cache=cache)
    elements = cache.nbytes() // 4
    assert elements == 311_296 != 589_824
    assert round(1 - elements / (2 * 1024 * 12 * 64), 3) == 0.802
    assert 5 < (2 * 1024 * 12 * 64) / elements < 5.1


def test_demo_tpa_learns_easy_reverse_task_and_measures_its_cache():
    """The lesson trains the easy size for 80 of SHOW's 150 steps: enough even for the smallest TPA."""
    from attn_course.demos.tpa import SHOW, train_and_measure

    model, acc, per_token = train_and_measure("TPA (R=2,1,1)", progress=False, **dict(SHOW, steps=80))
    assert acc > 0.95
    assert per_token == (1 + 1) * (4 + 8)                 # (R_k + R_v)(H + d_h), measured while decoding


@pytest.mark.parametrize("seed", [0, 1])
def test_demo_hard_reverse_task_mha_learns_faster_than_shared_or_factorised_keys(seed):
    """The lesson's claim on the COMPARE size (n = 16, H = 8, d_h = 4, 100 steps): MHA is well ahead of
    GQA-2 and of TPA (2, 1, 1), which are still learning; the caches are 64, 16 and 24 per token."""
    from attn_course.demos.tpa import COMPARE, train_and_measure

    res = {kind: train_and_measure(kind, seed=seed, progress=False, **COMPARE)[1:]
           for kind in ("MHA", "GQA (H_kv=2)", "TPA (R=2,1,1)")}
    acc = {kind: a for kind, (a, _) in res.items()}
    assert acc["MHA"] > 0.85
    for kind in ("GQA (H_kv=2)", "TPA (R=2,1,1)"):
        assert 0.3 < acc[kind] < acc["MHA"] - 0.15, (kind, acc)
    assert {kind: c for kind, (_, c) in res.items()} == {"MHA": 2 * 8 * 4, "GQA (H_kv=2)": 2 * 2 * 4,
                                                         "TPA (R=2,1,1)": (1 + 1) * (8 + 4)}
