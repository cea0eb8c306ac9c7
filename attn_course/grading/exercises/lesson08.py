"""Exercise set 08 — FlashAttention: online softmax, tiled forward, backward from the logsumexp, tiled backward, costs
(solutions/08_flash_attention_tiling.ipynb).

References are computed here in float64 from the definitions (softmax over the full score matrix,
autograd of the explicit formula, closed-form counts), independently of the learner and of
``attn_course.flash``. Hints are detected by computing what the common mistakes produce on the same inputs.
"""
from __future__ import annotations

import math

import torch

from ..spec import FORBID_COURSE, FORBID_SDPA, Case, Exercise, Verdict, close, randint, choice, draw, distinct

__all__ = ["EXERCISES"]

_F64 = torch.float64
_INF = float("inf")
# the softmax family in every spelling: functions, Tensor methods, modules (their forward calls F.softmax)
FORBID_SOFTMAX = ("torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax",
                  "torch.log_softmax", "torch.nn.functional.log_softmax", "torch.special.log_softmax",
                  "torch.logsumexp", "torch.special.logsumexp", "torch.Tensor.softmax", "torch.Tensor.log_softmax",
                  "torch.Tensor.logsumexp", "torch.nn.Softmax", "torch.nn.LogSoftmax",
                  "torch.nn.functional.softmin", "torch.nn.Softmin")


def _same(got: torch.Tensor, cand: torch.Tensor) -> bool:
    return got.shape == cand.shape and bool(torch.allclose(got.double(), cand.double(), atol=1e-4, rtol=1e-3,
                                                           equal_nan=True))


def _first(got: dict, cands, default: str) -> Verdict:
    for hint, cand in cands:
        if all(_same(got[key], cand[key]) for key in cand):
            return Verdict(False, hint)
    return Verdict(False, default)


def _has_nan(got: dict) -> bool:
    return any(bool(torch.isnan(t).any()) for t in got.values() if t.is_floating_point())


_NAN_HINT = ("NaN: a row whose tile is entirely −∞ gets m_new = −∞, and exp(s − m_new) = exp(−∞ + ∞) = NaN. "
             "Subtract a finite stand-in (0) where m_new is −∞ — the row then keeps l = 0 and acc = 0.")
_RESCALE_HINT = ("the accumulator is not rescaled: when a tile raises the max, multiply the old acc by "
                 "α = exp(m − m_new) before adding the new tile's P̃ V (you rescaled only l, or neither).")


# ---- 08_online_step: find and fix the bug -------------------------------------------------------------

def _fold(step, tiles):
    """Run ``step`` over (s, v) tiles from the empty state."""
    s0, v0 = tiles[0]
    m = torch.full((s0.shape[0], 1), -_INF, dtype=s0.dtype)
    l, acc = torch.zeros(s0.shape[0], 1, dtype=s0.dtype), torch.zeros(s0.shape[0], v0.shape[1], dtype=s0.dtype)
    for s, v in tiles:
        m, l, acc = step(m, l, acc, s.clone(), v)
    return {"m": m, "l": l, "acc": acc}


def _tiles(case):
    n = case.params["tiles"]
    return [(case.inputs[f"s{j}"], case.inputs[f"v{j}"]) for j in range(n)]


def _step_ref(m, l, acc, s, v, *, rescale_acc=True, rescale_l=True):
    m_new = torch.maximum(m, s.amax(-1, keepdim=True))
    m_sub = torch.where(m_new == -_INF, 0.0, m_new)
    p = torch.exp(s - m_sub)
    alpha = torch.exp(m - m_sub)
    l = (alpha if rescale_l else 1.0) * l + p.sum(-1, keepdim=True)
    acc = (alpha if rescale_acc else 1.0) * acc + p @ v
    return m_new, l, acc


