"""Exercise set 09 — sparse and sliding-window attention (solutions/09_sparse_and_sliding_window_attention.ipynb).

References are computed here from the definitions (brute-force loops over (i, j), closed-form counts,
float64 softmax), independently of the learner and of ``attn_course.masks``/``sparse``. Hints are detected
by computing what the common mistakes produce on the same inputs.
"""
from __future__ import annotations

import math

import torch

from ..spec import FORBID_COURSE, FORBID_SDPA, Case, Exercise, Verdict, close, diagnose, randint, choice, draw
from .lesson08 import FORBID_SOFTMAX

__all__ = ["EXERCISES"]

_F64 = torch.float64
_INF = float("inf")
FORBID_FLEX = ("torch.nn.attention.flex_attention.flex_attention",)


def _pairs(L, pred):
    return torch.tensor([[bool(pred(i, j)) for j in range(L)] for i in range(L)], dtype=torch.bool)


def _int(x) -> torch.Tensor:
    return torch.tensor(int(x), dtype=torch.int64)


# ---- 09_dilated_mask ----------------------------------------------------------------------------------

def _dilated(L, w, r, *, reach=None, causal=True, strict=True):
    reach = w * r if reach is None else reach
    return _pairs(L, lambda i, j: (i - j) % r == 0 and ((abs(i - j) < reach) if strict else abs(i - j) <= reach)
                  and (j <= i or not causal))


def _dil_cases(gen):
    def make(g):
        L, w, r = randint(g, 8, 24), randint(g, 2, 5), randint(g, 2, 4)
        masks = [_dilated(L, w, r), ~_dilated(L, w, r), _dilated(L, w, r, strict=False), _dilated(L, w, r, reach=w),
                 _dilated(L, w, r, causal=False)]
        return L, w, r, all(not torch.equal(a, b) for n, a in enumerate(masks) for b in masks[n + 1:])
    # each mistake below gives its own mask, different from the answer
    return [Case(f"L={L}, window={w}, dilation={r}", params={"L": L, "window": w, "dilation": r})
            for L, w, r, _ in (draw(gen, make, lambda x: x[3]) for _ in range(4))]


def _dil_answer(fn, case):
    p = case.params
    return {"mask": fn(p["L"], p["window"], p["dilation"])}


def _dil_expected(case):
    p = case.params
    return {"mask": _dilated(p["L"], p["window"], p["dilation"])}


def _dil_judge(got, want, case):
    if close(got["mask"], want["mask"]):
        return Verdict(True)
    L, w, r = case.params["L"], case.params["window"], case.params["dilation"]
    same = lambda a, b: torch.equal(a, b)
    return diagnose(got["mask"], [
        ("polarity: True must mean *may attend* (SDPA's convention); your mask is the complement.", ~_dilated(L, w, r)),
        ("off by one: with |i − j| <= window·dilation each query sees window + 1 keys; the query itself is the "
         "first of the window, so use |i − j| < window·dilation.", _dilated(L, w, r, strict=False)),
        ("the reach must be window·dilation: the window counts *kept* keys (every dilation-th), so |i − j| < window "
         "keeps too few.", _dilated(L, w, r, reach=w)),
        ("the mask must be causal: also require j <= i.", _dilated(L, w, r, causal=False)),
    ], "key j is visible to query i iff (i − j) % dilation == 0, |i − j| < window·dilation and j <= i.", same=same)


# ---- 09_window_density --------------------------------------------------------------------------------

def _density_cases(gen):
    shapes = [(randint(gen, 5, 20), None), (randint(gen, 1000, 5000), randint(gen, 64, 512)), (None, None),
              (randint(gen, 16384, 40000), 1024 * randint(gen, 1, 4)), (randint(gen, 50, 200), None)]
    out = []
    for n, (L, W) in enumerate(shapes):
        if n == 2:                                                   # a window longer than the sequence
            L = randint(gen, 3, 10)
            W = randint(gen, L + 1, 2 * L)
        elif W is None:
            W = randint(gen, 2, L - 1)
        out.append(Case(f"L={L}, window={W}", params={"L": L, "window": W}))
    return out


def _density_answer(fn, case):
    return {"density": torch.tensor(float(fn(case.params["L"], case.params["window"])), dtype=_F64)}


def _pairs_count(L, W):
    return sum(min(i + 1, W) for i in range(L))               # row i sees keys max(0, i−W+1) … i


