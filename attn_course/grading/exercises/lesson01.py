"""Exercise set 01 — scaled dot-product attention, softmax, masks (solutions/01_scaled_dot_product_attention.ipynb).

References are computed here in float64 straight from the formula (independently of the learner and of
``attn_course.attention``). Hints are *detected*: each judge computes what the common mistakes would
produce on the same inputs and names the one the learner's answer matches.
"""
from __future__ import annotations

import math

import torch

from ..spec import FORBID_COURSE, FORBID_SDPA, Case, Exercise, Verdict, close, randint

__all__ = ["EXERCISES"]

_F64 = torch.float64


def _same(got: torch.Tensor, cand: torch.Tensor, atol: float = 1e-4) -> bool:
    """``got`` equals a candidate mistake; where the mistake gives NaN, NaN or 0 (``nan_to_num``) match."""
    if got.shape != cand.shape:
        return False
    got, cand = got.double(), cand.double()
    cand = torch.where(torch.isnan(cand) & (got == 0), torch.zeros_like(cand), cand)
    return bool(torch.allclose(got, cand, atol=atol, rtol=1e-3, equal_nan=True))


def _first_match(got: dict, candidates: list[tuple[str, dict]]) -> str | None:
    for hint, cand in candidates:
        if all(_same(got[k], cand[k]) for k in cand):
            return hint
    return None


def _max_diff(got: torch.Tensor, want: torch.Tensor) -> str:
    d = (got.double() - want.double()).abs()
    return "NaN" if torch.isnan(d).any() else f"{float(d.max()):.3g}"


# ---- the textbook formula and its classic mistakes, in float64 ------------------------------------------

def _attend(q, k, v, mask=None, *, scale="sqrt", dim=-1, polarity=True, how="fill", nan_rows=False):
    """softmax(Q Kᵀ · scale + M) V with switchable mistakes. Returns (out, weights) in float64."""
    q, k, v = q.to(_F64), k.to(_F64), v.to(_F64)
    s = {"sqrt": 1 / math.sqrt(q.shape[-1]), "none": 1.0, "d": 1 / q.shape[-1]}[scale]
    scores = (q @ k.transpose(-2, -1)) * s                          # (B, H, Lq, Lk)
    visible = None
    if mask is not None:
        visible = mask if polarity else ~mask
        visible = visible.expand(scores.shape)
        if how == "fill":
            scores = scores.masked_fill(~visible, float("-inf"))
        elif how == "multiply":                                      # a Chinese attention survey: "scores ⊙ M"
            scores = scores * visible
    w = torch.softmax(scores, dim=dim)
    if not nan_rows:
        w = torch.nan_to_num(w, nan=0.0)                              # fully masked row -> 0, not NaN
    return w @ v, w


# ---- 01_attention_by_hand -------------------------------------------------------------------------------

def _attn_cases(gen):
    def r(*shape):
        return torch.randn(*shape, generator=gen)

    cases = []
    q, k, v = r(1, 1, 4, 16), r(1, 1, 4, 16), r(1, 1, 4, 16)
    cases.append(Case("no mask, one head (1, 1, 4, 16)", {"q": q, "k": k, "v": v}))
    q, k, v = r(2, 3, 5, 16), r(2, 3, 7, 16), r(2, 3, 7, 6)
    cases.append(Case("no mask, Lq=5 ≠ Lk=7, Ev=6 (2, 3, ·, ·)", {"q": q, "k": k, "v": v}))
    q, k, v = r(2, 2, 6, 8), r(2, 2, 6, 8), r(2, 2, 6, 8)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    cases.append(Case("causal mask (6, 6) broadcast over (2, 2)", {"q": q, "k": k, "v": v, "mask": causal}))
    q, k, v = r(3, 2, 4, 8), r(3, 2, 5, 8), r(3, 2, 5, 8)
    pad = (torch.arange(5) < torch.tensor([5, 3, 2])[:, None])[:, None, None, :]     # (3, 1, 1, 5)
    cases.append(Case("padding mask (3, 1, 1, 5)", {"q": q, "k": k, "v": v, "mask": pad}))
    q, k, v = r(1, 2, 4, 8), r(1, 2, 4, 8), r(1, 2, 4, 8)
    m = torch.rand(1, 2, 4, 4, generator=gen) < 0.6
    m[..., 0, :] = True
    m[0, 1, 2, :] = False                                            # head 1, query 2 sees no key
    cases.append(Case("random mask with a fully masked query row", {"q": q, "k": k, "v": v, "mask": m}))
    return cases


def _attn_answer(fn, case):
    i = case.inputs
    out, weights = fn(i["q"], i["k"], i["v"], i.get("mask"))
    return {"out": out, "weights": weights}


