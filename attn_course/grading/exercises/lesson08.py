"""Exercise set 08 — FlashAttention: online softmax, tiled forward, backward from the logsumexp, tiled backward, costs
(solutions/08_flash_attention_tiling.ipynb).

References are computed here in float64 from the definitions (softmax over the full score matrix, the
backward's formula, closed-form counts), independently of the learner and of ``attn_course.flash``. Hints are
detected by computing what the common mistakes produce on the same inputs.

The tiled builds are step-driven (docs/DESIGN.md §4): the grader runs the tile loops (every tile a causal kernel
visits, in a shuffled order) and calls the learner's step with one tile — a step sees no more than one tile, so
no whole-sequence shortcut exists to take. The forward starts from a prior state (keys seen elsewhere) and the
backwards get a shifted lse and another out/D on some cases, so only a step that uses what it is given passes.
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


# ---- 08_tiled_forward: the grader drives the tiles, the learner writes one tile's step ------------------

def _attn_ref(q, k, v, causal, *, scale=True):
    q, k, v = q.to(_F64), k.to(_F64), v.to(_F64)
    s = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
    if causal:
        Lq, Lk = s.shape[-2:]
        s = s.masked_fill(torch.ones(Lq, Lk, dtype=torch.bool).triu(1), -_INF)
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse[..., None]) @ v, lse, s


def tile_grid(L, block_q, block_k, causal, order_seed):
    """[(q0, q1, k0, k1)] of every tile a causal-skipping kernel visits (those with some key k0 <= the block's
    last query), in a shuffled order (:func:`shuffled`)."""
    return shuffled([(q0, min(q0 + block_q, L), k0, min(k0 + block_k, L)) for q0 in range(0, L, block_q)
                     for k0 in range(0, min(q0 + block_q, L) if causal else L, block_k)], order_seed)


def shuffled(tiles, seed):
    """``tiles`` in an order drawn from ``seed``: a step must not depend on the order of the tiles."""
    return [tiles[t] for t in torch.randperm(len(tiles), generator=torch.Generator().manual_seed(seed)).tolist()]


def _visible(q0, q1, k0, k1, causal):
    """(q1 − q0, k1 − k0) bool, True where query i may see key j."""
    i, j = torch.arange(q0, q1)[:, None], torch.arange(k0, k1)[None, :]
    return (j <= i) if causal else torch.ones(q1 - q0, k1 - k0, dtype=torch.bool)


def fold_tiles(case, tiles, call):
    """The grader's forward loop over ``tiles`` [(q0, q1, k0, k1)]: each query block starts from the case's prior
    state (``m0``, ``l0``, ``acc0``: nothing seen, or keys seen elsewhere) and ``call(m, l, acc, q0, q1, k0, k1)``
    (the learner's step on that tile) returns the new state; then out = acc / l, lse = m + log l."""
    i = case.inputs
    out, lse = torch.empty_like(i["q"][..., :1].expand_as(i["v"])), torch.empty(i["q"].shape[:-1], dtype=i["q"].dtype)
    state = {}
    for q0, q1, k0, k1 in tiles:
        m, l, acc = state.get(q0) or (i[n][..., q0:q1, :].clone() for n in ("m0", "l0", "acc0"))
        state[q0] = call(m, l, acc, q0, q1, k0, k1)
    for q0, (m, l, acc) in state.items():
        out[..., q0:q0 + m.shape[-2], :] = acc / l
        lse[..., q0:q0 + m.shape[-2]] = (m + torch.log(l)).squeeze(-1)
    return {"out": out, "lse": lse}


def _fwd_drive(step, case):
    i, p = case.inputs, case.params
    return fold_tiles(case, tile_grid(i["q"].shape[-2], p["block_q"], p["block_k"], p["causal"], p["order"]),
                      lambda m, l, acc, q0, q1, k0, k1: step(
                          m, l, acc, i["q"][..., q0:q1, :].clone(), i["k"][..., k0:k1, :].clone(),
                          i["v"][..., k0:k1, :].clone(), _visible(q0, q1, k0, k1, p["causal"])))


def _fwd_step(m, l, acc, q_i, k_j, v_j, visible, *, scale=True, mask=True, **kw):
    """The reference tile step (and its mistakes): S = q_i k_jᵀ/√d, −∞ where hidden, then 8.1's update."""
    s = q_i @ k_j.transpose(-2, -1) / (math.sqrt(q_i.shape[-1]) if scale else 1.0)
    return _step_ref(m, l, acc, s.masked_fill(~visible, -_INF) if mask else s, v_j, **kw)


def prior_state(gen, B, H, L, dv):
    """m0, l0 (B, H, L, 1), acc0 (B, H, L, dv): for about half the rows a state of keys seen elsewhere, for the
    others the empty state (−∞, 0, 0)."""
    seen = torch.rand(B, H, L, 1, generator=gen) < 0.5
    m0 = torch.where(seen, torch.randn(B, H, L, 1, generator=gen, dtype=_F64), -_INF)
    l0 = torch.where(seen, torch.rand(B, H, L, 1, generator=gen, dtype=_F64) * 3 + 0.5, 0.0)
    return {"m0": m0, "l0": l0, "acc0": torch.randn(B, H, L, dv, generator=gen, dtype=_F64) * l0}


def _tiled_cases(gen):
    out = []
    for B, H, L, d, bq, bk, causal in [(1, 2, 23, 4, 6, 4, False), (2, 1, 21, 3, 5, 3, True),
                                       (1, 3, 20, 2, 3, 7, True), (1, 1, 17, 3, 8, 5, True)]:
        qkv = {n: torch.randn(B, H, L, d, generator=gen, dtype=_F64) for n in "qkv"}
        out.append(Case(f"B={B}, H={H}, L={L}, d={d}, block_q={bq}, block_k={bk}, causal={causal}",
                        {**qkv, **prior_state(gen, B, H, L, d)},
                        {"causal": causal, "block_q": bq, "block_k": bk, "order": randint(gen, 0, 2**31)}))
    return out


def attention_after_prior(case, visible, *, scale=True):
    """Dense, from the definition: softmax over the row's visible keys and one more 'key' standing for the
    prior state, score m0 + log l0 and value acc0 / l0. Returns {"out", "lse"}."""
    i = case.inputs
    s = (i["q"] @ i["k"].transpose(-2, -1) / (math.sqrt(i["q"].shape[-1]) if scale else 1.0)).masked_fill(~visible, -_INF)
    prior = i["m0"] + torch.log(i["l0"])                                      # −∞ where nothing was seen
    lse = torch.logsumexp(torch.cat([s, prior], -1), -1)
    out = torch.exp(s - lse[..., None]) @ i["v"] + torch.exp(prior - lse[..., None]) * torch.nan_to_num(i["acc0"] / i["l0"])
    return {"out": out, "lse": lse}


def _tiled_expected(case):
    L = case.inputs["q"].shape[-2]
    return attention_after_prior(case, _visible(0, L, 0, L, case.params["causal"]))


def _tiled_judge(got, want, case):
    if close(got["out"], want["out"]) and close(got["lse"], want["lse"]):
        return Verdict(True)
    if _has_nan(got):
        return Verdict(False, _NAN_HINT)
    drive = lambda **kw: _fwd_drive(lambda *a: _fwd_step(*a, **kw), case)  # noqa: E731
    cands = [(_RESCALE_HINT, drive(rescale_acc=False)), (_RESCALE_HINT, drive(rescale_acc=False, rescale_l=False)),
             ("the denominator l is not rescaled: l_new = exp(m − m_new) · l + rowsum(P̃).", drive(rescale_l=False)),
             ("the scores are not scaled: multiply q_i k_jᵀ by 1/√d.", drive(scale=False))]
    if case.params["causal"]:
        cands.append(("`visible` is ignored: put −∞ in the scores where it is False (key j in the future of "
                      "query i), before the max and the exponentials.", drive(mask=False)))
    return _first(got, cands, "the step must fold the tile into the state it is given (it may already hold keys "
                              "from elsewhere): m_new = max(m, rowmax(S)), α = exp(m − m_new), "
                              "l_new = α·l + rowsum(P̃), acc_new = α·acc + P̃ v_j.")


# ---- 08_backward_from_lse (dense) and 08_tiled_backward (the grader drives the tiles) --------------------

def _bwd_tile(q_i, k_j, v_j, do_i, lse_i, D_i, visible, *, p="lse", use_D=True, scale_ds=True, mask=True):
    """The backward's contributions of one tile (the whole matrix is one tile too), and its mistakes: ``p``
    "lse" (P = exp(S − L)), "tile" (normalised by the tile's own row sums) or "exp"; ``use_D``; ``scale_ds``;
    ``mask``. Returns (dq_i, dk_j, dv_j)."""
    scale = 1 / math.sqrt(q_i.shape[-1])
    s = q_i @ k_j.transpose(-2, -1) * scale
    s = s.masked_fill(~visible, -_INF) if mask else s
    if p == "lse":
        P = torch.exp(s - lse_i[..., None])
    elif p == "tile":
        e = torch.exp(s - s.amax(-1, keepdim=True).clamp(min=-1e300))
        P = e / e.sum(-1, keepdim=True)
    else:
        P = torch.exp(s)
    dS = P * (do_i @ v_j.transpose(-2, -1) - (D_i[..., None] if use_D else 0.0)) * (scale if scale_ds else 1.0)
    return dS @ k_j, dS.transpose(-2, -1) @ q_i, P.transpose(-2, -1) @ do_i


def _grads(case, **kw):
    """The dense formula with the case's lse and D (D = rowsum(dout ∘ out) where the case gives ``out``)."""
    i = case.inputs
    L = i["q"].shape[-2]
    D = i["D"] if "D" in i else (i["dout"] * i["out"]).sum(-1)
    dq, dk, dv = _bwd_tile(i["q"], i["k"], i["v"], i["dout"], i["lse"], D, _visible(0, L, 0, L, case.params["causal"]),
                           **kw)
    return {"dq": dq, "dk": dk, "dv": dv}


def _true_grads(case):
    """Autograd of the explicit forward: what a backward that ignores the given lse (and out) returns."""
    i = case.inputs
    q, k, v = (i[n].clone().requires_grad_() for n in "qkv")
    out, _, _ = _attn_ref(q, k, v, case.params["causal"])
    return dict(zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), i["dout"])))


