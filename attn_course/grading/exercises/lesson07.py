"""Exercise set 07 — Tensor Product Attention (solutions/07_tensor_product_attention.ipynb).

References are computed here in float64 from the formulas of Zhang et al. 2025 (independently of the
learner and of ``attn_course.tpa``). Hints are *detected*: each judge computes what the common mistakes
(no 1/R, 1/√R, rank-major views, RoPE pairing/sign/frequency, rotating V or the rank axis, the blog post's
head-mixing scores, the blog post's cache arithmetic) would produce on the same inputs and names the match.
"""
from __future__ import annotations

import math

import torch

from ..spec import (Case, Exercise, FORBID_COURSE, FORBID_SDPA, Verdict, choice, close, diagnose, distinct, draw, first_match,
                    matches, randint)

SANDBOX_ALLOW = ("attn_course.rope",)          # 7.3's cell imports apply_rope (the sandbox refuses other course modules)
__all__ = ["EXERCISES"]

_F64 = torch.float64


def _max_diff(got: torch.Tensor, want: torch.Tensor) -> str:
    d = (got.double() - want.double()).abs()
    return "NaN" if torch.isnan(d).any() else f"{float(d.max()):.3g}"


# ---- formulas (float64) with switchable mistakes ---------------------------------------------------------

def _combine(A, B, *, scale="R"):
    """(1/R) Σ_r A[..., h, r] B[..., r, :]: (B, L, H, R) x (B, L, R, d) -> (B, L, H, d)."""
    R = A.shape[-1]
    s = {"R": 1.0 / R, "sqrtR": 1.0 / math.sqrt(R), "none": 1.0}[scale]
    return torch.einsum("blhr,blrd->blhd", A.to(_F64), B.to(_F64)) * s


