"""Exercise set 12 — Multi-head Latent Attention (solutions/12_multi_head_latent_attention.ipynb).

References are computed here in float64 from DeepSeek-V2's equations (independently of the learner and
of ``attn_course.mla``). Hints are *detected*: each judge computes what the common mistakes (per-head
rope keys, caching only the latent, counting the latent twice, the wrong view of ``kv_b_proj``, RoPE on
the latent, a scale over the nope dims only, ...) would return on the same inputs and names the match.
"""
from __future__ import annotations

import math

import torch

from ..spec import Case, Exercise, FORBID_COURSE, Verdict, close, diagnose, randint, choice, draw, distinct
from ..budget import OverBudget, Trace
from .lesson07 import _rope

SANDBOX_ALLOW = ("attn_course.rope",)          # 12.4's cell imports apply_rope
__all__ = ["EXERCISES", "counted_flops", "OverBudget"]

_F64 = torch.float64


def counted_flops(fn, *args):
    """``(fn(*args), FLOPs)``: the FLOPs the trace budget's :class:`~attn_course.grading.budget.Trace` counted while
    ``fn`` ran (every matrix product, 2 per multiply-add) — 12.5 compares its step with the absorbed reference's, 13.6
    each ring step with one block's."""
    with Trace() as trace:
        out = fn(*args)
    return out, trace.flops


def _max_diff(got: torch.Tensor, want: torch.Tensor) -> str:
    d = (got.double() - want.double()).abs()
    return "NaN" if torch.isnan(d).any() else f"{float(d.max()):.3g}"


# ---- 12_cache_bytes -------------------------------------------------------------------------------------

_CACHE_KEYS = ("seq_len", "batch_size", "num_layers", "num_heads", "kv_lora_rank", "qk_rope_head_dim",
               "bytes_per_element")


def _cache_cases(gen):
    makers = [lambda g: (1024 * randint(g, 1, 32), randint(g, 2, 8), 60, 128, 512, 64, 2),    # DeepSeek-V2's shapes
              lambda g: (randint(g, 100, 5000), randint(g, 3, 8), randint(g, 3, 6), 8, 64, 16, 4),
              lambda g: (randint(g, 3, 50), randint(g, 3, 5), randint(g, 3, 8), 16, 32, 8, 2)]

    def ok(s):                  # each mistake gives its own number (batch, layers, bytes all differ)
        p = dict(zip(_CACHE_KEYS, s))
        H, dc, dr = p["num_heads"], p["kv_lora_rank"], p["qk_rope_head_dim"]
        return distinct(_cache_total(p, dc + dr), _cache_total(p, dc + H * dr), _cache_total(p, dc),
                        _cache_total(p, 2 * dc + dr), _cache_total(p, 2 * (dc + dr)),
                        _cache_total(p, dc + dr, nbytes=False), _cache_total(p, dc + dr, layers=False),
                        _cache_total(p, dc + dr, batch=False))
    return [Case(", ".join(f"{k}={v}" for k, v in zip(_CACHE_KEYS, s)), params=dict(zip(_CACHE_KEYS, s)))
            for s in (draw(gen, make, ok) for make in makers)]


def _cache_answer(fn, case):
    return {"bytes": torch.tensor(int(fn(*case.params.values())), dtype=torch.int64)}


def _cache_total(p, per_token, *, layers=True, batch=True, nbytes=True):
    return (per_token * p["seq_len"] * (p["batch_size"] if batch else 1) * (p["num_layers"] if layers else 1)
            * (p["bytes_per_element"] if nbytes else 1))


def _cache_expected(case):
    p = case.params
    return {"bytes": torch.tensor(_cache_total(p, p["kv_lora_rank"] + p["qk_rope_head_dim"]), dtype=torch.int64)}


