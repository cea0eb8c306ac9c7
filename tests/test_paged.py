"""PagedKVCache and paged_attention: the cache holds exactly what was appended (against a plain list of
tensors), forks share blocks and copy on write, running out of blocks changes nothing, freeing returns
blocks; the decode step equals SDPA (fp64) over each sequence's keys, with GQA, and FlexAttention."""
import pytest
import torch
import torch.nn.functional as F

from attn_course.paged import OutOfBlocksError, PagedKVCache, paged_attention

TOL64 = dict(atol=1e-10, rtol=1e-10)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here at one thread (conftest's ``one_thread``)."""


def _kv(H, n, D, g):
    return torch.randn(H, n, D, generator=g, dtype=torch.float64), torch.randn(H, n, D, generator=g, dtype=torch.float64)


def _filled(lengths, block_size, H=2, D=8, num_blocks=64, chunk=5, seed=0):
    """A cache with one sequence per length, appended in chunks of ``chunk`` tokens, interleaved between
    sequences (so their blocks interleave in the pool); returns (cache, ids, reference k/v per sequence)."""
    g = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(num_blocks, block_size, H, D, dtype=torch.float64)
    ids = [cache.new_sequence() for _ in lengths]
    ref = {s: ([], []) for s in ids}
    done = [0] * len(lengths)
    while any(d < L for d, L in zip(done, lengths)):
        for i, s in enumerate(ids):
            n = min(chunk, lengths[i] - done[i])
            if n > 0:
                k, v = _kv(H, n, D, g)
                cache.append(s, k, v)
                ref[s][0].append(k), ref[s][1].append(v)
                done[i] += n
    ref = {s: (torch.cat(a, 1) if a else torch.zeros(H, 0, D, dtype=torch.float64),
               torch.cat(b, 1) if b else torch.zeros(H, 0, D, dtype=torch.float64)) for s, (a, b) in ref.items()}
    return cache, ids, ref


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("chunk", [1, 3, 40])
def test_cache_holds_what_was_appended(block_size, chunk):
    lengths = [0, 1, 17, 40]
    cache, ids, ref = _filled(lengths, block_size, chunk=chunk, num_blocks=200)
    for s, L in zip(ids, lengths):
        k, v = cache.gather(s)
        torch.testing.assert_close(k, ref[s][0], atol=0, rtol=0)
        torch.testing.assert_close(v, ref[s][1], atol=0, rtol=0)
        assert cache.seq_len(s) == L and len(cache.block_table(s)) == -(-L // block_size)
    used = sum(-(-L // block_size) for L in lengths)
    assert cache.num_free_blocks() == 200 - used
    tables = [b for s in ids for b in cache.block_table(s)]
    assert len(set(tables)) == len(tables)                       # no block used twice


@pytest.mark.parametrize("H,Hq", [(1, 1), (2, 2), (2, 6), (1, 4)])
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_paged_attention_equals_sdpa(H, Hq, block_size):
    lengths = [1, 7, 33, 16, 0]
    cache, ids, ref = _filled(lengths, block_size, H=H, num_blocks=128)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(len(ids), Hq, 8, generator=g, dtype=torch.float64)
    out = paged_attention(q, cache, ids)
    assert out.shape == (len(ids), Hq, 8)
    for i, s in enumerate(ids):
        k, v = ref[s]
        want = F.scaled_dot_product_attention(q[i, :, None], k, v, enable_gqa=True)[:, 0]
        torch.testing.assert_close(out[i], want, **TOL64)   # the empty sequence: zeros, as SDPA
    out2 = paged_attention(q * 3, cache, ids, scale=0.3)
    i = 2
    want = F.scaled_dot_product_attention(q[i, :, None] * 3, *ref[ids[i]], scale=0.3, enable_gqa=True)[:, 0]
    torch.testing.assert_close(out2[i], want, **TOL64)


def test_paged_attention_float32_and_repeated_ids():
    cache, ids, ref = _filled([20, 9], 4, H=2)
    cache32 = PagedKVCache(64, 4, 2, 8)
    s = cache32.new_sequence()
    cache32.append(s, *ref[ids[0]])
    q = torch.randn(2, 4, 8)
    out = paged_attention(q, cache32, [s, s])
    assert out.dtype == torch.float32
    want = F.scaled_dot_product_attention(q.double()[:, :, None], *(t[None] for t in ref[ids[0]]), enable_gqa=True)
    torch.testing.assert_close(out.double(), want[:, :, 0], atol=2e-6, rtol=2e-6)


def test_paged_attention_matches_flex_attention():
    """FlexAttention (PyTorch's own) on a padded batch with a length mask, GQA."""
    from torch.nn.attention.flex_attention import flex_attention
    lengths = [5, 23, 12]
    cache, ids, ref = _filled(lengths, 4, H=2, num_blocks=64)
    q = torch.randn(3, 6, 8, dtype=torch.float64)
    Lmax = max(lengths)
    K = torch.zeros(3, 2, Lmax, 8, dtype=torch.float64)
    V = torch.zeros_like(K)
    for i, s in enumerate(ids):
        K[i, :, :lengths[i]], V[i, :, :lengths[i]] = ref[s]
    lens = torch.tensor(lengths)

    def mask_padding(score, b, h, q_idx, kv_idx):
        return torch.where(kv_idx < lens[b], score, -float("inf"))
    want = flex_attention(q[:, :, None], K, V, score_mod=mask_padding, enable_gqa=True)[:, :, 0]
    torch.testing.assert_close(paged_attention(q, cache, ids), want, **TOL64)


def test_fork_shares_blocks_and_copies_on_write():
    g = torch.Generator().manual_seed(0)
    cache = PagedKVCache(16, 4, 2, 8, dtype=torch.float64)
    p = cache.new_sequence()
    k0, v0 = _kv(2, 10, 8, g)                                    # 2 full blocks + a half-full third
    cache.append(p, k0, v0)
    free0 = cache.num_free_blocks()
    c = cache.fork(p)
    assert cache.block_table(c) == cache.block_table(p) and cache.num_free_blocks() == free0   # nothing copied
    torch.testing.assert_close(cache.gather(c)[0], k0, atol=0, rtol=0)
    k1, v1 = _kv(2, 1, 8, g)
    cache.append(c, k1, v1)                                      # first write into the shared last block: COW
    tp, tc = cache.block_table(p), cache.block_table(c)
    assert tc[:2] == tp[:2] and tc[2] != tp[2] and cache.num_free_blocks() == free0 - 1
    torch.testing.assert_close(cache.gather(p)[0], k0, atol=0, rtol=0)          # parent untouched
    torch.testing.assert_close(cache.gather(c)[0], torch.cat([k0, k1], 1), atol=0, rtol=0)
    k2, v2 = _kv(2, 2, 8, g)                                     # fills the last block (10 + 2 = 12)
    cache.append(p, k2, v2)                                      # the parent's last block is its own again: no copy
    assert cache.block_table(p) == tp and cache.num_free_blocks() == free0 - 1
    torch.testing.assert_close(cache.gather(p)[1], torch.cat([v0, v2], 1), atol=0, rtol=0)
    torch.testing.assert_close(cache.gather(c)[1], torch.cat([v0, v1], 1), atol=0, rtol=0)
    q = torch.randn(2, 2, 8, dtype=torch.float64)
    out = paged_attention(q, cache, [p, c])
    for i, s in enumerate([p, c]):
        want = F.scaled_dot_product_attention(q[i, :, None], *cache.gather(s))[:, 0]
        torch.testing.assert_close(out[i], want, **TOL64)


def test_fork_of_full_blocks_copies_nothing_and_free_returns_shared_blocks_last():
    cache = PagedKVCache(8, 4, 1, 2)
    p = cache.new_sequence()
    cache.append(p, torch.ones(1, 8, 2), torch.ones(1, 8, 2))    # exactly two full blocks
    kids = [cache.fork(p) for _ in range(3)]
    for c in kids:
        cache.append(c, torch.zeros(1, 1, 2), torch.zeros(1, 1, 2))   # each takes one new block, copies none
    assert cache.num_free_blocks() == 8 - 2 - 3
    cache.free(p)
    assert cache.num_free_blocks() == 3                           # the prompt's blocks still used by the kids
    for c in kids:
        cache.free(c)
    assert cache.num_free_blocks() == 8 and cache.sequences() == []
    s = cache.new_sequence()
    cache.append(s, torch.ones(1, 5, 2), torch.ones(1, 5, 2))
    assert cache.block_table(s) == [0, 1]                         # lowest blocks first again


def test_out_of_blocks_leaves_the_cache_unchanged():
    cache, ids, ref = _filled([6, 3], 4, num_blocks=5)           # 2 + 1 blocks used, 2 free
    c = cache.fork(ids[0])
    snap = (cache.k_pool.clone(), cache.v_pool.clone(), [cache.block_table(s) for s in (*ids, c)],
            [cache.seq_len(s) for s in (*ids, c)], cache.num_free_blocks(), list(cache.ref_count))
    g = torch.Generator().manual_seed(3)
    for seq, n in [(ids[1], 10), (c, 7)]:                        # 7 tokens to c: COW + 2 new = 3 > 2 free
        with pytest.raises(OutOfBlocksError, match=r"needs 3 free blocks.*only 2 of 5.*unchanged"):
            cache.append(seq, *_kv(2, n, 8, g))
        assert torch.equal(cache.k_pool, snap[0]) and torch.equal(cache.v_pool, snap[1])
        assert [cache.block_table(s) for s in (*ids, c)] == snap[2]
        assert [cache.seq_len(s) for s in (*ids, c)] == snap[3]
        assert cache.num_free_blocks() == snap[4] and cache.ref_count == snap[5]
    cache.append(c, *_kv(2, 6, 8, g))                            # COW + 1 new = 2: fits exactly
    assert cache.num_free_blocks() == 0


def test_bad_input_raises_valueerror_naming_sizes():
    with pytest.raises(ValueError, match="block_size"):
        PagedKVCache(4, 0, 1, 2)
    with pytest.raises(ValueError, match="dtype"):
        PagedKVCache(4, 2, 1, 2, dtype=torch.int64)
    cache = PagedKVCache(4, 2, 2, 8)
    s = cache.new_sequence()
    with pytest.raises(ValueError, match=r"\(2, 'n', 8\).*\(3, 1, 8\)"):
        cache.append(s, torch.zeros(3, 1, 8), torch.zeros(3, 1, 8))
    with pytest.raises(ValueError, match=r"n >= 1.*\(2, 0, 8\)"):
        cache.append(s, torch.zeros(2, 0, 8), torch.zeros(2, 0, 8))
    with pytest.raises(ValueError, match="same shape"):
        cache.append(s, torch.zeros(2, 1, 8), torch.zeros(2, 2, 8))
    with pytest.raises(ValueError, match="unknown sequence 7"):
        cache.append(7, torch.zeros(2, 1, 8), torch.zeros(2, 1, 8))
    cache.free(s)
    with pytest.raises(ValueError, match="unknown sequence"):
        cache.gather(s)
    s = cache.new_sequence()
    with pytest.raises(ValueError, match=r"\(1, a multiple of num_kv_heads=2, 8\).*\(1, 3, 8\)"):
        paged_attention(torch.zeros(1, 3, 8), cache, [s])
    with pytest.raises(ValueError, match=r"\(2, a multiple"):
        paged_attention(torch.zeros(1, 2, 8), cache, [s, s])