def _rope(x, positions, *, pairing="half", sign=1.0, two=True, base=10000.0):
    """RoPE on (..., L, d) at integer positions (L,), float64. pairing 'half' (i, i+d/2) or 'interleaved'."""
    x = x.to(_F64)
    d = x.shape[-1]
    i = torch.arange(d // 2, dtype=_F64)
    theta = base ** (-(2.0 if two else 1.0) * i / d)
    ang = positions.to(_F64)[:, None] * theta                    # (L, d/2)
    cos, sin = ang.cos(), sign * ang.sin()
    if pairing == "half":
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


# ---- 07_tpa_combine -------------------------------------------------------------------------------------

def _combine_cases(gen):
    cases = []
    for B, L, H, R, d in ((1, 3, 4, 2, 8), (2, 5, 6, 3, 4), (2, 4, 3, 6, 10)):
        a = torch.randn(B, L, H * R, generator=gen)
        b = torch.randn(B, L, R * d, generator=gen)
        cases.append(Case(f"B={B}, L={L}, H={H}, R={R}, d_h={d}", {"a": a, "b": b}, {"H": H, "R": R}))
    return cases


def _combine_answer(fn, case):
    return {"out": fn(case.inputs["a"], case.inputs["b"], case.params["H"], case.params["R"])}


def _views(case, *, head_major=True):
    a, b = case.inputs["a"], case.inputs["b"]
    Bs, L, _ = a.shape
    H, R = case.params["H"], case.params["R"]
    A = a.view(Bs, L, H, R) if head_major else a.view(Bs, L, R, H).transpose(-2, -1)
    return A, b.view(Bs, L, R, -1)


def _combine_expected(case):
    return {"out": _combine(*_views(case)).to(case.inputs["a"].dtype)}


def _combine_judge(got, want, case):
    if close(got["out"], want["out"]):
        return Verdict(True)
    rank_major = "the head factors are laid out head-major: view W_A's output as (B, L, H, R), not (R, H) " \
                 "(the blog post's view(b, L, r, h) pairs every number with the wrong head and rank)"
    candidates = [
        ("you summed the R outer products without dividing by R: Q_t = (1/R) Σ_r a_r ⊗ b_r.",
         {"out": _combine(*_views(case), scale="none")}),
        ("the scale is 1/R (an average of the R rank-one terms), not 1/√R.",
         {"out": _combine(*_views(case), scale="sqrtR")}),
        (rank_major + ".", {"out": _combine(*_views(case, head_major=False))}),
        (rank_major + "; and the scale 1/R is missing too.",
         {"out": _combine(*_views(case, head_major=False), scale="none")}),
        (rank_major + "; and the scale is 1/R, not 1/√R.",
         {"out": _combine(*_views(case, head_major=False), scale="sqrtR")}),
    ]
    hint = first_match(got, candidates)
    return Verdict(False, hint or f"wrong values (largest difference {_max_diff(got['out'], want['out'])}).")


# ---- 07_rope --------------------------------------------------------------------------------------------

def _rope_cases(gen):
    cases = []
    # no case starts at position 0, where ignoring `positions` would give the right answer
    for shape, start in (((6, 8), 3), ((2, 3, 5, 16), 1), ((2, 4, 32), 7), ((1, 2, 3, 64), 100)):
        x = torch.randn(*shape, generator=gen)
        cases.append(Case(f"x {shape}, positions {start}..{start + shape[-2] - 1}",
                          {"x": x, "positions": torch.arange(start, start + shape[-2])}))
    return cases


def _rope_answer(fn, case):
    return {"out": fn(case.inputs["x"], case.inputs["positions"])}


def _rope_expected(case):
    return {"out": _rope(case.inputs["x"], case.inputs["positions"]).to(case.inputs["x"].dtype)}


def _rope_judge(got, want, case):
    if close(got["out"], want["out"]):
        return Verdict(True)
    x, pos = case.inputs["x"], case.inputs["positions"]
    L = x.shape[-2]
    candidates = [
        ("you paired neighbours (2i, 2i+1) — the original RoFormer layout; this course (like GPT-NeoX and "
         "HF LLaMA) pairs i with i + d/2: rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2]).",
         {"out": _rope(x, pos, pairing="interleaved")}),
        ("you rotate the wrong way: rotate_half(x) = cat(-x2, x1) (the minus on the second half), and "
         "out = x·cos + rotate_half(x)·sin.", {"out": _rope(x, pos, sign=-1.0)}),
        ("the frequencies are θ_i = base^(-2i/d) for i < d/2; you used base^(-i/d).",
         {"out": _rope(x, pos, two=False)}),
        ("you ignored the given positions and used 0..L-1; when decoding, the new token sits at its true "
         "position (after the cached ones).", {"out": _rope(x, torch.arange(L))}),
    ]
    hint = first_match(got, candidates)
    return Verdict(False, hint or f"wrong values (largest difference {_max_diff(got['out'], want['out'])}).")


# ---- 07_which_factors_rope ------------------------------------------------------------------------------

_FACTORS = ("A_q", "B_q", "A_k", "B_k", "A_v", "B_v")


def _which_cases(gen):
    cases = []
    for Bs, L, H, (Rq, Rk, Rv), d, start in ((1, 4, 2, (3, 2, 2), 8, 2), (2, 5, 4, (6, 2, 2), 16, 3),     # start > 0
                                            (2, 3, 3, (2, 1, 3), 8, 10)):
        t = {}
        for name in _FACTORS:
            R = {"q": Rq, "k": Rk, "v": Rv}[name[-1]]
            t[name] = torch.randn(Bs, L, H, R, generator=gen) if name[0] == "A" else torch.randn(Bs, L, R, d, generator=gen)
        cases.append(Case(f"B={Bs}, L={L}, H={H}, ranks {(Rq, Rk, Rv)}, d_h={d}, first position {start}",
                          t, {"start": start}))
    return cases


def _which_answer(fn, case):
    i = case.inputs
    q, k, v = fn(*(i[n] for n in _FACTORS), case.params["start"])
    return {"q": q, "k": k, "v": v}


def _qkv(case, *, rotate=("q", "k"), start=None, rank_axis=False):
    i, s = case.inputs, case.params["start"] if start is None else start
    L = i["A_q"].shape[1]
    pos = torch.arange(s, s + L)

    def rot(Bf):                                                         # (B, L, R, d)
        if rank_axis:                                                    # apply_rope on (B, L, R, d): R as "sequence"
            return _rope(Bf, torch.arange(Bf.shape[-2]))
        return _rope(Bf.transpose(1, 2), pos).transpose(1, 2)
    out = {}
    for n in "qkv":
        Bf = i[f"B_{n}"]
        out[n] = _combine(i[f"A_{n}"], rot(Bf) if n in rotate else Bf).to(Bf.dtype)
    return out


def _which_expected(case):
    return _qkv(case)


def _which_judge(got, want, case):
    if all(close(got[n], want[n]) for n in "qkv"):
        return Verdict(True)
    candidates = [
        ("values get no RoPE: rotate only the token factors of queries and keys (B_q, B_k), then combine.",
         _qkv(case, rotate=("q", "k", "v"))),
        ("your Q, K, V are not rotated at all: apply RoPE to B_q and B_k before combining.", _qkv(case, rotate=())),
        ("only K is rotated: queries need RoPE too, or the scores lose the relative position.",
         _qkv(case, rotate=("k",))),
        ("only Q is rotated: keys need RoPE too (and the cache keeps the rotated B_k).", _qkv(case, rotate=("q",))),
        ("you rotated along the rank axis: B has shape (B, L, R, d_h), so the sequence axis is 1, not -2 — move "
         "L next to d_h (B.transpose(1, 2)) before rotating, and back after.", _qkv(case, rank_axis=True)),
        ("the positions must start at `start` (the tokens already cached), not at 0.", _qkv(case, start=0)),
    ]
    hint = first_match(got, candidates)
    if hint:
        return Verdict(False, hint)
    if close(got["v"], want["v"]) and not close(got["q"], want["q"]):
        return Verdict(False, "V is right but Q/K are not: check the rotation (half-split pairing, θ_i = "
                              "base^(-2i/d)) and the 1/R scale.")
    return Verdict(False, "wrong values; combine with (1/R) Σ_r a_r ⊗ b_r after rotating B_q and B_k.")


# ---- 07_cache_elements ----------------------------------------------------------------------------------
# The lesson prints the count for one configuration and the per-token formula; the exercise asks for a ragged
# batch (each sequence caches its own tokens) and for TPA with constant head factors (the lesson's GQA-as-TPA,
# whose A_k, A_v are weights, not cache), so the learner counts what is cached (review 01-07, E07.4).

_CACHE_KEYS = ("seq_lens", "num_heads", "head_dim", "k_rank", "v_rank", "constant_heads")


def _cache_cases(gen):
    lens = lambda g, lo, hi: [randint(g, lo, hi) for _ in range(randint(g, 2, 5))]
    makers = [lambda g: (lens(g, 10, 2000), choice(g, (12, 16, 32)), choice(g, (64, 128)), 2, randint(g, 1, 2), False),
              lambda g: (lens(g, 100, 9000), choice(g, (32, 64)), 128, randint(g, 1, 4), randint(g, 1, 4), True),
              lambda g: (lens(g, 1, 999), randint(g, 2, 16), 8 * randint(g, 1, 8), randint(g, 1, 4), randint(g, 1, 4),
                         True)]
    # ragged lengths; one case of contextual factors, two of constant ones (the lesson's formula passes only
    # the first: 0 points); every mistake below gives its own number, different from the answer
    ok = lambda c: len(set(c[0])) > 1 and distinct(_cache_elements(c), *(v for v, _ in _cache_mistakes(c)))
    return [Case("lengths={}, H={}, d_h={}, R_k={}, R_v={}, constant head factors={}".format(*c),
                 params=dict(zip(_CACHE_KEYS, c))) for c in (draw(gen, make, ok) for make in makers)]


def _cache_answer(fn, case):
    p = case.params
    return {"elements": torch.tensor(int(fn(list(p["seq_lens"]), *(p[k] for k in _CACHE_KEYS[1:]))),
                                     dtype=torch.int64)}


def _cache_elements(c) -> int:
    lens, H, d, rk, rv, const = c
    return sum(lens) * (rk + rv) * ((0 if const else H) + d)


def _cache_expected(case):
    return {"elements": torch.tensor(_cache_elements([case.params[k] for k in _CACHE_KEYS]), dtype=torch.int64)}


def _cache_mistakes(c) -> list[tuple[int, str]]:
    lens, H, d, rk, rv, const = c
    n, w = sum(lens), _cache_elements(c)
    out = [(len(lens) * max(lens) * w // n, "each sequence caches its own tokens: add the lengths, do not pad "
                                            "every sequence to the longest."),
           (2 * w, "you counted keys and values twice (the blog post's 2·L·(R_k+R_v)·(H+d_h)): R_k + R_v already "
                   "covers both."),
           (n * 2 * H * d, "that is the MHA cache, 2·H·d_h per token; TPA caches the factors."),
           (n * rk * ((0 if const else H) + d), "the values' factors are cached too: R_k + R_v.")]
    if const:
        out.append((n * (rk + rv) * (H + d), "constant head factors are weights, shared by every token: the cache "
                                             "holds only what depends on the token, B_k and B_v."))
    else:
        out.append((n * (rk + rv) * H * d, "a rank-R factor pair of an H×d_h matrix holds R·(H + d_h) numbers, "
                                           "not R·H·d_h."))
    return out


def _cache_judge(got, want, case):
    g = int(got["elements"])
    if g == int(want["elements"]):
        return Verdict(True)
    return diagnose(g, [(h, v) for v, h in _cache_mistakes([case.params[k] for k in _CACHE_KEYS])],
                    f"got {g:,}: per token TPA caches R·(H + d_h) numbers for each of keys and values, counting only "
                    f"the factors that depend on the token.", same=lambda a, b: a == b)


# ---- 07_fix_seed_attention ------------------------------------------------------------------------------

def _fix_cases(gen):
    cases = []
    for Bs, L, H, d in ((1, 5, 2, 8), (2, 6, 4, 8), (2, 7, 3, 16)):
        q, k, v = (torch.randn(Bs, L, H, d, generator=gen) for _ in range(3))
        cases.append(Case(f"Q, K, V of shape (B, L, H, d_h) = {(Bs, L, H, d)}", {"Q": q, "K": k, "V": v}))
    return cases


def _fix_answer(fn, case):
    i = case.inputs
    return {"out": fn(i["Q"], i["K"], i["V"])}


def _attend(Q, K, V, *, causal=True, scale=True):
    q, k, v = (t.to(_F64).transpose(1, 2) for t in (Q, K, V))              # (B, H, L, d)
    s = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
    if causal:
        L = s.shape[-1]
        s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2)                             # (B, L, H, d)