def _step_cases(gen):
    out = []
    # both bugs show on every case: later tiles score higher (the max rises) and a tile is fully masked
    for R, C, D, n, masked in [(3, 4, 2, 3, True), (4, 3, 5, 4, True), (2, 5, 3, 2, True), (5, 2, 4, 3, True)]:
        inputs = {}
        for j in range(n):
            s = torch.randn(R, C, generator=gen, dtype=_F64) * 2 + j            # later tiles score higher
            if masked and j == 0:
                s[0] = -_INF                                                     # row 0: first tile fully masked
            if masked and R > 2:
                s[-1] = -_INF                                                    # last row: every key masked
            inputs[f"s{j}"], inputs[f"v{j}"] = s, torch.randn(C, D, generator=gen, dtype=_F64)
        name = f"{n} tiles of {R} rows × {C} keys, d={D}" + (", with fully masked tiles" if masked else "")
        out.append(Case(name, inputs, {"tiles": n}))
    return out


def _step_answer(fn, case):
    return _fold(fn, _tiles(case))


def _step_expected(case):
    S = torch.cat([s for s, _ in _tiles(case)], dim=1)                           # (R, all keys)
    V = torch.cat([v for _, v in _tiles(case)], dim=0)
    m = S.amax(-1, keepdim=True)
    e = torch.exp(S - torch.where(m == -_INF, 0.0, m))                           # direct formula, one pass
    return {"m": m, "l": e.sum(-1, keepdim=True), "acc": e @ V}


def _step_judge(got, want, case):
    if all(close(got[k], want[k]) for k in want):
        return Verdict(True)
    tiles = _tiles(case)
    cands = [(_RESCALE_HINT, _fold(lambda *a: _step_ref(*a, rescale_acc=False), tiles)),
             (_RESCALE_HINT, _fold(lambda *a: _step_ref(*a, rescale_acc=False, rescale_l=False), tiles)),
             ("the denominator l is not rescaled: l_new = exp(m − m_new) · l + rowsum(P̃).",
              _fold(lambda *a: _step_ref(*a, rescale_l=False), tiles))]
    if _has_nan(got):
        return _first(got, cands, _NAN_HINT)
    return _first(got, cands, "compare with the recurrence: m_new = max(m, rowmax(s)), P̃ = exp(s − m_new), "
                              "α = exp(m − m_new), l_new = α·l + rowsum(P̃), acc_new = α·acc + P̃ v.")


# ---- 08_tiled_forward ---------------------------------------------------------------------------------

def _attn_ref(q, k, v, causal, *, scale=True):
    q, k, v = q.to(_F64), k.to(_F64), v.to(_F64)
    s = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
    if causal:
        Lq, Lk = s.shape[-2:]
        s = s.masked_fill(torch.ones(Lq, Lk, dtype=torch.bool).triu(1), -_INF)
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse[..., None]) @ v, lse, s


def _tiled_cases(gen):
    # sizes chosen so that every tensor a tiled solution needs — the inputs' copies and the output
    # (B·H·L·d), a tile of scores (B·H·block²), even a query-block × all-keys strip (B·H·block·L) — is
    # smaller than one L × L score matrix, which the tiling guard (max_numel_fn) therefore rejects
    out = []
    for B, H, L, d, block, causal in [(1, 2, 24, 4, 6, False), (2, 1, 21, 4, 5, True), (1, 3, 20, 2, 4, True),
                                      (1, 1, 17, 3, 12, False)]:
        out.append(Case(f"B={B}, H={H}, L={L}, d={d}, block={block}, causal={causal}",
                        {n: torch.randn(B, H, L, d, generator=gen, dtype=_F64) for n in "qkv"},
                        {"causal": causal, "block": block}))
    return out


def _tiled_answer(fn, case):
    i, p = case.inputs, case.params
    out, lse = fn(i["q"], i["k"], i["v"], p["causal"], p["block"])
    return {"out": out, "lse": lse}


def _tiled_expected(case):
    i = case.inputs
    out, lse, _ = _attn_ref(i["q"], i["k"], i["v"], case.params["causal"])
    return {"out": out, "lse": lse}


