"""Exercise set 09: the reference solutions (and alternatives in another style) pass every case for
several seeds; each common mistake fails with the hint that names it."""
import math
from functools import partial

import torch

import exercise_kit
from exercise_kit import assert_all_pass

assert_hint = partial(exercise_kit.assert_hint, every=False)
INF = float("inf")


# ---- 09_dilated_mask
def dilated_ok(L, window, dilation, *, le=False, reach=None, causal=True, flip=False):
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    d = i - j
    R = window * dilation if reach is None else reach
    m = (d % dilation == 0) & ((d.abs() <= R) if le else (d.abs() < R))
    m = m & (d >= 0) if causal else m
    return ~m if flip else m


def dilated_loops(L, window, dilation):
    m = torch.zeros(L, L, dtype=torch.bool)
    for i in range(L):
        for t in range(window):                      # the t-th kept key back from i
            j = i - t * dilation
            if j >= 0:
                m[i, j] = True
    return m


def test_dilated_mask():
    assert_all_pass("09_dilated_mask", dilated_ok)
    assert_all_pass("09_dilated_mask", dilated_loops)
    assert_hint("09_dilated_mask", partial(dilated_ok, le=True), "off by one")
    assert_hint("09_dilated_mask", lambda L, w, r: dilated_ok(L, w, r, reach=w), "reach must be window·dilation")
    assert_hint("09_dilated_mask", partial(dilated_ok, causal=False), "causal")
    assert_hint("09_dilated_mask", partial(dilated_ok, flip=True), "polarity")


# ---- 09_window_density
def density_ok(L, W):
    return sum(min(i + 1, W) for i in range(L)) / L ** 2