def _attn_expected(case):
    i = case.inputs
    out, w = _attend(i["q"], i["k"], i["v"], i.get("mask"))
    return {"out": out.to(i["q"].dtype), "weights": w.to(i["q"].dtype)}


def _attn_judge(got, want, case):
    if close(got["out"], want["out"]) and close(got["weights"], want["weights"]):
        return Verdict(True)
    i = case.inputs
    q, k, v, mask = i["q"], i["k"], i["v"], i.get("mask")

    def cand(**kw):
        out, w = _attend(q, k, v, mask, **kw)
        return {"out": out, "weights": w}

    candidates = [
        ("rows of your weights do not sum to 1 — the columns do: softmax over dim=-2 (the query axis)? "
         "Each query's weights over the keys must sum to 1: softmax(..., dim=-1).", cand(dim=-2)),
        ("rows of your weights do not sum to 1 — the columns do: softmax over dim=-2 (the query axis)? "
         "Each query's weights over the keys must sum to 1: softmax(..., dim=-1).", cand(dim=-2, nan_rows=True)),
        ("your outputs match softmax(QKᵀ)V without the 1/√d_k scale.", cand(scale="none")),
        ("you scaled by 1/d_k; the scale is 1/√d_k (math.sqrt(q.shape[-1])).", cand(scale="d")),
    ]
    if mask is not None:
        candidates += [
            ("your mask is inverted: True must mean 'may attend' (nn.MultiheadAttention uses the opposite, "
             "SDPA and this course use True = attend).", cand(polarity=False)),
            ("your mask is inverted (True must mean 'may attend'), and the rows that your inverted mask "
             "hides completely come out as NaN.", cand(polarity=False, nan_rows=True)),
            ("your output ignores the mask: set the scores of masked keys to -inf before the softmax.",
             {"out": _attend(q, k, v)[0], "weights": _attend(q, k, v)[1]}),
            ("multiplying the scores by the mask does not hide a key (a score of 0 still gets weight): "
             "fill the masked scores with -inf before the softmax.", cand(how="multiply")),
        ]
    hint = _first_match(got, candidates)
    if hint:
        return Verdict(False, hint)
    if mask is not None:
        dead = ~mask.expand(want["weights"].shape).any(-1)                     # (B, H, Lq) fully masked rows
        nan_rows = torch.isnan(got["weights"]).any(-1) | torch.isnan(got["out"]).any(-1)
        if dead.any() and bool((nan_rows == dead).all()):
            return Verdict(False, "a query whose keys are all masked got NaN (softmax of a row of -inf is 0/0); "
                                  "its weights and output must be 0 — e.g. torch.nan_to_num on the weights.")
    if close(got["weights"], want["weights"]):
        return Verdict(False, "your weights are right but the output is not weights @ V.")
    if close(got["out"], want["out"]):
        return Verdict(False, "your output is right but the returned weights are not the softmax weights.")
    if torch.isnan(got["out"]).any() or torch.isnan(got["weights"]).any():
        return Verdict(False, "your answer contains NaN.")
    return Verdict(False, f"wrong values (largest difference in the output {_max_diff(got['out'], want['out'])}).")


# ---- 01_causal_padding_mask -----------------------------------------------------------------------------

def _mask_cases(gen):
    # every case has a sequence with at least two padded keys (so an off-by-one in the padding, a missing
    # padding mask and a missing causal mask all give different masks) and one without padding
    cases = []
    for n in (2, 3, 4):
        L = randint(gen, 4, 9)
        lengths = torch.randint(1, L + 1, (n,), generator=gen)
        lengths[0], lengths[1] = L, randint(gen, 1, L - 2)
        cases.append(Case(f"lengths {lengths.tolist()}, L={L}", {"lengths": lengths}, {"L": L}))
    return cases


def _mask_answer(fn, case):
    return {"mask": fn(case.inputs["lengths"], case.params["L"])}


def _mask_parts(case):
    L = case.params["L"]
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    real = (torch.arange(L) < case.inputs["lengths"][:, None])[:, None, :]   # (B, 1, L) key j is a real token
    return i, j, real, L


def _mask_expected(case):
    i, j, real, _ = _mask_parts(case)
    return {"mask": ((j <= i)[None] & real)[:, None]}                    # (B, 1, L, L)