def _cache_judge(got, want, case):
    g, w = int(got["bytes"]), int(want["bytes"])
    if g == w:
        return Verdict(True)
    p = case.params
    H, dc, dr = p["num_heads"], p["kv_lora_rank"], p["qk_rope_head_dim"]
    candidates = [
        (_cache_total(p, dc + H * dr), "the rope key k^R is shared by all heads: one d_R-wide vector per token "
                                       "(d_c + d_R), not one per head (d_c + H·d_R)."),
        (_cache_total(p, dc), "the rotated rope key is cached too: it cannot be recomputed from the latent, "
                              "so each token keeps d_c + d_R numbers."),
        (_cache_total(p, 2 * dc + dr), "the latent is cached once: keys AND values are both up-projected from "
                                       "the same c^KV, so it is not counted twice."),
        (_cache_total(p, 2 * (dc + dr)), "d_c + d_R already covers keys and values; do not double it."),
        (_cache_total(p, dc + dr, nbytes=False), "that is a number of elements: multiply by bytes_per_element."),
        (_cache_total(p, dc + dr, layers=False), "every layer has its own cache: multiply by num_layers."),
        (_cache_total(p, dc + dr, batch=False), "every sequence has its own cache: multiply by batch_size."),
    ]
    for value, hint in candidates:
        if g == value:
            return Verdict(False, hint)
    return Verdict(False, f"got {g:,}, expected {w:,} bytes: per token and layer MLA caches d_c + d_R numbers.")


# ---- 12_absorb_query ------------------------------------------------------------------------------------

def _absorb_cases(gen):
    cases = []
    for Bs, H, L, dn, dv, dc in ((1, 2, 3, 4, 6, 5), (2, 4, 5, 8, 8, 16), (2, 3, 4, 6, 4, 12)):
        q = torch.randn(Bs, H, L, dn, generator=gen)
        W = torch.randn(H * (dn + dv), dc, generator=gen) / math.sqrt(dc)
        cases.append(Case(f"q_nope (B, H, L, d_nope) = {(Bs, H, L, dn)}, kv_b_weight {tuple(W.shape)} "
                          f"(d_v={dv}, d_c={dc})", {"q_nope": q, "kv_b_weight": W}, {"qk_nope_head_dim": dn}))
    return cases


def _absorb_answer(fn, case):
    i = case.inputs
    return {"q_latent": fn(i["q_nope"], i["kv_b_weight"], case.params["qk_nope_head_dim"])}


def _W_UK(case, *, v_first=False, channel_major=False):
    q, W = case.inputs["q_nope"], case.inputs["kv_b_weight"].to(_F64)
    H, dn, dc = q.shape[1], case.params["qk_nope_head_dim"], W.shape[1]
    dv = W.shape[0] // H - dn
    if channel_major:                                                # rows read as (d_nope + d_v, H)
        Wc = W.view(dn + dv, H, dc)
        return (Wc[dv:] if v_first else Wc[:dn]).transpose(0, 1)
    Wh = W.view(H, dn + dv, dc)
    return Wh[:, dv:] if v_first else Wh[:, :dn]                     # (H, d_nope, d_c)


def _absorb(case, scale=1.0, **kw):
    q = case.inputs["q_nope"]
    return {"q_latent": (torch.einsum("bhld,hdc->bhlc", q.to(_F64), _W_UK(case, **kw)) * scale).to(q.dtype)}


def _absorb_expected(case):
    return _absorb(case)


def _absorb_judge(got, want, case):
    if close(got["q_latent"], want["q_latent"]):
        return Verdict(True)
    dn = case.params["qk_nope_head_dim"]
    layout = ("kv_b_proj's rows are head-major: view the weight as (H, d_nope + d_v, d_c) — head h owns rows "
              "h·(d_nope+d_v) … — not as (d_nope + d_v, H, d_c)")
    return diagnose(got, [
        ("each head's block is [k_nope | v]: W_UK is its FIRST d_nope rows, the values' W_UV the rest; "
         "you took the rows of the wrong part.", _absorb(case, v_first=True)),
        (layout + ".", _absorb(case, channel_major=True)),
        (layout + "; and the [k_nope | v] order puts W_UK first.", _absorb(case, v_first=True, channel_major=True)),
        ("leave the softmax scale out: it multiplies the whole score (nope and rope parts) later; absorbing "
         "W_UK only re-associates q·(W_UK c) = (W_UKᵀ q)·c.", _absorb(case, scale=1 / math.sqrt(dn))),
    ], f"wrong values (largest difference {_max_diff(got['q_latent'], want['q_latent'])}); "
       f"q_latent[b, h, l] = W_UK[h]ᵀ q_nope[b, h, l], with W_UK[h] of shape (d_nope, d_c).")