def density_closed_form(L, W):
    W = min(W, L)
    return (W * (W + 1) // 2 + (L - W) * W) / (L * L)


def test_window_density():
    assert_all_pass("09_window_density", density_ok)
    assert_all_pass("09_window_density", density_closed_form)
    assert_hint("09_window_density", lambda L, W: L * W / L ** 2, "first W − 1 rows")
    assert_hint("09_window_density", lambda L, W: sum(min(i, W - 1) + 1 + min(L - 1 - i, W - 1) for i in range(L)) / L ** 2,
                "only the past")
    assert_hint("09_window_density", lambda L, W: sum(min(i + 1, W) for i in range(L)), "fraction of all L² pairs")


# ---- 09_mask_mod
def make_ok(window, n_sink, *, causal_sink=True, le=False, sinks=True):
    def mask_mod(b, h, q_idx, kv_idx):
        d = q_idx - kv_idx
        win = (d >= 0) & ((d <= window) if le else (d < window))
        sink = (kv_idx < n_sink) & (d >= 0) if causal_sink else kv_idx < n_sink
        return win | sink if sinks else win
    return mask_mod


def make_where(window, n_sink):
    def mask_mod(b, h, q_idx, kv_idx):
        causal = kv_idx <= q_idx
        return torch.where(kv_idx < n_sink, causal, causal & (q_idx - kv_idx < window))
    return mask_mod


def test_mask_mod():
    assert_all_pass("09_mask_mod", make_ok)
    assert_all_pass("09_mask_mod", make_where)
    assert_hint("09_mask_mod", partial(make_ok, causal_sink=False), "sink tokens must stay causal")
    assert_hint("09_mask_mod", partial(make_ok, le=True), "off by one")
    assert_hint("09_mask_mod", partial(make_ok, sinks=False), "sinks are missing")

    def make_sliced(window, n_sink):            # right on index grids, unusable by FlexAttention (vmap over scalars)
        def mask_mod(b, h, q_idx, kv_idx):
            m = (q_idx - kv_idx >= 0) & (q_idx - kv_idx < window)
            m[..., :n_sink] |= kv_idx[..., :n_sink] <= q_idx
            return m
        return mask_mod
    res = exercise_kit.results("09_mask_mod", make_sliced)
    assert not any(ok for ok, _ in res) and all("FlexAttention cannot use this mask_mod" in m for _, m in res), res


# ---- 09_receptive_field
def test_receptive_field():
    assert_all_pass("09_receptive_field", lambda num_layers, window, seq_len: min(seq_len, num_layers * (window - 1) + 1))

    def loop(num_layers, window, seq_len):
        earliest = seq_len - 1                       # earliest input position the last token depends on
        for _ in range(num_layers):
            earliest = max(0, earliest - (window - 1))
        return seq_len - earliest
    assert_all_pass("09_receptive_field", loop)
    assert_hint("09_receptive_field", lambda num_layers, window, seq_len: min(seq_len, num_layers * window), "off by one")
    assert_hint("09_receptive_field", lambda num_layers, window, seq_len: num_layers * (window - 1) + 1, "cap the receptive field")
    assert_hint("09_receptive_field", lambda num_layers, window, seq_len: min(seq_len, window), "stacking composes")


# ---- 09_rolling_cache_bytes
def cache_ok(num_layers, num_kv_heads, head_dim, window, tokens, batch_size, bytes_per_element, *, length=None, factor=2):
    n = min(tokens, window) if length is None else length(tokens, window)
    return factor * num_layers * batch_size * num_kv_heads * n * head_dim * bytes_per_element


def test_rolling_cache_bytes():
    assert_all_pass("09_rolling_cache_bytes", cache_ok)
    assert_all_pass("09_rolling_cache_bytes", lambda n, g, d, w, t, b, e: 2 * n * g * d * b * e * (w if t >= w else t))
    assert_hint("09_rolling_cache_bytes", partial(cache_ok, length=lambda t, w: t), "never holds more than W")
    assert_hint("09_rolling_cache_bytes", partial(cache_ok, length=lambda t, w: w), "not full")
    assert_hint("09_rolling_cache_bytes", partial(cache_ok, factor=1), "multiply by 2")


# ---- 09_fix_sparse_attention
def attn_ok(q, k, v, mask, *, how="fill", scale=True):
    s = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
    s = {"fill": lambda: s.masked_fill(~mask, float("-inf")), "mul": lambda: s * mask,
         "add": lambda: s + mask, "flip": lambda: s.masked_fill(mask, float("-inf"))}[how]()
    return torch.softmax(s, -1) @ v


def attn_additive(q, k, v, mask):
    bias = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf"))
    w = torch.exp(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5 + bias)
    return (w / w.sum(-1, keepdim=True)) @ v


def test_fix_sparse_attention():
    assert_all_pass("09_fix_sparse_attention", attn_ok)
    assert_all_pass("09_fix_sparse_attention", attn_additive)
    assert_hint("09_fix_sparse_attention", partial(attn_ok, how="mul"), "⊙M bug")
    assert_hint("09_fix_sparse_attention", partial(attn_ok, how="add"), "adding the 0/1 mask")
    assert_hint("09_fix_sparse_attention", partial(attn_ok, how="flip"), "polarity")
    assert_hint("09_fix_sparse_attention", partial(attn_ok, scale=False), "1/√d")


def test_window_density_judge_never_crashes_on_a_wrong_answer():
    """9.2 once passed None (no L·W/L² candidate when window > L) to torch.isclose: a wrong answer then got
    'could not compare your answer (TypeError)' instead of a hint. Every wrong answer must get a hint."""
    from exercise_kit import results
    wrong = [lambda L, W: 0.5, lambda L, W: L * W / L ** 2, lambda L, W: 2.0, lambda L, W: 0]
    for seed in (0, 1, 2, 3):
        for fn in wrong:
            res = results("09_window_density", fn, seed)
            assert not all(ok for ok, _ in res)
            msgs = [msg for ok, msg in res if not ok]
            assert not any("could not compare" in m or "TypeError" in m for m in msgs), msgs
    cases = exercise_kit.get("09_window_density").cases(torch.Generator().manual_seed(0))
    assert any(c.params["window"] > c.params["L"] for c in cases)          # the case that used to crash


def test_window_density_accepts_float32_arithmetic():
    """An int/int division done in float32 is ~4e-8 off the exact fraction: the prompt promises 6 significant digits."""
    f32 = lambda L, window: torch.tensor(sum(min(i + 1, window) for i in range(L)), dtype=torch.float32) / (L * L)
    assert_all_pass("09_window_density", f32)


# ---- 09_window_tiles (the band's tile list; the grader runs the band through the learner's step)

def band_tiles_ok(L, window, block):
    return [(q0, k0) for q0 in range(0, L, block)
            for k0 in range(max(0, q0 - window + 1) // block * block, min(q0 + block, L), block)]


def make_update(le=False, causal=True, window=True, rescale=True, scale=True):
    def band_update(m, l, acc, q_i, k_j, v_j, q0, k0, W):
        s = q_i @ k_j.transpose(-2, -1) / (math.sqrt(q_i.shape[-1]) if scale else 1.0)
        i, j = torch.arange(q0, q0 + q_i.shape[-2])[:, None], torch.arange(k0, k0 + k_j.shape[-2])[None, :]
        hide = (j > i) if causal else torch.zeros_like(j > i)
        if window:
            hide = hide | ((i - j > W) if le else (i - j >= W))
        s = s.masked_fill(hide, -math.inf)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        m_sub = torch.where(m_new == -math.inf, 0.0, m_new)
        p, a = torch.exp(s - m_sub), torch.exp(m - m_sub)
        return m_new, a * l + p.sum(-1, keepdim=True), (a * acc if rescale else acc) + p @ v_j
    return band_update


def test_window_tiles():
    assert_all_pass("09_window_tiles", (band_tiles_ok, make_update()))
    for kw, hint in [(dict(le=True), "off by one"), (dict(causal=False), "need the causal mask too"),
                     (dict(window=False), "the window mask is missing"), (dict(rescale=False), "not rescaled"),
                     (dict(scale=False), "not scaled")]:
        assert_hint("09_window_tiles", (band_tiles_ok, make_update(**kw)), hint)
    every = lambda L, W, b: [(q0, k0) for q0 in range(0, L, b) for k0 in range(0, min(q0 + b, L), b)]  # noqa: E731
    assert_hint("09_window_tiles", (every, make_update()), "holds no key any query of its block may see")
    twice = lambda L, W, b: band_tiles_ok(L, W, b) * 2  # noqa: E731
    assert_hint("09_window_tiles", (twice, make_update()), "listed twice")


def test_window_tiles_scores_the_parts_separately():
    """A right tile list with a wrong step, and the reverse, each get half the points: the two parts are graded
    on their own cases."""
    ex = exercise_kit.get("09_window_tiles")
    for obj in [(band_tiles_ok, make_update(le=True)), (lambda L, W, b: [], make_update())]:
        res = exercise_kit.results("09_window_tiles", obj)
        assert sum(ok for ok, _ in res) == 3 and ex.score(3, 6) == 1.5, res


def test_window_tiles_counts_the_band_of_the_package():
    """The judge's band is the tiles flash_attention(window=) visits: two matmuls per tile."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from attn_course import flash_attention
    from attn_course.grading.exercises.lesson09 import _band

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += func.overloadpacket.__name__ in ("bmm", "baddbmm", "baddbmm_", "mm")
            return func(*args, **(kwargs or {}))

    for L, W, block in [(50, 7, 4), (33, 3, 6), (64, 20, 8)]:
        q = torch.randn(1, 1, L, 4, dtype=torch.float64)
        Count.n = 0
        with Count():
            flash_attention(q, q, q, is_causal=True, window=W, block_q=block, block_k=block)
        assert Count.n == 2 * len(list(_band(L, W, block)))


# ---- 09_rolling_decode (build: a cache bounded by W)
def make_decode(mistake=None):
    def decode_step(k_cache, v_cache, q, k, v, t):
        W = k_cache.shape[-2]
        slot = min(t, W - 1) if mistake == "last_slot" else t % W
        if mistake not in ("no_self", "w_plus_1"):
            k_cache[:, :, slot], v_cache[:, :, slot] = k, v
        keys, vals = k_cache, v_cache
        filled = torch.arange(W) <= t
        if mistake == "mod_valid":
            filled = torch.arange(W) <= t % W
        if mistake == "empty":
            filled = torch.ones(W, dtype=torch.bool)
        if mistake == "no_self":
            filled = torch.arange(W) < t
        if mistake == "w_plus_1":                            # attend to the full buffer and the new token
            keys, vals = torch.cat([k_cache, k[:, :, None]], 2), torch.cat([v_cache, v[:, :, None]], 2)
            filled = torch.cat([torch.arange(W) < t, torch.tensor([True])])
        s = (keys @ q[..., None]).squeeze(-1) / (1.0 if mistake == "no_scale" else math.sqrt(q.shape[-1]))
        w = torch.softmax(s.masked_fill(~filled, -INF), -1)
        out = (w.nan_to_num(0.0)[..., None, :] @ vals).squeeze(-2)
        if mistake in ("no_self", "w_plus_1"):                # attend first, then store
            k_cache[:, :, t % W], v_cache[:, :, t % W] = k, v
        return out, k_cache, v_cache
    return decode_step


def decode_shift(k_cache, v_cache, q, k, v, t):
    """Another style: a time-ordered buffer (oldest first) that drops its first slot; validity from t."""
    W = k_cache.shape[-2]
    k_cache = torch.cat([k_cache[:, :, 1:], k[:, :, None]], dim=2)
    v_cache = torch.cat([v_cache[:, :, 1:], v[:, :, None]], dim=2)
    valid = torch.arange(W) >= W - 1 - t                     # the last min(t + 1, W) slots
    s = torch.einsum("bhwd,bhd->bhw", k_cache, q) / q.shape[-1] ** 0.5
    e = torch.where(valid, (s - s.amax(-1, keepdim=True)).exp(), torch.zeros(()))
    return torch.einsum("bhw,bhwd->bhd", e / e.sum(-1, keepdim=True), v_cache), k_cache, v_cache


_HISTORY = []


def decode_global(k_cache, v_cache, q, k, v, t):
    """Right for one sequence, but its state lives in a global list: the two sequences mix."""
    _HISTORY.append((k, v))
    ks = torch.stack([a for a, _ in _HISTORY[-k_cache.shape[-2]:]], 2)
    vs = torch.stack([b for _, b in _HISTORY[-k_cache.shape[-2]:]], 2)
    w = torch.softmax((ks @ q[..., None]).squeeze(-1) / math.sqrt(q.shape[-1]), -1)
    return (w[..., None, :] @ vs).squeeze(-2), k_cache, v_cache


def decode_growing(k_cache, v_cache, q, k, v, t):
    """Right values, but the cache grows by one position per token (an ordinary KV cache)."""
    if t == 0:
        k_cache, v_cache = k_cache[:, :, :0], v_cache[:, :, :0]
    k_cache, v_cache = torch.cat([k_cache, k[:, :, None]], 2), torch.cat([v_cache, v[:, :, None]], 2)
    s = (k_cache @ q[..., None]).squeeze(-1) / math.sqrt(q.shape[-1])
    return (torch.softmax(s, -1)[..., None, :] @ v_cache).squeeze(-2), k_cache, v_cache


def test_rolling_decode():
    assert_all_pass("09_rolling_decode", make_decode())
    assert_all_pass("09_rolling_decode", decode_shift)
    for mistake, fragment in [("w_plus_1", "W + 1 keys"), ("no_self", "must see itself"),
                              ("empty", "empty slots"), ("last_slot", "replace the OLDEST"),
                              ("mod_valid", "not while s <= t mod W"), ("no_scale", "not scaled")]:
        exercise_kit.assert_hint("09_rolling_decode", make_decode(mistake), fragment)   # on every case
    _HISTORY.clear()
    assert_hint("09_rolling_decode", decode_global, "keeps tokens outside the caches")   # a later case may crash


def test_rolling_decode_refuses_a_growing_cache():
    from exercise_kit import results
    res = results("09_rolling_decode", decode_growing)
    assert not any(ok for ok, _ in res) and all("never grows" in msg for _, msg in res), res


def test_rolling_decode_reference_is_the_package_cache():
    """The judge's reference (windowed attention over the whole history) equals decoding with the lesson's
    RollingKVCache, token by token."""
    from attn_course.gqa import RollingKVCache
    from attn_course.grading.exercises import get
    ex = get("09_rolling_decode")
    case = ex.cases(torch.Generator().manual_seed(0))[0]
    q, k, v = (case.inputs[n][0] for n in "qkv")                 # the first sequence
    cache, outs = RollingKVCache(case.params["window"]), []
    for t in range(q.shape[-2]):
        k_all, v_all, mask = cache.update(k[:, :, t:t + 1], v[:, :, t:t + 1])
        s = (q[:, :, t:t + 1] @ k_all.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, -INF)
        outs.append(torch.softmax(s, -1) @ v_all)
    torch.testing.assert_close(torch.cat(outs, 2), ex.expected(case)["out"][0])