def _density_expected(case):
    L, W = case.params["L"], case.params["window"]
    return {"density": torch.tensor(_pairs_count(L, W) / (L * L), dtype=_F64)}


def _density_judge(got, want, case):
    if close(got["density"], want["density"], atol=1e-12, rtol=1e-6):
        return Verdict(True)
    L, W = case.params["L"], case.params["window"]
    t = lambda x: torch.tensor(float(x), dtype=_F64)
    return diagnose(got["density"], [
        ("the first W − 1 rows see fewer than W keys (there is nothing before position 0): count min(i + 1, W) "
         "per row, not L·W.", t(L * W / (L * L)) if W <= L else None),
        ("a causal window sees only the past: a row sees min(i + 1, W) keys, not the 2W − 1 of a symmetric window.",
         t(sum(min(i, W - 1) + 1 + min(L - 1 - i, W - 1) for i in range(L)) / (L * L))),
        ("density is a fraction of all L² pairs, between 0 and 1 — divide the count of visible pairs by L·L.",
         t(_pairs_count(L, W))),
    ], "count the visible (i, j) pairs — row i sees min(i + 1, W) keys — and divide by L².",
        same=lambda a, b: b is not None and bool(torch.isclose(a, b, rtol=1e-6, atol=1e-12)))


# ---- 09_mask_mod --------------------------------------------------------------------------------------

def _mm_ref(i, j, W, n, *, causal_sink=True, strict=True, sinks=True):
    win = (j <= i) & ((i - j < W) if strict else (i - j <= W))
    sink = (j < n) & (j <= i) if causal_sink else (j < n)
    return win | sink if sinks else win


def _mm_cases(gen):
    def make(g):
        L, W, n = randint(g, 10, 24), randint(g, 2, 6), randint(g, 1, 4)
        i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
        masks = [_mm_ref(i, j, W, n), _mm_ref(i, j, W, n, causal_sink=False), _mm_ref(i, j, W, n, strict=False),
                 _mm_ref(i, j, W, n, sinks=False)]
        return L, W, n, all(not torch.equal(a, b) for k, a in enumerate(masks) for b in masks[k + 1:])
    # each mistake below gives its own mask, different from the answer
    return [Case(f"L={L}, window={W}, n_sink={n}", params={"L": L, "window": W, "n_sink": n})
            for L, W, n, _ in (draw(gen, make, lambda x: x[3]) for _ in range(4))]


def _mm_answer(make, case):
    p = case.params
    mask_mod = make(p["window"], p["n_sink"])
    i = torch.arange(p["L"])[:, None]
    j = torch.arange(p["L"])[None, :]
    zero = torch.zeros((), dtype=torch.long)
    out = mask_mod(zero, zero, i, j)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"mask_mod must return a bool tensor, got {type(out).__name__}")
    # FlexAttention calls a mask_mod on scalar indices under vmap (create_block_mask, flex_attention): it must
    # work there too, and give the same mask
    from torch.nn.attention.flex_attention import create_mask
    try:
        flex = create_mask(mask_mod, 1, 1, p["L"], p["L"], device="cpu")[0, 0]
    except Exception as exc:
        raise ValueError(f"FlexAttention cannot use this mask_mod ({type(exc).__name__}: {exc}): it calls it on "
                         f"0-d index tensors under vmap, so use only elementwise tensor operations (& | ~, "
                         f"comparisons, torch.where) — no indexing, slicing or in-place updates") from None
    out = out.expand(p["L"], p["L"]).to(torch.bool).contiguous()
    if not torch.equal(flex.to(torch.bool), out):
        raise ValueError("your mask_mod gives a different mask when FlexAttention evaluates it (one index pair at "
                         "a time) than on whole index grids: use only elementwise tensor operations")
    return {"mask": out}


def _mm_expected(case):
    p = case.params
    return {"mask": _pairs(p["L"], lambda i, j: (j <= i and i - j < p["window"]) or (j < p["n_sink"] and j <= i))}


def _mm_judge(got, want, case):
    if close(got["mask"], want["mask"]):
        return Verdict(True)
    p = case.params
    i, j = torch.arange(p["L"])[:, None], torch.arange(p["L"])[None, :]
    W, n = p["window"], p["n_sink"]
    return diagnose(got["mask"], [
        ("the sink tokens must stay causal too: query i may see sink j only if j <= i (early queries must "
         "not see a later sink).", _mm_ref(i, j, W, n, causal_sink=False)),
        ("off by one: i − j <= window gives window + 1 keys; the query itself counts, so use i − j < window.",
         _mm_ref(i, j, W, n, strict=False)),
        ("the sinks are missing: OR the window with (kv_idx < n_sink) & (kv_idx <= q_idx).", _mm_ref(i, j, W, n, sinks=False)),
    ], "return (window: 0 <= q_idx − kv_idx < window) | (sink: kv_idx < n_sink and kv_idx <= q_idx), "
       "using only tensor operations (& and |, not `and`/`or`).", same=lambda a, b: torch.equal(a, b))