def _tiled_judge(got, want, case):
    ok_out, ok_lse = close(got["out"], want["out"]), close(got["lse"], want["lse"])
    if ok_out and ok_lse:
        return Verdict(True)
    i, c = case.inputs, case.params["causal"]
    if ok_out:
        _, lse, s = _attn_ref(i["q"], i["k"], i["v"], c)
        m = s.amax(-1)
        if _same(got["lse"], lse - m):
            return Verdict(False, "the logsumexp must add the running max back: L = m + log ℓ (log ℓ alone "
                                  "is relative to m).")
        return Verdict(False, "the output is right but the logsumexp is not: return L = m + log ℓ per query row.")
    if c:
        strict = _attn_ref(i["q"], i["k"], i["v"], False)[2].masked_fill(
            torch.ones(i["q"].shape[-2], i["k"].shape[-2], dtype=torch.bool).triu(0), -_INF)
        w = torch.exp(strict - strict.amax(-1, keepdim=True))
        hidden = (w / w.sum(-1, keepdim=True)) @ i["v"].to(_F64)          # row 0: NaN (it sees no key)
        g = got["out"].double()
        if bool(torch.allclose(torch.where(torch.isnan(hidden), g.nan_to_num(0.0), hidden), g.nan_to_num(0.0),
                               atol=1e-4, rtol=1e-3)):
            return Verdict(False, "the diagonal is hidden: query i may see key j ≤ i, itself included (mask j > i, "
                                  "not j ≥ i) — with the diagonal hidden, query 0 sees no key at all.")
    if _has_nan(got):
        return Verdict(False, _NAN_HINT)
    nocausal = _attn_ref(i["q"], i["k"], i["v"], False)[0]
    cands = [("the scores are not scaled: multiply Q Kᵀ by 1/√d.", {"out": _attn_ref(i["q"], i["k"], i["v"], c, scale=False)[0]})]
    if c:
        cands.append(("the causal mask is missing: query i may only see keys j ≤ i (and tiles past the "
                      "diagonal are skipped).", {"out": nocausal}))
    return _first(got, cands, "the output differs from softmax(QKᵀ/√d)V: check the rescale of acc and l by "
                              "α = exp(m − m_new) at every tile, and the division by ℓ at the end.")


# ---- 08_backward_from_lse -----------------------------------------------------------------------------

def _bwd_cases(gen):
    out = []
    for B, H, L, d, causal in [(1, 2, 6, 4, False), (2, 1, 9, 3, True), (1, 1, 5, 8, True)]:
        q, k, v = (torch.randn(B, H, L, d, generator=gen, dtype=_F64) for _ in range(3))
        o, lse, _ = _attn_ref(q, k, v, causal)
        out.append(Case(f"B={B}, H={H}, L={L}, d={d}, causal={causal}",
                        {"q": q, "k": k, "v": v, "out": o, "lse": lse,
                         "dout": torch.randn(B, H, L, d, generator=gen, dtype=_F64)}, {"causal": causal}))
    return out


def _bwd_answer(fn, case):
    i = case.inputs
    dq, dk, dv = fn(i["q"], i["k"], i["v"], i["out"], i["lse"], i["dout"], case.params["causal"])
    return {"dq": dq, "dk": dk, "dv": dv}


def _bwd_formula(case, *, use_lse=True, use_D=True, scale_grads=True):
    i, c = case.inputs, case.params["causal"]
    q, k, v, o, dO = (i[n] for n in ("q", "k", "v", "out", "dout"))
    scale = 1 / math.sqrt(q.shape[-1])
    s = q @ k.transpose(-2, -1) * scale
    if c:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -_INF)
    P = torch.exp(s - i["lse"][..., None]) if use_lse else torch.exp(s)
    dv = P.transpose(-2, -1) @ dO
    dP = dO @ v.transpose(-2, -1)
    D = (dO * o).sum(-1, keepdim=True) if use_D else 0.0
    dS = P * (dP - D)
    g = scale if scale_grads else 1.0
    return {"dq": dS @ k * g, "dk": dS.transpose(-2, -1) @ q * g, "dv": dv}


