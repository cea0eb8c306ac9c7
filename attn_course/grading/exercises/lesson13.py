"""Exercise set 13 — attention across processes (solutions/13_ring_attention_across_processes.ipynb).

Everything here runs in one process: the exercises are the pieces of ring attention that decide
whether it is exact and balanced — the log-sum-exp merge, the ring schedule, the zigzag layout, the
bytes on the wire and the causal skip rule. References are computed here from the definitions, in
float64, independently of ``attn_course.ring``; hints are detected by computing what each common
mistake returns on the same inputs.
"""
from __future__ import annotations

import math

import torch

from ..spec import Case, Exercise, FORBID_COURSE, Verdict, choice, close, diagnose, distinct, draw, first_match, randint
from .lesson12 import counted_flops

SANDBOX_ALLOW = ("attn_course.ring_sim",)      # the simulated ring the grader hands each rank
__all__ = ["EXERCISES"]

_F64 = torch.float64
_NEG_INF = float("-inf")


# ---- 13_merge_partials --------------------------------------------------------------------------------

def _partial(q, k, v, keep):
    """Attention of q over the keys with ``keep`` (bool (Lq, Lk)), normalised over them, and its lse."""
    s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~keep, _NEG_INF)
    lse = torch.logsumexp(s, dim=-1)
    w = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    return w @ v, lse


def _merge_ref(o1, l1, o2, l2):
    lse = torch.logaddexp(l1, l2)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return torch.exp(l1 - safe)[..., None] * o1 + torch.exp(l2 - safe)[..., None] * o2, lse


def _merge_cases(gen):
    out = []
    for Lq, Lk, E, big in [(4, 6, 8, 1.0), (5, 9, 4, 1.0), (3, 8, 8, 60.0)]:   # big: logits in the hundreds
        q = torch.randn(Lq, E, generator=gen, dtype=_F64) * big
        k = torch.randn(Lk, E, generator=gen, dtype=_F64) * big
        v = torch.randn(Lk, 3, generator=gen, dtype=_F64)
        split = Lk // 2
        keep = torch.rand(Lq, Lk, generator=gen) < 0.7
        keep[0, :split] = False                      # row 0 sees no key of the first part
        if Lq == 5:
            keep[1] = False                          # row 1 sees no key at all
        o1, l1 = _partial(q, k[:split], v[:split], keep[:, :split])
        o2, l2 = _partial(q, k[split:], v[split:], keep[:, split:])
        name = f"Lq={Lq}, two parts of {split} and {Lk - split} keys" + (", logits in the thousands" if big > 1 else "")
        out.append(Case(name, {"out1": o1, "lse1": l1, "out2": o2, "lse2": l2}))
    return out


def _merge_answer(fn, case):
    i = case.inputs
    out, lse = fn(i["out1"], i["lse1"], i["out2"], i["lse2"])
    return {"out": out, "lse": lse}


def _merge_expected(case):
    i = case.inputs
    out, lse = _merge_ref(i["out1"], i["lse1"], i["out2"], i["lse2"])
    return {"out": out, "lse": lse}