# ---- 09_receptive_field -------------------------------------------------------------------------------

def _rf_cases(gen):
    L0 = 1024 * randint(gen, 33, 128)
    n1, W1 = randint(gen, 2, 6), randint(gen, 2, 10)
    n2, W2 = randint(gen, 4, 8), randint(gen, 5, 12)
    n3, W3 = randint(gen, 2, 3), randint(gen, 32, 128)
    L1, L2, L3 = randint(gen, n1 * W1 + 1, 300), randint(gen, W2 + 1, n2 * (W2 - 1)), randint(gen, n3 * W3 + 1, 4000)
    return [Case(name, params={"num_layers": n, "window": W, "seq_len": L}) for name, n, W, L in [
        (f"Mistral 7B: 32 layers, W=4096, {L0 // 1024}k context", 32, 4096, L0),
        (f"{n1} layers, W={W1}, L={L1}", n1, W1, L1),
        (f"{n2} layers, W={W2}, L={L2} (the stack already sees everything)", n2, W2, L2),
        (f"{n3} layers, W={W3}, L={L3}", n3, W3, L3)]]


def _rf_answer(fn, case):
    return {"tokens": _int(fn(*case.params.values()))}


def _rf_expected(case):
    p = case.params
    reach = 0                                    # brute force: how far back does the last position reach?
    for _ in range(p["num_layers"]):
        reach += p["window"] - 1                 # one more layer: each visible key itself saw W − 1 back
    return {"tokens": _int(min(p["seq_len"], reach + 1))}


def _rf_judge(got, want, case):
    if close(got["tokens"], want["tokens"]):
        return Verdict(True)
    n, W, L = case.params["num_layers"], case.params["window"], case.params["seq_len"]
    return diagnose(got["tokens"], [
        ("a token cannot see beyond the sequence: cap the receptive field at seq_len.", _int(n * (W - 1) + 1)
         if n * (W - 1) + 1 > L else None),
        ("off by one: each layer reaches W − 1 positions further back (the window includes the token itself), "
         "so n layers see n·(W − 1) + 1 tokens, not n·W.", _int(min(L, n * W))),
        ("one layer sees W tokens, but stacking composes windows: layer n sees n·(W − 1) + 1.", _int(min(L, W))),
    ], "each layer extends the reach by W − 1 positions: min(seq_len, num_layers·(W − 1) + 1).")


# ---- 09_rolling_cache_bytes ---------------------------------------------------------------------------

def _cache_cases(gen):
    keys = ("num_layers", "num_kv_heads", "head_dim", "window", "tokens", "batch_size", "bytes_per_element")
    W2, W3 = 8 * randint(gen, 2, 8), 16 * randint(gen, 2, 8)
    t1, t2, t3 = 1024 * randint(gen, 5, 64), randint(gen, 2, W2 - 1), randint(gen, W3 + 1, 2000)
    cfgs = [(f"Mistral 7B (bf16), {t1} tokens decoded", 32, 8, 128, 4096, t1, 1, 2),
            (f"toy fp32, {t2} tokens with W={W2}", randint(gen, 2, 4), randint(gen, 1, 4), 8, W2, t2, randint(gen, 2, 4), 4),
            (f"toy fp16, {t3} tokens with W={W3}", randint(gen, 2, 6), 1, 16, W3, t3, randint(gen, 2, 4), 2)]
    return [Case(name, params=dict(zip(keys, cfg))) for name, *cfg in cfgs]


def _cache_answer(fn, case):
    return {"bytes": _int(fn(*case.params.values()))}


def _cache_bytes(p, *, length=None, factor=2):
    length = min(p["tokens"], p["window"]) if length is None else length
    return _int(factor * p["num_layers"] * p["batch_size"] * p["num_kv_heads"] * length * p["head_dim"]
                * p["bytes_per_element"])


def _cache_expected(case):
    return {"bytes": _cache_bytes(case.params)}