def _seed_attend(Q, K, V, *, causal=False):
    """The blog post's code: scores (B, L, H, d) @ (B, L, d, H) — heads attend to heads of the same token (with
    ``causal``, the learner's added mask, H × H lower-triangular)."""
    q, k, v = (t.to(_F64) for t in (Q, K, V))
    s = q @ k.transpose(2, 3) / math.sqrt(q.shape[-1])
    if causal:
        H = s.shape[-1]
        s = s.masked_fill(~torch.ones(H, H, dtype=torch.bool).tril(), float("-inf"))
    return s.softmax(-1) @ v


def _reshaped_attend(Q, K, V, *, causal=True, scale=True):
    """Heads moved with reshape (B, L, H, d) -> (B, H, L, d) instead of transpose, and back the same way."""
    Bs, L, H, d = Q.shape
    q, k, v = (t.to(_F64).reshape(Bs, H, L, d) for t in (Q, K, V))
    s = q @ k.transpose(-2, -1) / (math.sqrt(d) if scale else 1.0)
    if causal:
        s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    return (s.softmax(-1) @ v).reshape(Bs, L, H, d)


def _fix_expected(case):
    i = case.inputs
    return {"out": _attend(i["Q"], i["K"], i["V"]).to(i["Q"].dtype)}


def _fix_judge(got, want, case):
    if close(got["out"], want["out"]):
        return Verdict(True)
    Q, K, V = (case.inputs[n] for n in "QKV")
    candidates = [
        ("this is still the seed's computation (the blog post's code the exercise starts from): with Q in "
         "(B, L, H, d) layout, Q @ Kᵀ attends across the H heads of each token. Move the heads forward first "
         "(transpose(1, 2) -> (B, H, L, d)) so the scores are (B, H, L, L).", {"out": _seed_attend(Q, K, V)}),
        ("a causal mask on the blog post's scores does not fix them: Q @ Kᵀ in (B, L, H, d_h) layout gives (B, L, H, "
         "H) scores between the HEADS of one token, and masking those hides heads, not future tokens. Move "
         "the heads forward first (transpose(1, 2) -> (B, H, L, d_h)), then mask the (L, L) scores.",
         {"out": _seed_attend(Q, K, V, causal=True)}),
        ("reshape is not transpose: Q.reshape(B, H, L, d_h) cuts the (L, H) grid into new rows, mixing tokens "
         "and heads. Use Q.transpose(1, 2) to move the head axis (and transpose back at the end).",
         {"out": _reshaped_attend(Q, K, V)}),
        ("reshape is not transpose: Q.reshape(B, H, L, d_h) mixes tokens and heads — use transpose(1, 2); "
         "the 1/√d_h scale is missing too.", {"out": _reshaped_attend(Q, K, V, scale=False)}),
        ("the scores are over the sequence now, but without the causal mask: query i must not see keys j > i.",
         {"out": _attend(Q, K, V, causal=False)}),
        ("the 1/√d_h scale is missing.", {"out": _attend(Q, K, V, scale=False)}),
        ("no causal mask and no 1/√d_h scale.", {"out": _attend(Q, K, V, causal=False, scale=False)}),
    ]
    hint = first_match(got, candidates)
    return Verdict(False, hint or f"wrong values (largest difference {_max_diff(got['out'], want['out'])}).")


