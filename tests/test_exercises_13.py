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


# ---- 13_ring_loop (build: one rank's step, the grader drives the ring) ----

def make_step(merge="lse", diagonal=True, skip_future=True, skip_own=False, index="r-t", scale=True, lse_max=False):
    """One rank's step with one knob per mistake (the defaults are right)."""
    def ring_step(q, k, v, state, rank, step, world, causal):
        out, lse = state
        src = {"r-t": (rank - step) % world, "r+t": (rank + step) % world, "nomod": rank - step}[index]
        if causal and ((skip_future and src > rank) or (skip_own and src == rank)):
            return out, lse
        s = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale else 1.0)
        if causal and diagonal and src == rank:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
        lb = torch.logsumexp(s, -1)
        ob = torch.exp(s - lb[..., None]) @ v
        new = torch.logaddexp(lse, lb)
        out = {"lse": lambda: torch.exp(lse - new)[..., None] * out + torch.exp(lb - new)[..., None] * ob,
               "sum": lambda: out + ob}[merge]()
        return out, torch.maximum(lse, lb) if lse_max else new
    return ring_step


def step_gather(q, k, v, state, rank, step, world, causal, _seen=[]):
    """Keep every shard received and attend to all of them at each step (a gather over the steps)."""
    if step == 0:
        _seen.clear()
    _seen.append(((rank - step) % world, k, v))
    c = q.shape[-2]
    K, V = torch.cat([x[1] for x in _seen], -2), torch.cat([x[2] for x in _seen], -2)
    pos_k = torch.cat([torch.arange(s * c, (s + 1) * c) for s, _, _ in _seen])
    sc = q @ K.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        sc = sc.masked_fill(pos_k[None, :] > torch.arange(rank * c, rank * c + c)[:, None], -math.inf)
    return torch.softmax(sc, -1) @ V, torch.logsumexp(sc, -1)


def step_positions_style(q, k, v, state, rank, step, world, causal, skip=True):
    """Another correct style: the causal mask built from global positions, lesson 08's max shift.
    ``skip=False``: a later shard computed and masked (all −∞) instead of skipped — right values, but the work
    the causal skip saves (review 08-13, 13.6)."""
    out, lse = state
    c, src = q.shape[-2], (rank - step) % world
    if skip and causal and src > rank:
        return state
    s = torch.einsum("bhqe,bhke->bhqk", q, k) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.arange(src * c, (src + 1) * c)[None, :] > torch.arange(rank * c, (rank + 1) * c)[:, None],
                          -math.inf)
    m = torch.maximum(lse, s.amax(-1))
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p, a = torch.exp(s - safe[..., None]), torch.exp(lse - safe)
    l = a + p.sum(-1)
    lsafe = torch.where(l == 0, torch.ones_like(l), l)
    return (a[..., None] * out + p @ v) / lsafe[..., None], safe + torch.log(l)


def test_ring_loop():
    assert_all_pass("13_ring_loop", make_step())
    assert_all_pass("13_ring_loop", step_positions_style)
    assert_hint("13_ring_loop", partial(step_positions_style, skip=False),
                "masking with −∞ does the work", every=True)
    assert_hint("13_ring_loop", make_step(merge="sum"), "without their log-sum-exps", every=True)
    assert_hint("13_ring_loop", make_step(scale=False), "not scaled", every=True)
    assert_hint("13_ring_loop", make_step(lse_max=True), "not the max", every=True)
    # causal mistakes: named on every causal case (the non-causal case passes)
    for kw, hint in [(dict(diagonal=False), "diagonal block"), (dict(skip_future=False, diagonal=False), "mask is missing"),
                     (dict(index="nomod"), "without the mod"), (dict(skip_own=True), "cannot be skipped"),
                     (dict(index="r+t"), "not (r + t) mod P")]:
        res = exercise_kit.results("13_ring_loop", make_step(**kw))
        assert [ok for ok, _ in res] == [True, False, False], (kw, res)
        assert all(hint in msg for ok, msg in res if not ok), (kw, res)


def test_ring_loop_work_per_step():
    """The grader counts each call's FLOPs: a later rank's shard computed and masked (right values) is named on
    every causal case, computed unmasked (wrong values) too; attending to every shard seen so far fails on every
    case; the reference counts exactly one block per kept step and nothing on a skipped one."""
    res = exercise_kit.results("13_ring_loop", make_step(skip_future=False))
    assert [ok for ok, _ in res] == [True, False, False] and all("LATER rank" in m for ok, m in res if not ok), res
    assert_hint("13_ring_loop", step_gather, "attends to the ONE shard it is given", every=True)
    ex = L13.EXERCISES[-1]
    for case in ex.cases(torch.Generator().manual_seed(0)):
        got = ex.answer(make_step(), case)["flops"]
        assert torch.equal(got, ex.expected(case)["flops"]), (case.name, got)


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
    result = check("13_ring_loop", run_cell(source)["ring_step"])
    capsys.readouterr()
    assert result.score == points
    assert result.status == ("checked" if points else "not attempted")
