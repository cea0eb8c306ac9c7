"""GroupedQueryAttention(window=W): equal to explicit sliding-window attention; the rolling-buffer cache
keeps len <= W and constant bytes, and token-by-token (or chunked) decoding equals the full forward."""
import math

import pytest
import torch
from einops import rearrange

from attn_course import GroupedQueryAttention, masks
from attn_course.gqa import KVCache, RollingKVCache, StaticKVCache


def _reference(m, x, W, causal):
    """Brute force in fp64: per query head h (kv head h // G), softmax over keys within the window."""
    B, L, _ = x.shape
    H, Hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
    q = rearrange(m.q_proj(x), "b l (h d) -> b h l d", h=H).double()
    k = rearrange(m.k_proj(x), "b l (h d) -> b h l d", h=Hkv).double()
    v = rearrange(m.v_proj(x), "b l (h d) -> b h l d", h=Hkv).double()
    out = torch.zeros(B, H, L, d, dtype=torch.float64)
    for h in range(H):
        g = h // (H // Hkv)
        for i in range(L):
            js = [j for j in range(L) if (0 <= i - j < W if causal else abs(i - j) < W)]
            s = torch.einsum("bd,bnd->bn", q[:, h, i], k[:, g, js]) / math.sqrt(d)     # (B, n)
            out[:, h, i] = torch.einsum("bn,bnd->bd", torch.softmax(s, -1), v[:, g, js])
    return m.out_proj(rearrange(out, "b h l d -> b l (h d)").to(x.dtype))


@pytest.mark.parametrize("causal", [True, False])
def test_window_forward_matches_brute_force(causal):
    torch.manual_seed(0)
    m = GroupedQueryAttention(24, 6, 2, window=4).eval()
    x = torch.randn(2, 11, 24)
    with torch.no_grad():
        y, _ = m(x, is_causal=causal)
        y2, w = m(x, is_causal=causal, need_weights=True)
        ref = _reference(m, x, 4, causal)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y2, ref, atol=1e-5, rtol=1e-5)
    band = masks.sliding_window_mask(11, 4, causal=causal)
    assert bool((w[..., ~band] == 0).all())                              # no weight outside the window


@pytest.mark.parametrize("W, L, chunks", [(4, 23, [1] * 23), (5, 17, [3, 1, 7, 1, 1, 4]), (3, 12, [12]),
                                          (6, 20, [2, 9, 1, 8])])
def test_rolling_cache_decoding_equals_full_forward(W, L, chunks):
    torch.manual_seed(W)
    m = GroupedQueryAttention(16, 4, 2, window=W).eval()
    x = torch.randn(2, L, 16)
    with torch.no_grad():
        full, _ = m(x, is_causal=True)
        cache, outs, t = RollingKVCache(W), [], 0
        sizes = []
        for n in chunks:
            y, _ = m(x[:, t:t + n], is_causal=True, cache=cache)
            outs.append(y)
            t += n
            assert len(cache) <= W and len(cache) == min(t, W)
            sizes.append(cache.nbytes())
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=1e-5)
    assert len(set(sizes)) == 1 and sizes[0] == 2 * 2 * 2 * W * 4 * 4     # 2·B·H_kv·W·d_h·4 bytes, constant
    # the buffer holds exactly the last W positions, in slot p mod W
    assert sorted(cache.pos.tolist()) == list(range(L - W, L))
    assert all(int(p) % W == s for s, p in enumerate(cache.pos))


def test_plain_cache_grows_rolling_cache_does_not():
    torch.manual_seed(0)
    W = 8
    win, full = GroupedQueryAttention(16, 4, 1, window=W).eval(), GroupedQueryAttention(16, 4, 1).eval()
    x = torch.randn(1, 64, 16)
    rc, kc = RollingKVCache(W), KVCache()
    with torch.no_grad():
        for t in range(64):
            win(x[:, t:t + 1], is_causal=True, cache=rc)
            full(x[:, t:t + 1], is_causal=True, cache=kc)
    assert len(rc) == W and len(kc) == 64 and kc.nbytes() == 64 // W * rc.nbytes()


