"""Exercise set 09 — sparse and sliding-window attention (solutions/09_sparse_and_sliding_window_attention.ipynb).

References are computed here from the definitions (brute-force loops over (i, j), closed-form counts,
float64 softmax), independently of the learner and of ``attn_course.masks``/``sparse``. Hints are detected
by computing what the common mistakes produce on the same inputs.
"""
from __future__ import annotations

import math

import torch

from ..spec import FORBID_COURSE, FORBID_SDPA, Case, Exercise, Verdict, close, diagnose, randint, choice, draw
from .lesson08 import (_RESCALE_HINT, FORBID_SOFTMAX, _first, _fwd_step, attention_after_prior, fold_tiles,
                       prior_state, shuffled)

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


# ---- 09_window_tiles: the band's tile list, and the online-softmax step the grader runs over it ----------

def _band(L, W, block):
    """The band's tiles: per query block [q0, q1), the key tiles of the grid that meet [q0 − W + 1, q1)."""
    for q0 in range(0, L, block):
        q1 = min(q0 + block, L)
        for k0 in range(max(0, q0 - W + 1) // block * block, q1, block):
            yield q0, q1, k0, min(k0 + block, L)


def _masked_attn(q, k, v, visible, *, scale=True):
    """fp64 softmax attention over the (i, j) pairs ``visible`` (every row keeps a key), dense."""
    s = q.to(_F64) @ k.to(_F64).transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
    return torch.softmax(s.masked_fill(~visible, -_INF), -1) @ v.to(_F64)


def _ij(L):
    return torch.arange(L)[:, None], torch.arange(L)[None, :]


def _window(L, W, *, le=False):
    i, j = _ij(L)
    return (j <= i) & ((i - j <= W) if le else (i - j < W))


_MASKS = {"answer": dict(), "le": dict(le=True), "no_causal": dict(causal=False), "causal_only": dict(window=False)}


def _band_visible(q0, q1, k0, k1, W, *, le=False, causal=True, window=True):
    """Where query i may see key j in the tile — 0 <= i − j < W — and what each masking mistake lets through."""
    i, j = torch.arange(q0, q1)[:, None], torch.arange(k0, k1)[None, :]
    ok = (j <= i) if causal else torch.ones(q1 - q0, k1 - k0, dtype=torch.bool)
    return ok & ((i - j <= W) if le else (i - j < W)) if window else ok


def _grid(case):
    """The grid's (query blocks, key tiles) — the shape of the tile-visit counts."""
    n = -(-case.params["L"] // case.params["block"])
    return n, n


def _wt_cases(gen):
    def make(g):
        block = randint(g, 3, 6)
        W = choice(g, (randint(g, 2, block - 1), randint(g, block + 1, 3 * block)))
        L = randint(g, max(3 * W, 5 * block), 56)
        return (L, W, block), W % block != 0 and L % block != 0                  # edge tiles partly visible
    out = []
    for part in ("tiles", "update", "tiles", "update", "tiles", "update"):
        (L, W, block), _ = draw(gen, make, lambda x: x[1])
        if part == "tiles":
            out.append(Case(f"band_tiles(L={L}, window={W}, block={block})", {}, {"part": part, "L": L, "window": W,
                                                                                  "block": block}))
            continue
        B, H, d = randint(gen, 1, 2), randint(gen, 1, 2), randint(gen, 2, 4)
        qkv = {n: torch.randn(B, H, L, d, generator=gen, dtype=_F64) for n in "qkv"}
        out.append(Case(f"band_update over the band: B={B}, H={H}, L={L}, d={d}, window={W}, block={block}",
                        {**qkv, **prior_state(gen, B, H, L, d)},
                        {"part": part, "L": L, "window": W, "block": block, "order": randint(gen, 0, 2**31)}))
    return out


def _wt_drive(step, case):
    """The grader's loop over the band's tiles, in a shuffled order, from the case's prior state."""
    i, W = case.inputs, case.params["window"]
    return fold_tiles(case, shuffled(list(_band(case.params["L"], W, case.params["block"])), case.params["order"]),
                      lambda m, l, acc, q0, q1, k0, k1: step(
                          m, l, acc, i["q"][..., q0:q1, :].clone(), i["k"][..., k0:k1, :].clone(),
                          i["v"][..., k0:k1, :].clone(), q0, k0, W))


def _wt_answer(obj, case):
    if not (isinstance(obj, tuple) and len(obj) == 2):
        raise TypeError("hand in the pair (band_tiles, band_update)")
    band_tiles, band_update = obj
    if case.params["part"] == "update":
        return _wt_drive(band_update, case)
    p, visits = case.params, torch.zeros(_grid(case), dtype=torch.int64)
    for q0, k0 in band_tiles(p["L"], p["window"], p["block"]):
        q0, k0 = int(q0), int(k0)
        if q0 % p["block"] or k0 % p["block"] or not (0 <= q0 < p["L"] and 0 <= k0 < p["L"]):
            raise ValueError(f"({q0}, {k0}) is not a tile of the grid: q0 and k0 are multiples of block = "
                             f"{p['block']} below L = {p['L']}")
        visits[q0 // p["block"], k0 // p["block"]] += 1
    return {"visits": visits}


def _wt_expected(case):
    p = case.params
    if p["part"] == "update":
        return attention_after_prior(case, _window(p["L"], p["window"]))
    visits = torch.zeros(_grid(case), dtype=torch.int64)
    for q0, _, k0, _ in _band(p["L"], p["window"], p["block"]):
        visits[q0 // p["block"], k0 // p["block"]] = 1
    return {"visits": visits}


def _band_step(m, l, acc, q_i, k_j, v_j, q0, k0, W, *, scale=True, mask=dict(), **kw):
    """The reference step (and its mistakes: ``mask`` one of :data:`_MASKS`, ``scale``, lesson 08's ``rescale_*``)."""
    visible = _band_visible(q0, q0 + q_i.shape[-2], k0, k0 + k_j.shape[-2], W, **mask)
    return _fwd_step(m, l, acc, q_i, k_j, v_j, visible, scale=scale, **kw)


def _wt_judge(got, want, case):
    p = case.params
    if p["part"] == "tiles":
        extra, missing = (got["visits"] > want["visits"]).nonzero().tolist(), (got["visits"] < want["visits"]).nonzero().tolist()
        if not extra and not missing:
            return Verdict(True)
        b, W = p["block"], p["window"]
        if missing:
            q0, k0 = (x * b for x in missing[0])
            return Verdict(False, f"tile (q0={q0}, k0={k0}) is missing: some query of [{q0}, {q0 + b}) sees some key "
                                  f"of [{k0}, {k0 + b}) (0 <= i − j < {W}). Per query block, the key tiles from the "
                                  f"one holding key q0 − W + 1 up to the diagonal.")
        q0, k0 = (x * b for x in extra[0])
        twice = int(got["visits"][extra[0][0], extra[0][1]]) > 1 and bool(want["visits"][extra[0][0], extra[0][1]])
        return Verdict(False, f"tile (q0={q0}, k0={k0}) is listed twice." if twice else
                       f"tile (q0={q0}, k0={k0}) holds no key any query of its block may see (all are older than "
                       f"i − W + 1, or in the future): the band skips it — start the key tiles at (q0 − W + 1) // "
                       f"block · block and stop at the diagonal.")
    if close(got["out"], want["out"]) and close(got["lse"], want["lse"]):
        return Verdict(True)
    if bool(torch.isnan(got["out"]).any()):
        return Verdict(False, "NaN: a row whose keys in a tile are all hidden gets m_new = −∞ when its state is "
                              "empty, and exp(−∞ − (−∞)) = NaN. Subtract 0 where m_new is −∞ (that row keeps "
                              "l = 0, acc = 0 until a visible key arrives).")
    drive = lambda **kw: _wt_drive(lambda *a: _band_step(*a, **kw), case)  # noqa: E731
    off_by_one = ("off by one: i − j <= W lets each query see W + 1 keys; the window counts the query itself, so "
                  "key j is visible iff 0 <= i − j < W.")
    return _first(got, [
        (off_by_one, drive(mask=_MASKS["le"])),
        ("the diagonal tiles need the causal mask too: inside the tile where the query block meets its own keys, "
         "keys j > i are in the future.", drive(mask=_MASKS["no_causal"])),
        ("the window mask is missing: the band's oldest tiles (and, when W < block, the diagonal tile) hold keys "
         "older than i − W + 1 for some rows — hide i − j >= W as well as j > i.", drive(mask=_MASKS["causal_only"])),
        (_RESCALE_HINT, drive(rescale_acc=False)),
        ("the scores are not scaled: multiply q_i k_jᵀ by 1/√d.", drive(scale=False)),
    ], "the step must fold the tile into the state it is given (it may already hold keys from elsewhere), over the "
       "keys 0 <= i − j < W of the tile: m_new = max(m, rowmax(S)), α = exp(m − m_new), l_new = α·l + rowsum(P̃), "
       "acc_new = α·acc + P̃ v_j.")


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
    Exercise("09_window_tiles", 3, "Sliding-window attention by tiles: the band and its step",
             "the pair (band_tiles(L, window, block) -> [(q0, k0), ...], "
             "band_update(m, l, acc, q_i, k_j, v_j, q0, k0, window) -> (m_new, l_new, acc_new))",
             _wt_cases, _wt_answer, _wt_expected, _wt_judge,
             forbidden=FORBID_SDPA + FORBID_COURSE + FORBID_SOFTMAX + FORBID_FLEX, kind="build"),
    Exercise("09_rolling_decode", 3, "Decode with a rolling-buffer cache",
             "a function decode_step(k_cache, v_cache, q, k, v, t) -> (out, k_cache, v_cache)",
             _roll_cases, _roll_answer, _roll_expected, _roll_judge,
             forbidden=FORBID_SDPA + FORBID_COURSE + FORBID_FLEX, kind="build"),
]