def _mask_judge(got, want, case):
    if close(got["mask"], want["mask"]):
        return Verdict(True)
    i, j, real, L = _mask_parts(case)
    real_q = real.transpose(-2, -1)                                       # (B, L, 1) query i is a real token
    B = real.shape[0]
    lengths = case.inputs["lengths"]
    candidates = [
        ("your mask is inverted: True must mean 'may attend' (nn.MultiheadAttention uses True = blocked).",
         ~want["mask"]),
        ("off by one in the padding: key j is real when j < lengths[b] (positions 0 … length−1); "
         "j <= lengths[b] also shows the first padded key.",
         ((j <= i)[None] & (torch.arange(L) <= lengths[:, None])[:, None, :])[:, None]),
        ("off by one in the padding: key j is real when j < lengths[b]; j < lengths[b] − 1 hides the last "
         "real key too.",
         ((j <= i)[None] & (torch.arange(L) < lengths[:, None] - 1)[:, None, :])[:, None]),
        ("only the causal part is there: padded keys (j >= length) must be hidden too.",
         (j <= i).expand(B, -1, -1)[:, None]),
        ("only the padding part is there: a query must not see later keys (causal: j <= i).",
         real.expand(-1, i.shape[0], -1)[:, None]),
        ("the causal part is upside down: key j is visible to query i when j <= i (torch.tril, not triu).",
         ((j >= i)[None] & real)[:, None]),
        ("the diagonal is hidden: a token may attend to itself (j <= i, not j < i).",
         ((j < i)[None] & real)[:, None]),
        ("you also hid the rows of padded queries; only padded keys (columns) are masked — padded queries "
         "keep the real keys, which avoids all-masked rows.", ((j <= i)[None] & real & real_q)[:, None]),
    ]
    for hint, cand in candidates:
        if torch.equal(got["mask"], cand):
            return Verdict(False, hint)
    wrong = int((got["mask"] != want["mask"]).sum())
    return Verdict(False, f"{wrong} of {want['mask'].numel()} entries differ from the expected mask.")


# ---- 01_predict_shapes ----------------------------------------------------------------------------------

def _shape_cases(gen):
    cases = []
    for _ in range(3):
        B, H, Lq, Lk, E, Ev = (int(x) for x in torch.randint(2, 9, (6,), generator=gen))
        Lk = Lq + 1 + Lk % 3                                             # Lq != Lk
        Ev = E + 1 + Ev % 4                                              # E != Ev
        cases.append(Case(f"q {(B, H, Lq, E)}, k {(B, H, Lk, E)}, v {(B, H, Lk, Ev)}",
                          params={"q": [B, H, Lq, E], "k": [B, H, Lk, E], "v": [B, H, Lk, Ev]}))
    return cases


def _shape_answer(fn, case):
    p = case.params
    out_shape, weights_shape = fn(tuple(p["q"]), tuple(p["k"]), tuple(p["v"]))
    return {"out_shape": torch.tensor([int(s) for s in out_shape], dtype=torch.int64),
            "weights_shape": torch.tensor([int(s) for s in weights_shape], dtype=torch.int64)}


def _shape_expected(case):
    (B, H, Lq, _), (_, _, Lk, _), (_, _, _, Ev) = case.params["q"], case.params["k"], case.params["v"]
    return {"out_shape": torch.tensor([B, H, Lq, Ev]), "weights_shape": torch.tensor([B, H, Lq, Lk])}


def _shape_judge(got, want, case):
    (B, H, Lq, E), (_, _, Lk, _), (_, _, _, Ev) = case.params["q"], case.params["k"], case.params["v"]
    hints = []
    o, w = got["out_shape"].tolist(), got["weights_shape"].tolist()
    if w == [B, H, Lk, Lq]:
        hints.append("the weights have one row per query and one column per key: (B, H, Lq, Lk)")
    elif w != [B, H, Lq, Lk]:
        hints.append(f"weights: expected (B, H, Lq, Lk) = {(B, H, Lq, Lk)}")
    if o == [B, H, Lq, E]:
        hints.append("the output's last size comes from the values (Ev), not from the queries (E)")
    elif o == [B, H, Lk, Ev]:
        hints.append("the output has one row per query (Lq), not per key")
    elif o != [B, H, Lq, Ev]:
        hints.append(f"output: expected (B, H, Lq, Ev) = {(B, H, Lq, Ev)}")
    return Verdict(not hints, "; ".join(hints) + ("." if hints else ""))


# ---- 01_fix_the_bug -------------------------------------------------------------------------------------

_BUGS = {"scale": "the 1/√d_k scale is missing", "polarity": "the mask polarity is inverted (True = may attend)",
         "dim": "the softmax runs over dim=-2 (the queries) instead of dim=-1 (the keys)"}