def test_window_without_window_is_unchanged_and_bad_inputs():
    torch.manual_seed(0)
    m = GroupedQueryAttention(16, 4, 2).eval()
    w = GroupedQueryAttention(16, 4, 2, window=100).eval()
    w.load_state_dict(m.state_dict())
    x = torch.randn(1, 9, 16)
    with torch.no_grad():
        torch.testing.assert_close(w(x, is_causal=True)[0], m(x, is_causal=True)[0])   # W >= L: plain causal
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="window"):
            GroupedQueryAttention(16, 4, 2, window=bad)
    with pytest.raises(ValueError, match="RollingKVCache"):
        w(x, is_causal=True, cache=StaticKVCache(1, 2, 16, 4))       # a preallocated cache cannot roll
    with pytest.raises(ValueError, match="is_causal=True"):
        w(x, cache=KVCache())
    with pytest.raises(ValueError, match="RollingKVCache"):
        w(x, is_causal=True, cache=RollingKVCache(5))
    with pytest.raises(ValueError, match="window=W"):
        m(x, is_causal=True, cache=RollingKVCache(5))
    with pytest.raises(ValueError, match="is_causal=True"):
        w(x, cache=RollingKVCache(100))
    with pytest.raises(ValueError, match="attn_mask"):
        w(x, attn_mask=torch.ones(9, 9, dtype=torch.bool))
    c = RollingKVCache(4)
    w2 = GroupedQueryAttention(16, 4, 2, window=4)
    w2(x, is_causal=True, cache=c)
    with pytest.raises(ValueError, match="batch size"):
        w2(torch.randn(2, 1, 16), is_causal=True, cache=c)


@pytest.mark.parametrize("need_weights", [False, True])
def test_window_with_empty_input_gives_an_empty_output(need_weights):
    m = GroupedQueryAttention(16, 4, 2, window=3).eval()
    out, w = m(torch.zeros(2, 0, 16), is_causal=True, need_weights=need_weights)
    assert out.shape == (2, 0, 16) and (w is None or w.shape == (2, 4, 0, 0))
    cache = RollingKVCache(3)
    m(torch.randn(2, 5, 16), cache=cache, is_causal=True)
    out, w = m(torch.zeros(2, 0, 16), cache=cache, is_causal=True, need_weights=need_weights)
    assert out.shape == (2, 0, 16) and len(cache) == 3 and (w is None or w.shape == (2, 4, 0, 3))


@pytest.mark.parametrize("W, L, chunks", [(4, 23, [1] * 23), (5, 17, [3, 1, 7, 1, 1, 4]), (3, 12, [12]),
                                          (6, 20, [2, 9, 1, 8])])
@pytest.mark.parametrize("need_weights", [False, True])
def test_plain_cache_with_a_window_keeps_the_last_W_positions_and_decodes_like_the_full_forward(W, L, chunks,
                                                                                              need_weights):
    """The contract: with window set, the cache keeps only the last W positions. A plain KVCache given to a
    windowed module is cropped to them after every call, and decoding still equals the full windowed forward."""
    torch.manual_seed(W)
    m = GroupedQueryAttention(16, 4, 2, window=W).eval()
    x = torch.randn(2, L, 16)
    with torch.no_grad():
        full, _ = m(x, is_causal=True)
        cache, outs, t = KVCache(), [], 0
        for n in chunks:
            y, w = m(x[:, t:t + n], is_causal=True, cache=cache, need_weights=need_weights)
            if need_weights:   # rows sum to 1 and every query sees at most W keys
                assert torch.allclose(w.sum(-1), torch.ones(())) and int((w > 0).sum(-1).max()) <= W
            outs.append(y)
            t += n
            assert len(cache) == min(t, W) and cache.nbytes() <= 2 * 2 * 2 * W * 4 * 4
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=1e-5)
    k_full = rearrange(m.k_proj(x), "b l (h d) -> b h l d", h=2)
    torch.testing.assert_close(cache.k, k_full[:, :, -W:])            # exactly the last W positions, in order