def _bwd_expected(case):
    i = case.inputs
    q, k, v = (i[n].clone().requires_grad_() for n in "qkv")
    out, _, _ = _attn_ref(q, k, v, case.params["causal"])                        # autograd of the explicit formula
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), i["dout"])
    return {"dq": dq, "dk": dk, "dv": dv}


def _bwd_judge(got, want, case):
    ok = {key: close(got[key], want[key]) for key in want}
    if all(ok.values()):
        return Verdict(True)
    for hint, kw in [
        ("P must be recomputed as exp(S − L) with the saved logsumexp L; exp(S) alone is not normalised.",
         dict(use_lse=False)),
        ("dS = P ∘ (dP − D) with D = rowsum(dO ∘ O): you left out D (the softmax Jacobian's second term).",
         dict(use_D=False)),
        ("dQ and dK need the scale too: S = Q Kᵀ · scale, so dQ = dS K · scale and dK = dSᵀ Q · scale.",
         dict(scale_grads=False)),
    ]:
        cand = _bwd_formula(case, **kw)
        if all(_same(got[key], cand[key]) for key in ("dq", "dk", "dv") if not ok[key]):
            return Verdict(False, hint)
    if ok["dv"]:
        return Verdict(False, "dV is right; for dQ, dK: dP = dO Vᵀ, dS = P ∘ (dP − D), dQ = dS K·scale, dK = dSᵀ Q·scale.")
    return Verdict(False, "recompute S = Q Kᵀ·scale (masked), P = exp(S − L), then dV = Pᵀ dO.")


# ---- 08_tiled_backward: FlashAttention's tiled, recomputing backward ------------------------------------

def _tb_tiles(L, block, causal):
    """(q0, q1, k0, k1) of every tile a causal-skipping kernel visits: all of them, or those on or below the
    diagonal (some key k0 <= the block's last query)."""
    for k0 in range(0, L, block):
        for q0 in range(0, L, block):
            if not causal or k0 <= min(q0 + block, L) - 1:
                yield q0, min(q0 + block, L), k0, min(k0 + block, L)


def _tb_limits(case):
    """(work allowed in FLOPs, the largest product allowed). Work: 7 tile products per visited tile (S, dP,
    P̃ᵀdO, dS K, dSᵀQ, and S, dP again for a second pass over the tiles) + D = rowsum(dO ∘ O) twice over.
    Largest: one tile's products, B·H·block·max(block, d), or one value per row (B·H·L, D)."""
    B, H, L, d = case.inputs["q"].shape
    block, causal = case.params["block"], case.params["causal"]
    pairs = sum((q1 - q0) * (k1 - k0) for q0, q1, k0, k1 in _tb_tiles(L, block, causal))
    return 2 * B * H * d * (7 * pairs + 2 * L), B * H * max(block * max(block, d), L)


def _tb_cases(gen):
    def make(g):
        B, H = choice(g, ((1, 1), (1, 2), (2, 1)))
        d, block = randint(g, 2, 4), randint(g, 3, 6)
        L = randint(g, max(3 * block + 1, 2 * B * H * d + 1, 13), 40)
        return (B, H, L, d, block), B * H * d * 2 < L and L % block != 0     # ragged; tiled tensors < L·L
    out = []
    for causal in (False, True, True):
        (B, H, L, d, block), _ = draw(gen, make, lambda x: x[1])
        q, k, v = (torch.randn(B, H, L, d, generator=gen, dtype=_F64) for _ in range(3))
        o, lse, _ = _attn_ref(q, k, v, causal)
        out.append(Case(f"B={B}, H={H}, L={L}, d={d}, block={block}, causal={causal}",
                        {"q": q, "k": k, "v": v, "out": o, "lse": lse,
                         "dout": torch.randn(B, H, L, d, generator=gen, dtype=_F64)},
                        {"causal": causal, "block": block}))
    return out