def _merge_judge(got, want, case):
    ok_out = close(got["out"], want["out"], atol=1e-8, rtol=1e-6)
    ok_lse = bool(torch.equal(torch.isinf(got["lse"]), torch.isinf(want["lse"]))) and close(
        torch.where(torch.isinf(want["lse"]), 0.0, got["lse"]), torch.where(torch.isinf(want["lse"]), 0.0, want["lse"]))
    if ok_out and ok_lse:
        return Verdict(True)
    i = case.inputs
    o1, l1, o2, l2 = i["out1"], i["lse1"], i["out2"], i["lse2"]
    empty = torch.isinf(l1) | torch.isinf(l2)                        # rows where one part saw no key (lse = −∞)
    if empty.any() and (~empty).any():
        fine = ~empty
        right_elsewhere = close(got["out"][fine], want["out"][fine], atol=1e-8, rtol=1e-6) and close(
            got["lse"][fine], want["lse"][fine])
        if right_elsewhere:
            return Verdict(False, "right on every row where both parts saw keys, but a part with no visible key "
                                  "has lse = −∞, and there your merge gives NaN or a wrong value (the sigmoid form "
                                  "of ring-flash-attention's update, exact elsewhere, computes −∞ − (−∞) there): "
                                  "the course's ring starts from lse = −∞, so handle it — torch.logaddexp, and "
                                  "weights e^{lse_i − lse} with a row of no keys at all kept at zero.")
    if ok_out:
        return diagnose(got["lse"], [
            ("the merged lse is log(e^{lse1} + e^{lse2}) (torch.logaddexp), not the max of the two.",
             torch.maximum(l1, l2)),
            ("the merged lse is log(e^{lse1} + e^{lse2}), not their sum.", l1 + l2),
        ], "the output is right; the merged lse must be log(e^{lse1} + e^{lse2}).")
    if torch.isnan(got["out"]).any() and not torch.isnan(want["out"]).any():
        return Verdict(False, "NaN: e^{lse} overflows for large logits and −∞ − (−∞) is NaN for an empty row — "
                              "weigh each part by e^{lse_i − lse} with lse = logaddexp(lse1, lse2), and keep rows "
                              "with no key at all at zero.")
    return diagnose(got["out"], [
        ("you averaged the two outputs: each part is normalised over its OWN keys, so they must be weighed "
         "by their share of the total mass, e^{lse_i − lse}.", (o1 + o2) / 2),
        ("you added the two outputs: each is already normalised; weigh them by e^{lse_i − lse}.", o1 + o2),
        ("each part's weight is e^{lse_i − lse}: the exponent must be the part's lse minus the merged lse.",
         torch.exp(l2 - torch.logaddexp(l1, l2))[..., None] * o1 + torch.exp(l1 - torch.logaddexp(l1, l2))[..., None] * o2),
    ], "out = e^{lse1 − lse}·out1 + e^{lse2 − lse}·out2 with lse = logaddexp(lse1, lse2).")


# ---- 13_ring_schedule ---------------------------------------------------------------------------------

def _sched_cases(gen):
    return [Case(f"P={P}", params={"world": P})                    # P = 2 cannot tell r+t from r−t
            for P in (randint(gen, 3, 4), randint(gen, 5, 6), randint(gen, 7, 9))]


def _sched_answer(fn, case):
    P = case.params["world"]
    return {"src": torch.tensor([[int(fn(r, t, P)) for r in range(P)] for t in range(P)], dtype=torch.int64)}


def _sched_expected(case):
    P = case.params["world"]
    return {"src": torch.tensor([[(r - t) % P for r in range(P)] for t in range(P)], dtype=torch.int64)}


def _sched_judge(got, want, case):
    if close(got["src"], want["src"]):
        return Verdict(True)
    P = case.params["world"]
    grid = lambda f: torch.tensor([[f(r, t) for r in range(P)] for t in range(P)], dtype=torch.int64)  # noqa: E731
    return diagnose(got["src"], [
        ("wrong direction: each rank SENDS to rank r+1 and RECEIVES from r−1, so the shard arrives from "
         "ever lower ranks: (r − t) mod P.", grid(lambda r, t: (r + t) % P)),
        ("r − t goes negative: take it modulo P (Python's % already returns 0…P−1).", grid(lambda r, t: r - t)),
        ("at step t the shard has made t hops: it started on rank (r − t) mod P, not r − t − 1.",
         grid(lambda r, t: (r - t - 1) % P)),
    ], "rank r holds, at step t, the K/V shard that started on rank (r − t) mod P.", same=close)


# ---- 13_zigzag_positions ------------------------------------------------------------------------------

def _zig_cases(gen):
    def one(gen, P):
        r, L = randint(gen, 0, P - 1), 2 * P * randint(gen, 1, 4)
        case = Case(f"rank {r} of P={P}, L={L}", params={"rank": r, "world": P, "L": L})
        return case, distinct(*(tuple(x.tolist()) for x in [_zig_expected(case)["positions"]] + _zig_mistakes(r, P, L)))
    # on no case do two of the mistakes the judge names give the same positions (P = 2, rank 0: the
    # contiguous layout is chunks 0, 1 — and so is the mirror P − 1 − r), so each hint can be told apart
    return [draw(gen, lambda g: one(g, P), lambda x: x[1])[0]
            for P in (2, randint(gen, 3, 4), randint(gen, 3, 5), randint(gen, 4, 8))]


def _zig_answer(fn, case):
    p = case.params
    return {"positions": torch.as_tensor(fn(p["rank"], p["world"], p["L"]), dtype=torch.int64).reshape(-1)}


def _zig(rank, world, L, first, second):
    c = L // (2 * world)
    return torch.cat([torch.arange(first * c, (first + 1) * c), torch.arange(second * c, (second + 1) * c)])


