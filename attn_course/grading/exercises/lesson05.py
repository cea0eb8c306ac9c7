"""Exercise set 05 — temporal attention (solutions/05_temporal_attention.ipynb).

References are computed here in float64 from Rosin & Radinsky's formula, independently of the learner
and of ``attn_course``. Hints are detected: each judge computes what the common mistakes would give
(the authors' batch-wide norm, no or squared norm, padding left in TᵀT, time added instead of
multiplied, a missing √L, a "(b f)" instead of "(b n)" grouping, ...) and names the one that matches.
"""
from __future__ import annotations

import math

import torch

from ..spec import Case, Exercise, FORBID_COURSE, FORBID_SDPA, Verdict, close, diagnose, randint, choice, draw, distinct

__all__ = ["EXERCISES"]

_F64 = torch.float64


# ---- 05_time_matrix -------------------------------------------------------------------------------------

def _tm_cases(gen):
    cases = []
    # B·H > 1 everywhere: a batch-wide norm differs from the per-(sample, head) norm on every case
    for B, H, L, d, lengths in ((2, 1, 4, 3, None), (3, 2, 5, 4, None), (2, 2, 6, 4, [6, 3]), (3, 1, 5, 2, [2, 5, 4])):
        T = torch.randn(B, H, L, d, generator=gen) * (1 + torch.arange(B, dtype=torch.float32))[:, None, None, None]
        inputs = {"T": T}
        name = f"T {(B, H, L, d)}"
        if lengths is not None:
            inputs["keep"] = torch.arange(L) < torch.tensor(lengths)[:, None]          # (B, L) True = real
            name += f", lengths {lengths}"
        cases.append(Case(name, inputs))
    return cases


def _tm_answer(fn, case):
    return {"M": fn(case.inputs["T"], case.inputs.get("keep"))}


def _tm_ref(T, keep=None, *, norm="sample", use_keep=True, norm_before_mask=False):
    T = T.to(_F64)
    Tn = T
    if keep is not None and use_keep:
        T = T * keep[:, None, :, None]
    src = Tn if norm_before_mask else T
    if norm == "sample":
        n = src.pow(2).sum((-2, -1), keepdim=True).sqrt()
    elif norm == "batch":
        n = src.pow(2).sum().sqrt()
    elif norm == "squared":
        n = src.pow(2).sum((-2, -1), keepdim=True)
    else:
        n = torch.ones(())
    return T.transpose(-2, -1) @ T / n


def _tm_expected(case):
    return {"M": _tm_ref(case.inputs["T"], case.inputs.get("keep")).to(case.inputs["T"].dtype)}


def _tm_judge(got, want, case):
    if close(got["M"], want["M"], atol=1e-4):
        return Verdict(True)
    T, keep = case.inputs["T"], case.inputs.get("keep")
    c = []
    if T.shape[0] * T.shape[1] > 1:
        c.append(("you divided by the norm of the whole batch (as the authors' code does): take ‖T‖_F per sample "
                  "and head, over the last two axes, so a sample never depends on its batch.",
                  _tm_ref(T, keep, norm="batch")))
    c += [("no normalisation: M = TᵀT / ‖T‖_F.", _tm_ref(T, keep, norm="none")),
          ("you divided by ‖T‖_F² (the sum of squares); divide by the Frobenius norm itself, its square root.",
           _tm_ref(T, keep, norm="squared"))]
    if keep is not None:
        c += [("padded rows are still in TᵀT: zero the rows where keep is False before TᵀT and the norm.",
               _tm_ref(T, keep, use_keep=False)),
              ("padded rows are out of TᵀT but still in the norm: take ‖T‖_F after zeroing them.",
               _tm_ref(T, keep, norm_before_mask=True))]
    return diagnose(got["M"], c, "wrong values: M[b, h] = T[b, h]ᵀ T[b, h] / ‖T[b, h]‖_F, shape (B, H, d, d).")


# ---- 05_temporal_weights --------------------------------------------------------------------------------

def _tw_cases(gen):
    cases = []
    for B, H, L, d, per_seq in ((2, 1, 4, 4, False), (2, 2, 5, 3, False), (2, 3, 6, 4, True)):     # B·H > 1
        q, k = torch.randn(B, H, L, d, generator=gen), torch.randn(B, H, L, d, generator=gen)
        T = torch.randn(B, H, 1 if per_seq else L, d, generator=gen).expand(B, H, L, d).contiguous() * 2
        cases.append(Case(f"q, k, T {(B, H, L, d)}" + (", one time per sequence" if per_seq else ""),
                          {"q": q, "k": k, "T": T}))
    return cases


def _tw_answer(fn, case):
    i = case.inputs
    return {"weights": fn(i["q"], i["k"], i["T"])}