# ---- 07_tpa_decode_step: one new token, the factor cache, graded against the paper's equations ---------------

_CACHE = ("A_k", "B_k", "A_v", "B_v")
_WEIGHTS = ("W_A_q", "W_B_q", "W_A_k", "W_B_k", "W_A_v", "W_B_v", "W_o")


def _step_sizes(case):
    i, H = case.inputs, case.params["H"]
    B, S, _, Rk = i["A_k"].shape
    return B, S, H, i["W_A_q"].shape[0] // H, Rk, i["A_v"].shape[-1], i["B_k"].shape[-1], i["x"].shape[-1]


def _step_cases(gen):
    cases = []
    for _ in range(3):
        B, S, H, d, D = randint(gen, 1, 2), randint(gen, 3, 9), randint(gen, 2, 4), choice(gen, (4, 6, 8)), randint(gen, 8, 16)
        Rq, Rk, Rv = randint(gen, 2, 6), randint(gen, 2, 3), randint(gen, 2, 3)      # ranks > 1: the views differ
        lin = lambda o, i_: torch.randn(o, i_, generator=gen) / math.sqrt(i_)      # noqa: E731  nn.Linear: (out, in)
        t = {"x": torch.randn(B, 1, D, generator=gen),
             "A_k": torch.randn(B, S, H, Rk, generator=gen), "B_k": torch.randn(B, S, Rk, d, generator=gen),
             "A_v": torch.randn(B, S, H, Rv, generator=gen), "B_v": torch.randn(B, S, Rv, d, generator=gen),
             "W_A_q": lin(H * Rq, D), "W_B_q": lin(Rq * d, D), "W_A_k": lin(H * Rk, D), "W_B_k": lin(Rk * d, D),
             "W_A_v": lin(H * Rv, D), "W_B_v": lin(Rv * d, D), "W_o": lin(D, H * d)}
        cases.append(Case(f"B={B}, S={S} cached tokens, H={H}, ranks ({Rq}, {Rk}, {Rv}), d_h={d}, d_model={D}",
                          t, {"H": H}))
    return cases