def _tb_answer(fn, case):
    from ..guard import Work
    i, p = case.inputs, case.params
    with Work() as work:
        dq, dk, dv = fn(i["q"], i["k"], i["v"], i["out"], i["lse"], i["dout"], p["causal"], p["block"])
    return {"dq": dq, "dk": dk, "dv": dv, "flops": torch.tensor(work.flops, dtype=torch.int64),
            "largest": torch.tensor(work.largest, dtype=torch.int64)}


def _tb_expected(case):
    """Autograd of SDPA, float64 — independent of the tiles."""
    import torch.nn.functional as F
    i = case.inputs
    q, k, v = (i[n].clone().requires_grad_() for n in "qkv")
    out = F.scaled_dot_product_attention(q, k, v, is_causal=case.params["causal"])
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), i["dout"])
    flops, largest = _tb_limits(case)
    return {"dq": dq, "dk": dk, "dv": dv, "flops": torch.tensor(flops, dtype=torch.int64),
            "largest": torch.tensor(largest, dtype=torch.int64)}


def _tb_model(case, *, p="lse", use_D=True, scale_ds=True):
    """The tiled backward in float64 with one mistake: ``p`` "lse" (P = exp(S − L)), "tile" (each tile's P
    normalised by the tile's own row sums) or "exp" (exp(S), not normalised); ``use_D``; ``scale_ds``."""
    i, block, causal = case.inputs, case.params["block"], case.params["causal"]
    q, k, v, o, lse, dO = (i[n] for n in ("q", "k", "v", "out", "lse", "dout"))
    L, d = q.shape[-2:]
    scale = 1 / math.sqrt(d)
    D = (dO * o).sum(-1, keepdim=True) if use_D else torch.zeros_like(o[..., :1])
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for q0, q1, k0, k1 in _tb_tiles(L, block, causal):
        s = q[..., q0:q1, :] @ k[..., k0:k1, :].transpose(-2, -1) * scale
        if causal:
            s = s.masked_fill(torch.arange(k0, k1)[None, :] > torch.arange(q0, q1)[:, None], -_INF)
        if p == "lse":
            P = torch.exp(s - lse[..., q0:q1, None])
        elif p == "tile":
            e = torch.exp(s - s.amax(-1, keepdim=True).clamp(min=-1e300))
            P = e / e.sum(-1, keepdim=True)
        else:
            P = torch.exp(s)
        dv[..., k0:k1, :] += P.transpose(-2, -1) @ dO[..., q0:q1, :]
        dS = P * (dO[..., q0:q1, :] @ v[..., k0:k1, :].transpose(-2, -1) - D[..., q0:q1, :])
        g = scale if scale_ds else 1.0
        dq[..., q0:q1, :] += dS @ k[..., k0:k1, :] * g
        dk[..., k0:k1, :] += dS.transpose(-2, -1) @ q[..., q0:q1, :] * g
    return {"dq": dq, "dk": dk, "dv": dv}