# ---- 12_shared_rope_key ---------------------------------------------------------------------------------

def _shared_cases(gen):
    shapes = [(128, 128, 512, 64), (choice(gen, (16, 32, 64)), 128, choice(gen, (256, 512)), choice(gen, (32, 64))),
              (choice(gen, (4, 8, 16)), choice(gen, (32, 64)), choice(gen, (64, 128)), choice(gen, (8, 16)))]
    shapes[0] = (choice(gen, (64, 128)), 128, 512, 64)             # DeepSeek-V2 (128 heads) or V2-Lite-like (64)
    return [Case(f"num_heads={H}, head_dim={d}, kv_lora_rank={dc}, qk_rope_head_dim={dr}",
                 params=dict(num_heads=H, head_dim=d, kv_lora_rank=dc, qk_rope_head_dim=dr))
            for H, d, dc, dr in shapes]


def _shared_answer(fn, case):
    return {"costs": torch.tensor([float(v) for v in fn(*case.params.values())], dtype=_F64)}


def _costs(p, *, per_head_latent=False, per_head_without_latent=False, group_width=2):
    H, d, dc, dr = p["num_heads"], p["head_dim"], p["kv_lora_rank"], p["qk_rope_head_dim"]
    shared = dc + dr
    per_head = H * (dc + dr) if per_head_latent else (H * dr if per_head_without_latent else dc + H * dr)
    return {"costs": torch.tensor([shared, per_head, shared / (group_width * d), per_head / (group_width * d)],
                                  dtype=_F64)}


def _shared_expected(case):
    return _costs(case.params)


def _shared_judge(got, want, case):
    g, w = got["costs"], want["costs"]
    if close(g, w):
        return Verdict(True)
    p = case.params
    return diagnose(got, [
        ("GQA with n_g groups caches 2·n_g·d_h numbers (a key AND a value per group): divide by 2·head_dim.",
         _costs(p, group_width=1)),
        ("with per-head rope keys the latent is still one shared d_c-wide vector: d_c + H·d_R, not H·(d_c + d_R).",
         _costs(p, per_head_latent=True)),
        ("the per-head variant still caches the latent: d_c + H·d_R.", _costs(p, per_head_without_latent=True)),
    ], f"expected (d_c + d_R, d_c + H·d_R, (d_c + d_R)/(2·d_h), (d_c + H·d_R)/(2·d_h)) = "
       f"{tuple(round(v, 4) for v in w.tolist())}, got {tuple(round(v, 4) for v in g.tolist())}.")


# ---- 12_fix_buggy_mla -----------------------------------------------------------------------------------

def _fix_cases(gen):
    cases = []
    for Bs, H, S, dn, dr, dc in ((1, 2, 5, 4, 4, 6), (2, 3, 6, 8, 4, 8), (2, 4, 7, 6, 8, 10)):
        t = {"c_kv": torch.randn(Bs, S, dc, generator=gen), "k_rope": torch.randn(Bs, S, dr, generator=gen),
             "q_nope": torch.randn(Bs, H, S, dn, generator=gen), "q_rope": torch.randn(Bs, H, S, dr, generator=gen),
             "W_UK": torch.randn(H, dn, dc, generator=gen) / math.sqrt(dc)}
        cases.append(Case(f"B={Bs}, H={H}, S={S}, d_nope={dn}, d_R={dr}, d_c={dc}", t))
    return cases


def _fix_answer(fn, case):
    i = case.inputs
    return {"weights": fn(i["c_kv"], i["k_rope"], i["q_nope"], i["q_rope"], i["W_UK"])}


