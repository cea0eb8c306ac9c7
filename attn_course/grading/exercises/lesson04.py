"""Exercise set 04 — cross-attention (solutions/04_cross_attention.ipynb).

References are computed here in float64 from the formula, independently of the learner and of
``attn_course``. Hints are detected: each judge computes what the common mistakes would give on the
same inputs (queries taken from the context, inverted mask polarity, √d_model instead of √d_h, one
joint softmax instead of a popular Chinese attention tutorial's two, a hard-coded 257, ...) and names the one that matches.
"""
from __future__ import annotations

import math

import torch

from ..spec import Case, Exercise, FORBID_COURSE, FORBID_SDPA, Verdict, close, first_match, matches, randint

__all__ = ["EXERCISES"]

_F64 = torch.float64


def _softmax_attend(q, k, v, keep=None, *, scale=None, dim=-1, raw=False):
    """softmax(q kᵀ·scale) v over (..., Lq, E) tensors in float64; keep: bool broadcastable to the scores.
    Fully masked rows give 0, or NaN with ``raw=True`` (what a plain softmax produces)."""
    q, k, v = q.to(_F64), k.to(_F64), v.to(_F64)
    s = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    w = torch.softmax(s, dim=dim)
    return (w if raw else torch.nan_to_num(w, nan=0.0)) @ v


# ---- 04_cross_attend ------------------------------------------------------------------------------------

def _cross_cases(gen):
    def r(*shape):
        return torch.randn(*shape, generator=gen)

    cases = []
    # (B, Lq, Lk, d_model, context_dim, H, lengths)
    for B, Lq, Lk, d, c, H, lengths in ((2, 3, 5, 8, 6, 2, None), (2, 4, 6, 12, 12, 3, [6, 2]),
                                        (3, 5, 5, 8, 8, 2, [5, 3, 4]), (1, 2, 7, 16, 4, 4, [4])):
        inputs = {"x": r(B, Lq, d), "context": r(B, Lk, c), "w_q": r(d, d) / math.sqrt(d),
                  "w_k": r(c, d) / math.sqrt(c), "w_v": r(c, d) / math.sqrt(c)}
        name = f"x {(B, Lq, d)}, context {(B, Lk, c)}, H={H}"
        if lengths is not None:
            inputs["keep"] = torch.arange(Lk) < torch.tensor(lengths)[:, None]        # (B, Lk) True = real
            name += f", context lengths {lengths}"
        cases.append(Case(name, inputs, {"num_heads": H}))
    return cases


_LINEAR_LAYOUT = ("you used nn.Linear's layout, x @ W.T; this exercise's weights are (in, out), as the prompt says: "
                  "Q = x @ w_q, K = context @ w_k, V = context @ w_v.")


def _cross_error_hint(case, error):
    """A matmul shape error on a case whose context width differs from d_model: the nn.Linear layout."""
    return _LINEAR_LAYOUT if "cannot be multiplied" in error else None


def _cross_answer(fn, case):
    i = case.inputs
    return {"out": fn(i["x"], i["context"], i["w_q"], i["w_k"], i["w_v"], case.params["num_heads"], i.get("keep"))}