_IGNORED = ("right gradients of attention, but not from the lse (and out/D) this case gives you: the grader passes "
            "a shifted lse and another out/D here and expects P = exp(S − lse) and D as given — recompute P from "
            "them, not by a forward pass (or autograd) of your own.")


def _perturb(gen, lse, shape):
    """A shifted lse, and a per-row offset: the 'perturbed but consistent' inputs of a case."""
    return lse + torch.rand(lse.shape, generator=gen, dtype=_F64) * 2 - 1, torch.randn(shape, generator=gen, dtype=_F64)


def _bwd_cases(gen):
    out = []
    for B, H, L, d, causal, perturbed in [(1, 2, 6, 4, False, False), (2, 1, 9, 3, True, False),
                                          (1, 1, 5, 8, True, True), (1, 2, 7, 3, False, True)]:
        q, k, v, dout = (torch.randn(B, H, L, d, generator=gen, dtype=_F64) for _ in range(4))
        o, lse, _ = _attn_ref(q, k, v, causal)
        if perturbed:
            lse, noise = _perturb(gen, lse, o.shape)
            o = o + noise
        out.append(Case(f"B={B}, H={H}, L={L}, d={d}, causal={causal}" + (", lse and out changed" if perturbed else ""),
                        {"q": q, "k": k, "v": v, "out": o, "lse": lse, "dout": dout},
                        {"causal": causal, "perturbed": perturbed}))
    return out


