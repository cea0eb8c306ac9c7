"""attn_course.sparse: every pattern's mask_mod equals its dense definition (masks.* or brute force),
FlexAttention with it equals attention() with the dense mask, score_mods equal their formulas, the
BlockMask classifies tiles as a brute-force pass does, and the compiled kernel agrees and is reused."""
import math

import pytest
import torch

from attn_course import attention, masks, positions, sparse


def _qkv(B, H, L, E, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, E, generator=g, dtype=dtype) for _ in range(3)]


def _brute(L, pred):
    return torch.tensor([[bool(pred(i, j)) for j in range(L)] for i in range(L)])


L, BLK = 48, 8
NB = L // BLK
RAND = sparse.random_block_layout(NB, 2, generator=torch.Generator().manual_seed(3))
ST = sparse.sparse_transformer_layout(NB, 3)
PATTERNS = {  # name: (mask_mod, independent dense reference)
    "causal": (sparse.causal(), masks.causal_mask(L)),
    "window": (sparse.sliding_window(5), masks.sliding_window_mask(L, 5)),
    "window, bidirectional": (sparse.sliding_window(4, causal=False), masks.sliding_window_mask(L, 4, causal=False)),
    "dilated": (sparse.dilated(4, 3), masks.dilated_mask(L, 4, 3)),
    "dilated, bidirectional": (sparse.dilated(3, 2, causal=False), masks.dilated_mask(L, 3, 2, causal=False)),
    "global+local": (sparse.global_local(3, [0, 17], L), masks.global_local_mask(L, 3, [0, 17])),
    "bigbird": (sparse.bigbird(3, [0], RAND, BLK, L),
                _brute(L, lambda i, j: abs(i - j) < 3 or i == 0 or j == 0 or RAND[i // BLK, j // BLK])),
    "sparse transformer": (sparse.block_sparse(ST, BLK, causal=True),
                           _brute(L, lambda i, j: j <= i and (i // BLK // 3 == j // BLK // 3 or j // BLK % 3 == 2))),
}


@pytest.mark.parametrize("name", list(PATTERNS))
def test_mask_mod_matches_dense_definition(name):
    mm, want = PATTERNS[name]
    assert torch.equal(sparse.dense(mm, L), want)


@pytest.mark.parametrize("name", list(PATTERNS))
def test_flex_with_block_mask_equals_attention_with_dense_mask(name):
    mm, want = PATTERNS[name]
    q, k, v = _qkv(2, 3, L, 8, seed=len(name))
    bm = sparse.block_mask(mm, L, block=BLK)
    out = sparse.flex(q, k, v, block_mask=bm, compiled=False)
    torch.testing.assert_close(out, attention(q, k, v, attn_mask=want)[0], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", ["window", "global+local", "sparse transformer", "dilated"])
def test_block_mask_classifies_tiles_like_brute_force(name):
    mm, dense = PATTERNS[name]
    bm = sparse.block_mask(mm, L, block=BLK)
    tiles = dense.reshape(NB, BLK, NB, BLK).permute(0, 2, 1, 3)               # (qb, kb, BLK, BLK)
    full, nonempty = tiles.all(-1).all(-1), tiles.any(-1).any(-1)
    assert torch.equal(bm.full_kv_num_blocks[0, 0], full.sum(-1).int())
    assert torch.equal(bm.kv_num_blocks[0, 0], (nonempty & ~full).sum(-1).int())   # partial tiles
    for qb in range(NB):
        n = int(bm.kv_num_blocks[0, 0, qb])
        assert set(bm.kv_indices[0, 0, qb, :n].tolist()) == set(torch.nonzero(nonempty[qb] & ~full[qb]).flatten().tolist())
    # a dense bool mask takes L² bytes; the BlockMask O((L/BLK)²)
    assert sparse.block_mask_bytes(bm) < L * L


def test_score_mods_equal_their_formulas():
    H, n = 4, 20
    q, k, v = _qkv(1, H, n, 8, seed=5)
    s = q @ k.transpose(-2, -1) / math.sqrt(8)                               # (1, H, n, n)
    causal = masks.causal_mask(n)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]

    def ref(scores):
        return torch.softmax(scores.masked_fill(~causal, -math.inf), -1) @ v

    bm = sparse.block_mask(sparse.causal(), n, block=8)
    got = sparse.flex(q, k, v, score_mod=sparse.alibi(H), block_mask=bm, compiled=False)
    m = positions.alibi_slopes(H).double()
    torch.testing.assert_close(got, ref(s - m[:, None, None] * (i - j)), atol=1e-6, rtol=1e-6)
    # and the course's own alibi_bias gives the same thing through attention()
    torch.testing.assert_close(got, attention(q, k, v, attn_mask=positions.alibi_bias(H, n, dtype=torch.float64)
                                              .masked_fill(~causal, -math.inf))[0], atol=1e-6, rtol=1e-6)
    got = sparse.flex(q * 30, k, v, score_mod=sparse.soft_cap(5.0), block_mask=bm, compiled=False)
    torch.testing.assert_close(got, ref(5.0 * torch.tanh(30 * s / 5.0)), atol=1e-8, rtol=1e-8)
    table = torch.randn(H, 2 * n - 1, dtype=torch.float64)
    got = sparse.flex(q, k, v, score_mod=sparse.relative_bias(table), block_mask=bm, compiled=False)
    bias = torch.stack([torch.tensor([[table[h, a - b + n - 1] for b in range(n)] for a in range(n)]) for h in range(H)])
    torch.testing.assert_close(got, ref(s + bias), atol=1e-8, rtol=1e-8)


def test_bad_inputs():
    with pytest.raises(ValueError, match="window"):
        sparse.sliding_window(0)
    with pytest.raises(ValueError, match="dilation"):
        sparse.dilated(3, 0)
    with pytest.raises(ValueError, match=r"\[0, q_len=10\)"):
        sparse.global_local(2, [10], 10)
    with pytest.raises(ValueError, match="cap"):
        sparse.soft_cap(0.0)
    with pytest.raises(ValueError, match="2L - 1"):
        sparse.relative_bias(torch.zeros(2, 6))
    with pytest.raises(ValueError, match="per_row=5"):
        sparse.random_block_layout(4, 5)
    with pytest.raises(ValueError, match="bool"):
        sparse.block_sparse(torch.ones(3, 3), 4)
    lay = sparse.random_block_layout(6, 2, generator=torch.Generator().manual_seed(0))
    assert lay.sum(-1).tolist() == [2] * 6


def test_compiled_flex_agrees_and_is_reused():
    """The compiled kernel (first call compiles C++ on CPU: slow) equals the dense reference, skipping
    empty tiles, and the compiled function is created once and reused."""
    n, W = 256, 32
    q, k, v = _qkv(1, 2, n, 16, seed=1, dtype=torch.float32)
    bm = sparse.block_mask(sparse.sliding_window(W), n, block=64)
    f = sparse.compiled_flex()
    assert sparse.compiled_flex() is f
    want = attention(q, k, v, attn_mask=masks.sliding_window_mask(n, W))[0]
    torch.testing.assert_close(sparse.flex(q, k, v, block_mask=bm), want, atol=2e-5, rtol=2e-5)
    q2 = torch.randn_like(q)
    torch.testing.assert_close(sparse.flex(q2, k, v, block_mask=bm),
                               attention(q2, k, v, attn_mask=masks.sliding_window_mask(n, W))[0], atol=2e-5, rtol=2e-5)


def test_tile_occupancy_matches_block_mask_and_ragged_edges():
    m = masks.sliding_window_mask(L, 5)
    full, partial = sparse.tile_occupancy(m, BLK)
    bm = sparse.block_mask(sparse.sliding_window(5), L, block=BLK)
    assert torch.equal(full.sum(-1).int(), bm.full_kv_num_blocks[0, 0])
    assert torch.equal(partial.sum(-1).int(), bm.kv_num_blocks[0, 0])
    # ragged: L=10, block 4 -> 3x3 tiles; a full causal mask's last diagonal tile (2 rows x 2 cols) is partial
    full, partial = sparse.tile_occupancy(masks.causal_mask(10), 4)
    assert full.tolist() == [[False, False, False], [True, False, False], [True, True, False]]
    assert partial.tolist() == [[True, False, False], [False, True, False], [False, False, True]]
    full, _ = sparse.tile_occupancy(torch.ones(10, 10, dtype=torch.bool), 4)
    assert bool(full.all())


def test_sparse_explorer_views():
    from attn_course.widgets.sparse import PATTERNS, SparseExplorer
    ex = SparseExplorer()
    for p in PATTERNS:
        v = ex.view(p, L=64, window=8, block=8)
        assert v.mask.shape == (64, 64) and 0 < v.density < 1
        assert v.tile_share >= v.density - 1e-9                          # tiles cover every kept pair
    v = ex.view("causal window", L=64, window=8, block=8)
    assert v.density == sum(min(i + 1, 8) for i in range(64)) / 64 ** 2
    assert int(v.partial.sum()) == 8 + 7 and int(v.full.sum()) == 0     # diagonal tiles + the ones just below
    box = ex.widget()
    box.controls["pattern"].value = "dilated"
    assert len(box.children[-1].outputs) == 1


def _tiles_brute(m, block):
    """Tiles with at least one kept pair, by a loop over tiles."""
    Lq, Lk = m.shape
    return sum(bool(m[a:a + block, b:b + block].any()) for a in range(0, Lq, block) for b in range(0, Lk, block))


def test_tile_share_counts_touched_tiles_and_exceeds_density():
    for m, block in [(masks.sliding_window_mask(64, 8), 8), (masks.dilated_mask(64, 8, 3), 8),
                     (masks.causal_mask(10), 4), (masks.global_local_mask(40, 3, [0, 17]), 16)]:
        n = -(-m.shape[0] // block) * -(-m.shape[1] // block)
        assert sparse.tile_share(m, block) == _tiles_brute(m, block) / n
        assert sparse.tile_share(m, block) >= sparse.density(m)
    # equal density, about twice the tiles (lesson 09 §2): W = 6 keys per row, plain vs dilated by r = 8
    win, dil = masks.sliding_window_mask(256, 6), masks.dilated_mask(256, 6, 8)
    assert abs(sparse.density(win) - sparse.density(dil)) < 0.002
    assert (_tiles_brute(win, 16), _tiles_brute(dil, 16)) == (31, 58)
    with pytest.raises(ValueError, match="block"):
        sparse.tile_share(win, 0)


def test_sparse_transformer_layout_device_and_definition():
    n, s = 6, 2
    lay = sparse.sparse_transformer_layout(n, s, device=torch.device("cpu"))
    ref = torch.tensor([[((i // s == j // s) or (j % s == s - 1)) and j <= i for j in range(n)] for i in range(n)])
    assert lay.device.type == "cpu" and torch.equal(lay, ref)
    if torch.cuda.is_available():
        assert sparse.sparse_transformer_layout(n, s, device="cuda").device.type == "cuda"


@pytest.mark.parametrize("causal", [True, False])
def test_document_mask_equals_attention_within_each_document(causal):
    """Packed documents: one masked attention over the row equals each document's own attention (fp64),
    through the dense mask and through FlexAttention with its BlockMask."""
    lengths = [5, 9, 1, 17]
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    L = ids.numel()
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, L, 8, generator=g, dtype=torch.float64) for _ in range(3))
    m = sparse.dense(sparse.document(ids, causal=causal), L)
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    assert torch.equal(m, (ids[:, None] == ids[None, :]) & ((j <= i) | (not causal)))
    out = attention(q, k, v, attn_mask=m)[0]
    pieces, start = [], 0
    for n in lengths:
        s = slice(start, start + n)
        pieces.append(torch.nn.functional.scaled_dot_product_attention(q[..., s, :], k[..., s, :], v[..., s, :],
                                                                        is_causal=causal))
        start += n
    torch.testing.assert_close(out, torch.cat(pieces, dim=-2), rtol=0, atol=1e-12)
    bm = sparse.block_mask(sparse.document(ids, causal=causal), L, block=8)
    got = sparse.flex(q, k, v, block_mask=bm, compiled=False)
    torch.testing.assert_close(got, out, rtol=0, atol=1e-12)


def test_document_ids_must_be_contiguous():
    with pytest.raises(ValueError, match="non-decreasing"):
        sparse.document([0, 0, 1, 0])