def _mla_weights(case, *, rope_latent=False, nope_scale=False, causal=True, rope=True, pairing="half"):
    i = {k: v.to(_F64) for k, v in case.inputs.items()}
    S, H = i["c_kv"].shape[1], i["q_nope"].shape[1]
    pos = torch.arange(S)
    rot = (lambda x: _rope(x, pos, pairing=pairing)) if rope else (lambda x: x)
    c = _rope(i["c_kv"], pos) if rope_latent else i["c_kv"]
    k_nope = torch.einsum("bsc,hdc->bhsd", c, i["W_UK"])                                  # Eq. (10)
    q = torch.cat((i["q_nope"], rot(i["q_rope"])), dim=-1)                                # Eq. (16)
    k = torch.cat((k_nope, rot(i["k_rope"])[:, None].expand(-1, H, -1, -1)), dim=-1)      # Eq. (17)
    dn, dr = i["q_nope"].shape[-1], i["q_rope"].shape[-1]
    s = q @ k.transpose(-2, -1) / math.sqrt(dn if nope_scale else dn + dr)                 # Eq. (18)
    if causal:
        s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    return {"weights": s.softmax(-1).to(case.inputs["c_kv"].dtype)}


def _fix_expected(case):
    return _mla_weights(case)


def _fix_judge(got, want, case):
    if close(got["weights"], want["weights"]):
        return Verdict(True)
    latent = ("RoPE must not touch the latent: rotating c^KV before the up-projection makes the content scores "
              "depend on the key's absolute position (and a rotated latent can no longer be absorbed). Rotate "
              "only q_rope and the shared k_rope")
    scale = "the scale is 1/sqrt(d_nope + d_R) — the query/key width is d_nope + d_R (Eq. 18), not d_nope alone"
    return diagnose(got, [
        ("both bugs are still there. " + latent + "; and " + scale + ".",
         _mla_weights(case, rope_latent=True, nope_scale=True)),
        (latent + ".", _mla_weights(case, rope_latent=True)),
        ("RoPE is fixed; one bug left: " + scale + ".", _mla_weights(case, nope_scale=True)),
        ("the causal mask is missing: query i may only see keys j <= i.", _mla_weights(case, causal=False)),
        ("q_rope and k_rope must be rotated (positions 0..S-1).", _mla_weights(case, rope=False)),
        ("use the half-split RoPE of apply_rope (pairs i, i + d/2), not neighbour pairs (2i, 2i+1).",
         _mla_weights(case, pairing="interleaved")),
    ], f"wrong weights (largest difference {_max_diff(got['weights'], want['weights'])}).")


# ---- 12_absorbed_decode ---------------------------------------------------------------------------------

def _dec_sizes(case):
    B, H, dn = case.inputs["q_nope"].shape
    S, dc = case.inputs["c_kv"].shape[1:]
    return B, H, S, dn, case.inputs["q_rope"].shape[-1], case.inputs["kv_b_weight"].shape[0] // H - dn, dc


def _dec_cases(gen):
    def make(g):
        return (randint(g, 1, 2), randint(g, 3, 4), randint(g, 18, 40), choice(g, (4, 6, 8)), choice(g, (2, 4)),
                choice(g, (4, 6, 8)), choice(g, (6, 8, 10)))

    def ok(s):                                   # every scale mistake differs; keys, values and latent differ in width
        B, H, S, dn, dr, dv, dc = s
        return distinct(dn, dn + dr, dc + dr) and distinct(dn, dv, dc)
    cases = []
    for B, H, S, dn, dr, dv, dc in (draw(gen, make, ok) for _ in range(3)):
        t = {"q_nope": torch.randn(B, H, dn, generator=gen), "q_rope": torch.randn(B, H, dr, generator=gen),
             "c_kv": torch.randn(B, S, dc, generator=gen), "k_rope": torch.randn(B, S, dr, generator=gen),
             "kv_b_weight": torch.randn(H * (dn + dv), dc, generator=gen) / math.sqrt(dc)}
        cases.append(Case(f"B={B}, H={H}, S={S} cached tokens, d_nope={dn}, d_R={dr}, d_v={dv}, d_c={dc}", t))
    return cases


_DEC_FLOPS = 1.5        # the learner's step may count at most this many times the absorbed reference's FLOPs


