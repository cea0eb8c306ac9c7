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

from ..spec import Case, Exercise, FORBID_COURSE, Verdict, close, diagnose, randint, choice

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
            return Verdict(False, "right on every row where both parts saw keys (the sigmoid form of "
                                  "ring-flash-attention's update is fine there), but a part with no visible key "
                                  "has lse = −∞, and there your merge gives NaN or a wrong value: the course's ring "
                                  "starts from lse = −∞, so handle it (torch.logaddexp, or weigh by e^{lse_i − lse} "
                                  "with a row of no keys at all kept at zero).")
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
    out = []
    for P in (2, randint(gen, 3, 4), randint(gen, 3, 5), randint(gen, 4, 8)):
        r, L = randint(gen, 0, P - 1), 2 * P * randint(gen, 1, 4)
        out.append(Case(f"rank {r} of P={P}, L={L}", params={"rank": r, "world": P, "L": L}))
    return out


def _zig_answer(fn, case):
    p = case.params
    return {"positions": torch.as_tensor(fn(p["rank"], p["world"], p["L"]), dtype=torch.int64).reshape(-1)}


def _zig(rank, world, L, first, second):
    c = L // (2 * world)
    return torch.cat([torch.arange(first * c, (first + 1) * c), torch.arange(second * c, (second + 1) * c)])


def _zig_expected(case):
    p = case.params
    return {"positions": _zig(p["rank"], p["world"], p["L"], p["rank"], 2 * p["world"] - 1 - p["rank"])}


def _zig_judge(got, want, case):
    if close(got["positions"], want["positions"]):
        return Verdict(True)
    r, P, L = case.params["rank"], case.params["world"], case.params["L"]
    c = L // P
    return diagnose(got["positions"], [
        ("that is the contiguous layout: zigzag cuts L into 2P chunks and gives rank r chunks r and 2P−1−r.",
         torch.arange(r * c, (r + 1) * c)),
        ("right chunks, wrong order: concatenate chunk r first, then chunk 2P−1−r.",
         _zig(r, P, L, 2 * P - 1 - r, r)),
        ("the mirror of chunk r among 2P chunks is 2P−1−r, not P−1−r.", _zig(r, P, L, r, P - 1 - r)),
    ], "rank r holds chunk r and chunk 2P−1−r of the 2P equal chunks, in that order.", same=close)


# ---- 13_ring_bytes ------------------------------------------------------------------------------------

def _bytes_cases(gen):
    P1, P2, P3 = choice(gen, (4, 8)), choice(gen, (4, 8, 16)), randint(gen, 3, 7)     # P = 2: P hops = a shard of L
    cfgs = [(P1, 1, choice(gen, (8, 16)), P1 * 512 * randint(gen, 1, 8), 64, 2),
            (P2, randint(gen, 2, 4), 32, P2 * 1024 * randint(gen, 4, 32), 128, 2),
            (P3, 1, randint(gen, 2, 9), P3 * randint(gen, 4, 40), 16, 4)]
    return [Case(f"P={P}, B={B}, H={H}, L={L}, E={E}, {nb} B/elem",
                 params={"world": P, "batch": B, "heads": H, "seq_len": L, "head_dim": E, "elem_bytes": nb})
            for P, B, H, L, E, nb in cfgs]


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


def _bytes_judge(got, want, case):
    g, p = int(got["bytes"]), case.params
    if g == int(want["bytes"]):
        return Verdict(True)
    for hint, value in [
        ("P hops would send a shard back home: after P − 1 hops every rank has seen every shard.",
         _bytes_formula(**p, hops=p["world"])),
        ("both K and V travel: 2 tensors per hop.", _bytes_formula(**p, tensors=1)),
        ("a shard holds L/P positions, not L.", _bytes_formula(**p, length=p["seq_len"])),
        ("that is Ulysses' volume (4·(P−1)/P of a shard); the ring sends its K and V shard P − 1 times.",
         4 * (p["world"] - 1) * p["batch"] * p["heads"] * (p["seq_len"] // p["world"]) * p["head_dim"]
         * p["elem_bytes"] // p["world"]),
    ]:
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
]