_PER_HEAD = ("your cache holds the per-head keys or values (B, S + 1, H, d_h): a TPA cache keeps the FACTORS "
             "A_k, B_k, A_v, B_v, and combines them only to attend.")


def _step_answer(fn, case):
    i = case.inputs
    out, new = fn(i["x"], {k: i[k] for k in _CACHE}, {k: i[k] for k in _WEIGHTS}, case.params["H"])
    new = [new[k] for k in _CACHE] if isinstance(new, dict) else list(new)
    B, S, H, _, Rk, Rv, d, _ = _step_sizes(case)
    # named before the shape check rejects it (review 01-07, G-3): a per-head K or V has H rows, not R
    per_head = (B, S + 1, H, d)
    if len(new) == 4 and any(isinstance(t, torch.Tensor) and tuple(t.shape) == per_head != (B, S + 1, R, d)
                             for t, R in ((new[1], Rk), (new[3], Rv))):
        raise ValueError(_PER_HEAD)
    return {"out": out, **dict(zip(_CACHE, new))}


def _step_expected(case):
    """The step from the paper's equations in float64 (:func:`_step`, no mistake switched on); the tests check it
    against attn_course.TensorProductAttention over a TPACache."""
    return _step(case)


def _step(case, *, scale="R", head_major=True, pos="S", rotate=("q", "k"), rerotate_cache=False, sqrt_d=True,
          append="end"):
    """The decode step in float64 from the paper's equations, with switches for the common mistakes."""
    i = {k: v.to(_F64) for k, v in case.inputs.items()}
    B, S, H, Rq, Rk, Rv, d, D = _step_sizes(case)
    p = torch.tensor([{"S": S, "S-1": S - 1, "0": 0}[pos]])
    x = i["x"]

    def A(w, R):                                                     # (B, 1, H, R), or the rank-major mistake
        a = x @ w.T
        return a.view(B, 1, H, R) if head_major else a.view(B, 1, R, H).transpose(-1, -2)

    def Bf(w, R, rot):                                               # (B, 1, R, d), rotated at position p
        b = (x @ w.T).view(B, 1, R, d)
        return _rope(b.transpose(1, 2), p).transpose(1, 2) if rot else b
    A_q, B_q = A(i["W_A_q"], Rq), Bf(i["W_B_q"], Rq, "q" in rotate)
    new = {"A_k": A(i["W_A_k"], Rk), "B_k": Bf(i["W_B_k"], Rk, "k" in rotate),
           "A_v": A(i["W_A_v"], Rv), "B_v": Bf(i["W_B_v"], Rv, "v" in rotate)}
    old = {k: i[k] for k in _CACHE}
    if rerotate_cache:                                               # the cached B_k rotated a second time
        old["B_k"] = _rope(old["B_k"].transpose(1, 2), torch.arange(S)).transpose(1, 2)
    cache = {k: torch.cat((old[k], new[k]) if append == "end" else (new[k], old[k]), dim=1) for k in _CACHE}
    q = _combine(A_q, B_q, scale=scale)                              # (B, 1, H, d): Eq. (3.1) with 1/R_q
    k = _combine(cache["A_k"], cache["B_k"], scale=scale)            # (B, S+1, H, d)
    v = _combine(cache["A_v"], cache["B_v"], scale=scale)
    w = (torch.einsum("bqhd,bshd->bhqs", q, k) / (math.sqrt(d) if sqrt_d else 1.0)).softmax(-1)
    o = torch.einsum("bhqs,bshd->bqhd", w, v).reshape(B, 1, H * d) @ i["W_o"].T       # (B, 1, d_model)
    return {"out": o.float(), **{kk: c.float() for kk, c in cache.items()}}