def _cache_judge(got, want, case):
    if close(got["bytes"], want["bytes"]):
        return Verdict(True)
    p = case.params
    return diagnose(got["bytes"], [
        ("the rolling buffer never holds more than W positions: use min(tokens, window), not tokens.",
         _cache_bytes(p, length=p["tokens"]) if p["tokens"] > p["window"] else None),
        ("before W tokens have been decoded the buffer is not full: use min(tokens, window) (if it is "
         "preallocated, it is still only the written slots that count here).",
         _cache_bytes(p, length=p["window"]) if p["tokens"] < p["window"] else None),
        ("both K and V are cached: multiply by 2.", _cache_bytes(p, factor=1)),
    ], "bytes = 2 (K and V) · layers · batch · H_kv · min(tokens, window) · d_h · bytes per element.")


# ---- 09_fix_sparse_attention (find the bug: a popular survey's ⊙M) ---------------------------------------

def _att(q, k, v, scores_fn):
    s = q.to(_F64) @ k.to(_F64).transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores_fn(s), -1) @ v.to(_F64)


def _fix_cases(gen):
    out = []
    for B, H, L, d, W in [(2, 2, 9, 4, 3), (1, 3, 12, 8, 4), (2, 1, 7, 4, 2)]:
        i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
        mask = (j <= i) & (i - j < W)
        out.append(Case(f"B={B}, H={H}, L={L}, d={d}, sliding window W={W}",
                        {"q": torch.randn(B, H, L, d, generator=gen), "k": torch.randn(B, H, L, d, generator=gen),
                         "v": torch.randn(B, H, L, d, generator=gen), "mask": mask}))
    # a non-band pattern too: global token 0 + a random sparse pattern (row 0 keeps its diagonal)
    L = 10
    mask = torch.rand(L, L, generator=gen) < 0.3
    mask[:, 0] = True
    mask |= torch.eye(L, dtype=torch.bool)
    out.append(Case("B=1, H=2, L=10, d=4, random sparse mask + global key 0",
                    {"q": torch.randn(1, 2, L, 4, generator=gen), "k": torch.randn(1, 2, L, 4, generator=gen),
                     "v": torch.randn(1, 2, L, 4, generator=gen), "mask": mask}))
    return out


def _fix_answer(fn, case):
    i = case.inputs
    return {"out": fn(i["q"], i["k"], i["v"], i["mask"])}


def _fix_expected(case):
    i = case.inputs
    return {"out": _att(i["q"], i["k"], i["v"], lambda s: s.masked_fill(~i["mask"], -math.inf)).to(i["q"].dtype)}


def _fix_judge(got, want, case):
    if close(got["out"], want["out"]):
        return Verdict(True)
    i = case.inputs
    q, k, v, m = i["q"], i["k"], i["v"], i["mask"]
    return diagnose(got["out"], [
        ("still the ⊙M bug: multiplying the scores by a 0/1 mask sets hidden scores to 0, and exp(0) = 1 still "
         "gives those keys weight. Hidden scores must become −∞ before the softmax (masked_fill).",
         _att(q, k, v, lambda s: s * m)),
        ("adding the 0/1 mask only shifts visible scores by 1; hidden keys keep their weight. Use −∞ where "
         "the mask is False.", _att(q, k, v, lambda s: s + m)),
        ("polarity: True = may attend, so fill −∞ where the mask is False (~mask), not where it is True.",
         _att(q, k, v, lambda s: s.masked_fill(m, -math.inf)) if bool((~m).any(-1).all()) else None),
        ("the scores lost their 1/√d scaling.", _att(q, k, v, lambda s: (s * math.sqrt(q.shape[-1])).masked_fill(~m, -math.inf))),
    ], "softmax(QKᵀ/√d with −∞ where the mask is False) V.")


# ---- 09_window_tiles: sliding-window attention by tiles, only the band's tiles ------------------------