def _split(t, H):                                                     # (B, L, H·d_h) -> (B, H, L, d_h)
    B, L, D = t.shape
    return t.reshape(B, L, H, D // H).transpose(1, 2)


def _merge(t):                                                        # (B, H, L, d_h) -> (B, L, H·d_h)
    B, H, L, d = t.shape
    return t.transpose(1, 2).reshape(B, L, H * d)


def _cross_ref(x, context, w_q, w_k, w_v, H, keep=None, *, swap=False, polarity=True, scale="d_h", dim=-1,
               heads=True, bad_split=False, raw=False, linear_layout=False):
    x, context = x.to(_F64), context.to(_F64)
    if linear_layout:                                                         # x @ W.T, nn.Linear's (out, in)
        w_q, w_k, w_v = w_q.T, w_k.T, w_v.T
    qs, ks = (context, x) if swap else (x, context)
    Q, K, V = qs @ w_q.to(_F64), ks @ w_k.to(_F64), ks @ w_v.to(_F64)         # (B, L, d_model)
    if not heads:
        H = 1
    split = (lambda t, H: t.reshape(t.shape[0], H, t.shape[1], -1)) if bad_split else _split
    Q, K, V = split(Q, H), split(K, H), split(V, H)                           # (B, H, L, d_h)
    m = None if keep is None else (keep if polarity else ~keep)[:, None, None, :]
    s = 1 / math.sqrt(Q.shape[-1] * (H if scale == "d_model" else 1))
    return _merge(_softmax_attend(Q, K, V, m, scale=s, dim=dim, raw=raw))


def _cross_expected(case):
    i = case.inputs
    out = _cross_ref(i["x"], i["context"], i["w_q"], i["w_k"], i["w_v"], case.params["num_heads"], i.get("keep"))
    return {"out": out.to(i["x"].dtype)}


def _cross_judge(got, want, case):
    if close(got["out"], want["out"], atol=1e-4):
        return Verdict(True)
    i = case.inputs
    args = (i["x"], i["context"], i["w_q"], i["w_k"], i["w_v"], case.params["num_heads"])
    same_shapes = i["x"].shape == i["context"].shape

    def cand(**kw):
        kw = {"keep": i.get("keep"), **kw}
        try:
            a, b = _cross_ref(*args, **kw), _cross_ref(*args, raw=True, **kw)
        except RuntimeError:
            return None
        # a plain softmax turns a fully masked row (or column, for dim=-2) into NaN: accept either
        return a if matches(got["out"], a) else b

    candidates = [
        (_LINEAR_LAYOUT, cand(linear_layout=True)),
        ("your queries come from the context and your keys/values from x: in cross-attention the queries "
         "come from x (the sequence that asks), keys and values from the context.",
         cand(swap=True) if same_shapes else None),
        ("your mask is inverted: keep is True for real context tokens (True = may attend); "
         "nn.MultiheadAttention's key_padding_mask uses the opposite polarity, this exercise does not.",
         cand(polarity=False) if "keep" in i else None),
        ("your output ignores the padding: masked (padded) context tokens must get -inf scores.",
         cand(keep=None) if "keep" in i else None),
        ("you scaled by 1/√d_model; each head's scores are scaled by 1/√d_h with d_h = d_model / num_heads.",
         cand(scale="d_model")),
        ("your output is single-head attention over the full width: split Q, K, V into num_heads heads of "
         "d_h = d_model / num_heads, attend per head, then concatenate.", cand(heads=False)),
        ("your heads are cut the wrong way: t.view(B, H, L, d_h) slices the flattened tokens; split the "
         "features with t.view(B, L, H, d_h).transpose(1, 2).", cand(bad_split=True)),
        ("your softmax runs over the queries (dim=-2); each query's weights over the context must sum to 1 "
         "(dim=-1).", cand(dim=-2)),
    ]
    hint = first_match(got["out"], candidates)
    if hint:
        return Verdict(False, hint)
    return Verdict(False, "wrong values; check the order: project, split heads, scores / √d_h, mask, "
                          "softmax over the keys, weights @ V, merge heads (no output projection here).")


# ---- 04_mha_key_padding ---------------------------------------------------------------------------------

def _kpm_cases(gen):
    cases = []
    for n in (2, 5):
        max_len = randint(gen, 4, 9)
        lengths = torch.randint(1, max_len, (n,), generator=gen)
        lengths[0] = max_len                                          # one sequence without padding
        cases.append(Case(f"lengths {lengths.tolist()}, max_len {max_len}", {"lengths": lengths}, {"max_len": max_len}))
    return cases


def _kpm_answer(fn, case):
    return {"key_padding_mask": fn(case.inputs["lengths"], case.params["max_len"])}


def _kpm_expected(case):
    return {"key_padding_mask": torch.arange(case.params["max_len"]) >= case.inputs["lengths"][:, None]}


def _kpm_judge(got, want, case):
    g, w = got["key_padding_mask"], want["key_padding_mask"]
    if torch.equal(g, w):
        return Verdict(True)
    if torch.equal(g, ~w):
        return Verdict(False, "inverted: nn.MultiheadAttention's key_padding_mask is True for the positions to "
                              "IGNORE (the padding), the opposite of SDPA and attn_course (True = may attend).")
    off = torch.arange(case.params["max_len"]) > case.inputs["lengths"][:, None]
    if torch.equal(g, off):
        return Verdict(False, "off by one: position `length` is already padding (positions 0 … length−1 are real).")
    return Verdict(False, f"{int((g != w).sum())} of {w.numel()} entries differ.")


# ---- 04_predict_shapes ----------------------------------------------------------------------------------

def _shape_cases(gen):
    cases = []
    for _ in range(3):
        B, Lq, Lk, H = (int(x) for x in torch.randint(2, 9, (4,), generator=gen))
        Lk = Lq + 1 + Lk % 4
        d_model, context_dim = 8 * H, 8 * H + 16
        p = {"B": B, "Lq": Lq, "Lk": Lk, "d_model": d_model, "context_dim": context_dim, "num_heads": H}
        cases.append(Case(f"B={B}, Lq={Lq}, Lk={Lk}, d_model={d_model}, context_dim={context_dim}, H={H}", params=p))
    return cases


def _shape_answer(fn, case):
    p = case.params
    out_shape, weights_shape = fn(p["B"], p["Lq"], p["Lk"], p["d_model"], p["context_dim"], p["num_heads"])
    return {"out_shape": torch.tensor([int(s) for s in out_shape], dtype=torch.int64),
            "weights_shape": torch.tensor([int(s) for s in weights_shape], dtype=torch.int64)}


def _shape_expected(case):
    p = case.params
    return {"out_shape": torch.tensor([p["B"], p["Lq"], p["d_model"]]),
            "weights_shape": torch.tensor([p["B"], p["num_heads"], p["Lq"], p["Lk"]])}


def _shape_judge(got, want, case):
    p = case.params
    B, Lq, Lk, d, c, H = p["B"], p["Lq"], p["Lk"], p["d_model"], p["context_dim"], p["num_heads"]
    o, w = got["out_shape"].tolist(), got["weights_shape"].tolist()
    hints = []
    if w == [B, H, Lk, Lq]:
        hints.append("weights: one row per query (from x) and one column per context token: (B, H, Lq, Lk)")
    elif w != [B, H, Lq, Lk]:
        hints.append(f"weights: expected (B, H, Lq, Lk) = {(B, H, Lq, Lk)}")
    if o[:2] == [B, Lk]:
        hints.append("the output has one row per query: its length is Lq, whatever the context's length")
    if o[2:] == [c]:
        hints.append("the output width is d_model: v_proj maps context_dim -> d_model and out_proj keeps it")
    if not hints and o != [B, Lq, d]:
        hints.append(f"output: expected (B, Lq, d_model) = {(B, Lq, d)}")
    return Verdict(not hints, "; ".join(hints) + ("." if hints else ""))


# ---- 04_split_cross_attention ---------------------------------------------------------------------------

def _split_cases(gen):
    cases = []
    # never 257 image tokens (a hard-coded 257 must fail everywhere); two contexts longer than 257, where
    # a split at 257 differs from one joint softmax, and two short ones, where it is the same thing
    for B, H, Lq, n_img, n_txt, d in ((1, 1, 3, 5, 4, 8), (2, 2, 4, 9, 3, 8), (1, 2, 2, 256, 6, 4),
                                      (1, 1, 2, 300, 5, 4)):
        q = torch.randn(B, H, Lq, d, generator=gen)
        k = torch.randn(B, H, n_img + n_txt, d, generator=gen)
        v = torch.randn(B, H, n_img + n_txt, d + 2, generator=gen)
        cases.append(Case(f"{n_img} image + {n_txt} text tokens, q {(B, H, Lq, d)}", {"q": q, "k": k, "v": v},
                          {"num_image_tokens": n_img}))
    return cases


def _split_answer(fn, case):
    i = case.inputs
    return {"out": fn(i["q"], i["k"], i["v"], case.params["num_image_tokens"])}


def _split_ref(q, k, v, n, *, joint=False, text_first=False):
    if joint:
        return _softmax_attend(q, k, v)
    if text_first:
        n = k.shape[-2] - n
    return _softmax_attend(q, k[..., :n, :], v[..., :n, :]) + _softmax_attend(q, k[..., n:, :], v[..., n:, :])


def _split_expected(case):
    i = case.inputs
    return {"out": _split_ref(i["q"], i["k"], i["v"], case.params["num_image_tokens"]).to(i["q"].dtype)}


def _split_judge(got, want, case):
    if close(got["out"], want["out"], atol=1e-4):
        return Verdict(True)
    i, n = case.inputs, case.params["num_image_tokens"]
    L = i["k"].shape[-2]
    candidates = [
        ("you split at 257 whatever num_image_tokens is: use the argument, the layout is not always CLIP's.",
         _split_ref(i["q"], i["k"], i["v"], 257) if 0 < 257 < L and n != 257 else None),
        ("you ran one softmax over all image + text tokens (or split at a hard-coded 257, which on a context "
         "shorter than 257 tokens is the same thing): the tutorial runs two attentions (image = the first "
         "num_image_tokens, text = the rest), each with its own softmax, and adds their outputs."
         if L <= 257 else
         "you ran one softmax over all image + text tokens: the tutorial runs two attentions (image, text), each "
         "with its own softmax, and adds their outputs.", _split_ref(i["q"], i["k"], i["v"], n, joint=True)),
        ("the image tokens come first in the context: image = [:num_image_tokens], text = the rest.",
         _split_ref(i["q"], i["k"], i["v"], n, text_first=True) if 2 * n != L else None),
    ]
    hint = first_match(got["out"], candidates)
    return Verdict(False, hint or "wrong values: out = attn(q, k_img, v_img) + attn(q, k_txt, v_txt), "
                                  "each softmax(q kᵀ/√d) v.")


EXERCISES = [
    Exercise("04_cross_attend", 4, "Multi-head cross-attention by hand",
             "a function cross_attend(x, context, w_q, w_k, w_v, num_heads, keep=None) -> (B, Lq, d_model)",
             _cross_cases, _cross_answer, _cross_expected, _cross_judge, forbidden=FORBID_SDPA + FORBID_COURSE,
             error_hint_fn=_cross_error_hint, kind="build"),
    Exercise("04_mha_key_padding", 2, "A key_padding_mask for nn.MultiheadAttention",
             "a function mha_key_padding(lengths, max_len) -> bool (B, max_len)",
             _kpm_cases, _kpm_answer, _kpm_expected, _kpm_judge, forbidden=FORBID_COURSE, kind="compute"),   # one line
    Exercise("04_predict_shapes", 1, "Predict the cross-attention shapes",
             "a function cross_shapes(B, Lq, Lk, d_model, context_dim, num_heads) -> (out_shape, weights_shape)",
             _shape_cases, _shape_answer, _shape_expected, _shape_judge, kind="predict"),
    Exercise("04_split_cross_attention", 3, "The tutorial's image + text split cross-attention",
             "a function split_cross_attention(q, k, v, num_image_tokens) -> (B, H, Lq, Ev)",
             _split_cases, _split_answer, _split_expected, _split_judge, forbidden=FORBID_SDPA + FORBID_COURSE, kind="build"),
]
