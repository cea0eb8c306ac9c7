"""Exercise set 09: the reference solutions (and alternatives in another style) pass every case for
several seeds; each common mistake fails with the hint that names it."""
import math
from functools import partial

import torch

import exercise_kit
from exercise_kit import assert_all_pass

assert_hint = partial(exercise_kit.assert_hint, every=False)


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
