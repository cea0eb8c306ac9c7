"""Exercise set 03: the reference solutions pass every case; each common mistake fails with its hint."""
import math
from functools import partial

import pytest
import torch

from attn_course.grading.exercises import get
import exercise_kit
from exercise_kit import assert_all_pass

# some cases cannot tell two mistakes apart, so a mistake need only be named on the cases that can
assert_hint = partial(exercise_kit.assert_hint, every=False)


def expand_ok(k, H):
    return k.repeat_interleave(H // k.shape[1], dim=1)


def expand_tiled(k, H):
    return k.repeat(1, H // k.shape[1], 1, 1)


def test_expand_kv():
    assert_all_pass("03_expand_kv", expand_ok)
    assert_hint("03_expand_kv", expand_tiled, "repeat_interleave")


def make_gqa(expand=expand_ok, scale=True, mask=True):
    def gqa_attention(q, k, v, causal):
        H, L = q.shape[1], q.shape[2]
        k, v = expand(k, H), expand(v, H)
        s = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
        if causal and mask:
            s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        return torch.softmax(s, -1) @ v
    return gqa_attention


def test_gqa_attention():
    assert_all_pass("03_gqa_attention", make_gqa())
    assert_hint("03_gqa_attention", make_gqa(expand=expand_tiled), "repeat_interleave")
    assert_hint("03_gqa_attention", make_gqa(scale=False), "not scaled")
    assert_hint("03_gqa_attention", make_gqa(mask=False), "causal mask is missing")


def test_gqa_cases_have_batch_different_from_groups():
    cases = get("03_gqa_attention").cases(torch.Generator().manual_seed(0))
    assert any(c.inputs["q"].shape[0] not in (1, c.inputs["k"].shape[1]) for c in cases)


def bytes_ok(num_layers, num_heads, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element):
    return 2 * num_layers * num_kv_heads * head_dim * seq_len * batch_size * bytes_per_element


@pytest.mark.parametrize("fn,fragment", [
    (lambda num_layers, num_heads, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element:
     2 * num_layers * num_heads * head_dim * seq_len * batch_size * bytes_per_element, "num_kv_heads"),
    (lambda num_layers, num_heads, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element:
     num_layers * num_kv_heads * head_dim * seq_len * batch_size * bytes_per_element, "multiply by 2"),
    (lambda num_layers, num_heads, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element:
     2 * num_kv_heads * head_dim * seq_len * batch_size * bytes_per_element, "num_layers"),
    (lambda num_layers, num_heads, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element:
     2 * num_layers * num_kv_heads * num_heads * head_dim * seq_len * batch_size * bytes_per_element, "survey's mistake"),
    (lambda num_layers, num_heads, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element:
     2 * num_layers * num_kv_heads * head_dim * seq_len * batch_size, "bytes_per_element"),
])
def test_kv_cache_bytes(fn, fragment):
    assert_all_pass("03_kv_cache_bytes", bytes_ok)
    assert_hint("03_kv_cache_bytes", fn, fragment)


def test_kv_cache_bytes_agrees_with_package():
    from attn_course import kv_cache_bytes
    assert bytes_ok(80, 64, 8, 128, 4096, 1, 2) == kv_cache_bytes("gqa", seq_len=4096, num_heads=64, head_dim=128,
                                                                   num_kv_heads=8, num_layers=80)


def make_decode(append_first=True, expand=expand_ok, scale=True, cat_dim=2):
    def decode_step(x_t, W_q, W_k, W_v, W_o, num_heads, num_kv_heads, k_cache, v_cache):
        B, _, D = x_t.shape
        d = D // num_heads
        q = (x_t @ W_q.T).view(B, 1, num_heads, d).transpose(1, 2)
        k_new = (x_t @ W_k.T).view(B, 1, num_kv_heads, d).transpose(1, 2)
        v_new = (x_t @ W_v.T).view(B, 1, num_kv_heads, d).transpose(1, 2)
        k_all = torch.cat([k_cache, k_new], dim=cat_dim)
        v_all = torch.cat([v_cache, v_new], dim=cat_dim)
        k_att, v_att = (k_all, v_all) if append_first else (k_cache, v_cache)
        s = q @ expand(k_att, num_heads).transpose(-2, -1) / (math.sqrt(d) if scale else 1.0)
        y = (torch.softmax(s, -1) @ expand(v_att, num_heads)).transpose(1, 2).reshape(B, 1, D)
        return y @ W_o.T, k_all, v_all
    return decode_step


def test_decode_step():
    assert_all_pass("03_decode_step", make_decode())
    assert_hint("03_decode_step", make_decode(append_first=False), "BEFORE attending")
    assert_hint("03_decode_step", make_decode(expand=expand_tiled), "repeat_interleave")
    assert_hint("03_decode_step", make_decode(scale=False), "not scaled")

    def prepends_to_caches(*args):                      # right y, but the new k, v put FIRST in the caches
        y, k, v = make_decode()(*args)
        return y, k.roll(1, dims=2), v.roll(1, dims=2)
    assert_hint("03_decode_step", prepends_to_caches, "new token's k and v appended")


def test_decode_step_matches_package_module():
    """The exercise's reference is the package's GQA decoding, computed independently."""
    from attn_course import GroupedQueryAttention
    from attn_course.gqa import KVCache
    m = GroupedQueryAttention(16, 4, 2)
    x = torch.randn(2, 3, 16)
    cache = KVCache()
    m(x[:, :2], cache=cache, is_causal=True)
    k0, v0 = cache.k.clone(), cache.v.clone()
    y_pkg, _ = m(x[:, 2:], cache=cache, is_causal=True)
    y, k, v = make_decode()(x[:, 2:], m.q_proj.weight, m.k_proj.weight, m.v_proj.weight, m.out_proj.weight, 4, 2, k0, v0)
    torch.testing.assert_close(y, y_pkg)
    torch.testing.assert_close(k, cache.k)