def _tw_ref(q, k, T, *, mode="ok", scale=True, dim=-1, norm="sample"):
    q, k, T = q.to(_F64), k.to(_F64), T.to(_F64)
    n = T.pow(2).sum((-2, -1), keepdim=True).sqrt() if norm == "sample" else (
        T.pow(2).sum().sqrt() if norm == "batch" else torch.ones(()))
    M = T.transpose(-2, -1) @ T / n
    if mode == "ok":
        s = q @ M @ k.transpose(-2, -1)
    elif mode == "added":                                   # time as an additive bias T Tᵀ / ‖T‖
        s = q @ k.transpose(-2, -1) + T @ T.transpose(-2, -1) / n
    elif mode == "qt_only":                                 # (Q Tᵀ) as the scores, K forgotten
        s = q @ T.transpose(-2, -1)
    elif mode == "plain":
        s = q @ k.transpose(-2, -1)
    s = s / math.sqrt(q.shape[-1]) if scale else s
    return torch.softmax(s, dim=dim)


def _tw_expected(case):
    i = case.inputs
    return {"weights": _tw_ref(i["q"], i["k"], i["T"]).to(i["q"].dtype)}


def _tw_judge(got, want, case):
    if close(got["weights"], want["weights"], atol=1e-5):
        return Verdict(True)
    q, k, T = case.inputs["q"], case.inputs["k"], case.inputs["T"]
    c = [("the time does not change your weights: they are softmax(QKᵀ/√d) (a time term added equally to every "
          "key's score, like TTᵀ with one time per sequence, cancels in the softmax); the time must multiply: "
          "Q (TᵀT/‖T‖_F) Kᵀ.", _tw_ref(q, k, T, mode="plain")),
         ("you added the time to the scores; in this paper the time must multiply: Q (TᵀT/‖T‖_F) Kᵀ.",
          _tw_ref(q, k, T, mode="added")),
         ("the 1/√d_h scale is missing.", _tw_ref(q, k, T, scale=False)),
         ("your softmax runs over the queries (dim=-2); it must run over the keys (dim=-1).", _tw_ref(q, k, T, dim=-2)),
         ("TᵀT is not normalised: divide it by ‖T‖_F (per sample and head).", _tw_ref(q, k, T, norm="none"))]
    if q.shape[0] * q.shape[1] > 1:
        c.append(("you divided by the norm of the whole batch (as the authors' code does): take ‖T‖_F per "
                  "sample and head.", _tw_ref(q, k, T, norm="batch")))
    return diagnose(got["weights"], c, "wrong values: weights = softmax(Q M Kᵀ / √d_h) with M = TᵀT / ‖T‖_F.")


# ---- 05_rank_one_scale ----------------------------------------------------------------------------------
# The lesson derives c for one time per sequence; the exercise gives a sequence whose tokens come from two
# periods (L1 tokens at t̄1, L2 at t̄2): the scores are rank two, and the learner derives both factors
# (review 01-07, E05.3: the one-period c is printed by the lesson).

def _r1_c(L1, n1, L2, n2, d):
    norm = math.sqrt(L1 * n1 * n1 + L2 * n2 * n2)            # ‖T‖_F: L1 rows of norm n1, L2 of norm n2
    return L1 / (norm * math.sqrt(d)), L2 / (norm * math.sqrt(d))


def _r1_mistakes(L1, n1, L2, n2, d) -> list[tuple[str, tuple[float, float]]]:
    rd = math.sqrt(d)
    return [
        ("that is the one-period factor √L/(‖t̄‖√d_h) applied to each period: both periods share ONE ‖T‖_F, "
         "which sums the squared norms of all L1 + L2 rows.", (math.sqrt(L1) / (n1 * rd), math.sqrt(L2) / (n2 * rd))),
        ("‖T‖_F is not L1‖t̄1‖ + L2‖t̄2‖: it is the square root of the sum of the squared norms of the rows.",
         (L1 / ((L1 * n1 + L2 * n2) * rd), L2 / ((L1 * n1 + L2 * n2) * rd))),
        ("‖T‖_F is not the sum of the two blocks' norms: square them, add, then take the root.",
         (L1 / ((math.sqrt(L1) * n1 + math.sqrt(L2) * n2) * rd), L2 / ((math.sqrt(L1) * n1 + math.sqrt(L2) * n2) * rd))),
        ("the 1/√d_h of the attention scores is missing.", tuple(c * rd for c in _r1_c(L1, n1, L2, n2, d))),
        ("the two factors are swapped: c1 goes with t̄1, the period of the first L1 tokens.",
         _r1_c(L1, n1, L2, n2, d)[::-1]),
    ]


