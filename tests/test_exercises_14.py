"""Exercise set 14: the reference solutions (and alternatives in another style) pass every case; each common
mistake fails with the hint that names it; the references agree with attn_course.paged (a real pool, forks with
copy-on-write, paged_attention)."""
import math

import pytest
import torch
import torch.nn.functional as F

from attn_course.grading.exercises import get
from attn_course.paged import PagedKVCache, paged_attention
from exercise_kit import assert_all_pass, assert_hint


# ---- 14_pool_blocks ----------------------------------------------------------------------------------

def pool_blocks(memory_bytes, num_layers, num_kv_heads, head_dim, bytes_per_element, block_size,
                *, kv=2, layers=True, nbytes=True, tokens=False, ceil=False):
    block = (kv * (num_layers if layers else 1) * num_kv_heads * head_dim * (bytes_per_element if nbytes else 1)
             * (1 if tokens else block_size))
    return math.ceil(memory_bytes / block) if ceil else memory_bytes // block


def test_pool_blocks_reference_passes_and_matches_a_real_pool():
    assert_all_pass("14_pool_blocks", pool_blocks)
    assert pool_blocks(40 * 2**30, 32, 8, 128, 2, 16) == 20_480          # the prompt's Llama-3-8B example
    cache = PagedKVCache(7, 16, 8, 128, dtype=torch.float16)              # one layer's pool: nbytes is K and V
    assert pool_blocks(cache.nbytes(), 1, 8, 128, 2, 16) == 7 and pool_blocks(cache.nbytes() - 1, 1, 8, 128, 2, 16) == 6


@pytest.mark.parametrize("mistake, hint", [
    (dict(kv=1), "keys AND values"),
    (dict(layers=False), "multiply by num_layers"),
    (dict(nbytes=False), "multiply the numbers per block by bytes_per_element"),
    (dict(tokens=True), "counts token slots"),
    (dict(ceil=True), "round down"),
])
def test_pool_blocks_mistakes_hinted(mistake, hint):
    assert_hint("14_pool_blocks", lambda *a: pool_blocks(*a, **mistake), hint)


# ---- 14_shared_prefix_blocks -------------------------------------------------------------------------