def _band(L, W, block):
    """The band's tiles: per query block [q0, q1), the key tiles of the grid that meet [q0 − W + 1, q1)."""
    for q0 in range(0, L, block):
        q1 = min(q0 + block, L)
        for k0 in range(max(0, q0 - W + 1) // block * block, q1, block):
            yield q0, q1, k0, min(k0 + block, L)


def _band_work(case):
    """(tiles, FLOPs of QKᵀ and P·V over them) for the case's shapes."""
    B, H, L, d = case.inputs["q"].shape
    dv = case.inputs["v"].shape[-1]
    tiles = list(_band(L, case.params["window"], case.params["block"]))
    return len(tiles), sum(2 * B * H * (q1 - q0) * (k1 - k0) * (d + dv) for q0, q1, k0, k1 in tiles)


def _masked_attn(q, k, v, visible, *, scale=True):
    """fp64 softmax attention over the (i, j) pairs ``visible`` (every row keeps a key), dense."""
    s = q.to(_F64) @ k.to(_F64).transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
    return torch.softmax(s.masked_fill(~visible, -_INF), -1) @ v.to(_F64)


def _ij(L):
    return torch.arange(L)[:, None], torch.arange(L)[None, :]


def _window(L, W, *, le=False):
    i, j = _ij(L)
    return (j <= i) & ((i - j <= W) if le else (i - j < W))


def _tiled(q, k, v, W, block, *, rescale=True, le=False):
    """The band's tiles, as a learner's online softmax runs them — with acc not rescaled when the running max
    rises, or with the mask i − j <= W (whose extra key is then seen only where its tile is visited)."""
    L = q.shape[-2]
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=_F64)
    for q0, q1, k0, k1 in _band(L, W, block):
        if k0 == max(0, q0 - W + 1) // block * block:                 # first tile of the block: fresh state
            m = torch.full((*q.shape[:-2], q1 - q0, 1), -_INF, dtype=_F64)
            l, acc = torch.zeros_like(m), torch.zeros(*q.shape[:-2], q1 - q0, v.shape[-1], dtype=_F64)
        s = q[..., q0:q1, :].to(_F64) @ k[..., k0:k1, :].to(_F64).transpose(-2, -1) / math.sqrt(q.shape[-1])
        i, j = torch.arange(q0, q1)[:, None], torch.arange(k0, k1)[None, :]
        s = s.masked_fill((j > i) | ((i - j > W) if le else (i - j >= W)), -_INF)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        m_sub = torch.where(m_new == -_INF, 0.0, m_new)
        p = torch.exp(s - m_sub)
        alpha = torch.exp(m - m_sub)
        l = alpha * l + p.sum(-1, keepdim=True)
        acc = (alpha * acc if rescale else acc) + p @ v[..., k0:k1, :].to(_F64)
        m = m_new
        if k1 >= q1:                                                  # the diagonal tile is the block's last
            out[..., q0:q1, :] = acc / l
    return out