def _tb_judge(got, want, case):
    ok = {key: close(got[key], want[key]) for key in ("dq", "dk", "dv")}
    if all(ok.values()):
        flops, largest = int(got["flops"]), int(got["largest"])
        allowed, cap = int(want["flops"]), int(want["largest"])
        if largest > cap:
            return Verdict(False, f"right gradients, but your code formed {largest} products at once (more than one "
                                  f"tile's, {cap}): that is a dense backward over whole rows of the L × L matrix — "
                                  f"recompute P tile by tile, block × block.")
        if flops > allowed:
            return Verdict(False, f"right gradients, but your products cost {flops} FLOPs, more than the tiles allow "
                                  f"({allowed}: 7 tile products per tile{', on or below the diagonal' if case.params['causal'] else ''}"
                                  f"): {'skip the tiles above the diagonal — all their keys are in the future; ' if case.params['causal'] else ''}"
                                  f"recompute each tile's P once per pass.")
        return Verdict(True)
    if _has_nan(got):
        return Verdict(False, "NaN: recompute P = exp(S − L) with the saved lse L (finite for every row); a row "
                              "normalised by its own maximum over a tile of −∞ gives exp(−∞ + ∞).")
    for hint, kw in [
        ("D_i is missing: dS = P ∘ (dP − D) with D_i = rowsum(dO_i ∘ O_i), computed once before the loop.",
         dict(use_D=False)),
        ("P must be recomputed from the saved lse, P = exp(S − L), not normalised by each tile's own row sums: a "
         "tile holds only some of the row's keys, the lse holds all of them.", dict(p="tile")),
        ("P must be recomputed as exp(S − L) with the saved lse L; exp(S) alone is not normalised.", dict(p="exp")),
        ("the scale is missing in dS: S = Q Kᵀ · scale, so dQ += dS K · scale and dK += dSᵀ Q · scale.",
         dict(scale_ds=False)),
    ]:
        cand = _tb_model(case, **kw)
        if all(_same(got[key], cand[key]) for key in ("dq", "dk", "dv") if not ok[key]):
            return Verdict(False, hint)
    if ok["dv"]:
        return Verdict(False, "dV is right; for dQ, dK per tile: dP = dO_i V_jᵀ, dS = P ∘ (dP − D_i), dQ_i += dS K_j·scale, "
                              "dK_j += dSᵀ Q_i·scale.")
    return Verdict(False, "per tile: S = Q_i K_jᵀ·scale (masked), P = exp(S − L_i), dV_j += Pᵀ dO_i — summed over every "
                          "query tile that sees key tile j.")


# ---- 08_causal_tiles ----------------------------------------------------------------------------------