def shared_prefix_blocks(prefix_len, suffix_lengths, block_size, *, cow=True, parent=True, share=True):
    ceil = lambda n: -(-n // block_size)                                 # noqa: E731
    if not share:
        return sum(ceil(prefix_len + u) for u in suffix_lengths) + (ceil(prefix_len) if parent else 0)
    first = prefix_len // block_size if cow else ceil(prefix_len)
    return sum(ceil(prefix_len + u) - first for u in suffix_lengths) + (ceil(prefix_len) if parent else 0)


def blocks_by_simulation(prefix_len, suffix_lengths, block_size):
    """The same count from the package's cache: fork the prompt, append each suffix, count used blocks."""
    cache = PagedKVCache(10_000, block_size, 1, 1)
    p = cache.new_sequence()
    cache.append(p, torch.zeros(1, prefix_len, 1), torch.zeros(1, prefix_len, 1))
    for u in suffix_lengths:
        c = cache.fork(p)
        cache.append(c, torch.zeros(1, u, 1), torch.zeros(1, u, 1))
    return cache.num_blocks - cache.num_free_blocks()


def test_shared_prefix_reference_passes_and_equals_the_package():
    assert_all_pass("14_shared_prefix_blocks", shared_prefix_blocks)
    assert_all_pass("14_shared_prefix_blocks", blocks_by_simulation)
    assert shared_prefix_blocks(10, [3, 7], 4) == 8                       # the prompt's example
    ex = get("14_shared_prefix_blocks")
    for seed in range(5):
        for case in ex.cases(torch.Generator().manual_seed(seed)):
            assert int(ex.expected(case)["blocks"]) == blocks_by_simulation(*case.params.values())


@pytest.mark.parametrize("mistake, hint", [
    (dict(cow=False), "copy-on-write"),
    (dict(parent=False), "count its ceil(prefix_len / block_size) blocks once"),
    (dict(share=False), "count them once, not once per request"),
    (dict(share=False, parent=False), "that is the cache without sharing"),
])
def test_shared_prefix_mistakes_hinted(mistake, hint):
    assert_hint("14_shared_prefix_blocks", lambda *a: shared_prefix_blocks(*a, **mistake), hint)


# ---- 14_paged_decode ---------------------------------------------------------------------------------

def paged_decode(q, k_pool, v_pool, block_table, seq_len, *, mask=True, grouping="div", order="table",
                 scale=True):
    """Online softmax over the blocks (the solution's method), with switchable mistakes."""
    H, d = q.shape
    Hkv, B = k_pool.shape[1], k_pool.shape[2]
    g = H // Hkv
    table = block_table.sort().values if order == "sorted" else block_table
    qg = q.reshape(Hkv, g, d) if grouping == "div" else q.reshape(g, Hkv, d).transpose(0, 1)
    qg = qg / (math.sqrt(d) if scale else 1.0)
    m = torch.full((Hkv, g, 1), -math.inf, dtype=q.dtype)
    l = torch.zeros(Hkv, g, 1, dtype=q.dtype)
    acc = torch.zeros(Hkv, g, d, dtype=q.dtype)
    for j in range(-(-seq_len // B)):
        n = min(B, seq_len - j * B) if mask else B
        K, V = k_pool[table[j], :, :n], v_pool[table[j], :, :n]
        s = qg @ K.transpose(1, 2)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p, alpha = torch.exp(s - m_new), torch.exp(m - m_new)
        l, acc, m = alpha * l + p.sum(-1, keepdim=True), alpha * acc + p @ V, m_new
    out = acc / l
    return (out if grouping == "div" else out.transpose(0, 1)).reshape(H, d)


def test_paged_decode_reference_passes_and_equals_paged_attention():
    assert_all_pass("14_paged_decode", paged_decode)
    ex = get("14_paged_decode")
    for case in ex.cases(torch.Generator().manual_seed(3)):
        i, L = case.inputs, case.params["seq_len"]
        nb, Hkv, B, d = i["k_pool"].shape
        cache = PagedKVCache(nb, B, Hkv, d, dtype=torch.float64)          # the same blocks, through the package
        s = cache.new_sequence()
        cache.append(s, torch.zeros(Hkv, L, d, dtype=torch.float64), torch.zeros(Hkv, L, d, dtype=torch.float64))
        cache.k_pool.zero_(), cache.v_pool.zero_()
        for j, b in enumerate(cache.block_table(s)):
            cache.k_pool[b], cache.v_pool[b] = i["k_pool"][i["block_table"][j]], i["v_pool"][i["block_table"][j]]
        want = paged_attention(i["q"][None], cache, [s])[0]
        torch.testing.assert_close(ex.expected(case)["out"], want, atol=1e-12, rtol=1e-12)
        K, V = cache.gather(s)
        ref = F.scaled_dot_product_attention(i["q"][:, None], K, V, enable_gqa=True)[:, 0]
        torch.testing.assert_close(want, ref, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("mistake, hint", [
    (dict(mask=False), "stale keys"),
    (dict(grouping="mod"), "not h % H_kv"),
    (dict(order="sorted"), "in the block table's order"),
    (dict(scale=False), "1/sqrt(head_dim)"),
])
def test_paged_decode_mistakes_hinted(mistake, hint):
    assert_hint("14_paged_decode", lambda *a: paged_decode(*a, **mistake), hint)


def test_gathering_the_sequence_fails_with_the_size_message():
    def gathered(q, k_pool, v_pool, block_table, seq_len):
        H, d = q.shape
        Hkv = k_pool.shape[1]
        K = k_pool[block_table].transpose(0, 1).reshape(Hkv, -1, d)[:, :seq_len]
        V = v_pool[block_table].transpose(0, 1).reshape(Hkv, -1, d)[:, :seq_len]
        K, V = K.repeat_interleave(H // Hkv, 0), V.repeat_interleave(H // Hkv, 0)
        return ((q[:, None] @ K.transpose(1, 2)) / math.sqrt(d)).softmax(-1).matmul(V)[:, 0]
    assert_hint("14_paged_decode", gathered, "whole sequence's keys or values gathered", ignore=())


# ---- 14_split_kv -------------------------------------------------------------------------------------

def split_kv_decode(q, k, v, num_splits, *, merge="lse", tensor_split=False, base2=False, normalise=True,
                    scale=True):
    E = q.shape[-1]
    C = -(-k.shape[1] // num_splits)
    ks = k.tensor_split(num_splits, dim=1) if tensor_split else k.split(C, dim=1)
    vs = v.tensor_split(num_splits, dim=1) if tensor_split else v.split(C, dim=1)
    outs, lses = [], []
    for k_s, v_s in zip(ks, vs):
        x = torch.einsum("he,hle->hl", q, k_s) / (math.sqrt(E) if scale else 1.0)
        m = x.amax(-1, keepdim=True)
        p = torch.exp(x - m)
        l = p.sum(-1, keepdim=True)
        outs.append(torch.einsum("hl,hld->hd", p, v_s) / (l if normalise else torch.exp(-m)))
        lses.append((m + torch.log(l)).squeeze(-1))
    split_out, split_lse = torch.stack(outs), torch.stack(lses)
    w = torch.softmax(split_lse, 0) if merge == "lse" else torch.full_like(split_lse, 1 / num_splits)
    normalised = split_out if normalise else split_out / torch.exp(split_lse)[..., None]
    out = (w[..., None] * normalised).sum(0)
    return out, split_out, split_lse / (math.log(2) if base2 else 1.0)


def test_split_kv_reference_passes_and_equals_the_package():
    from attn_course.decoding import split_partials
    assert_all_pass("14_split_kv", split_kv_decode)
    ex = get("14_split_kv")
    for case in ex.cases(torch.Generator().manual_seed(4)):
        i, S = case.inputs, case.params["num_splits"]
        want = ex.expected(case)
        parts, lse = split_partials(i["q"][:, None], i["k"], i["v"], S)          # (S, H, 1, Dv), (S, H, 1)
        torch.testing.assert_close(want["split_out"], parts[:, :, 0], atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(want["split_lse"], lse[:, :, 0], atol=1e-12, rtol=1e-12)
        ref = F.scaled_dot_product_attention(i["q"][:, None], i["k"], i["v"])[:, 0]
        torch.testing.assert_close(want["out"], ref, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("mistake, hint", [
    (dict(merge="mean"), "weight split s by exp(lse_s − lse)"),
    (dict(tensor_split=True), "not torch.tensor_split's sizes"),
    (dict(base2=True), "NATURAL log-sum-exp"),
    (dict(normalise=False), "normalised over its own keys"),
    (dict(scale=False), "1/sqrt(E)"),
])
def test_split_kv_mistakes_hinted(mistake, hint):
    assert_hint("14_split_kv", lambda *a: split_kv_decode(*a, **mistake), hint)