def _wt_masks(L, W, block):
    """The answer's band and what each masking mistake lets through instead."""
    i, j = _ij(L)
    first_tile = (((i // block) * block - W + 1).clamp(min=0) // block) * block
    return {"answer": _window(L, W), "le": _window(L, W, le=True),
            "no_diag": (i - j < W) & (j // block <= i // block),          # no causal mask in the diagonal tiles
            "open_diag": _window(L, W) | (j // block == i // block),      # no mask at all in the diagonal tiles
            "causal_only": (j <= i) & (j >= first_tile)}                  # no window mask in the band's tiles


def _first_tile_hidden(L, W, block):
    """Does some row see no key at all in the first tile its block visits (the NaN trap of exp(−∞ + ∞))?"""
    for q0 in range(0, L, block):
        q1 = min(q0 + block, L)
        if q1 - W >= max(0, q0 - W + 1) // block * block + block:     # row q1 − 1 starts past that tile
            return True
    return False


def _wt_cases(gen):
    def make(g):
        B, H = choice(g, ((1, 1), (1, 2), (2, 1)))
        d, block = randint(g, 2, 4), randint(g, 3, 6)
        W = choice(g, (randint(g, 2, block - 1), randint(g, block + 1, 3 * block)))
        L = randint(g, max(3 * W, 5 * block), 56)
        masks = [m for key, m in _wt_masks(L, W, block).items() if key != "open_diag" or W < block]
        n_band = len(list(_band(L, W, block)))
        n_causal = sum(-(-min(L, q0 + block) // block) for q0 in range(0, L, block))
        ok = (W % block != 0 and B * H * d * 2 < L                       # every tiled tensor < L·L
              and block + W - 1 > max(block, d)                          # a softmax over a whole key range > a tile
              and 4 * n_band <= 3 * n_causal                             # the causal tiles are 1/3 more work at least
              and _first_tile_hidden(L, W, block)
              and all(not torch.equal(a, b) for n, a in enumerate(masks) for b in masks[n + 1:]))
        return (B, H, L, d, W, block), ok
    # every case: W not a multiple of block (edge tiles are partly visible), a band clearly smaller than the
    # causal triangle, a row whose first tile is all hidden, and each masking mistake a different mask;
    # tensors of a tiled solution < L·L
    out = []
    for _ in range(3):
        (B, H, L, d, W, block), _ = draw(gen, make, lambda x: x[1])
        out.append(Case(f"B={B}, H={H}, L={L}, d={d}, window={W}, block={block}",
                        {n: torch.randn(B, H, L, d, generator=gen, dtype=_F64) for n in "qkv"},
                        {"window": W, "block": block}))
    return out


def _wt_answer(fn, case):
    from ..guard import Work
    i, p = case.inputs, case.params
    with Work() as work:
        out = fn(i["q"], i["k"], i["v"], p["window"], p["block"])
    return {"out": out, "flops": torch.tensor(work.flops, dtype=torch.int64),
            "largest": torch.tensor(work.largest, dtype=torch.int64)}


def _tile_cap(case):
    """The largest product result a tile-by-tile online softmax forms: one tile's scores (B·H·block·block) or
    one tile's P̃V (B·H·block·d)."""
    B, H, L, d = case.inputs["q"].shape
    return B * H * case.params["block"] * max(case.params["block"], case.inputs["v"].shape[-1])


def _wt_expected(case):
    i, L = case.inputs, case.inputs["q"].shape[-2]
    return {"out": _masked_attn(i["q"], i["k"], i["v"], _window(L, case.params["window"])),
            "flops": torch.tensor(_band_work(case)[1], dtype=torch.int64),
            "largest": torch.tensor(_tile_cap(case), dtype=torch.int64)}


def _wt_judge(got, want, case):
    i, W, block = case.inputs, case.params["window"], case.params["block"]
    L, d = i["q"].shape[-2:]
    if close(got["out"], want["out"]):
        tiles, work = _band_work(case)
        flops, largest, cap = int(got["flops"]), int(got["largest"]), _tile_cap(case)
        if largest > cap:
            return Verdict(False, f"right values, but your code formed {largest} scores at once (more than one tile's "
                                  f"scores, B·H·block·max(block, d) = {cap}): that is one softmax over the block's "
                                  f"whole key range, not the online softmax — take the keys one tile of `block` at a "
                                  f"time and rescale m, l, acc at each.")
        if flops <= work * (1 + 1 / (2 * d)):                            # + a product with ones for the row sums
            return Verdict(True)
        return Verdict(False, f"right values, but you visited about {round(tiles * flops / work)} tiles; the band "
                              f"has {tiles}: for the query block [q0, q1) only the key tiles that meet "
                              f"[q0 − W + 1, q1) hold a visible key — start the key loop there and stop at q1.")
    if _has_nan(got["out"]):
        return Verdict(False, "NaN: a row whose keys in the first tile it visits are all hidden gets m_new = −∞ "
                              "and exp(−∞ − (−∞)) = NaN. Subtract 0 where m_new is −∞ (that row keeps l = 0, "
                              "acc = 0 until a visible key arrives).")
    q, k, v = i["q"], i["k"], i["v"]
    masks = _wt_masks(L, W, block)
    off_by_one = ("off by one: i − j <= W lets each query see W + 1 keys; the window counts the query itself, so "
                  "key j is visible iff 0 <= i − j < W.")
    diagonal = ("the diagonal tiles need the causal mask too: inside the tile where the query block meets its own "
                "keys, keys j > i are in the future.")
    return diagnose(got["out"], [
        (off_by_one, _masked_attn(q, k, v, masks["le"])),
        (off_by_one, _tiled(q, k, v, W, block, le=True)),
        (diagonal, _masked_attn(q, k, v, masks["no_diag"])),
        (diagonal, _masked_attn(q, k, v, masks["open_diag"])),
        ("the window mask is missing: the band's oldest tiles (and, when W < block, the diagonal tile) hold keys "
         "older than i − W + 1 for some rows — hide i − j >= W as well as j > i.",
         _masked_attn(q, k, v, masks["causal_only"])),
        ("the accumulator is not rescaled: when a tile raises the running max, multiply the old acc by "
         "α = exp(m − m_new) before adding the new tile's P̃V.", _tiled(q, k, v, W, block, rescale=False)),
        ("the scores are not scaled: multiply QKᵀ by 1/√d.", _masked_attn(q, k, v, masks["answer"], scale=False)),
    ], "compare with softmax(QKᵀ/√d) V over the keys 0 <= i − j < W: per tile rescale acc and l by "
       "α = exp(m − m_new), and divide by l at the end.")


def _has_nan(t):
    return bool(torch.isnan(t).any())


# ---- 09_rolling_decode: the rolling-buffer cache, token by token --------------------------------------

def _roll_cases(gen):
    out = []
    for _ in range(3):
        B, H, d, W = randint(gen, 1, 2), randint(gen, 1, 2), randint(gen, 2, 4), randint(gen, 3, 6)
        T = 3 * W + randint(gen, 1, W - 1)                             # decode well past the window
        out.append(Case(f"two sequences of {T} tokens decoded in turn, B={B}, H={H}, d={d}, window={W}",
                        {n: torch.randn(2, B, H, T, d, generator=gen, dtype=_F64) for n in "qkv"},
                        {"window": W}))
    return out


def _roll_answer(fn, case):
    q, k, v = (case.inputs[n] for n in "qkv")
    S, B, H, T, d = q.shape
    W = case.params["window"]
    caches = [(q.new_zeros(B, H, W, d), q.new_zeros(B, H, W, d)) for _ in range(S)]
    outs = q.new_zeros(S, B, H, T, d)
    for t in range(T):
        for s in range(S):                                              # the sequences take turns
            kc, vc = caches[s]
            got = fn(kc.clone(), vc.clone(), q[s, :, :, t].clone(), k[s, :, :, t].clone(), v[s, :, :, t].clone(), t)
            if not (isinstance(got, tuple) and len(got) == 3):
                raise TypeError("return (out, k_cache, v_cache)")
            for name, x, shape in (("out", got[0], (B, H, d)), ("k_cache", got[1], (B, H, W, d)),
                                   ("v_cache", got[2], (B, H, W, d))):
                if type(x) is not torch.Tensor or x.dtype != q.dtype or tuple(x.shape) != shape:
                    what = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
                    grow = (" — a rolling buffer never grows: overwrite the oldest slot instead of appending"
                            if name != "out" and isinstance(x, torch.Tensor) and x.dim() == 4 else "")
                    raise ValueError(f"after token t={t} your {name} has {what} (dtype "
                                     f"{getattr(x, 'dtype', '?')}); expected {shape} in {q.dtype}{grow}")
            outs[s, :, :, t] = got[0]
            caches[s] = (got[1].detach().clone(), got[2].detach().clone())   # no attribute rides along
    return {"out": outs}


def _roll_expected(case):
    i = case.inputs
    return {"out": _masked_attn(i["q"], i["k"], i["v"], _window(i["q"].shape[-2], case.params["window"]))}


def _roll_empty_slots(q, k, v, W):
    """Before the buffer is full its W − t − 1 empty (zero) slots are attended: score 0, value 0."""
    T = q.shape[-2]
    s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~_window(T, W), -_INF)
    zeros = torch.tensor([max(0, W - 1 - t) for t in range(T)], dtype=_F64)[:, None]
    m = s.amax(-1, keepdim=True).clamp(min=0.0)
    e = torch.exp(s - m)
    return (e @ v) / (e.sum(-1, keepdim=True) + zeros * torch.exp(-m))


def _roll_shared(q, k, v, W):
    """State kept outside the returned caches (a global list): the last W tokens of BOTH sequences."""
    S, T = q.shape[0], q.shape[-2]
    seen, out = [], torch.zeros_like(v)
    for t in range(T):
        for s in range(S):
            seen.append((s, t))
            keys = seen[-W:]
            kk = torch.stack([k[a, :, :, b] for a, b in keys], -2)
            vv = torch.stack([v[a, :, :, b] for a, b in keys], -2)
            w = torch.softmax((kk @ q[s, :, :, t, :, None]).squeeze(-1) / math.sqrt(q.shape[-1]), -1)
            out[s, :, :, t] = (w[..., None, :] @ vv).squeeze(-2)
    return out


def _roll_judge(got, want, case):
    if close(got["out"], want["out"]):
        return Verdict(True)
    i, W = case.inputs, case.params["window"]
    q, k, v = (i[n].to(_F64) for n in "qkv")
    T = q.shape[-2]
    t, j = _ij(T)
    no_self = (j < t) & (t - j <= W)
    itself = _masked_attn(q, k, v, no_self | (t == 0))                # row 0 has no key at all: NaN or 0
    itself[..., 0, :] = float("nan")
    return diagnose(got["out"], [
        ("off by one: you attend to the whole buffer AND the new token — W + 1 keys (i − j <= W). Store the new "
         "token first (it overwrites the oldest), then attend to the W slots.", _masked_attn(q, k, v, _window(T, W, le=True))),
        ("off by one: each query sees W keys, itself included (0 <= i − j < W); you keep only W − 1.",
         _masked_attn(q, k, v, _window(T, W - 1)) if W > 1 else None),
        ("the new token must see itself: store its key and value before attending (or attend to the buffer "
         "and the new token together).", itself),
        ("the new token must see itself: store its key and value before attending (or attend to the buffer "
         "and the new token together).", itself.nan_to_num(0.0)),
        ("before the buffer is full its empty slots are zeros, not keys: hide them (slot s holds a token only "
         "once t >= s).", _roll_empty_slots(q, k, v, W)),
        ("after wrap-around (t >= W) the new key must replace the OLDEST one — slot t mod W, or the first of a "
         "time-ordered buffer — not the last slot or the newest: yours keeps tokens 0 … W − 2 for ever.",
         _masked_attn(q, k, v, (j == t) | ((j <= W - 2) & (j <= t)))),
        ("after wrap-around every slot holds a visible key: slot s is valid once t >= s (min(t + 1, W) valid "
         "slots), not while s <= t mod W.", _masked_attn(q, k, v, (j <= t) & (j >= t - t % W))),
        ("your function keeps tokens outside the caches it returns (a global or a closure), so the two "
         "sequences the grader decodes in turn see each other's keys: keep all state in k_cache and v_cache.",
         _roll_shared(q, k, v, W)),
        ("the scores are not scaled: multiply qᵀk by 1/√d.", _masked_attn(q, k, v, _window(T, W), scale=False)),
    ], f"token t must attend to tokens max(0, t − W + 1) … t, itself included (W = {W}): compare the outputs "
       f"before and after the buffer wraps around (t = W).")


EXERCISES = [
    Exercise("09_dilated_mask", 2, "A dilated sliding-window mask by hand",
             "a function dilated_mask(L, window, dilation) -> bool (L, L), True = may attend",
             _dil_cases, _dil_answer, _dil_expected, _dil_judge, forbidden=FORBID_COURSE, kind="build"),
    Exercise("09_window_density", 1, "Density of a causal sliding window",
             "a function window_density(L, window) -> float", _density_cases, _density_answer, _density_expected,
             _density_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("09_mask_mod", 2, "A mask_mod: sliding window + attention sinks",
             "a function make_mask_mod(window, n_sink) returning mask_mod(b, h, q_idx, kv_idx) -> bool tensor",
             _mm_cases, _mm_answer, _mm_expected, _mm_judge, forbidden=FORBID_COURSE, kind="build"),
    Exercise("09_receptive_field", 1, "Receptive field of a stack of windowed layers",
             "a function receptive_field(num_layers, window, seq_len) -> int", _rf_cases, _rf_answer, _rf_expected,
             _rf_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("09_rolling_cache_bytes", 1, "Bytes of a rolling-buffer KV cache",
             "a function rolling_cache_bytes(num_layers, num_kv_heads, head_dim, window, tokens, batch_size, "
             "bytes_per_element) -> int", _cache_cases, _cache_answer, _cache_expected, _cache_judge,
             forbidden=FORBID_COURSE, kind="compute"),
    Exercise("09_fix_sparse_attention", 2, "Find the bug: a survey's softmax(QKᵀ/√d ⊙ M)",
             "a function sparse_attention(q, k, v, mask) -> (B, H, L, d), mask bool (L, L), True = may attend",
             _fix_cases, _fix_answer, _fix_expected, _fix_judge, forbidden=FORBID_SDPA + FORBID_COURSE, kind="debug"),
    Exercise("09_window_tiles", 3, "Sliding-window attention by tiles: only the band",
             "a function window_attention(q, k, v, window, block) -> out (B, H, L, d)",
             _wt_cases, _wt_answer, _wt_expected, _wt_judge,
             forbidden=FORBID_SDPA + FORBID_COURSE + FORBID_SOFTMAX + FORBID_FLEX,
             max_numel_fn=lambda case: case.inputs["q"].shape[-2] ** 2, kind="build"),   # no L × L tensor
    Exercise("09_rolling_decode", 3, "Decode with a rolling-buffer cache",
             "a function decode_step(k_cache, v_cache, q, k, v, t) -> (out, k_cache, v_cache)",
             _roll_cases, _roll_answer, _roll_expected, _roll_judge,
             forbidden=FORBID_SDPA + FORBID_COURSE + FORBID_FLEX, kind="build"),
]