def _dec_reference(q_nope, q_rope, c_kv, k_rope, kv_b_weight):
    """The absorbed step in plain torch, in the inputs' dtype: whose counted FLOPs set the budget,
    2·B·H·(d_c·(d_nope + d_v) + S·(2·d_c + d_R))."""
    (B, H, dn), (S, dc), dr = q_nope.shape, c_kv.shape[1:], q_rope.shape[-1]
    W = kv_b_weight.view(H, -1, dc)
    q_lat = torch.einsum("bhd,hdc->bhc", q_nope, W[:, :dn])                 # W_UK absorbed into the query
    q_rot = _rope(q_rope[:, :, None], torch.tensor([S - 1]))[:, :, 0].to(q_nope.dtype)
    s = (torch.einsum("bhc,bsc->bhs", q_lat, c_kv) + torch.einsum("bhr,bsr->bhs", q_rot, k_rope)) / math.sqrt(dn + dr)
    return torch.einsum("bhc,hvc->bhv", torch.einsum("bhs,bsc->bhc", s.softmax(-1), c_kv), W[:, dn:])


def _dec_answer(fn, case):
    args = [case.inputs[x] for x in ("q_nope", "q_rope", "c_kv", "k_rope", "kv_b_weight")]
    out, mine = counted_flops(fn, *(a.clone() for a in args))
    ref = counted_flops(_dec_reference, *args)[1]
    if mine > _DEC_FLOPS * ref:
        raise OverBudget(f"rule: trace budget — counted FLOPs ({mine:,}) were {mine / ref:.1f}× the absorbed step's "
                         f"({ref:,}; limit {_DEC_FLOPS}×): the cache was up-projected into per-head keys or values")
    return {"out": out}


def _dec_split(W, H, dn, dv, dc, how):
    """W_UK (H, d_nope, d_c), W_UV (H, d_v, d_c) from kv_b_proj's weight, read as ``how``."""
    if how == "channel":                                             # rows read as (d_nope + d_v, H)
        Wh = W.view(dn + dv, H, dc).transpose(0, 1)
    elif how == "view":                                              # a view where a transpose was meant
        Wh = W.reshape(H, dc, dn + dv).transpose(1, 2)
    else:
        Wh = W.view(H, dn + dv, dc)
    return (Wh[:, dv:], Wh[:, :dv]) if how == "v_first" else (Wh[:, :dn], Wh[:, dn:])


def _decode(case, *, scale="full", split="head", q_pos="last", rope_latent=None, rerotate_k=False, rope_part=True):
    """The new token's per-head outputs (B, H, d_v) by the NAIVE path in float64: up-project the cache into
    per-head keys and values (Eqs. 10, 11, 17), then attend (Eq. 18). Switches give the common mistakes."""
    i = {k: v.to(_F64) for k, v in case.inputs.items()}
    B, H, S, dn, dr, dv, dc = _dec_sizes(case)
    W_UK, W_UV = _dec_split(i["kv_b_weight"], H, dn, dv, dc, split)
    pos = {"last": S - 1, "next": S}.get(q_pos)
    q_rope = i["q_rope"] if pos is None else _rope(i["q_rope"][:, :, None], torch.tensor([pos]))[:, :, 0]
    k_rope = _rope(i["k_rope"], torch.arange(S)) if rerotate_k else i["k_rope"]
    c = i["c_kv"]
    c_k = _rope(c, torch.arange(S)) if rope_latent else c                   # RoPE on the latent: keys ...
    c_v = c_k if rope_latent == "both" else c                               # ... and values
    k_nope = torch.einsum("bsc,hdc->bhsd", c_k, W_UK)                       # Eq. (10): per-head content keys
    v = torch.einsum("bsc,hvc->bhsv", c_v, W_UV)                            # Eq. (11): per-head values
    s = torch.einsum("bhd,bhsd->bhs", i["q_nope"], k_nope)
    if rope_part:
        s = s + torch.einsum("bhr,bsr->bhs", q_rope, k_rope)                # Eq. (17): the shared rope key
    width = {"full": dn + dr, "nope": dn, "latent": dc + dr, "none": 1}[scale]
    p = (s / math.sqrt(width)).softmax(-1)                                  # Eq. (18)
    return {"out": torch.einsum("bhs,bhsv->bhv", p, v).to(case.inputs["q_nope"].dtype)}


def _dec_expected(case):
    return _decode(case)