def _fix_cases(gen):
    cases = []
    for B, H, L, E in ((1, 1, 5, 16), (2, 2, 6, 8), (2, 3, 4, 32)):
        q, k, v = (torch.randn(B, H, L, E, generator=gen) for _ in range(3))
        mask = torch.rand(B, 1, L, L, generator=gen) < 0.5
        mask |= torch.eye(L, dtype=torch.bool)                           # every query sees itself
        i = torch.arange(L)
        mask[..., i, (i + 1) % L] = False       # no row or column all True: the inverted mask hides none
        cases.append(Case(f"(B, H, L, E) = {(B, H, L, E)}, random mask", {"q": q, "k": k, "v": v, "mask": mask}))
    return cases


def _fix_answer(fn, case):
    i = case.inputs
    return {"out": fn(i["q"], i["k"], i["v"], i["mask"])}


def _fix_expected(case):
    i = case.inputs
    return {"out": _attend(i["q"], i["k"], i["v"], i["mask"])[0].to(i["q"].dtype)}


def _fix_judge(got, want, case):
    if close(got["out"], want["out"]):
        return Verdict(True)
    i = case.inputs
    names = list(_BUGS)
    for n in range(1, 2 ** len(names)):                                   # every non-empty set of remaining bugs
        left = [b for bit, b in enumerate(names) if n >> bit & 1]
        out, _ = _attend(i["q"], i["k"], i["v"], i["mask"], scale="none" if "scale" in left else "sqrt",
                         dim=-2 if "dim" in left else -1, polarity="polarity" not in left, nan_rows=True)
        if _same(got["out"], out):
            return Verdict(False, "still buggy: " + "; ".join(_BUGS[b] for b in left) + ".")
    return Verdict(False, f"wrong values (largest difference {_max_diff(got['out'], want['out'])}); "
                          f"fix only the three bugs and keep the rest of the computation.")


# ---- 01_score_std ---------------------------------------------------------------------------------------

def _std_cases(gen):
    return [Case(f"d_k = {d}", params={"d_k": d})
            for d in (randint(gen, 2, 8), randint(gen, 9, 40), randint(gen, 41, 200), randint(gen, 201, 1024))]


def _std_answer(fn, case):
    unscaled, scaled = fn(case.params["d_k"])
    return {"std": torch.tensor([float(unscaled), float(scaled)], dtype=_F64)}


def _std_expected(case):
    return {"std": torch.tensor([math.sqrt(case.params["d_k"]), 1.0], dtype=_F64)}


def _std_judge(got, want, case):
    g = got["std"]
    if bool(torch.allclose(g, want["std"], rtol=0.05, atol=0.0)):        # 5%: a simulation is fine too
        return Verdict(True)
    d = case.params["d_k"]
    if torch.allclose(g, torch.tensor([float(d), 1.0], dtype=_F64), rtol=0.05):
        return Verdict(False, "you returned the variance d_k; the standard deviation is its square root, √d_k.")
    if torch.allclose(g[0], torch.tensor(math.sqrt(d), dtype=_F64), rtol=0.05):
        return Verdict(False, "the unscaled std is right; dividing every score by √d_k divides the std by "
                              "√d_k: √d_k / √d_k = 1.")
    return Verdict(False, "q·k is a sum of d_k products of independent N(0, 1) pairs; each product has "
                          "variance 1, so the sum has variance d_k.")


EXERCISES = [
    Exercise("01_attention_by_hand", 3, "Scaled dot-product attention by hand",
             "a function my_attention(q, k, v, mask=None) -> (out, weights)",
             _attn_cases, _attn_answer, _attn_expected, _attn_judge, forbidden=FORBID_SDPA + FORBID_COURSE, kind="build"),
    Exercise("01_causal_padding_mask", 2, "A causal + padding mask",
             "a function make_mask(lengths, L) -> bool tensor (B, 1, L, L)",
             _mask_cases, _mask_answer, _mask_expected, _mask_judge, forbidden=FORBID_COURSE, kind="build"),
    Exercise("01_predict_shapes", 1, "Predict the shapes",
             "a function predict_shapes(q_shape, k_shape, v_shape) -> (out_shape, weights_shape)",
             _shape_cases, _shape_answer, _shape_expected, _shape_judge, kind="predict"),
    Exercise("01_fix_the_bug", 2, "Fix a buggy attention",
             "a function fixed_attention(q, k, v, mask) -> out",
             _fix_cases, _fix_answer, _fix_expected, _fix_judge, forbidden=FORBID_SDPA + FORBID_COURSE,
             kind="debug"),           # the cell may compare with SDPA; fixed_attention may not call it
    Exercise("01_score_std", 1, "Why 1/√d_k: the spread of the scores",
             "a function score_std(d_k) -> (std_unscaled, std_scaled)",
             _std_cases, _std_answer, _std_expected, _std_judge, kind="compute"),
]
