"""GroupedQueryAttention: grouping against an fp64 per-head formula, MHA/MQA extremes, the KV cache."""
import math

import pytest
import torch
from torch.testing import assert_close

from attn_course import GroupedQueryAttention, MultiHeadAttention, kv_cache_bytes
from attn_course.gqa import KVCache, StaticKVCache

# (batch, num_heads, num_kv_heads): batch differs from the number of groups (the blog post's grouping bug of lesson 03 needs B == groups)
CONFIGS = [(3, 8, 2), (1, 4, 4), (2, 4, 1), (5, 6, 3), (4, 4, 2)]


def _reference(m, x, causal):
    """Per-head loop in fp64: query head i reads kv head i // (H / H_kv) (Ainslie et al. 2023)."""
    H, Hkv, dh = m.num_heads, m.num_kv_heads, m.head_dim
    W = {n: getattr(m, n).weight.double() for n in ("q_proj", "k_proj", "v_proj", "out_proj")}
    x = x.double()
    B, L, _ = x.shape
    heads = []
    for i in range(H):
        j = i // (H // Hkv)
        q = x @ W["q_proj"][i * dh:(i + 1) * dh].T
        k = x @ W["k_proj"][j * dh:(j + 1) * dh].T
        v = x @ W["v_proj"][j * dh:(j + 1) * dh].T
        s = q @ k.transpose(-1, -2) / math.sqrt(dh)
        if causal:
            s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        heads.append(torch.softmax(s, -1) @ v)
    return torch.cat(heads, -1) @ W["out_proj"].T


@pytest.mark.parametrize("B,H,Hkv", CONFIGS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("need_weights", [False, True])
def test_matches_per_head_reference(B, H, Hkv, causal, need_weights):
    m = GroupedQueryAttention(4 * H, H, Hkv).eval()
    x = torch.randn(B, 6, 4 * H)
    out, w = m(x, is_causal=causal, need_weights=need_weights)
    assert_close(out.double(), _reference(m, x, causal), atol=1e-5, rtol=1e-4)
    assert (w is None) != need_weights


def test_parameter_shapes_follow_contract():
    m = GroupedQueryAttention(64, 8, 2)
    assert m.head_dim == 8
    assert m.q_proj.weight.shape == (64, 64) and m.out_proj.weight.shape == (64, 64)
    assert m.k_proj.weight.shape == m.v_proj.weight.shape == (16, 64)
    assert m.q_proj.bias is None and m.out_proj.bias is None
    assert GroupedQueryAttention(64, 8, 2, bias=True).k_proj.bias.shape == (16,)


def test_num_kv_heads_equal_num_heads_is_mha():
    g = GroupedQueryAttention(16, 4, 4)
    m = MultiHeadAttention(16, 4, bias=False)
    m.load_state_dict(g.state_dict())
    x = torch.randn(2, 5, 16)
    assert_close(g(x, is_causal=True)[0], m(x, is_causal=True)[0])


def test_weights_shared_within_a_group():
    """With identical query weights, the heads of one group give identical maps; other groups differ."""
    g = GroupedQueryAttention(16, 4, 2)
    with torch.no_grad():
        g.q_proj.weight.copy_(g.q_proj.weight[:4].repeat(4, 1))          # all 4 query heads equal
    _, w = g(torch.randn(3, 5, 16), need_weights=True)
    assert_close(w[:, 0], w[:, 1])                                       # heads 0, 1 read kv head 0
    assert_close(w[:, 2], w[:, 3])                                       # heads 2, 3 read kv head 1
    assert not torch.allclose(w[:, 1], w[:, 2])


@pytest.mark.parametrize("mask_kind", ["bool", "float", "padding"])
def test_fast_equals_explicit_with_masks(mask_kind):
    g = GroupedQueryAttention(24, 6, 2).eval()
    x = torch.randn(3, 7, 24)
    mask = {"bool": torch.rand(3, 6, 7, 7) > 0.4, "float": torch.randn(7, 7),
            "padding": torch.arange(7)[None, None, None, :] < torch.tensor([7, 4, 1])[:, None, None, None]}[mask_kind]
    fast, _ = g(x, attn_mask=mask)
    slow, w = g(x, attn_mask=mask, need_weights=True)
    assert w.shape == (3, 6, 7, 7)
    assert_close(fast, slow, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("B,H,Hkv", CONFIGS)
@pytest.mark.parametrize("need_weights", [False, True])
def test_decode_token_by_token_equals_full_causal_forward(B, H, Hkv, need_weights):
    g = GroupedQueryAttention(4 * H, H, Hkv).eval()
    x = torch.randn(B, 7, 4 * H)
    full, _ = g(x, is_causal=True)
    cache = KVCache()
    steps = [g(x[:, t:t + 1], cache=cache, is_causal=True, need_weights=need_weights)[0] for t in range(7)]
    assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-4)
    assert len(cache) == 7 and cache.k.shape == (B, Hkv, 7, 4)


@pytest.mark.parametrize("need_weights", [False, True])
def test_prefill_chunks_are_causal_bottom_right(need_weights):
    g = GroupedQueryAttention(16, 4, 2).eval()
    x = torch.randn(2, 9, 16)
    full, _ = g(x, is_causal=True)
    cache = KVCache()
    parts = [g(x[:, a:b], cache=cache, is_causal=True, need_weights=need_weights) for a, b in ((0, 4), (4, 5), (5, 9))]
    assert_close(torch.cat([p[0] for p in parts], 1), full, atol=1e-5, rtol=1e-4)
    if need_weights:   # last chunk: 4 queries at positions 5..8 over 9 keys, bottom-right causal
        w = parts[2][1]
        assert w.shape == (2, 4, 4, 9)
        visible = w[0, 0] > 0
        assert torch.equal(visible, torch.arange(9)[None, :] <= torch.arange(5, 9)[:, None])


def test_cache_with_explicit_mask_broadcasts_over_cached_keys():
    """A padding-style mask over all L_cached + L keys is honoured while decoding."""
    g = GroupedQueryAttention(16, 4, 1).eval()
    x = torch.randn(2, 5, 16)
    keep = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)       # sample 1: drop token 0
    full_mask = keep[:, None, None, :] & torch.ones(5, 5, dtype=torch.bool).tril()
    full, _ = g(x, attn_mask=full_mask)
    cache = KVCache()
    steps = [g(x[:, t:t + 1], cache=cache, attn_mask=keep[:, None, None, :t + 1])[0] for t in range(5)]
    assert_close(torch.cat(steps, 1)[:, 1:], full[:, 1:], atol=1e-5, rtol=1e-4)


