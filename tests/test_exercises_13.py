"""Exercise set 13: reference solutions and other correct styles pass; each mistake fails with its hint."""
import math
from functools import partial

import pytest
import torch

import exercise_kit
from attn_course.grading.exercises import lesson13 as L13
from exercise_kit import assert_all_pass

assert_hint = partial(exercise_kit.assert_hint, every=False)


# ---- 13_merge_partials ----

def merge_ok(out1, lse1, out2, lse2):
    lse = torch.logaddexp(lse1, lse2)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return torch.exp(lse1 - safe)[..., None] * out1 + torch.exp(lse2 - safe)[..., None] * out2, lse


def merge_ok_max_style(out1, lse1, out2, lse2):
    """Another correct style: subtract the max, as lesson 08's online softmax does."""
    m = torch.maximum(lse1, lse2)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    a, b = torch.exp(lse1 - m_safe), torch.exp(lse2 - m_safe)
    den = a + b
    out = (a[..., None] * out1 + b[..., None] * out2) / torch.where(den == 0, torch.ones_like(den), den)[..., None]
    return out, m + torch.log(den)


def merge_average(out1, lse1, out2, lse2):
    return (out1 + out2) / 2, torch.logaddexp(lse1, lse2)


def merge_naive_exp(out1, lse1, out2, lse2):
    a, b = torch.exp(lse1), torch.exp(lse2)
    return (a[..., None] * out1 + b[..., None] * out2) / (a + b)[..., None], torch.log(a + b)


def merge_lse_max(out1, lse1, out2, lse2):
    return merge_ok(out1, lse1, out2, lse2)[0], torch.maximum(lse1, lse2)


def test_merge_partials():
    assert_all_pass("13_merge_partials", merge_ok)
    assert_all_pass("13_merge_partials", merge_ok_max_style)
    assert_hint("13_merge_partials", merge_average, "you averaged the two outputs")
    assert_hint("13_merge_partials", merge_naive_exp, "NaN")
    assert_hint("13_merge_partials", merge_lse_max, "not the max")

    def merge_sigmoid(out1, lse1, out2, lse2):  # ring-flash-attention's _update_out_and_lse: NaN where a side is −∞
        out = out1 - torch.sigmoid(lse2 - lse1)[..., None] * (out1 - out2)
        return out, lse1 - torch.nn.functional.logsigmoid(lse1 - lse2)
    assert_hint("13_merge_partials", merge_sigmoid, "sigmoid form", every=False)


# ---- 13_ring_schedule ----

def test_ring_schedule():
    assert_all_pass("13_ring_schedule", lambda r, t, P: (r - t) % P)
    assert_all_pass("13_ring_schedule", lambda r, t, P: (r + P - t) % P)
    assert_hint("13_ring_schedule", lambda r, t, P: (r + t) % P, "wrong direction", every=True)
    assert_hint("13_ring_schedule", lambda r, t, P: r - t, "modulo P")


# ---- 13_zigzag_positions ----

def zigzag_ok(rank, world, L):
    c = L // (2 * world)
    return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange((2 * world - 1 - rank) * c, (2 * world - rank) * c)])


def zigzag_list_style(rank, world, L):
    chunks = torch.arange(L).chunk(2 * world)
    return [int(i) for i in chunks[rank]] + [int(i) for i in chunks[-1 - rank]]


