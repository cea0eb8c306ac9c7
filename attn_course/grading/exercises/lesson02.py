"""Exercise set 02 — multi-head attention (solutions/02_multi_head_attention.ipynb).

References are computed here in float64 from the equations (independently of the learner and of the
package). Hints are *detected*: each judge computes what the common mistakes produce on the same inputs
and names the one that the learner's answer matches.
"""
from __future__ import annotations

import math

import torch
from einops import rearrange

from ..spec import Case, Exercise, FORBID_COURSE, FORBID_SDPA, Verdict, close, diagnose, draw, randint

__all__ = ["EXERCISES"]

_F64 = torch.float64


def _first(got, candidates):
    return diagnose(got, candidates, "wrong values; compare with the shape table in lesson 02, section 2.")


# ---- 02_split_heads -----------------------------------------------------------------------------------

def _split_cases(gen):
    out = []
    for B, L, H, d_h in [(1, 4, 2, 4), (2, 3, 4, 5), (3, 8, 2, 8)]:      # L == d_h in the 1st and 3rd case
        out.append(Case(f"x (B={B}, L={L}, H·d_h={H * d_h}), H={H}",
                        {"x": torch.randn(B, L, H * d_h, generator=gen)}, {"num_heads": H}))
    return out


def _split_answer(fn, case):
    return {"heads": fn(case.inputs["x"], case.params["num_heads"])}


def _split_expected(case):
    return {"heads": rearrange(case.inputs["x"], "b l (h d) -> b h l d", h=case.params["num_heads"])}