def _dec_judge(got, want, case):
    if close(got["out"], want["out"], atol=1e-4, rtol=1e-3):
        return Verdict(True)
    latent = ("RoPE must not touch the latent: c_kv is position-free (only the rope channels are rotated), "
              "and a rotated latent could not be absorbed")
    layout = ("kv_b_proj's weight is (H·(d_nope + d_v), d_c) with head-major rows and [k_nope | v] within each "
              "head: W_UK[h] = rows h·(d_nope+d_v) … +d_nope, W_UV[h] the d_v rows after them")
    return diagnose(got, [
        ("the softmax scale is 1/sqrt(d_nope + d_R) — the width of the full query and key (Eq. 18) — not "
         "1/sqrt(d_nope).", _decode(case, scale="nope")),
        ("the softmax scale is 1/sqrt(d_nope + d_R), the width of the ORIGINAL query·key (Eq. 18): absorption "
         "only re-associates the product, so the absorbed query's width d_c + d_R does not change the scale.",
         _decode(case, scale="latent")),
        ("the scores are not scaled: divide by sqrt(d_nope + d_R).", _decode(case, scale="none")),
        (latent + ".", _decode(case, rope_latent="both")),
        (latent + " (you rotated the latent on the key side).", _decode(case, rope_latent="keys")),
        ("rotate q_rope at the new token's position S − 1 (the last of the S cached tokens): you left it "
         "unrotated (or rotated it at position 0, which is no rotation).", _decode(case, q_pos=None)),
        ("the new token is already in the cache, at position S − 1 (not S): rotate q_rope there.",
         _decode(case, q_pos="next")),
        ("the cached k_rope is already rotated at its own position: rotate only the new query.",
         _decode(case, rerotate_k=True)),
        ("the score has two parts: q_latent·c_kv (content) PLUS q_rope·k_rope (position) — the rope part is "
         "missing.", _decode(case, rope_part=False)),
        (layout + "; you took [v | k_nope].", _decode(case, split="v_first")),
        (layout + "; you read the rows as (d_nope + d_v, H).", _decode(case, split="channel")),
        (layout + "; you reshaped it to (H, d_c, d_nope + d_v) where a transpose was needed.",
         _decode(case, split="view")),
    ], f"wrong values (largest difference {_max_diff(got['out'], want['out'])}): out[b, h] = W_UV[h] Σ_s p_s c_s "
       f"with p = softmax((W_UK[h]ᵀ q_nope)·c_s + RoPE(q_rope)·k_rope_s) / sqrt(d_nope + d_R)).")


EXERCISES = [
    Exercise("12_cache_bytes", 1, "MLA's cache in bytes",
             "a function mla_cache_bytes(seq_len, batch_size, num_layers, num_heads, kv_lora_rank, "
             "qk_rope_head_dim, bytes_per_element) -> int",
             _cache_cases, _cache_answer, _cache_expected, _cache_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("12_absorb_query", 2, "Absorb W_UK into the query by hand",
             "a function absorb_query(q_nope, kv_b_weight, qk_nope_head_dim) -> (B, H, L, d_c)",
             _absorb_cases, _absorb_answer, _absorb_expected, _absorb_judge, forbidden=FORBID_COURSE, kind="build"),
    Exercise("12_shared_rope_key", 1, "Why the rope key is shared",
             "a function rope_key_costs(num_heads, head_dim, kv_lora_rank, qk_rope_head_dim) -> "
             "(shared, per_head, shared_groups, per_head_groups)",
             _shared_cases, _shared_answer, _shared_expected, _shared_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("12_fix_buggy_mla", 3, "Find the bugs: RoPE on the latent, the wrong scale",
             "a function mla_weights(c_kv, k_rope, q_nope, q_rope, W_UK) -> causal weights (B, H, S, S)",
             _fix_cases, _fix_answer, _fix_expected, _fix_judge, kind="debug"),
    Exercise("12_absorbed_decode", 4, "The absorbed decode step over the latent cache",
             "a function absorbed_decode(q_nope, q_rope, c_kv, k_rope, kv_b_weight) -> (B, H, d_v)",
             _dec_cases, _dec_answer, _dec_expected, _dec_judge,
             forbidden=FORBID_COURSE, kind="build"),
]