def _step_judge(got, want, case):
    if all(close(got[k], want[k], atol=1e-4, rtol=1e-3) for k in want):
        return Verdict(True)
    S = _step_sizes(case)[1]
    K, V = (_combine(want[f"A_{n}"], want[f"B_{n}"]) for n in "kv")            # the per-head keys and values
    if matches(got["B_k"], K) or matches(got["B_v"], V):                        # R = H: the shapes agree
        return Verdict(False, _PER_HEAD)
    candidates = [
        (f"the new token sits at position S = {S} (the S cached tokens hold positions 0 … S − 1): rotate its B_q "
         "and B_k there.", _step(case, pos="S-1")),
        ("the new token's B_q and B_k are not rotated (or rotated at position 0): RoPE at position S, the number "
         "of cached tokens.", _step(case, pos="0")),
        ("the cached B_k is already rotated at its own position: rotate only the new token's factors, never the "
         "cache again.", _step(case, rerotate_cache=True)),
        ("the new B_k goes into the cache ROTATED (keys keep their position); only B_q and B_k get RoPE.",
         _step(case, rotate=("q",))),
        ("values get no RoPE: rotate B_q and B_k only.", _step(case, rotate=("q", "k", "v"))),
        ("combine the factors with (1/R) Σ_r a_r ⊗ b_r: the 1/R scale is missing.", _step(case, scale="none")),
        ("the A factors are head-major: view W_A x as (B, 1, H, R), not (B, 1, R, H).", _step(case, head_major=False)),
        ("the scores are not scaled: divide q·k by √d_h.", _step(case, sqrt_d=False)),
        ("append the new token's factors at the END of the cache (it is the latest token), along the sequence "
         "axis 1.", _step(case, append="front")),
    ]
    hint = first_match(got, candidates)
    if hint:
        return Verdict(False, hint)
    if all(close(got[k], want[k], atol=1e-4, rtol=1e-3) for k in _CACHE):
        return Verdict(False, f"the new cache is right but the output is not (largest difference "
                              f"{_max_diff(got['out'], want['out'])}): combine q, K, V with 1/R, softmax(q·Kᵀ/√d_h), "
                              "heads side by side, then W_o.")
    return Verdict(False, f"wrong values (largest difference in out {_max_diff(got['out'], want['out'])}): append "
                          "the new token's factors (B_k rotated at position S), then attend over all S + 1 tokens.")