def _tiles_cases(gen):
    def one(gen):
        L, bq, bk = randint(gen, 64, 4096), choice(gen, (16, 32, 64, 128, 7, 48)), choice(gen, (16, 32, 64, 128, 11, 96))
        Tq, Tk = -(-L // bq), -(-L // bk)
        answer = _tiles_count(L, bq, bk)
        return L, bq, bk, distinct(answer, Tq * (Tq + 1) // 2, Tk * (Tk + 1) // 2, Tq * Tk)
    # block_q != block_k everywhere (with equal blocks T(T+1)/2 is right), and on no case does a
    # mistake below coincide with the answer or with another mistake
    shapes = [draw(gen, one, lambda x: x[3]) for _ in range(4)]
    return [Case(f"L={L}, block_q={bq}, block_k={bk}", params={"L": L, "block_q": bq, "block_k": bk})
            for L, bq, bk, _ in shapes]


def _tiles_answer(fn, case):
    return {"tiles": torch.tensor(int(fn(*case.params.values())), dtype=torch.int64)}


def _tiles_count(L, block_q, block_k):
    """Key tiles a query block visits: those starting at or before its last query."""
    return sum(math.ceil(min(L, q0 + block_q) / block_k) for q0 in range(0, L, block_q))


def _tiles_expected(case):
    return {"tiles": torch.tensor(_tiles_count(**case.params), dtype=torch.int64)}


def _tiles_judge(got, want, case):
    g, p = int(got["tiles"]), case.params
    if g == int(want["tiles"]):
        return Verdict(True)
    Tq, Tk = math.ceil(p["L"] / p["block_q"]), math.ceil(p["L"] / p["block_k"])
    triangle = "T(T+1)/2 holds only when block_q = block_k; count per query block the key tiles that start " \
               "at or before its last query"
    every = "that is every tile: causal attention skips the tiles entirely above the diagonal"
    hints = []
    if g in (Tq * (Tq + 1) // 2, Tk * (Tk + 1) // 2):
        hints.append(triangle)
    if g == Tq * Tk:
        hints.append(every)
    if hints:
        return Verdict(False, " — or ".join(hints) + ".")
    return Verdict(False, f"expected the number of (query block, key tile) pairs with some visible key, got {g}.")


# ---- 08_hbm_traffic -----------------------------------------------------------------------------------

def _io_cases(gen):
    def one(gen):
        N, d = randint(gen, 64, 8192), choice(gen, (8, 32, 64, 128))
        br, bc = choice(gen, (16, 30, 64, 128)), choice(gen, (7, 32, 64, 100, 128))
        p = {"N": N, "d": d, "block_q": br, "block_k": bc}
        return p, distinct(_io_count(**p), _io_count(**p, kv=1), _io_count(**p, per="k"), _io_count(**p, writes=False))
    # B_r != B_c everywhere: counting passes per key tile must differ from per query block
    return [Case(f"N={p['N']}, d={p['d']}, B_r={p['block_q']}, B_c={p['block_k']}", params=p)
            for p, _ in (draw(gen, one, lambda x: x[1]) for _ in range(4))]


def _io_answer(fn, case):
    return {"elements": torch.tensor(int(fn(*case.params.values())), dtype=torch.int64)}


def _io_count(N, d, block_q, block_k, *, kv=2, per="q", writes=True):
    blocks = math.ceil(N / (block_q if per == "q" else block_k))
    return N * d + blocks * kv * N * d + ((N * d + N) if writes else 0)


def _io_expected(case):
    return {"elements": torch.tensor(_io_count(**case.params), dtype=torch.int64)}


def _io_judge(got, want, case):
    g, p = int(got["elements"]), case.params
    if g == int(want["elements"]):
        return Verdict(True)
    for hint, value in [
        ("K and V are both streamed for every query block: 2·N·d per block.", _io_count(**p, kv=1)),
        ("the number of passes over K, V is the number of QUERY blocks, ⌈N/B_r⌉ (the outer loop), not ⌈N/B_c⌉.",
         _io_count(**p, per="k")),
        ("add the writes: O (N·d) and the logsumexp (N) are written once.", _io_count(**p, writes=False)),
    ]:
        if g == value:
            return Verdict(False, hint)
    return Verdict(False, "reads: Q once (N·d) + ⌈N/B_r⌉ passes over K and V (2·N·d each); writes: O and L once.")


EXERCISES = [
    Exercise("08_online_step", 3, "Fix the online-softmax step",
             "a function online_step(m, l, acc, s, v) -> (m_new, l_new, acc_new)",
             _step_cases, _step_answer, _step_expected, _step_judge, forbidden=FORBID_COURSE + FORBID_SOFTMAX, kind="debug"),
    Exercise("08_tiled_forward", 3, "Tiled attention forward with the logsumexp",
             "a function tiled_attention(q, k, v, causal, block) -> (out, lse)",
             _tiled_cases, _tiled_answer, _tiled_expected, _tiled_judge,
             forbidden=FORBID_SDPA + FORBID_COURSE + FORBID_SOFTMAX,
             max_numel_fn=lambda case: case.inputs["q"].shape[-2] * case.inputs["k"].shape[-2], kind="build"),   # tile by tile
    Exercise("08_backward_from_lse", 3, "Backward from the output and the logsumexp",
             "a function attention_backward(q, k, v, out, lse, dout, causal) -> (dq, dk, dv)",
             _bwd_cases, _bwd_answer, _bwd_expected, _bwd_judge,
             forbidden=FORBID_SDPA + FORBID_COURSE + FORBID_SOFTMAX + ("torch.autograd",), kind="build"),
    Exercise("08_causal_tiles", 1, "How many tiles does causal attention compute?",
             "a function causal_tiles(L, block_q, block_k) -> int",
             _tiles_cases, _tiles_answer, _tiles_expected, _tiles_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("08_hbm_traffic", 2, "Slow-memory traffic of the tiled forward",
             "a function tiled_traffic(N, d, block_q, block_k) -> int",
             _io_cases, _io_answer, _io_expected, _io_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("08_tiled_backward", 4, "FlashAttention's tiled, recomputing backward",
             "a function tiled_backward(q, k, v, out, lse, dout, causal, block) -> (dq, dk, dv)",
             _tb_cases, _tb_answer, _tb_expected, _tb_judge,
             forbidden=FORBID_SDPA + FORBID_COURSE + FORBID_SOFTMAX + ("torch.autograd",),
             max_numel_fn=lambda case: case.inputs["q"].shape[-2] ** 2, kind="build"),   # no L × L tensor
]