def _r1_cases(gen):
    def make(g, lo, hi, dims):
        return randint(g, lo, hi), randint(g, 2, 12) / 4, randint(g, lo, hi), randint(g, 2, 12) / 4, choice(g, dims)
    makers = [lambda g: make(g, 1, 20, (8, 16, 32)), lambda g: make(g, 20, 200, (32, 64, 128)),
              lambda g: make(g, 2, 50, (8, 64))]
    # every mistake gives its own value, different from the answer (L1 ≠ L2, ‖t̄1‖ ≠ ‖t̄2‖, ...)
    key = lambda pair: tuple(round(x, 9) for x in pair)
    ok = lambda c: c[0] != c[2] and distinct(key(_r1_c(*c)), *(key(v) for _, v in _r1_mistakes(*c)))
    return [Case(f"L1={L1}, ‖t̄1‖={n1}, L2={L2}, ‖t̄2‖={n2}, d_h={d}",
                 params={"L1": L1, "n1": n1, "L2": L2, "n2": n2, "d_h": d})
            for L1, n1, L2, n2, d in (draw(gen, make, ok) for make in makers)]


def _r1_args(case):
    p = case.params
    return p["L1"], p["n1"], p["L2"], p["n2"], p["d_h"]


def _r1_answer(fn, case):
    c1, c2 = fn(*_r1_args(case))
    return {"c": torch.tensor([float(c1), float(c2)], dtype=_F64)}


def _r1_expected(case):
    return {"c": torch.tensor(_r1_c(*_r1_args(case)), dtype=_F64)}


def _r1_judge(got, want, case):
    if close(got["c"], want["c"], atol=0, rtol=1e-6):
        return Verdict(True)
    cands = [(hint, torch.tensor(v, dtype=_F64)) for hint, v in _r1_mistakes(*_r1_args(case))]
    return diagnose(got["c"], cands, "S = Q (TᵀT/‖T‖_F) Kᵀ/√d_h with T = L1 rows t̄1 then L2 rows t̄2: write TᵀT "
                    "and ‖T‖_F in terms of L1, L2, t̄1 and t̄2.", same=lambda a, b: close(a, b, atol=0, rtol=1e-6))


# ---- 05_video_frames ------------------------------------------------------------------------------------

def _vf_cases(gen):
    cases = []
    for B, F, N, C in ((2, 3, 4, 5), (2, 4, 6, 2), (3, 5, 5, 3)):            # B > 1: "(n b)" != "(b n)"
        x = torch.randn(B, F, N, C, generator=gen)
        cases.append(Case(f"frames (B, F, N, C) = {(B, F, N, C)}", {"x": x}))
    return cases


def _vf_answer(fn, case):
    return {"seq": fn(case.inputs["x"])}


def _vf_expected(case):
    x = case.inputs["x"]
    B, F, N, C = x.shape
    return {"seq": x.permute(0, 2, 1, 3).reshape(B * N, F, C)}


def _vf_judge(got, want, case):
    if torch.equal(got["seq"], want["seq"]):
        return Verdict(True)
    x = case.inputs["x"]
    B, F, N, C = x.shape
    c = [("you reshaped without moving the frame axis, which cuts sequences of patches within one frame "
          "('(b f) n c', spatial attention); temporal attention needs one sequence of F frames per patch: "
          "permute to (B, N, F, C) first, i.e. '(b n) f c'.", x.reshape(B * N, F, C)),
         ("the batch and patch axes are grouped as (n b); use (b n) so that sequence i = b·N + n.",
          x.permute(2, 0, 1, 3).reshape(N * B, F, C))]
    return diagnose(got["seq"], c, "wrong order: sequence b·N + n must hold x[b, :, n, :] (all F frames of patch n).",
                    same=lambda g, cand: g.shape == cand.shape and torch.equal(g, cand))


EXERCISES = [
    Exercise("05_time_matrix", 3, "The time matrix TᵀT / ‖T‖_F, per sample and head, without padding",
             "a function time_matrix(T, keep=None) -> M (B, H, d, d)",
             _tm_cases, _tm_answer, _tm_expected, _tm_judge, forbidden=FORBID_COURSE, kind="build"),
    Exercise("05_temporal_weights", 3, "Temporal attention weights",
             "a function temporal_weights(q, k, T) -> weights (B, H, L, L)",
             _tw_cases, _tw_answer, _tw_expected, _tw_judge, forbidden=FORBID_SDPA + FORBID_COURSE, kind="build"),
    Exercise("05_rank_one_scale", 2, "Two periods in one sequence: the factors c1, c2",
             "a function period_scales(L1, n1, L2, n2, d_h) -> (c1, c2)",
             _r1_cases, _r1_answer, _r1_expected, _r1_judge, kind="compute"),
    Exercise("05_video_frames", 2, "Temporal attention in video models: frames as the sequence",
             "a function frames_to_sequences(x) -> (B·N, F, C)",
             _vf_cases, _vf_answer, _vf_expected, _vf_judge, kind="compute"),   # one rearrange
]