def _bwd_answer(fn, case):
    i = case.inputs
    dq, dk, dv = fn(i["q"], i["k"], i["v"], i["out"], i["lse"], i["dout"], case.params["causal"])
    return {"dq": dq, "dk": dk, "dv": dv}


def _bwd_judge(got, want, case):
    ok = {key: close(got[key], want[key]) for key in want}
    if all(ok.values()):
        return Verdict(True)
    if case.params["perturbed"] and all(_same(got[key], t) for key, t in _true_grads(case).items()):
        return Verdict(False, _IGNORED)
    for hint, kw in [
        ("P must be recomputed as exp(S − L) with the saved logsumexp L; exp(S) alone is not normalised.",
         dict(p="exp")),
        ("dS = P ∘ (dP − D) with D = rowsum(dO ∘ O): you left out D (the softmax Jacobian's second term).",
         dict(use_D=False)),
        ("dQ and dK need the scale too: S = Q Kᵀ · scale, so dQ = dS K · scale and dK = dSᵀ Q · scale.",
         dict(scale_ds=False)),
    ]:
        cand = _grads(case, **kw)
        if all(_same(got[key], cand[key]) for key in ("dq", "dk", "dv") if not ok[key]):
            return Verdict(False, hint)
    if ok["dv"]:
        return Verdict(False, "dV is right; for dQ, dK: dP = dO Vᵀ, dS = P ∘ (dP − D), dQ = dS K·scale, dK = dSᵀ Q·scale.")
    return Verdict(False, "recompute S = Q Kᵀ·scale (masked), P = exp(S − L), then dV = Pᵀ dO.")