EXERCISES = [
    Exercise("07_tpa_combine", 2, "Combine the factors into Q",
             "a function combine(a, b, num_heads, rank) -> (B, L, H, d_h)",
             _combine_cases, _combine_answer, _combine_expected, _combine_judge, forbidden=FORBID_COURSE, kind="build"),
    Exercise("07_rope", 2, "Rotary position embedding by hand",
             "a function rope(x, positions) -> tensor shaped like x",
             _rope_cases, _rope_answer, _rope_expected, _rope_judge, forbidden=FORBID_COURSE, kind="build"),
    Exercise("07_which_factors_rope", 2, "Which factors get RoPE",
             "a function rotated_qkv(A_q, B_q, A_k, B_k, A_v, B_v, start) -> (Q, K, V), each (B, L, H, d_h)",
             _which_cases, _which_answer, _which_expected, _which_judge, kind="build"),
    Exercise("07_cache_elements", 1, "TPA cache arithmetic",
             "a function tpa_cache_elements(seq_lens, num_heads, head_dim, k_rank, v_rank, constant_heads) -> int",
             _cache_cases, _cache_answer, _cache_expected, _cache_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("07_fix_seed_attention", 3, "Fix the blog post's TPA attention",
             "a function fixed_attention(Q, K, V) -> (B, L, H, d_h), causal",
             _fix_cases, _fix_answer, _fix_expected, _fix_judge, forbidden=FORBID_SDPA + FORBID_COURSE, kind="debug"),
    Exercise("07_tpa_decode_step", 4, "One TPA decode step from the factor cache",
             "a function tpa_decode_step(x, cache, w, num_heads) -> (out (B, 1, d_model), new_cache: "
             "dict A_k, B_k, A_v, B_v with S + 1 tokens)",
             _step_cases, _step_answer, _step_expected, _step_judge, forbidden=FORBID_SDPA + FORBID_COURSE,
             kind="build"),
]