def _split_judge(got, want, case):
    if close(got["heads"], want["heads"]):
        return Verdict(True)
    x, H = case.inputs["x"], case.params["num_heads"]
    B, L, D = x.shape
    return _first(got["heads"], [
        ("x.view(B, H, L, d_h) cuts the flattened tokens into H pieces, it does not split the features: "
         "view as (B, L, H, d_h) first, then transpose(1, 2).", x.reshape(B, H, L, D // H)),
        ("your heads take every H-th feature ('(d h)'): head h owns the CONSECUTIVE features "
         "h·d_h … (h+1)·d_h − 1, i.e. 'b l (h d) -> b h l d'.", rearrange(x, "b l (d h) -> b h l d", h=H)),
    ])


# ---- 02_merge_heads -----------------------------------------------------------------------------------

def _merge_cases(gen):
    return [Case(f"y (B={B}, H={H}, L={L}, d_h={d})", {"y": torch.randn(B, H, L, d, generator=gen)})
            for B, H, L, d in [(1, 2, 4, 4), (2, 4, 3, 5), (2, 3, 6, 2)]]


def _merge_answer(fn, case):
    return {"merged": fn(case.inputs["y"])}


def _merge_expected(case):
    return {"merged": rearrange(case.inputs["y"], "b h l d -> b l (h d)")}


def _merge_judge(got, want, case):
    if close(got["merged"], want["merged"]):
        return Verdict(True)
    y = case.inputs["y"]
    B, H, L, d = y.shape
    return _first(got["merged"], [
        ("y.reshape(B, L, H·d_h) without moving the head axis mixes tokens: transpose(1, 2) first "
         "(then reshape, since the transposed tensor is not contiguous).", y.reshape(B, L, H * d)),
        ("your features are interleaved ('(d h)'): Concat(head_1, …, head_H) puts head h's d_h features "
         "side by side, 'b h l d -> b l (h d)'.", rearrange(y, "b h l d -> b l (d h)")),
    ])


# ---- 02_mha_forward -----------------------------------------------------------------------------------

def _mha(x, Wq, Wk, Wv, Wo, H, causal, *, scale="d_h", split="right", mask_causal=True):
    x, Wq, Wk, Wv, Wo = (t.to(_F64) for t in (x, Wq, Wk, Wv, Wo))
    B, L, D = x.shape
    d_h = D // H
    pattern = "b l (h d) -> b h l d" if split == "right" else "b l (d h) -> b h l d"
    q, k, v = (rearrange(x @ W.T, pattern, h=H) for W in (Wq, Wk, Wv))
    s = q @ k.transpose(-2, -1) / math.sqrt({"d_h": d_h, "d_model": D, "none": 1}[scale])
    if causal and mask_causal:
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    y = rearrange(torch.softmax(s, -1) @ v, "b h l d -> b l (h d)")
    return y @ Wo.T


def _mha_cases(gen):
    out = []
    for B, L, D, H, causal in [(2, 5, 16, 4, False), (3, 6, 12, 3, True), (1, 4, 8, 2, True)]:
        w = {n: torch.randn(D, D, generator=gen) / math.sqrt(D) for n in ("W_q", "W_k", "W_v", "W_o")}
        out.append(Case(f"B={B}, L={L}, d_model={D}, H={H}, causal={causal}",
                        {"x": torch.randn(B, L, D, generator=gen), **w}, {"num_heads": H, "causal": causal}))
    return out


def _mha_answer(fn, case):
    i, p = case.inputs, case.params
    return {"y": fn(i["x"], i["W_q"], i["W_k"], i["W_v"], i["W_o"], p["num_heads"], p["causal"])}


def _mha_args(case):
    i, p = case.inputs, case.params
    return (i["x"], i["W_q"], i["W_k"], i["W_v"], i["W_o"], p["num_heads"], p["causal"])


def _mha_expected(case):
    return {"y": _mha(*_mha_args(case)).to(case.inputs["x"].dtype)}


def _mha_judge(got, want, case):
    if close(got["y"], want["y"]):
        return Verdict(True)
    a = _mha_args(case)
    x, Wq, Wk, Wv, Wo, H, causal = a
    cands = [
        ("you divided the scores by √d_model; each head's scores are divided by √d_h = √(d_model / H).",
         _mha(*a, scale="d_model")),
        ("the scores are not scaled: divide Q_i K_iᵀ by √d_h.", _mha(*a, scale="none")),
        ("your heads take every H-th feature; head h owns the consecutive features h·d_h … (h+1)·d_h − 1.",
         _mha(*a, split="interleaved")),
        ("weights are in nn.Linear's layout (out, in): project with x @ W.T, not x @ W.",
         _mha(x, Wq.T, Wk.T, Wv.T, Wo.T, H, causal)),
        ("this is ONE head of width d_model: split the projections into num_heads heads of d_model // H.",
         _mha(x, Wq, Wk, Wv, Wo, 1, causal, scale="d_model")),
    ]
    if causal:
        cands.append(("the causal mask is missing: query i may only attend keys j <= i.",
                      _mha(*a, mask_causal=False)))
    return _first(got["y"], cands)


# ---- 02_mha_flops -------------------------------------------------------------------------------------
# The lesson prints 8·B·L·d² + 4·B·L²·d for heads of width d_model/H; the exercise draws heads whose total
# width H·d_h differs from d_model (as in Gemma or T5), so the learner derives the count (review 01-07, E02.4).

def _flops_cases(gen):
    def make(g, L_lo, L_hi, d_lo, d_hi):
        B, L, D = randint(g, 1, 4), randint(g, L_lo, L_hi), 16 * randint(g, d_lo, d_hi)
        H, dh = randint(g, 2, 16), 8 * randint(g, 1, 16)
        return B, L, D, H, dh
    shapes = [draw(gen, lambda g: make(g, 2, 64, 2, 8), lambda s: s[3] * s[4] != s[2]),
              draw(gen, lambda g: make(g, 100, 2048, 8, 48), lambda s: s[3] * s[4] != s[2]),
              draw(gen, lambda g: make(g, 2048, 8192, 16, 64), lambda s: s[3] * s[4] != s[2])]
    return [Case(f"B={B}, L={L}, d_model={D}, H={H}, d_h={dh}",
                 params={"B": B, "L": L, "d_model": D, "num_heads": H, "head_dim": dh}) for B, L, D, H, dh in shapes]


def _flops_answer(fn, case):
    p = case.params
    return {"flops": torch.tensor(int(fn(p["B"], p["L"], p["d_model"], p["num_heads"], p["head_dim"])),
                                  dtype=torch.int64)}


def _flops_parts(case):
    p = case.params
    B, L, D, inner = p["B"], p["L"], p["d_model"], p["num_heads"] * p["head_dim"]
    return 2 * B * L * D * inner, 2 * B * L * L * inner    # one d_model × H·d_h projection; one L×L product


def _flops_expected(case):
    proj, mm = _flops_parts(case)
    return {"flops": torch.tensor(4 * proj + 2 * mm, dtype=torch.int64)}


def _flops_judge(got, want, case):
    g = int(got["flops"])
    if g == int(want["flops"]):
        return Verdict(True)
    proj, mm = _flops_parts(case)
    B, L, D = case.params["B"], case.params["L"], case.params["d_model"]
    return diagnose(g, [
        ("that is the lesson's count for heads of width d_model/H; here the heads are H·d_h wide in all, which is "
         "not d_model: each projection maps d_model to H·d_h (or back), and the L×L products run over H·d_h.",
         8 * B * L * D * D + 4 * B * L * L * D),
        ("you counted 3 projections; the output projection W^O (H·d_h → d_model) is a fourth.", 3 * proj + 2 * mm),
        ("you counted a multiply-add as 1 FLOP; the convention here is 2 (one multiply, one add).", (4 * proj + 2 * mm) // 2),
        ("only one of the two L×L products: both Q Kᵀ and weights @ V cost 2·B·H·L²·d_h.", 4 * proj + mm),
        ("the attention products are missing: add 2·B·H·L²·d_h for Q Kᵀ and the same for weights @ V.", 4 * proj),
        ("the projections are missing: 4 matmuls between d_model and H·d_h features for B·L tokens.", 2 * mm),
    ], f"expected the matmul FLOPs of the 4 projections (d_model ↔ H·d_h) and the 2 L×L products, got {g:,}.",
        same=lambda a, b: a == b)


EXERCISES = [
    Exercise("02_split_heads", 2, "Split into heads", "a function split_heads(x, num_heads) -> (B, H, L, d_h)",
             _split_cases, _split_answer, _split_expected, _split_judge, forbidden=FORBID_COURSE, kind="predict"),
    # one view + transpose (a layout: which feature lands in which head), not a build; 02_mha_forward is
    # the lesson's build
    Exercise("02_merge_heads", 1, "Merge the heads", "a function merge_heads(y) -> (B, L, H·d_h)",
             _merge_cases, _merge_answer, _merge_expected, _merge_judge, forbidden=FORBID_COURSE, kind="predict"),
    # a one-line merge (review 01-07, course-wide 4: "build" labels inflated): the layout, not a build
    Exercise("02_mha_forward", 3, "Multi-head self-attention from its weights",
             "a function mha_forward(x, W_q, W_k, W_v, W_o, num_heads, causal) -> (B, L, d_model)",
             _mha_cases, _mha_answer, _mha_expected, _mha_judge, forbidden=FORBID_SDPA + FORBID_COURSE, kind="build"),
    Exercise("02_mha_flops", 2, "Count the FLOPs of a layer", "a function mha_flops(B, L, d_model, num_heads, head_dim) -> int",
             _flops_cases, _flops_answer, _flops_expected, _flops_judge, kind="compute"),      # no helper computes it: no rule
]
