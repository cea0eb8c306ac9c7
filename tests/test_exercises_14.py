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

def paged_decode(q, reader, *, mask=True, grouping="div", order="table", scale=True):
    """Online softmax over the blocks read through the reader (the solution's method), with switchable mistakes."""
    H, d = q.shape
    B, seq_len = reader.block_size, reader.seq_len
    table = reader.block_table.sort().values if order == "sorted" else reader.block_table
    m = l = acc = None
    for j in range(-(-seq_len // B)):
        K, V = reader.read(table[j])
        n = min(B, seq_len - j * B) if mask else B
        Hkv, g = K.shape[0], H // K.shape[0]
        qg = q.reshape(Hkv, g, d) if grouping == "div" else q.reshape(g, Hkv, d).transpose(0, 1)
        qg = qg / (math.sqrt(d) if scale else 1.0)
        s = qg @ K[:, :n].transpose(1, 2)
        if m is None:
            m, l, acc = torch.full_like(s[..., :1], -math.inf), torch.zeros_like(s[..., :1]), torch.zeros_like(qg)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p, alpha = torch.exp(s - m_new), torch.exp(m - m_new)
        l, acc, m = alpha * l + p.sum(-1, keepdim=True), alpha * acc + p @ V[:, :n], m_new
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


def test_the_reader_hands_out_only_the_sequence_and_counts():
    """The step never gets the pool: the reader refuses a block outside the table (the case fails even if the
    refusal is caught), a third read of a block fails the case, and what it reads is a copy."""
    from attn_course.grading.exercises.lesson14 import BlockReader

    def peeks(q, reader):
        try:
            reader.read(max(reader.block_table.tolist()) + 1 if max(reader.block_table.tolist()) < 11 else 0)
        except ValueError:
            pass
        return paged_decode(q, reader)
    assert_hint("14_paged_decode", peeks, "not one of the sequence's", ignore=())

    def thrice(q, reader):
        for _ in range(3):
            reader.read(reader.block_table[0])
        return paged_decode(q, reader)
    assert_hint("14_paged_decode", thrice, "at most twice", ignore=())
    k, v = torch.randn(3, 1, 2, 4), torch.randn(3, 1, 2, 4)
    reader = BlockReader(k, v, torch.tensor([2, 0]), 3)
    K, _ = reader.read(2)
    K.zero_()
    assert torch.equal(reader.read(2)[0], k[2]) and reader.reads == {2: 2}
    with pytest.raises(ValueError, match="not one of this sequence's blocks"):
        reader.read(1)


def test_gathering_what_was_read_fails_with_the_size_message():
    def gathered(q, reader):
        H, d = q.shape
        blocks = [reader.read(b) for b in reader.block_table.tolist()]
        K = torch.cat([k for k, _ in blocks], 1)[:, :reader.seq_len]
        V = torch.cat([v for _, v in blocks], 1)[:, :reader.seq_len]
        K, V = K.repeat_interleave(H // K.shape[0], 0), V.repeat_interleave(H // K.shape[0], 0)
        return ((q[:, None] @ K.transpose(1, 2)) / math.sqrt(d)).softmax(-1).matmul(V)[:, 0]
    assert_hint("14_paged_decode", gathered, "gathered into one tensor", ignore=())


# ---- 14_split_kv -------------------------------------------------------------------------------------

def merge_splits(split_out, split_lse, *, how="lse"):
    """The merge with the max subtracted, or a named mistake."""
    m = split_lse.amax(0)
    w = torch.exp(split_lse - m) if how != "naive" else torch.exp(split_lse)
    total = w.sum(0)
    if how == "mean":
        return split_out.mean(0), m + torch.log(total)
    lse = {"lse": m + torch.log(total), "naive": torch.log(total), "max": m,
           "log2": (m + torch.log(total)) / math.log(2)}[how]
    return (w[..., None] * split_out).sum(0) / total[..., None], lse


def test_split_kv_reference_passes_and_equals_the_package():
    """The merge passes; the judge's reference is attn_course.decoding.merge_splits; and on partials made from real
    keys (attn_course.decoding.split_partials), the merge gives attention over all of them."""
    from attn_course.decoding import merge_splits as course_merge, split_partials
    assert_all_pass("14_split_kv", merge_splits)
    ex = get("14_split_kv")
    for case in ex.cases(torch.Generator().manual_seed(3)):
        want = ex.expected(case)
        out, lse = course_merge(case.inputs["split_out"], case.inputs["split_lse"])
        torch.testing.assert_close(want["out"], out, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(want["lse"], lse, atol=1e-12, rtol=1e-12)
    q, k, v = torch.randn(3, 1, 8, dtype=torch.float64), torch.randn(3, 40, 8, dtype=torch.float64), \
        torch.randn(3, 40, 5, dtype=torch.float64)
    parts, lses = split_partials(q, k, v, 4)
    out, _ = merge_splits(parts, lses)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("mistake, hint", [
    (dict(how="mean"), "weight split s by exp(lse_s − lse)"),
    (dict(how="naive"), "subtract the largest lse_s"),
    (dict(how="max"), "not the largest lse_s"),
    (dict(how="log2"), "NATURAL log"),
])
def test_split_kv_mistakes_hinted(mistake, hint):
    assert_hint("14_split_kv", lambda *a: merge_splits(*a, **mistake), hint)


def test_every_split_case_draws_far_apart_lses_and_an_empty_split():
    for seed in range(5):
        cases = get("14_split_kv").cases(torch.Generator().manual_seed(seed))
        lse = [c.inputs["split_lse"] for c in cases]
        assert [bool(torch.isinf(x).any()) for x in lse] == [False, True, True]
        assert float(lse[2][torch.isfinite(lse[2])].abs().max()) == 900         # beyond exp's float64 range