def _tb_cases(gen):
    def make(g):
        B, H = choice(g, ((1, 1), (1, 2), (2, 1)))
        d, bq, bk = randint(g, 2, 4), randint(g, 3, 6), randint(g, 3, 6)
        L = randint(g, 3 * max(bq, bk) + 1, 40)
        return (B, H, L, d, bq, bk), L % bq != 0 and L % bk != 0 and bq != bk       # ragged, unequal blocks
    out = []
    for causal, perturbed in ((False, False), (True, False), (True, True)):
        (B, H, L, d, bq, bk), _ = draw(gen, make, lambda x: x[1])
        q, k, v, dout = (torch.randn(B, H, L, d, generator=gen, dtype=_F64) for _ in range(4))
        o, lse, _ = _attn_ref(q, k, v, causal)
        D = (dout * o).sum(-1)
        if perturbed:
            lse, shift = _perturb(gen, lse, D.shape)
            D = D + shift
        out.append(Case(f"B={B}, H={H}, L={L}, d={d}, block_q={bq}, block_k={bk}, causal={causal}"
                        + (", lse and D changed" if perturbed else ""),
                        {"q": q, "k": k, "v": v, "lse": lse, "D": D, "dout": dout},
                        {"causal": causal, "perturbed": perturbed, "block_q": bq, "block_k": bk,
                         "order": randint(gen, 0, 2**31)}))
    return out


def _tb_drive(step, case):
    """The grader's loop: every tile a causal-skipping kernel visits, in a shuffled order; ``step`` returns the
    tile's contributions, which the grader adds into dQ_i, dK_j, dV_j."""
    i, p = case.inputs, case.params
    q, k, v, dout, lse, D = (i[n] for n in ("q", "k", "v", "dout", "lse", "D"))
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for q0, q1, k0, k1 in tile_grid(q.shape[-2], p["block_q"], p["block_k"], p["causal"], p["order"]):
        a, b, c = step(q[..., q0:q1, :].clone(), k[..., k0:k1, :].clone(), v[..., k0:k1, :].clone(),
                       dout[..., q0:q1, :].clone(), lse[..., q0:q1].clone(), D[..., q0:q1].clone(),
                       _visible(q0, q1, k0, k1, p["causal"]))
        dq[..., q0:q1, :] += a
        dk[..., k0:k1, :] += b
        dv[..., k0:k1, :] += c
    return {"dq": dq, "dk": dk, "dv": dv}