def _zig_expected(case):
    p = case.params
    return {"positions": _zig(p["rank"], p["world"], p["L"], p["rank"], 2 * p["world"] - 1 - p["rank"])}


def _zig_mistakes(r, P, L):
    """The positions each mistake the judge names gives, in the order of its hints."""
    c = L // P
    return [torch.arange(r * c, (r + 1) * c), _zig(r, P, L, 2 * P - 1 - r, r), _zig(r, P, L, r, P - 1 - r)]


_ZIG_HINTS = ("that is the contiguous layout: zigzag cuts L into 2P chunks and gives rank r chunks r and 2P−1−r.",
              "right chunks, wrong order: concatenate chunk r first, then chunk 2P−1−r.",
              "the mirror of chunk r among 2P chunks is 2P−1−r, not P−1−r.")


def _zig_judge(got, want, case):
    if close(got["positions"], want["positions"]):
        return Verdict(True)
    r, P, L = case.params["rank"], case.params["world"], case.params["L"]
    return diagnose(got["positions"], list(zip(_ZIG_HINTS, _zig_mistakes(r, P, L))),
                    "rank r holds chunk r and chunk 2P−1−r of the 2P equal chunks, in that order.", same=close)


# ---- 13_ring_bytes ------------------------------------------------------------------------------------

def _bytes_cases(gen):
    def one(gen, P, B, H, per_rank, E, nb):
        p = {"world": P, "batch": B, "heads": H, "seq_len": P * per_rank, "head_dim": E, "elem_bytes": nb}
        return p, distinct(_bytes_formula(**p), *(value for _, value in _bytes_mistakes(p)))
    # P = 2: P hops give a shard of L; P = 4: Ulysses' volume equals K alone — on no case do two mistakes the
    # judge names coincide (or one coincide with the answer), so each hint can be told apart
    makers = [lambda g: one(g, choice(g, (4, 8, 16)), 1, choice(g, (8, 16)), 512 * randint(g, 1, 8), 64, 2),
              lambda g: one(g, choice(g, (4, 8, 16)), randint(g, 2, 4), 32, 1024 * randint(g, 4, 32), 128, 2),
              lambda g: one(g, randint(g, 3, 7), 1, randint(g, 2, 9), randint(g, 4, 40), 16, 4)]
    params = [draw(gen, make, lambda x: x[1])[0] for make in makers]
    return [Case(f"P={p['world']}, B={p['batch']}, H={p['heads']}, L={p['seq_len']}, E={p['head_dim']}, "
                 f"{p['elem_bytes']} B/elem", params=p) for p in params]


def _bytes_answer(fn, case):
    p = case.params
    return {"bytes": torch.tensor(int(fn(p["world"], p["batch"], p["heads"], p["seq_len"], p["head_dim"],
                                         p["elem_bytes"])), dtype=torch.int64)}


def _bytes_formula(world, batch, heads, seq_len, head_dim, elem_bytes, *, hops=None, tensors=2, length=None):
    hops = world - 1 if hops is None else hops
    length = seq_len // world if length is None else length
    return hops * tensors * batch * heads * length * head_dim * elem_bytes


def _bytes_expected(case):
    return {"bytes": torch.tensor(_bytes_formula(**case.params), dtype=torch.int64)}