def test_causality_under_future_perturbation():
    g = GroupedQueryAttention(16, 4, 2)
    x = torch.randn(3, 6, 16)
    y = x.clone()
    y[:, 3:] += torch.randn(3, 3, 16)
    assert_close(g(x, is_causal=True)[0][:, :3], g(y, is_causal=True)[0][:, :3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("H,Hkv", [(8, 8), (8, 2), (8, 1)])
def test_cache_bytes_match_kv_cache_bytes(dtype, H, Hkv):
    g = GroupedQueryAttention(8 * H, H, Hkv).to(dtype).eval()
    cache = KVCache()
    mech = {8: "mha", 2: "gqa", 1: "mqa"}[Hkv]
    for t in range(1, 6):
        g(torch.randn(3, 1, 8 * H, dtype=dtype), cache=cache, is_causal=True)
        assert cache.nbytes() == kv_cache_bytes(mech, seq_len=t, num_heads=H, head_dim=8, batch_size=3,
                                                num_kv_heads=Hkv if mech == "gqa" else None, dtype=dtype)
    assert cache.nbytes() == 2 * 3 * Hkv * 5 * 8 * torch.empty((), dtype=dtype).element_size()


def test_gradients_flow_through_both_paths():
    g = GroupedQueryAttention(16, 4, 2)
    x = torch.randn(2, 5, 16, requires_grad=True)
    grads = []
    for need in (False, True):
        out, _ = g(x, is_causal=True, need_weights=need)
        grads.append(torch.autograd.grad(out.square().sum(), [x, g.k_proj.weight]))
    assert_close(grads[0][0], grads[1][0], atol=1e-5, rtol=1e-4)
    assert_close(grads[0][1], grads[1][1], atol=1e-5, rtol=1e-4)


def test_errors_name_sizes():
    with pytest.raises(ValueError, match="num_heads=8 is not divisible by num_kv_heads=3"):
        GroupedQueryAttention(32, 8, 3)
    with pytest.raises(ValueError, match="d_model=30 is not divisible by num_heads=4"):
        GroupedQueryAttention(30, 4, 2)
    with pytest.raises(ValueError, match="num_kv_heads must be a positive integer, got 0"):
        GroupedQueryAttention(32, 8, 0)
    g = GroupedQueryAttention(16, 4, 2)
    with pytest.raises(ValueError, match="x has last dimension 8.*d_model=16"):
        g(torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match="either attn_mask or is_causal"):
        g(torch.randn(2, 3, 16), attn_mask=torch.ones(3, 3, dtype=torch.bool), is_causal=True)
    with pytest.raises(ValueError, match=r"attn_mask of shape \(3, 2\) does not broadcast"):
        g(torch.randn(2, 3, 16), attn_mask=torch.ones(3, 2, dtype=torch.bool))
    cache = KVCache()
    g(torch.randn(2, 3, 16), cache=cache)
    with pytest.raises(ValueError, match=r"cache holds keys of shape .* = \(2, 2, 3, 4\).*\(3, 2, 1, 4\)"):
        g(torch.randn(3, 1, 16), cache=cache)


# --- up-training an MHA checkpoint into GQA (Ainslie et al. 2023, §2.1) -------------------------------

def test_from_multi_head_mean_pools_key_value_heads():
    m = MultiHeadAttention(16, 4)                          # with biases
    g = GroupedQueryAttention.from_multi_head(m, 2)
    assert (g.num_heads, g.num_kv_heads, g.head_dim) == (4, 2, 4)
    Wk = m.k_proj.weight.view(4, 4, 16)                    # (H, d_h, d_model)
    assert_close(g.k_proj.weight, torch.stack([Wk[0:2].mean(0), Wk[2:4].mean(0)]).reshape(8, 16))
    assert_close(g.v_proj.bias, m.v_proj.bias.view(2, 2, 4).mean(1).flatten())
    assert_close(g.q_proj.weight, m.q_proj.weight)
    assert_close(g.out_proj.bias, m.out_proj.bias)


def test_from_multi_head_is_exact_when_grouped_heads_agree():
    m = MultiHeadAttention(16, 4, bias=False)
    with torch.no_grad():                                  # heads 0=1 and 2=3 share K and V
        for p in (m.k_proj.weight, m.v_proj.weight):
            w = p.view(4, 4, 16)
            w[1], w[3] = w[0], w[2]
    x = torch.randn(3, 5, 16)
    g = GroupedQueryAttention.from_multi_head(m, 2)
    assert_close(g(x, is_causal=True)[0], m(x, is_causal=True)[0])
    assert_close(GroupedQueryAttention.from_multi_head(m, 4)(x)[0], m(x)[0])   # H_kv = H: a plain copy


def test_from_multi_head_first_and_random_conversions():
    """Ainslie et al.'s other two conversions: the first head of each group, and fresh key/value projections."""
    m = MultiHeadAttention(16, 4)
    g = GroupedQueryAttention.from_multi_head(m, 2, pool="first")
    Wk, bv = m.k_proj.weight.view(4, 4, 16), m.v_proj.bias.view(4, 4)
    assert_close(g.k_proj.weight, torch.cat([Wk[0], Wk[2]]))
    assert_close(g.v_proj.bias, torch.cat([bv[0], bv[2]]))
    torch.manual_seed(3)
    r = GroupedQueryAttention.from_multi_head(m, 2, pool="random")
    torch.manual_seed(3)
    fresh = GroupedQueryAttention(16, 4, 2, bias=True)      # the same draws as the conversion's fresh module
    assert_close(r.k_proj.weight, fresh.k_proj.weight)
    assert_close(r.q_proj.weight, m.q_proj.weight)          # queries and output are still copied
    assert not torch.allclose(r.v_proj.weight, g.v_proj.weight)


def test_from_multi_head_errors():
    with pytest.raises(ValueError, match="pool='max'"):
        GroupedQueryAttention.from_multi_head(MultiHeadAttention(16, 4), 2, pool="max")
    with pytest.raises(ValueError, match="num_heads=4 is not divisible by num_kv_heads=3"):
        GroupedQueryAttention.from_multi_head(MultiHeadAttention(16, 4), 3)
    with pytest.raises(ValueError, match="expected a multi-head module .*num_heads=4.*num_kv_heads=2"):
        GroupedQueryAttention.from_multi_head(GroupedQueryAttention(16, 4, 2), 1)


# --- lesson 03's tiny task and model ------------------------------------------------------------------

def test_lag_task_targets():
    from attn_course.demos.heads import IGNORE, LagTask
    task = LagTask(vocab_size=10, seq_len=6, lag=3)
    x = torch.tensor([[1, 7, 2, 9, 4, 4]])
    y = task.targets(x)
    assert y[0, :3].tolist() == [IGNORE] * 3
    assert y[0, 3:].tolist() == [(2 - 1) % 10, (9 - 7) % 10, (4 - 2) % 10]


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_tiny_model_decodes_with_cache_like_full_forward(num_kv_heads):
    from attn_course.demos.heads import LagTask, make_model
    task = LagTask(vocab_size=8, seq_len=7)
    model = make_model(task, d_model=16, num_heads=4, num_kv_heads=num_kv_heads).eval()
    x, _ = task.sample(torch.Generator().manual_seed(0), 3)
    full = model(x)
    cache = KVCache()
    steps = torch.cat([model(x[:, t:t + 1], cache=cache) for t in range(7)], 1)
    assert_close(steps, full, atol=1e-5, rtol=1e-4)
    assert cache.nbytes() == kv_cache_bytes("gqa", seq_len=7, num_heads=4, head_dim=4, batch_size=3,
                                            num_kv_heads=num_kv_heads, dtype=torch.float32)


@pytest.mark.parametrize("need_weights", [False, True])
def test_static_cache_decodes_like_full_forward_and_like_the_growing_cache(need_weights):
    g = GroupedQueryAttention(16, 4, 2).eval()
    x = torch.randn(3, 9, 16)
    full, _ = g(x, is_causal=True)
    static, growing = StaticKVCache(3, 2, 12, 4), KVCache()
    chunks = ((0, 4), (4, 5), (5, 9))                                    # prefill, one token, a chunk
    out = [g(x[:, a:b], cache=static, is_causal=True, need_weights=need_weights)[0] for a, b in chunks]
    ref = [g(x[:, a:b], cache=growing, is_causal=True)[0] for a, b in chunks]
    assert_close(torch.cat(out, 1), full, atol=1e-5, rtol=1e-4)
    assert_close(torch.cat(out, 1), torch.cat(ref, 1), atol=1e-6, rtol=1e-5)
    assert len(static) == 9 and torch.equal(static.k, growing.k) and torch.equal(static.v, growing.v)
    assert static.nbytes() == kv_cache_bytes("gqa", seq_len=12, num_heads=4, head_dim=4, batch_size=3,
                                             num_kv_heads=2, dtype=torch.float32)


def test_static_cache_writes_in_place_while_the_growing_cache_reallocates_every_step():
    B, H_kv, d_h, T = 2, 2, 8, 16
    static, growing = StaticKVCache(B, H_kv, T, d_h), KVCache()
    new = torch.randn(B, H_kv, 1, d_h)
    static_ptrs, growing_ptrs = set(), []
    for _ in range(T):
        static.update(new, new)
        growing.update(new, new)
        static_ptrs.add(static.k.untyped_storage().data_ptr())
        growing_ptrs.append(growing.k.untyped_storage().data_ptr())
    assert static_ptrs == {static.k_buf.untyped_storage().data_ptr()}            # one buffer, reused
    assert all(a != b for a, b in zip(growing_ptrs[1:], growing_ptrs))           # torch.cat: a new tensor each step
    assert torch.equal(static.k, growing.k)


def test_static_cache_errors_name_sizes():
    c = StaticKVCache(2, 2, 4, 8)
    with pytest.raises(ValueError, match="max_len=4"):
        c.update(torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8))
    with pytest.raises(ValueError, match=r"\(2, 2, 4, 8\)"):
        c.update(torch.randn(3, 2, 1, 8), torch.randn(3, 2, 1, 8))
    with pytest.raises(ValueError, match="max_len"):
        StaticKVCache(2, 2, 0, 8)
    with pytest.raises(ValueError, match="length=1"):
        c.crop(1)                                                          # holds 0 positions


def test_static_cache_crop_then_decode_equals_decoding_the_kept_prefix():
    g = GroupedQueryAttention(16, 4, 2).eval()
    x, other = torch.randn(2, 6, 16), torch.randn(2, 3, 16)
    c = StaticKVCache(2, 2, 8, 4)
    g(x[:, :3], cache=c, is_causal=True)
    g(other, cache=c, is_causal=True)                                      # 3 tokens to be rejected
    c.crop(3)
    out, _ = g(x[:, 3:], cache=c, is_causal=True)
    assert_close(out, g(x, is_causal=True)[0][:, 3:], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("need_weights", [False, True])
def test_empty_input_behaves_like_sdpa_with_and_without_cache(need_weights):
    """x of length 0: an empty output (and weights (B, H, 0, L_k)), with no cache and after a prefill."""
    torch.manual_seed(0)
    m = GroupedQueryAttention(16, 4, 2).double().eval()
    empty = torch.zeros(2, 0, 16, dtype=torch.float64)
    out, w = m(empty, is_causal=True, need_weights=need_weights)
    assert out.shape == (2, 0, 16) and (w is None) == (not need_weights)
    if need_weights:
        assert w.shape == (2, 4, 0, 0)
    cache = KVCache()
    m(torch.randn(2, 3, 16, dtype=torch.float64), cache=cache, is_causal=True)
    out, w = m(empty, cache=cache, is_causal=True, need_weights=need_weights)
    assert out.shape == (2, 0, 16) and len(cache) == 3
    if need_weights:
        assert w.shape == (2, 4, 0, 3)