def test_zigzag_positions():
    assert_all_pass("13_zigzag_positions", zigzag_ok)
    assert_all_pass("13_zigzag_positions", zigzag_list_style)
    assert_hint("13_zigzag_positions", lambda r, P, L: torch.arange(r * L // P, (r + 1) * L // P), "contiguous layout",
                every=True)
    assert_hint("13_zigzag_positions", lambda r, P, L: zigzag_ok(r, P, L).flip(0).reshape(2, -1).flip(1).reshape(-1),
                "wrong order", every=True)
    c = lambda L, P: L // (2 * P)  # noqa: E731
    assert_hint("13_zigzag_positions", lambda r, P, L: torch.cat([torch.arange(r * c(L, P), (r + 1) * c(L, P)),
                                                                  torch.arange((P - 1 - r) * c(L, P), (P - r) * c(L, P))]),
                "2P−1−r, not P−1−r", every=True)


# ---- 13_ring_bytes ----

def test_ring_bytes():
    ok = lambda world, batch, heads, seq_len, head_dim, elem_bytes: (world - 1) * 2 * batch * heads * (seq_len // world) * head_dim * elem_bytes  # noqa: E731,E501
    assert_all_pass("13_ring_bytes", ok)
    assert_all_pass("13_ring_bytes", lambda P, B, H, L, E, nbytes: 2 * (P - 1) * B * H * L * E * nbytes // P)
    assert_hint("13_ring_bytes", lambda P, *a: ok(P, *a) * P // (P - 1), "P hops", every=True)
    assert_hint("13_ring_bytes", lambda *a: ok(*a) // 2, "both K and V", every=True)
    assert_hint("13_ring_bytes", lambda P, *a: ok(P, *a) * P, "L/P positions", every=True)
    assert_hint("13_ring_bytes", lambda P, B, H, L, E, nb: 4 * (P - 1) * B * H * (L // P) * E * nb // P, "Ulysses",
                every=True)


@pytest.mark.parametrize("ex_id, mistakes", [
    ("13_ring_bytes", lambda p: [v for _, v in L13._bytes_mistakes(p)] + [L13._bytes_formula(**p)]),
    ("13_zigzag_positions", lambda p: [tuple(x.tolist()) for x in L13._zig_mistakes(p["rank"], p["world"], p["L"])]
     + [tuple(L13._zig(p["rank"], p["world"], p["L"], p["rank"], 2 * p["world"] - 1 - p["rank"]).tolist())]),
])
def test_no_two_named_mistakes_coincide(ex_id, mistakes):
    """Issue 24: pairs of mistakes that give the same numbers (ring bytes at P = 4: Ulysses' volume = K alone;
    zigzag at P = 2, rank 0: the contiguous layout = the P−1−r mirror) named only one of them. No case, for
    any seed, lets two named mistakes (or a mistake and the answer) coincide, so every hint is the right one."""
    from attn_course.grading.exercises import get
    for seed in range(40):
        for case in get(ex_id).cases(torch.Generator().manual_seed(seed)):
            values = mistakes(case.params)
            assert len(set(values)) == len(values), (seed, case.name)


# ---- 13_causal_blocks ----

def blocks_ok(rank, src, world):
    return 2 if src < rank else 1 if src == rank else 0


def test_causal_blocks():
    assert_all_pass("13_causal_blocks", blocks_ok)
    assert_all_pass("13_causal_blocks", lambda r, s, P: {True: 2, False: int(s == r)}[s < r])
    assert_hint("13_causal_blocks", lambda r, s, P: 2 if s > r else 1 if s == r else 0, "LATER ranks", every=True)
    assert_hint("13_causal_blocks", lambda r, s, P: 2 if s <= r else 0, "causal on its diagonal", every=True)
    assert_hint("13_causal_blocks", lambda r, s, P: 2 if s < r else 1, "skip them instead", every=True)


# ---- 13_ring_loop (build: the ring loop on the simulated ring) ----

def make_ring(merge="lse", diagonal=True, skip_future=True, skip_own=False, index="r-t", scale=True,
              passes="all", keep=False, lse_max=False, lse_last=False):
    """A ring loop with one knob per mistake (the defaults are right)."""
    def ring_forward(q, rank, world, ring, causal):
        out, lse, n, kept = None, torch.full(q.shape[:-1], -math.inf, dtype=q.dtype), 0, []
        for t in range(world):
            k, v = ring.kv()
            if out is None:
                out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
            if keep:
                kept.append(k)                                   # a list of shards: the ring refuses
            src = {"r-t": (rank - t) % world, "r+t": (rank + t) % world, "nomod": rank - t}[index]
            skip = causal and ((skip_future and src > rank) or (skip_own and src == rank))
            if not skip:
                s = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale else 1.0)
                if causal and diagonal and src == rank:
                    s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
                lb = torch.logsumexp(s, -1)
                ob = torch.exp(s - lb[..., None]) @ v
                new = torch.logaddexp(lse, lb)
                if merge == "lse":
                    out = torch.exp(lse - new)[..., None] * out + torch.exp(lb - new)[..., None] * ob
                elif merge == "mean":
                    out = (out * n + ob) / (n + 1)
                elif merge == "sum":
                    out = out + ob
                lse = torch.maximum(lse, lb) if lse_max else new
                last = lb
                n += 1
            if t < world - 1 and (passes in ("all", "P") or (passes == "until done" and not (causal and t >= rank))):
                ring.pass_on()
        if passes == "P":
            ring.pass_on()
        return out, (last if lse_last else lse)
    return ring_forward


def ring_gather(q, rank, world, ring, causal):
    """Collect every shard (copies), then attend to the whole K/V at once."""
    ks, vs = [], []
    for t in range(world):
        k, v = ring.kv()
        ks.append(k.clone())
        vs.append(v.clone())
        if t < world - 1:
            ring.pass_on()
    order = [(rank - t) % world for t in range(world)]
    K = torch.cat([ks[order.index(s)] for s in range(world)], -2)
    V = torch.cat([vs[order.index(s)] for s in range(world)], -2)
    s = q @ K.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        c = q.shape[-2]
        pos_q = torch.arange(rank * c, (rank + 1) * c)
        s = s.masked_fill(torch.arange(K.shape[-2])[None, :] > pos_q[:, None], -math.inf)
    return torch.softmax(s, -1) @ V, torch.logsumexp(s, -1)


def ring_positions_style(q, rank, world, ring, causal, skip=True):
    """Another correct style: the causal mask built from global positions, running max and sum as in lesson 08.
    ``skip=False``: later shards computed and masked (all −∞) instead of skipped — right values, but the work
    the causal skip saves (review 08-14, 13.6)."""
    c, scale = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    pos_q = torch.arange(rank * c, (rank + 1) * c)
    m = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype)
    den, acc = torch.zeros_like(m), 0.0
    for t in range(world):
        k, v = ring.kv()
        src = (rank - t) % world
        if not (skip and causal and src > rank):
            s = torch.einsum("bhqe,bhke->bhqk", q, k) * scale
            if causal:
                s = s.masked_fill(torch.arange(src * c, (src + 1) * c)[None, :] > pos_q[:, None], -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - safe)
            alpha = torch.exp(m - safe)
            den, acc, m = alpha * den + p.sum(-1, keepdim=True), alpha * acc + p @ v, m_new
        if t + 1 < world:
            ring.pass_on()
    return acc / den, (m + den.log()).squeeze(-1)


def test_ring_loop():
    assert_all_pass("13_ring_loop", make_ring())
    assert_all_pass("13_ring_loop", ring_positions_style)
    assert_hint("13_ring_loop", partial(ring_positions_style, skip=False),
                "masking them with −∞ does the work", every=True)
    for merge in ("mean", "sum"):
        assert_hint("13_ring_loop", make_ring(merge=merge), "without their log-sum-exps", every=True)
    assert_hint("13_ring_loop", make_ring(scale=False), "not scaled", every=True)
    assert_hint("13_ring_loop", make_ring(lse_max=True), "not the max", every=True)
    assert_hint("13_ring_loop", make_ring(lse_last=True), "not the last block's", every=True)
    # causal mistakes: named on every causal case (the non-causal case passes)
    for kw, hint in [(dict(diagonal=False), "diagonal block"), (dict(skip_future=False, diagonal=False), "mask is missing"),
                     (dict(skip_future=False), "LATER ranks"), (dict(index="nomod"), "without the mod"),
                     (dict(skip_own=True), "cannot be skipped"), (dict(index="r+t"), "not (r + t) mod P")]:
        res = exercise_kit.results("13_ring_loop", make_ring(**kw))
        assert [ok for ok, _ in res] == [True, False, False], (kw, res)
        assert all(hint in msg for ok, msg in res if not ok), (kw, res)
    # "future not skipped" and "r − t without the mod" give the same numbers: one hint names both
    assert_hint("13_ring_loop", make_ring(skip_future=False), "without the mod")


def test_ring_loop_property_checks():
    """What each rank holds: one shard at a time (a list of shards is refused by the ring, a gathered K/V by
    the largest-tensor counter), exactly P − 1 passes."""
    assert_hint("13_ring_loop", make_ring(keep=True), "keeps ONE shard at a time", every=True)
    assert_hint("13_ring_loop", ring_gather, "never gathers them", every=True)
    assert_hint("13_ring_loop", make_ring(passes="P"), "back where it started", every=True)
    res = exercise_kit.results("13_ring_loop", make_ring(passes="until done"))
    assert [ok for ok, _ in res] == [True, False, False], res         # right numbers, but it stops relaying
    assert all("every rank passes its shard on P − 1" in msg for ok, msg in res if not ok), res


def test_simulated_ring_follows_the_schedule_and_counts():
    """The simulator hands rank r at step t the shard of rank (r − t) mod P (attn_course.ring's schedule) and
    enforces its two rules; run_ring reports each rank's passes."""
    from attn_course import ring as real
    from attn_course.ring_sim import RingRuleError, SimulatedRing, run_ring
    P, L = 4, 8
    x = torch.arange(L, dtype=torch.float64).reshape(1, 1, L, 1)
    shards = [real.shard(x, s, P) for s in range(P)]
    sched = real.ring_schedule(P)
    for r in range(P):
        ring = SimulatedRing(shards, shards, r)
        for t in range(P):
            k, v = ring.kv()
            assert ring.kv()[0] is k and torch.equal(k, shards[sched[t][r]]) and k is not shards[sched[t][r]]
            if t < P - 1:
                ring.pass_on()
        with pytest.raises(RingRuleError, match="back where it started"):
            ring.pass_on()
    ring, kept = SimulatedRing(shards, shards, 0), []
    kept.append(ring.kv()[0][..., :1, :])                          # a view keeps the shard alive
    ring.pass_on()
    kept.append(ring.kv()[1])
    with pytest.raises(RingRuleError, match="still holds 2 K/V shards"):
        ring.pass_on()
    results, passes = run_ring(lambda q, r, P_, ring, extra: (q * extra, r), shards, shards, shards, 2.0)
    assert passes == [0] * P and [r for _, r in results] == list(range(P))


@pytest.mark.parametrize("folder, points", [("solutions", 4), ("exercises", 0)])
def test_ring_loop_solution_gets_full_marks_and_the_released_stub_zero(folder, points, capsys):
    """The notebook's own cells, through check(): the solution 4/4, the released stub 0 ("not attempted")."""
    from pathlib import Path

    from attn_course.grading import check
    from attn_course.grading import notebook as nbk
    from test_grading_learners import run_cell
    root = Path(__file__).resolve().parents[1]
    nb = nbk.read(next((root / folder).glob("13_*.ipynb")))
    source = nbk.exercise_cells(nb)["13_ring_loop"]["source"]
    source = source if isinstance(source, str) else "".join(source)
    result = check("13_ring_loop", run_cell(source)["ring_forward"])
    capsys.readouterr()
    assert result.score == points
    assert result.status == ("checked" if points else "not attempted")