def _tb_judge(got, want, case):
    ok = {key: close(got[key], want[key]) for key in ("dq", "dk", "dv")}
    if all(ok.values()):
        return Verdict(True)
    if _has_nan(got):
        return Verdict(False, "NaN: recompute P = exp(S − lse_i) with the lse you are given (finite for every row); "
                              "a row normalised by its own maximum over a tile of −∞ gives exp(−∞ + ∞).")
    for hint, kw in [
        ("D_i is missing: dS = P ∘ (dP − D_i), with the D_i you are given.", dict(use_D=False)),
        ("P must be recomputed from the given lse, P = exp(S − lse_i), not normalised by each tile's own row sums: a "
         "tile holds only some of the row's keys, the lse holds all of them.", dict(p="tile")),
        ("P must be recomputed as exp(S − lse_i) with the given lse; exp(S) alone is not normalised.", dict(p="exp")),
        ("the scale is missing in dS: S = Q Kᵀ · scale, so dq_i = dS K_j · scale and dk_j = dSᵀ Q_i · scale.",
         dict(scale_ds=False)),
        ("`visible` is ignored: put −∞ in S where it is False (key j in the future of query i), so that P is 0 there.",
         dict(mask=False)),
    ]:
        cand = _tb_drive(lambda *a: _bwd_tile(*a, **kw), case)
        if all(_same(got[key], cand[key]) for key in ("dq", "dk", "dv") if not ok[key]):
            return Verdict(False, hint)
    if ok["dv"]:
        return Verdict(False, "dv_j is right; for dq_i, dk_j: dP = dO_i V_jᵀ, dS = P ∘ (dP − D_i), dq_i = dS K_j·scale, "
                              "dk_j = dSᵀ Q_i·scale.")
    return Verdict(False, "per tile: S = Q_i K_jᵀ·scale (−∞ where not visible), P = exp(S − lse_i), dv_j = Pᵀ dO_i.")


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
    Exercise("08_tiled_forward", 3, "The tile step of the tiled forward",
             "a function flash_tile(m, l, acc, q_i, k_j, v_j, visible) -> (m_new, l_new, acc_new)",
             _tiled_cases, _fwd_drive, _tiled_expected, _tiled_judge,
             forbidden=FORBID_SDPA + FORBID_COURSE + FORBID_SOFTMAX, kind="build"),
    Exercise("08_backward_from_lse", 3, "Backward from the output and the logsumexp",
             "a function attention_backward(q, k, v, out, lse, dout, causal) -> (dq, dk, dv)",
             _bwd_cases, _bwd_answer, _grads, _bwd_judge,
             forbidden=FORBID_SDPA + FORBID_COURSE + FORBID_SOFTMAX, kind="build"),
    Exercise("08_causal_tiles", 1, "How many tiles does causal attention compute?",
             "a function causal_tiles(L, block_q, block_k) -> int",
             _tiles_cases, _tiles_answer, _tiles_expected, _tiles_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("08_hbm_traffic", 2, "Slow-memory traffic of the tiled forward",
             "a function tiled_traffic(N, d, block_q, block_k) -> int",
             _io_cases, _io_answer, _io_expected, _io_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("08_tiled_backward", 4, "FlashAttention's tiled, recomputing backward: the tile step",
             "a function tile_step(q_i, k_j, v_j, do_i, lse_i, D_i, visible) -> (dq_i, dk_j, dv_j)",
             _tb_cases, _tb_drive, _grads, _tb_judge,
             forbidden=FORBID_SDPA + FORBID_COURSE + FORBID_SOFTMAX, kind="build"),
]
