"""Exercise set 11 — positions, normalisation and the transformer block
(solutions/11_positions_normalisation_and_the_block.ipynb).

References are computed here in float64 from the papers' formulas (Vaswani et al. 2017 §3.5; Su et al.
2021; Zhang & Sennrich 2019), independently of the learner and of ``attn_course.rope``/``positions``/``norm``.
Hints are detected: each judge computes what the common mistakes return on the same inputs and names the match.
"""
from __future__ import annotations

import itertools
import math

import torch

from ..spec import Case, Exercise, FORBID_COURSE, FORBID_SDPA, Verdict, close, diagnose, randint, choice, draw, distinct

SANDBOX_ALLOW = ("fused attention kernels",)   # 11.7 builds the block around attention: SDPA may do the attention
__all__ = ["EXERCISES"]

_F64 = torch.float64


def _max_diff(got, want) -> str:
    d = (got.double() - want.double()).abs()
    return "NaN" if torch.isnan(d).any() else f"{float(d.max()):.3g}"


# ---- 11_sinusoidal --------------------------------------------------------------------------------------

def _sin(positions, dim, *, layout="interleaved", two=True, swap=False):
    omega = 10000.0 ** (-(2.0 if two else 1.0) * torch.arange(dim // 2, dtype=_F64) / dim)
    a = positions.to(_F64)[:, None] * omega
    s, c = (a.cos(), a.sin()) if swap else (a.sin(), a.cos())
    pe = torch.stack((s, c), -1).flatten(-2) if layout == "interleaved" else torch.cat((c, s), -1)
    return pe.float()


def _sin_cases(gen):
    out = []
    for L, dim, start in ((randint(gen, 4, 8), choice(gen, (8, 12)), 0), (randint(gen, 3, 7), 16, randint(gen, 1, 20)),
                          (randint(gen, 3, 6), 32, None)):
        pos = torch.arange(start, start + L) if start is not None else torch.randperm(500, generator=gen)[:L]
        out.append(Case(f"positions {pos.tolist()}, dim={dim}", {"positions": pos}, {"dim": dim}))
    return out


def _sin_answer(fn, case):
    return {"pe": fn(case.inputs["positions"], case.params["dim"])}


def _sin_expected(case):
    return {"pe": _sin(case.inputs["positions"], case.params["dim"])}


def _sin_judge(got, want, case):
    if close(got["pe"], want["pe"]):
        return Verdict(True)
    p, d = case.inputs["positions"], case.params["dim"]
    return diagnose(got["pe"], [
        ("sin goes in the even channels and cos in the odd ones: PE(p, 2i) = sin(p·ω_i), PE(p, 2i+1) = cos(p·ω_i).",
         _sin(p, d, swap=True)),
        ("that is a popular Chinese attention tutorial's layout (all cosines, then all sines); the paper interleaves sin and cos channel by channel.",
         _sin(p, d, layout="cat")),
        ("the frequencies are ω_i = 10000^(−2i/d) for i < d/2: the exponent is 2i/d, not i/d.", _sin(p, d, two=False)),
    ], f"wrong values (largest difference {_max_diff(got['pe'], want['pe'])}); PE(p, 2i) = sin(p·10000^(−2i/d)).")


# ---- 11_rope_interleaved --------------------------------------------------------------------------------

def _rope(x, positions, *, pairing="interleaved", sign=1.0, two=True):
    x = x.to(_F64)
    d = x.shape[-1]
    theta = 10000.0 ** (-(2.0 if two else 1.0) * torch.arange(d // 2, dtype=_F64) / d)
    ang = positions.to(_F64)[:, None] * theta                 # (L, d/2)
    cos, sin = ang.cos(), sign * ang.sin()
    if pairing == "half":
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def _rope_cases(gen):
    out = []
    for shape, start in (((6, 8), 0), ((2, 3, 5, 16), 0), ((2, 4, 32), 9)):
        out.append(Case(f"x {shape}, positions {start}..{start + shape[-2] - 1}",
                        {"x": torch.randn(*shape, generator=gen), "positions": torch.arange(start, start + shape[-2])}))
    return out


def _rope_answer(fn, case):
    return {"out": fn(case.inputs["x"], case.inputs["positions"])}


def _rope_expected(case):
    return {"out": _rope(case.inputs["x"], case.inputs["positions"]).to(case.inputs["x"].dtype)}


def _rope_judge(got, want, case):
    if close(got["out"], want["out"]):
        return Verdict(True)
    x, p = case.inputs["x"], case.inputs["positions"]
    return diagnose(got["out"], [
        ("you paired channel i with i + d/2 (the half-split / rotate_half convention); here neighbours (2i, 2i+1) "
         "form each pair, as in the complex form x[..., 0::2] + i·x[..., 1::2].", _rope(x, p, pairing="half")),
        ("you rotate the wrong way: (x₁, x₂) -> (x₁cos − x₂sin, x₁sin + x₂cos), i.e. multiply by e^{+ipθ}.",
         _rope(x, p, sign=-1.0)),
        ("the frequencies are θ_i = 10000^(−2i/d) for i < d/2; you used 10000^(−i/d).", _rope(x, p, two=False)),
        ("you ignored the given positions and used 0..L-1.", _rope(x, torch.arange(x.shape[-2]))),
    ], f"wrong values (largest difference {_max_diff(got['out'], want['out'])}).")


# ---- 11_convert_checkpoint ------------------------------------------------------------------------------

def _perm(d):
    return torch.stack((torch.arange(d // 2), torch.arange(d // 2, d)), -1).flatten()


def _convert(w, heads, *, how="perm"):
    d_h = w.shape[0] // heads
    if how == "global":                                      # one permutation over all rows, ignoring heads
        return w[_perm(w.shape[0])]
    p = _perm(d_h) if how == "perm" else torch.argsort(_perm(d_h))
    return w.view(heads, d_h, -1)[:, p].reshape(w.shape)


def _conv_cases(gen):
    out = []
    for D, H, Hkv, dh in ((32, 4, 2, 8), (48, 3, 1, 16), (64, 8, 4, 8)):
        out.append(Case(f"d_model={D}, num_heads={H}, num_kv_heads={Hkv}, head_dim={dh}",
                        {"w_q": torch.randn(H * dh, D, generator=gen), "w_k": torch.randn(Hkv * dh, D, generator=gen)},
                        {"num_heads": H, "num_kv_heads": Hkv}))
    return out


def _conv_answer(fn, case):
    wq, wk = fn(case.inputs["w_q"], case.inputs["w_k"], case.params["num_heads"], case.params["num_kv_heads"])
    return {"w_q": wq, "w_k": wk}


def _conv_expected(case, *, how="perm", k_heads=None, k_how=None):
    i, p = case.inputs, case.params
    return {"w_q": _convert(i["w_q"], p["num_heads"], how=how),
            "w_k": _convert(i["w_k"], k_heads or p["num_kv_heads"], how=k_how or how)}


def _conv_judge(got, want, case):
    if all(close(got[n], want[n]) for n in want):
        return Verdict(True)
    i, p = case.inputs, case.params
    cands = [
        ("you used the inverse permutation: new row 2j must be old row j and new row 2j+1 old row j + d_h/2 "
         "(index with perm = [0, d_h/2, 1, d_h/2+1, ...]).", _conv_expected(case, how="inv")),
        ("the permutation acts within each head: view the rows as (heads, head_dim) and permute head_dim, not "
         "all rows at once.", _conv_expected(case, how="global")),
        ("w_k has num_kv_heads heads (GQA), not num_heads: split its rows into num_kv_heads blocks of head_dim.",
         {"w_q": want["w_q"], "w_k": _convert(i["w_k"], p["num_heads"]) if i["w_k"].shape[0] % p["num_heads"] == 0 else None}),
        ("w_k has num_kv_heads heads (GQA), not num_heads: split its rows into num_kv_heads blocks of head_dim "
         "(you viewed it as num_heads blocks of head_dim, which reshuffles rows across heads).",
         {"w_q": want["w_q"], "w_k": _conv_k_as_q(case)}),
        ("the keys need the same permutation as the queries (RoPE rotates both).", {"w_q": want["w_q"], "w_k": i["w_k"]}),
        ("the queries need the same permutation as the keys (RoPE rotates both).", {"w_q": i["w_q"], "w_k": want["w_k"]}),
    ]
    cands = [(h, c) for h, c in cands if all(v is not None for v in c.values())]
    return diagnose(got, cands, "wrong rows: permute the rows of each head by [0, d_h/2, 1, d_h/2+1, ...].")


def _conv_k_as_q(case):
    """w_k viewed as (num_heads, head_dim, ·) with the queries' head_dim (possible when the sizes divide)."""
    i, H = case.inputs, case.params["num_heads"]
    w, dh = i["w_k"], i["w_q"].shape[0] // H
    return None if w.numel() % (H * dh) else w.reshape(H, dh, -1)[:, _perm(dh)].reshape(w.shape)


def _conv_error_hint(case, error):
    """Splitting w_k into num_heads blocks raises a shape error whenever num_kv_heads < num_heads divides badly
    (a view, or a permutation built for one head size and applied to another)."""
    if any(w in error for w in ("is invalid for input of size", "shape '[", "must be divisible", "view size",
                                "stack expects each tensor to be equal size", "out of bounds for dimension")):
        return ("w_k has num_kv_heads heads (GQA), not num_heads: split its rows into num_kv_heads blocks of "
                "head_dim = w_k.shape[0] // num_kv_heads.")
    return None


# ---- 11_rmsnorm -----------------------------------------------------------------------------------------

def _rms(x, g, eps, *, mode="rms", dim=-1):
    xf = x.to(_F64)
    if mode == "layernorm":
        xc = xf - xf.mean(dim, keepdim=True)
        y = xc / torch.sqrt(xc.pow(2).mean(dim, keepdim=True) + eps)
    elif mode == "eps_outside":
        y = xf / (torch.sqrt(xf.pow(2).mean(dim, keepdim=True)) + eps)
    elif mode == "std":
        y = xf / torch.sqrt(xf.var(dim, keepdim=True) + eps)
    else:
        y = xf / torch.sqrt(xf.pow(2).mean(dim, keepdim=True) + eps)
    return (y if g is None else y * g.to(_F64)).to(x.dtype)


def _rms_cases(gen):
    out = []
    for shape, eps, scale, dtype in (((4, 8), 0.1, 0.5, torch.float32), ((2, 5, 16), 0.05, 0.3, torch.float32),
                                     ((3, 6, 12), 0.2, 0.6, torch.float64)):
        x = (torch.randn(*shape, generator=gen) * scale + 0.3).to(dtype)
        g = (1.0 + 0.5 * torch.randn(shape[-1], generator=gen)).to(dtype)
        out.append(Case(f"x {shape} {dtype}, eps={eps}", {"x": x, "weight": g}, {"eps": eps}))
    return out


def _rms_answer(fn, case):
    return {"y": fn(case.inputs["x"], case.inputs["weight"], case.params["eps"])}


def _rms_expected(case):
    return {"y": _rms(case.inputs["x"], case.inputs["weight"], case.params["eps"])}


def _rms_judge(got, want, case):
    if close(got["y"], want["y"]):
        return Verdict(True)
    x, g, eps = case.inputs["x"], case.inputs["weight"], case.params["eps"]
    return diagnose(got["y"], [
        ("you subtracted the mean: that is LayerNorm. RMSNorm divides by sqrt(mean(x²) + eps) without centring.",
         _rms(x, g, eps, mode="layernorm")),
        ("you divided by the variance (centred): RMSNorm uses the raw mean of squares, mean(x²).", _rms(x, g, eps, mode="std")),
        ("eps goes inside the square root: x / sqrt(mean(x²) + eps).", _rms(x, g, eps, mode="eps_outside")),
        ("normalise over the last axis (the features of each vector), not over the sequence/batch axis.",
         _rms(x, g, eps, dim=-2)),
        ("multiply by the gain `weight` at the end.", _rms(x, None, eps)),
    ], f"wrong values (largest difference {_max_diff(got['y'], want['y'])}); y = x / sqrt(mean(x², last axis) + eps) · weight.")


# ---- 11_block_params ------------------------------------------------------------------------------------

def _params(D, H, Hkv, F, *, kv="gqa", ffn=3, norms=2, qk="head"):
    dh = D // H
    kv_rows = Hkv * dh if kv == "gqa" else D
    qkn = {"head": 2 * dh, "model": 2 * D, "none": 0}[qk]
    return 2 * D * D + 2 * D * kv_rows + ffn * D * F + norms * D + qkn


def _params_cases(gen):
    def make(g):
        H = choice(g, (4, 8, 12, 16))
        D = H * choice(g, (8, 16, 64))
        Hkv = choice(g, [h for h in (1, 2, 4) if H % h == 0 and h < H])
        F = 8 * randint(g, D // 8, 4 * D // 8)
        args = (D, H, Hkv, F)
        return args, distinct(_params(*args), _params(*args, kv="full"), _params(*args, ffn=2),
                              _params(*args, qk="model"), _params(*args, qk="none"), _params(*args, norms=0))
    # GQA everywhere (num_kv_heads < num_heads) and each mistake below gives its own count
    return [Case(f"d_model={D}, num_heads={H}, num_kv_heads={Hkv}, ffn_dim={F}",
                 params=dict(d_model=D, num_heads=H, num_kv_heads=Hkv, ffn_dim=F))
            for (D, H, Hkv, F), _ in (draw(gen, make, lambda x: x[1]) for _ in range(3))]


def _params_answer(fn, case):
    return {"n": torch.tensor(int(fn(*case.params.values())), dtype=torch.int64)}


def _params_expected(case):
    p = case.params
    return {"n": torch.tensor(_params(p["d_model"], p["num_heads"], p["num_kv_heads"], p["ffn_dim"]), dtype=torch.int64)}


def _params_judge(got, want, case):
    g = int(got["n"])
    if g == int(want["n"]):
        return Verdict(True)
    p = case.params
    args = (p["d_model"], p["num_heads"], p["num_kv_heads"], p["ffn_dim"])
    cands = [
        ("k_proj and v_proj map d_model to num_kv_heads·head_dim (GQA), not to d_model.", _params(*args, kv="full")),
        ("SwiGLU has three matrices (w1, w3: d_model→ffn_dim, w2: ffn_dim→d_model), not two.", _params(*args, ffn=2)),
        ("QK-norm normalises over head_dim: q_norm and k_norm are one RMSNorm(head_dim) each, shared by all "
         "heads (timm's q_norm/k_norm) — head_dim gains each, not d_model (= one gain per head and channel).",
         _params(*args, qk="model")),
        ("you left out the QK-norm gains (2·head_dim).", _params(*args, qk="none")),
        ("you left out the two RMSNorm gains of the block (norm1, norm2: d_model each).", _params(*args, norms=0)),
    ]
    for hint, value in cands:
        if g == value:
            return Verdict(False, hint)
    return Verdict(False, f"got {g:,}, expected {int(want['n']):,}: count q, k, v, o, the three SwiGLU matrices "
                          f"and the gains of norm1, norm2, q_norm, k_norm.")


# ---- 11_fix_block_attention ------------------------------------------------------------------------------

_BUGS = ("rope_v", "rope_scores", "norm_axis")


def _attend(x, Wq, Wk, Wv, gq, gk, H, *, bugs=(), wan=False):
    """Causal multi-head attention with per-head QK-norm (RMSNorm over d_h, eps 1e-6) then half-split RoPE."""
    x = x.to(_F64)
    B, L, D = x.shape
    dh = D // H
    pos = torch.arange(L)

    def heads(t):
        return t.view(B, L, H, dh).transpose(1, 2)                   # (B, H, L, dh)

    q, k, v = x @ Wq.to(_F64).T, x @ Wk.to(_F64).T, x @ Wv.to(_F64).T
    if wan:                                                          # one RMSNorm over the whole width (Wan)
        q = q / torch.sqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) * gq.to(_F64).repeat(H)
        k = k / torch.sqrt(k.pow(2).mean(-1, keepdim=True) + 1e-6) * gk.to(_F64).repeat(H)
        q, k, v = heads(q), heads(k), heads(v)
    else:
        q, k, v = heads(q), heads(k), heads(v)
        ax = -2 if "norm_axis" in bugs else -1
        q = q / torch.sqrt(q.pow(2).mean(ax, keepdim=True) + 1e-6) * gq.to(_F64)
        k = k / torch.sqrt(k.pow(2).mean(ax, keepdim=True) + 1e-6) * gk.to(_F64)
    if "rope_scores" in bugs:
        s = _rope(q @ k.transpose(-2, -1), pos, pairing="half") / math.sqrt(dh)
    else:
        s = _rope(q, pos, pairing="half") @ _rope(k, pos, pairing="half").transpose(-2, -1) / math.sqrt(dh)
    if "rope_v" in bugs:
        v = _rope(v, pos, pairing="half")
    s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, D)


def _fix_cases(gen):
    out = []
    for B, L, D, H in ((1, 6, 16, 2), (2, 8, 32, 4), (2, 10, 24, 3)):
        dh = D // H
        t = {"x": torch.randn(B, L, D, generator=gen)}
        for n in ("W_q", "W_k", "W_v"):
            t[n] = torch.randn(D, D, generator=gen) / math.sqrt(D)
        for n in ("g_q", "g_k"):
            t[n] = 1.0 + 0.5 * torch.randn(dh, generator=gen)
        out.append(Case(f"x (B={B}, L={L}, d_model={D}), num_heads={H}", t, {"num_heads": H}))
    return out


def _fix_args(case):
    i = case.inputs
    return (i["x"], i["W_q"], i["W_k"], i["W_v"], i["g_q"], i["g_k"], case.params["num_heads"])


def _fix_answer(fn, case):
    return {"out": fn(*_fix_args(case))}


def _fix_expected(case):
    return {"out": _attend(*_fix_args(case)).to(case.inputs["x"].dtype)}


_BUG_TEXT = {"rope_v": "RoPE is still applied to v (it belongs on q and k only: values carry content, not position)",
             "rope_scores": "RoPE is applied after the dot product (rotate q and k, then take q·k)",
             "norm_axis": "the RMSNorm averages over the sequence axis (-2) instead of head_dim (-1), which also lets "
                          "future tokens leak into the past"}


def _fix_judge(got, want, case):
    if close(got["out"], want["out"]):
        return Verdict(True)
    args = _fix_args(case)
    cands = []
    for r in (1, 2, 3):
        for left in itertools.combinations(_BUGS, r):
            cands.append(("still wrong: " + "; ".join(_BUG_TEXT[b] for b in left) + ".", _attend(*args, bugs=left)))
    cands.append(("you normalised q and k over the whole width (Wan's norm_q on d_model); the block's QK-norm is per "
                  "head, over head_dim, with a gain of size head_dim.", _attend(*args, wan=True)))
    return diagnose(got["out"], cands, f"wrong values (largest difference {_max_diff(got['out'], want['out'])}).")


# ---- 11_block_forward -----------------------------------------------------------------------------------

_BLOCK_WEIGHTS = ("norm1.weight", "attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
                  "attn.out_proj.weight", "norm2.weight", "ffn.w1.weight", "ffn.w3.weight", "ffn.w2.weight")


def _block(x, w, H, Hkv, eps, *, post_norm=False, residual=(True, True), eps_outside=False, norm_axis=-1,
           pairing="half", rope=True, rope_v=False, causal=True, scale=True, swap_gate=False, tile_kv=False):
    """The pre-norm block from its weights in float64 (Xiong et al. 2020 Fig. 1(b); Shazeer 2020 Eq. 6), with
    switches for the common mistakes."""
    x = x.to(_F64)
    w = {k: v.to(_F64) for k, v in w.items()}
    B, L, D = x.shape
    dh, pos = D // H, torch.arange(L)

    def rms(t, g):                                                   # RMSNorm (Zhang & Sennrich 2019, Eq. 4)
        ms = t.pow(2).mean(norm_axis, keepdim=True)
        return t / (ms.sqrt() + eps if eps_outside else torch.sqrt(ms + eps)) * g

    def attn(h):
        q, k, v = ((h @ w[f"attn.{n}_proj.weight"].T).view(B, L, -1, dh).transpose(1, 2) for n in "qkv")
        if rope:
            q, k = _rope(q, pos, pairing=pairing), _rope(k, pos, pairing=pairing)
        if rope_v:
            v = _rope(v, pos, pairing=pairing)
        G = H // Hkv                                                 # query head i reads kv head i // G
        k, v = ((t.repeat(1, G, 1, 1) if tile_kv else t.repeat_interleave(G, dim=1)) for t in (k, v))
        s = q @ k.transpose(-2, -1) / (math.sqrt(dh) if scale else 1.0)
        if causal:
            s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        return (s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, D) @ w["attn.out_proj.weight"].T

    def ffn(u):
        gate, up = u @ w["ffn.w1.weight"].T, u @ w["ffn.w3.weight"].T
        if swap_gate:
            gate, up = up, gate
        return (torch.nn.functional.silu(gate) * up) @ w["ffn.w2.weight"].T

    if post_norm:                                                    # the 2017 Transformer's order
        h = rms(x + attn(x), w["norm1.weight"])
        return rms(h + ffn(h), w["norm2.weight"])
    h = (x if residual[0] else 0.0) + attn(rms(x, w["norm1.weight"]))
    return (h if residual[1] else 0.0) + ffn(rms(h, w["norm2.weight"]))


def _blk_cases(gen):
    out = []
    for _ in range(3):
        # GQA everywhere with 1 < num_kv_heads < num_heads (so the kv-head grouping matters), an eps large
        # enough that its place matters, head_dim even (RoPE)
        H = choice(gen, (4, 6))
        Hkv = choice(gen, [h for h in (2, 3) if H % h == 0])
        B, L, dh, F = randint(gen, 1, 2), randint(gen, 5, 9), choice(gen, (4, 6, 8)), randint(gen, 12, 40)
        D, eps = H * dh, choice(gen, (0.02, 0.05, 0.1, 0.2))
        shapes = {"norm1.weight": (D,), "attn.q_proj.weight": (D, D), "attn.k_proj.weight": (Hkv * dh, D),
                  "attn.v_proj.weight": (Hkv * dh, D), "attn.out_proj.weight": (D, D), "norm2.weight": (D,),
                  "ffn.w1.weight": (F, D), "ffn.w3.weight": (F, D), "ffn.w2.weight": (D, F)}
        t = {"x": torch.randn(B, L, D, generator=gen)}
        for n, shape in shapes.items():
            r = torch.randn(*shape, generator=gen)
            t[n] = 1.0 + 0.3 * r if len(shape) == 1 else r / math.sqrt(shape[1])
        out.append(Case(f"x (B={B}, L={L}, d_model={D}), num_heads={H}, num_kv_heads={Hkv}, ffn_dim={F}, eps={eps}",
                        t, {"num_heads": H, "num_kv_heads": Hkv, "eps": eps}))
    return out


def _blk_args(case):
    i, p = case.inputs, case.params
    return i["x"], {n: i[n] for n in _BLOCK_WEIGHTS}, p["num_heads"], p["num_kv_heads"], p["eps"]


def _blk_answer(fn, case):
    return {"y": fn(*_blk_args(case))}


def _blk_expected(case):
    """attn_course.TransformerBlock with the drawn sizes, loaded with the case's weights (float64)."""
    from ...block import TransformerBlock
    x, w, H, Hkv, eps = _blk_args(case)
    D, F = x.shape[-1], w["ffn.w1.weight"].shape[0]
    block = TransformerBlock(D, H, Hkv, F).double().eval()
    block.norm1.eps = block.norm2.eps = eps
    block.load_state_dict({n: t.double() for n, t in w.items()})
    with torch.no_grad():
        return {"y": block(x.double()).to(x.dtype)}


def _blk_judge(got, want, case):
    if close(got["y"], want["y"], atol=1e-4, rtol=1e-3):
        return Verdict(True)
    a = _blk_args(case)
    return diagnose(got["y"], [
        ("that is POST-norm (norm after adding the residual, as in the 2017 Transformer); this block is pre-norm: "
         "h = x + Attn(RMSNorm₁(x)), y = h + FFN(RMSNorm₂(h)).", _block(*a, post_norm=True)),
        ("the residual connections are missing: add each sub-layer's output to its input, h = x + Attn(RMSNorm₁(x)) "
         "and y = h + FFN(RMSNorm₂(h)).", _block(*a, residual=(False, False))),
        ("the attention's residual is missing: h = x + Attn(RMSNorm₁(x)).", _block(*a, residual=(False, True))),
        ("the FFN's residual is missing: y = h + FFN(RMSNorm₂(h)).", _block(*a, residual=(True, False))),
        ("RMSNorm's eps goes inside the square root: x / sqrt(mean(x²) + eps).", _block(*a, eps_outside=True)),
        ("RMSNorm averages over the features (the last axis, d_model), not over the sequence.",
         _block(*a, norm_axis=-2)),
        ("you paired neighbours (2i, 2i+1) — the interleaved RoPE convention; the course's block pairs channel i "
         "with i + d_h/2 (half-split, rotate_half).", _block(*a, pairing="interleaved")),
        ("RoPE belongs on q and k only: values carry content, not position — do not rotate v.",
         _block(*a, rope_v=True)),
        ("q and k must be rotated by RoPE at positions 0..L-1.", _block(*a, rope=False)),
        ("SwiGLU's gate and up are swapped: FFN(u) = w2(SiLU(w1 u) ⊙ w3 u) — SiLU on w1's output.",
         _block(*a, swap_gate=True)),
        ("the causal mask is missing: token i may only attend to tokens j ≤ i.", _block(*a, causal=False)),
        ("the scores are not scaled: divide q·k by sqrt(head_dim).", _block(*a, scale=False)),
        ("query head i reads kv head i // (num_heads / num_kv_heads): repeat each kv head for its group "
         "(repeat_interleave), not the whole stack (repeat tiles it).", _block(*a, tile_kv=True)),
    ], f"wrong values (largest difference {_max_diff(got['y'], want['y'])}): h = x + Attn(RMSNorm₁(x)), "
       f"y = h + FFN(RMSNorm₂(h)).")


def _blk_error_hint(case, error):
    """q with num_heads heads against k, v with num_kv_heads heads: a broadcast or view error."""
    if any(w in error for w in ("must match the size of tensor", "is invalid for input of size")):
        return ("k and v have num_kv_heads heads (their projections are num_kv_heads·head_dim wide): repeat each "
                "kv head for the num_heads / num_kv_heads query heads of its group (repeat_interleave on the "
                "head axis), or pass enable_gqa=True to F.scaled_dot_product_attention.")
    return None

EXERCISES = [
    Exercise("11_sinusoidal", 1, "Sinusoidal position encoding by hand",
             "a function sinusoidal(positions, dim) -> float32 (L, dim)",
             _sin_cases, _sin_answer, _sin_expected, _sin_judge, forbidden=FORBID_COURSE, kind="build"),
    Exercise("11_rope_interleaved", 2, "Interleaved (complex-form) RoPE by hand",
             "a function rope_interleaved(x, positions) -> tensor shaped like x",
             _rope_cases, _rope_answer, _rope_expected, _rope_judge, forbidden=FORBID_COURSE, kind="build"),
    Exercise("11_convert_checkpoint", 2, "Convert a half-split checkpoint to interleaved RoPE",
             "a function convert(w_q, w_k, num_heads, num_kv_heads) -> (new_w_q, new_w_k)",
             _conv_cases, _conv_answer, _conv_expected, _conv_judge, forbidden=FORBID_COURSE,
             error_hint_fn=_conv_error_hint, kind="build"),
    Exercise("11_rmsnorm", 2, "RMSNorm by hand",
             "a function rms_norm(x, weight, eps) -> tensor shaped like x, same dtype",
             _rms_cases, _rms_answer, _rms_expected, _rms_judge, forbidden=FORBID_COURSE, kind="build"),
    Exercise("11_block_params", 1, "Parameter count of a block",
             "a function block_params(d_model, num_heads, num_kv_heads, ffn_dim) -> int",
             _params_cases, _params_answer, _params_expected, _params_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("11_fix_block_attention", 3, "Find the bugs in a block's attention",
             "a function attend(x, W_q, W_k, W_v, g_q, g_k, num_heads) -> (B, L, d_model), causal",
             _fix_cases, _fix_answer, _fix_expected, _fix_judge, forbidden=FORBID_SDPA + FORBID_COURSE, kind="debug"),
    Exercise("11_block_forward", 4, "The pre-norm transformer block, forward, by hand",
             "a function block_forward(x, weights, num_heads, num_kv_heads, eps) -> (B, L, d_model)",
             _blk_cases, _blk_answer, _blk_expected, _blk_judge, forbidden=FORBID_COURSE,
             error_hint_fn=_blk_error_hint, kind="build"),
]