def _bytes_mistakes(p):
    """(hint, value) for each mistake the judge names."""
    return [
        ("P hops would send a shard back home: after P − 1 hops every rank has seen every shard.",
         _bytes_formula(**p, hops=p["world"])),
        ("both K and V travel: 2 tensors per hop.", _bytes_formula(**p, tensors=1)),
        ("a shard holds L/P positions, not L.", _bytes_formula(**p, length=p["seq_len"])),
        ("that is Ulysses' volume (4·(P−1)/P of a shard); the ring sends its K and V shard P − 1 times.",
         4 * (p["world"] - 1) * p["batch"] * p["heads"] * (p["seq_len"] // p["world"]) * p["head_dim"]
         * p["elem_bytes"] // p["world"]),
    ]


def _bytes_judge(got, want, case):
    g, p = int(got["bytes"]), case.params
    if g == int(want["bytes"]):
        return Verdict(True)
    for hint, value in _bytes_mistakes(p):
        if g == value:
            return Verdict(False, hint)
    return Verdict(False, "bytes = (P − 1) hops × 2 tensors (K, V) × B·H·(L/P)·E elements × bytes per element.")


# ---- 13_causal_blocks (find the bug) ------------------------------------------------------------------

SKIP, DIAGONAL, FULL = 0, 1, 2


def _blocks_cases(gen):
    return [Case(f"contiguous layout, P={P}", params={"world": P})
            for P in (randint(gen, 2, 3), randint(gen, 4, 5), randint(gen, 6, 8))]


def _blocks_answer(fn, case):
    P = case.params["world"]
    return {"kind": torch.tensor([[int(fn(r, s, P)) for s in range(P)] for r in range(P)], dtype=torch.int64)}


def _blocks_grid(P, rule):
    return torch.tensor([[rule(r, s) for s in range(P)] for r in range(P)], dtype=torch.int64)


def _blocks_expected(case):
    return {"kind": _blocks_grid(case.params["world"], lambda r, s: FULL if s < r else DIAGONAL if s == r else SKIP)}


def _blocks_judge(got, want, case):
    if close(got["kind"], want["kind"]):
        return Verdict(True)
    P = case.params["world"]
    return diagnose(got["kind"], [
        ("still the bug: the skipped shards are the ones from LATER ranks (their keys are in the queries' "
         "future), not the earlier ones.", _blocks_grid(P, lambda r, s: FULL if s > r else DIAGONAL if s == r else SKIP)),
        ("the rank's own shard must be causal on its diagonal (DIAGONAL), not fully visible.",
         _blocks_grid(P, lambda r, s: FULL if s <= r else SKIP)),
        ("the rank's own shard is needed (its diagonal block), it cannot be skipped.",
         _blocks_grid(P, lambda r, s: FULL if s < r else SKIP)),
        ("with a causal mask, shards from later ranks are never needed: skip them instead of masking them.",
         _blocks_grid(P, lambda r, s: FULL if s < r else DIAGONAL)),
    ], "query shard r needs shards s < r fully, its own shard causally, and never s > r.", same=close)


# ---- 13_ring_loop (build: the grader drives the ring, the learner writes one rank's step) --------------------

def _loop_cases(gen):
    out = []
    for causal in (False, True, True):
        P, c, E, Ev = randint(gen, 3, 5), randint(gen, 3, 6), randint(gen, 3, 6), randint(gen, 3, 6)
        B, H = randint(gen, 1, 2), randint(gen, 1, 2)
        L = P * c
        q, k = (torch.randn(B, H, L, E, generator=gen, dtype=_F64) for _ in range(2))
        v = torch.randn(B, H, L, Ev, generator=gen, dtype=_F64)
        out.append(Case(f"P={P} ranks, L={L}, (B, H, E, Ev)=({B}, {H}, {E}, {Ev}), causal={causal}",
                        {"q": q, "k": k, "v": v}, {"world": P, "causal": causal}))
    return out


def _block_flops(case):
    """Counted FLOPs of one block: q kᵀ and P·V, 2·B·H·c²·(E + Ev)."""
    B, H, L, E = case.inputs["q"].shape
    return 2 * B * H * (L // case.params["world"]) ** 2 * (E + case.inputs["v"].shape[-1])


def _loop_answer(fn, case):
    """Drives the ring: at step t rank r holds the shard of rank (r − t) mod P and calls
    ``fn(q_r, k, v, (out, lse), r, t, P, causal) -> (out, lse)``; the counted FLOPs of every call are kept."""
    i, P, causal = case.inputs, case.params["world"], case.params["causal"]
    qs, ks, vs = (list(x.chunk(P, dim=-2)) for x in (i["q"], i["k"], i["v"]))
    shapes = (qs[0].shape[:-1] + vs[0].shape[-1:], qs[0].shape[:-1])
    outs, lses, flops = [], [], torch.zeros(P, P, dtype=torch.int64)
    for r in range(P):
        state = (torch.zeros(shapes[0], dtype=_F64), torch.full(shapes[1], _NEG_INF, dtype=_F64))
        for t in range(P):
            src = (r - t) % P
            state, flops[r, t] = counted_flops(fn, qs[r].clone(), ks[src].clone(), vs[src].clone(), state, r, t, P,
                                               causal)
            if not (type(state) is tuple and len(state) == 2 and all(type(x) is torch.Tensor for x in state)
                    and tuple(x.shape for x in state) == shapes):
                raise ValueError(f"rank {r}, step {t}: return the state as a tuple (out {tuple(shapes[0])}, lse "
                                 f"{tuple(shapes[1])}) of two tensors — nothing else travels with it")
        outs.append(state[0])
        lses.append(state[1])
    return {"out": torch.cat(outs, dim=-2), "lse": torch.cat(lses, dim=-1), "flops": flops}


def _loop_expected(case):
    i, P = case.inputs, case.params["world"]
    L = i["q"].shape[-2]
    keep = torch.ones(L, L, dtype=torch.bool)
    if case.params["causal"]:
        keep = keep.tril()
    out, lse = _partial(i["q"], i["k"], i["v"], keep)                 # full attention, straight from the formula
    ranks = torch.arange(P)
    later = (ranks[:, None] - ranks[None, :]) % P > ranks[:, None]     # src = (r − t) mod P > r: a skipped shard
    blocks = torch.where(later & case.params["causal"], 0, _block_flops(case))
    return {"out": out, "lse": lse, "flops": blocks}


def _rule(r, s):
    """The causal rule of 13.5 (contiguous layout) for query shard r and key shard s."""
    return FULL if s < r else DIAGONAL if s == r else SKIP


def _ring_model(case, kind=None, merge="lse", scale=True):
    """What a ring loop returns when rank r treats the shard it holds at step t (the one of rank
    (r − t) mod P) by ``kind(r, t)`` and merges the blocks by ``merge``: {"out", "lse"} in fp64."""
    i, P, causal = case.inputs, case.params["world"], case.params["causal"]
    qs, ks, vs = (list(x.chunk(P, dim=-2)) for x in (i["q"], i["k"], i["v"]))
    c = qs[0].shape[-2]
    if kind is None:
        kind = (lambda r, t: _rule(r, (r - t) % P)) if causal else (lambda r, t: FULL)
    res = {"out": [], "lse": [], "lse max": [], "lse last": []}
    for r in range(P):
        blocks = []
        for t in range(P):
            s, how = (r - t) % P, kind(r, t)
            if how == SKIP:
                continue
            keep = torch.ones(c, c, dtype=torch.bool)
            q = qs[r] if scale else qs[r] * math.sqrt(qs[r].shape[-1])
            blocks.append(_partial(q, ks[s], vs[s], keep.tril() if how == DIAGONAL else keep))
        out = torch.zeros(*qs[r].shape[:-1], vs[0].shape[-1], dtype=_F64)
        lse = torch.full(qs[r].shape[:-1], _NEG_INF, dtype=_F64)
        for n, (o, l) in enumerate(blocks):
            if merge == "lse":
                out, lse = _merge_ref(out, lse, o, l)
            elif merge == "lse max":                                   # the running lse kept as a max
                out, lse = _merge_ref(out, lse, o, l)[0], torch.maximum(lse, l)
            else:                                                      # no lse: a mean, a running halving, a sum
                out = {"mean": out + o / len(blocks), "sum": out + o, "halves": o if n == 0 else (out + o) / 2}[merge]
                lse = torch.logaddexp(lse, l)
        res["out"].append(out)
        res["lse"].append(lse)
        res["lse max"].append(torch.stack([l for _, l in blocks]).amax(0) if blocks else lse)
        res["lse last"].append(blocks[-1][1] if blocks else lse)
    return {key: torch.cat(parts, dim=-2 if key == "out" else -1) for key, parts in res.items()}


def _loop_judge(got, want, case):
    P, causal, block = case.params["world"], case.params["causal"], _block_flops(case)
    ok_out = close(got["out"], want["out"], atol=1e-8, rtol=1e-6)
    ok_lse = close(got["lse"], want["lse"], atol=1e-8, rtol=1e-6)
    for (r, t), mine in zip(((r, t) for r in range(P) for t in range(P)), got["flops"].flatten().tolist()):
        if not (ok_out and ok_lse):
            break                                                      # wrong values: name the mistake below
        if mine > 1.5 * block:
            return Verdict(False, f"rank {r}, step {t} counted {mine:,} FLOPs, {mine / block:.1f}× one block's "
                                  f"(q kᵀ and P·V, 2·B·H·c²·(E + Ev) = {block:,}): a step attends to the ONE shard it "
                                  f"is given and merges it into the state.")
        if int(want["flops"][r, t]) == 0 and mine >= block // 4:
            return Verdict(False, f"rank {r}, step {t} holds the shard of rank {(r - t) % P}, a LATER rank: its keys "
                                  f"are all in the queries' future, so return the state unchanged without computing "
                                  f"the block (your step counted {mine:,} FLOPs; masking with −∞ does the work the "
                                  f"causal skip saves).")
    if ok_out and ok_lse:
        return Verdict(True)
    lse_max = "the running lse is logaddexp(lse, lse_block), not the max of the two."
    if ok_out:
        blocks = _ring_model(case)
        return diagnose(got["lse"], [(lse_max, blocks["lse max"]),
                                     ("return the MERGED lse, not the last block's.", blocks["lse last"])],
                        "the output is right; return the merged log-sum-exp too: lse ← logaddexp(lse, lse_block).")

    def model(**kw):
        return _ring_model(case, **kw)["out"]
    averaging = ("the blocks are merged without their log-sum-exps (an average or a sum): each block's output is "
                 "normalised over its OWN keys, so weigh it by its share of the mass — out ← e^{lse − lse_new}·out "
                 "+ e^{lse_b − lse_new}·out_b with lse_new = logaddexp(lse, lse_b).")
    cands = [(averaging, model(merge=m)) for m in ("mean", "halves", "sum")]
    cands.append((lse_max + " (The weights e^{lse − lse_new} then come out wrong.)", model(merge="lse max")))
    cands.append(("the scores are not scaled: multiply q kᵀ by 1/√E.", model(scale=False)))
    if causal:
        src = lambda r, t: (r - t) % P                                 # noqa: E731
        cands += [
            ("the diagonal block (the rank's own shard) must be causal: mask keys after the query inside it.",
             model(kind=lambda r, t: FULL if src(r, t) <= r else SKIP)),
            ("the causal mask is missing: skip the shards of later ranks and mask the diagonal block.",
             model(kind=lambda r, t: FULL)),
            ("shards of LATER ranks hold keys in the queries' future: skip them — or, if you skip by the shard's "
             "index, take (r − t) mod P: without the mod, r − t goes negative and every shard looks earlier.",
             model(kind=lambda r, t: DIAGONAL if src(r, t) == r else FULL)),
            ("the rank's own shard is needed (causally masked on its diagonal): it cannot be skipped.",
             model(kind=lambda r, t: FULL if src(r, t) < r else SKIP)),
            ("wrong shard index: at step t rank r holds the shard that started on rank (r − t) mod P (shards "
             "travel to r + 1), not (r + t) mod P — so the wrong blocks were skipped.",
             model(kind=lambda r, t: _rule(r, (r + t) % P))),
        ]
    hint = first_match(got["out"], cands)
    if hint is None and bool(torch.isnan(got["out"]).any()):
        hint = ("NaN: in a block where a query sees no key (all −∞) the softmax is NaN — skip blocks wholly "
                "in the future, and merge so that a part with lse = −∞ weighs e^{−∞} = 0 (start from out = 0, "
                "lse = −∞).")
    return Verdict(False, hint or "the output differs from full attention: at each step compute the block "
                                  "(q·kᵀ/√E, the causal rule of 13.5), its lse, and merge by log-sum-exp.")


EXERCISES = [
    Exercise("13_merge_partials", 3, "Merge two partial attentions by their log-sum-exp",
             "a function merge(out1, lse1, out2, lse2) -> (out, lse)",
             _merge_cases, _merge_answer, _merge_expected, _merge_judge, forbidden=FORBID_COURSE, kind="build"),
    Exercise("13_ring_schedule", 1, "Which K/V shard is on rank r at step t?",
             "a function shard_at(r, t, P) -> int",
             _sched_cases, _sched_answer, _sched_expected, _sched_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("13_zigzag_positions", 2, "The positions of a zigzag shard",
             "a function zigzag_positions(rank, world, L) -> LongTensor (L/P,)",
             _zig_cases, _zig_answer, _zig_expected, _zig_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("13_ring_bytes", 2, "Bytes one rank sends in a ring-attention forward",
             "a function ring_bytes(world, batch, heads, seq_len, head_dim, elem_bytes) -> int",
             _bytes_cases, _bytes_answer, _bytes_expected, _bytes_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("13_causal_blocks", 2, "Find the bug: the causal skip rule",
             "a function block_kind(rank, src, world) -> 0 (skip), 1 (diagonal) or 2 (full)",
             _blocks_cases, _blocks_answer, _blocks_expected, _blocks_judge, forbidden=FORBID_COURSE, kind="debug"),
    Exercise("13_ring_loop", 4, "One rank's step of the ring",
             "a function ring_step(q, k, v, state, rank, step, world, causal) -> state = (out, lse)",
             _loop_cases, _loop_answer, _loop_expected, _loop_judge, forbidden=FORBID_COURSE, kind="build"),
]
