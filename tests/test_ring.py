"""Ring attention and Ulysses across real processes (gloo on CPU) against single-process attention.

Each launch spawns P fresh processes (a free loopback port, a deadline, every child reaped), so the
checks are batched: one launch per world size runs every configuration and returns errors, bytes
and work counts, which the tests below assert.
"""
import multiprocessing
import os
import subprocess
import sys
import time

import pytest
import torch
from torch.testing import assert_close

from attn_course import ring
from attn_course.functional import attention

CONFIGS = [dict(seq_len=L, layout=lay, causal=c, backward=True, heads=H, dtype="float64")
           for L, H in ((8, 3), (24, 2)) for lay in ring.LAYOUTS for c in (False, True)]
CONFIGS += [dict(seq_len=24, layout=lay, causal=True, backward=True, dtype="float32", seed=1) for lay in ring.LAYOUTS]
CONFIGS += [dict(method="ulysses", seq_len=16, heads=4, causal=c, backward=True, dtype="float64") for c in (False, True)]


@pytest.fixture(scope="module", params=[2, 4])
def run(request):
    P = request.param
    configs = [c for c in CONFIGS if c["seq_len"] % (2 * P) == 0]
    t0 = time.monotonic()
    results = ring.launch(ring.verify, P, configs, timeout=240)
    assert not multiprocessing.active_children()                  # every child reaped
    return P, results, time.monotonic() - t0


def _rows(results, **match):
    """Per config matching ``match``: the list of per-rank result dicts."""
    out = []
    for i, cfg in enumerate(results[0]):
        if all(cfg.get(k, {"method": "ring"}.get(k)) == v for k, v in match.items()):
            out.append([r[i] for r in results])
    assert out, match
    return out


def test_outputs_and_gradients_equal_single_process_attention(run):
    P, results, _ = run
    for per_rank in _rows(results):
        for r in per_rank:
            tol = 1e-12 if r["dtype"] == "float64" else 2e-5
            assert r["out_err"] < tol and r["grad_err"] < tol, r


def test_bytes_sent_equal_the_formulas(run):
    P, results, _ = run
    for per_rank in _rows(results):
        for r in per_rank:
            elem = 8 if r["dtype"] == "float64" else 4
            kw = dict(world=P, batch=1, heads=r.get("heads", 2), seq_len=r["seq_len"], head_dim=16, elem_bytes=elem)
            if r.get("method", "ring") == "ring":
                assert r["bytes_sent"] == ring.ring_comm_bytes(**kw) == 2 * (P - 1) * (r["seq_len"] // P) * kw["heads"] * 16 * elem
                assert r["bytes_sent_backward"] == ring.ring_comm_bytes(**kw, backward=True)
            else:
                assert r["bytes_sent"] == ring.ulysses_comm_bytes(**kw)
                assert r["bytes_sent_backward"] == r["bytes_sent"]   # the adjoint all-to-alls move the same data


def test_zigzag_balances_causal_work_and_contiguous_does_not(run):
    P, results, _ = run
    L, H = 24, 2
    for per_rank in _rows(results, layout="zigzag", causal=True, seq_len=L, dtype="float64"):
        work = [r["score_entries"] for r in per_rank]
        assert len(set(work)) == 1, work
    for per_rank in _rows(results, layout="contiguous", causal=True, seq_len=L, dtype="float64"):
        work = [r["score_entries"] for r in per_rank]
        c = L // P                                   # rank r: r full blocks + one causal diagonal block
        assert work == [H * (r * c * c + c * (c + 1) // 2) for r in range(P)], work
    for per_rank in _rows(results, causal=False, seq_len=L, dtype="float64"):
        assert {r["score_entries"] for r in per_rank} == {H * L * L // P}


def worker_raises_on_rank_1(rank, world):
    if rank == 1:
        raise ValueError("rank one is unhappy")
    import torch.distributed as dist
    dist.barrier()                                   # would hang forever without the launcher's fail-fast


def worker_bad_length(rank, world):
    x = torch.randn(1, 3, 5, 8)                      # L = 5·P is not divisible by 2P
    return ring.ring_attention(x, x, x, layout="zigzag")


def worker_ulysses_bad_heads(rank, world):
    x = torch.randn(1, 3, 4, 8)
    return ring.ulysses_attention(x, x, x)


def test_a_failing_rank_fails_the_run_fast_with_its_message():
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1: ValueError: rank one is unhappy"):
        ring.launch(worker_raises_on_rank_1, 2, timeout=120)
    assert time.monotonic() - t0 < 100
    assert not multiprocessing.active_children()


@pytest.mark.parametrize("worker, message", [(worker_bad_length, "L=10 must be divisible by 4"),
                                             (worker_ulysses_bad_heads, "H=3 is not divisible by the world size P=2")])
def test_bad_shapes_raise_a_clear_error_on_every_rank(worker, message):
    with pytest.raises(RuntimeError, match=message):
        ring.launch(worker, 2, timeout=120)


def test_merge_partials_equals_softmax_over_the_union_including_empty_rows():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 5, 8, dtype=torch.float64), torch.randn(2, 9, 8, dtype=torch.float64), torch.randn(2, 9, 4, dtype=torch.float64)
    mask = torch.rand(5, 9) < 0.6
    mask[1] = False                                  # a row with no visible key anywhere
    mask[2, :4] = False                              # a row empty in the first part only
    ref, _ = attention(q, k, v, attn_mask=mask)

    def part(sl):
        s = (q @ k[:, sl].transpose(-1, -2)) / 8 ** 0.5
        s = s.masked_fill(~mask[:, sl], float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        w = torch.where(torch.isinf(lse)[..., None], torch.zeros_like(s), torch.exp(s - lse[..., None].nan_to_num(neginf=0.0)))
        return w @ v[:, sl], lse

    out, lse = ring.merge_partials(*part(slice(0, 4)), *part(slice(4, 9)))
    assert_close(out, ref)
    assert torch.isneginf(lse[:, 1]).all() and torch.equal(out[:, 1], torch.zeros_like(out[:, 1]))


def test_layouts_schedule_and_shards():
    assert ring.shard_positions(0, 2, 8, "zigzag").tolist() == [0, 1, 6, 7]
    assert ring.shard_positions(1, 2, 8, "zigzag").tolist() == [2, 3, 4, 5]
    assert ring.shard_positions(1, 4, 8).tolist() == [2, 3]
    for layout in ring.LAYOUTS:
        allpos = torch.cat([ring.shard_positions(r, 4, 16, layout) for r in range(4)])
        assert sorted(allpos.tolist()) == list(range(16))                          # a partition
        x = torch.arange(16.0)[None, :, None]
        assert torch.equal(ring.shard(x, 3, 4, layout)[0, :, 0], ring.shard_positions(3, 4, 16, layout).float())
    sched = ring.ring_schedule(4)
    assert sched[0] == [0, 1, 2, 3] and sched[1] == [3, 0, 1, 2]
    assert all(sorted(col) == [0, 1, 2, 3] for col in zip(*sched))                # every rank sees every shard
    with pytest.raises(ValueError, match="L=10 must be divisible by 4"):
        ring.shard_positions(0, 2, 10, "zigzag")
    with pytest.raises(ValueError, match="layout"):
        ring.shard_positions(0, 2, 8, "stripes")


def test_outside_a_process_group_the_error_says_how_to_start_one():
    x = torch.randn(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ring.ring_attention(x, x, x)


def test_cli_and_torchrun_print_the_same_verified_table(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cli = subprocess.run([sys.executable, "-m", "attn_course.cli", "ring", "--world-size", "2",
                          "--seq-len", "64", "--causal", "--layout", "zigzag", "--repeats", "1"],
                         capture_output=True, text=True, timeout=240, env=env)
    assert cli.returncode == 0, cli.stderr
    assert "layout=zigzag" in cli.stdout and "50.0%" in cli.stdout
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    tr = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "attn_course.ring",
                         "--seq-len", "64", "--causal", "--repeats", "1"],
                        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert tr.returncode == 0, tr.stderr[-2000:]
    errors = [float(line.split()[1]) for line in tr.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert len(errors) == 2 and max(errors) < 1e-5, tr.stdout


def test_ring_plan_covers_exactly_the_visible_pairs_and_predicts_the_measured_work(run):
    P, results, _ = run
    L = 24
    for layout in ring.LAYOUTS:
        for causal in (False, True):
            plan = ring.ring_plan(P, L, layout, causal)
            visible = torch.ones(L, L, dtype=torch.bool).tril() if causal else torch.ones(L, L, dtype=torch.bool)
            assert torch.equal(plan >= 0, visible)
            assert plan.max() <= P - 1
            for per_rank in _rows(results, layout=layout, causal=causal, seq_len=L, dtype="float64"):
                H = per_rank[0]["heads"]
                assert [H * w for w in ring.work_per_rank(P, L, layout, causal)] == [r["score_entries"] for r in per_rank]


# ---- backend choice, device, the blockwise reference, the formulas (no GPU needed) -------------------------

def _fake_cuda(monkeypatch, gpus):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(ring.dist, "is_nccl_available", lambda: True)


@pytest.mark.parametrize("gpus, world, expected", [(0, 2, "gloo"), (1, 2, "gloo"), (2, 2, "nccl"), (8, 4, "nccl"),
                                                   (4, 1, "nccl")])
def test_auto_backend_is_nccl_only_with_one_gpu_per_rank(monkeypatch, gpus, world, expected):
    _fake_cuda(monkeypatch, gpus)
    assert ring.choose_backend("auto", world) == expected
    assert ring.choose_backend("gloo", world) == "gloo"                      # forcing gloo always works


def test_forcing_nccl_without_enough_gpus_names_the_sizes(monkeypatch):
    _fake_cuda(monkeypatch, 1)
    with pytest.raises(ValueError, match="world_size=2, GPUs available=1"):
        ring.choose_backend("nccl", 2)
    with pytest.raises(ValueError, match="world_size=2, GPUs available=1"):
        ring.launch(worker_raises_on_rank_1, 2, backend="nccl")               # refused before any process starts
    assert not multiprocessing.active_children()
    with pytest.raises(ValueError, match="'auto', 'gloo' or 'nccl'"):
        ring.choose_backend("mpi", 2)
    assert ring.rank_device("gloo", 3) == torch.device("cpu")


def test_nccl_rank_device_sets_the_local_gpu(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.cuda, "set_device", seen.append)
    assert ring.rank_device("nccl", 3) == torch.device("cuda", 3) and seen == [3]


@pytest.mark.parametrize("layout", ring.LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
def test_reference_rows_equals_sdpa_rows_without_an_LxL_tensor(layout, causal):
    from attn_course.bench import largest_tensor_created
    B, H, L, E, P = 1, 2, 2048, 8, 4
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, H, L, E, generator=g, dtype=torch.float64) for _ in range(3))
    rows = ring.shard_positions(1, P, L, layout)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)[..., rows, :]
    assert_close(ring.reference_rows(q, k, v, rows, is_causal=causal), ref, atol=1e-12, rtol=0)
    largest = largest_tensor_created(lambda: ring.reference_rows(q, k, v, rows, is_causal=causal)) // 8   # elements
    assert largest <= B * H * 128 * L <= B * H * L * L // 16, largest          # 128-row blocks, never L×L
    small = largest_tensor_created(lambda: ring.reference_rows(q, k, v, rows, is_causal=causal,
                                                               max_block_elems=B * H * L * 16)) // 8
    assert small <= B * H * 16 * L, small


def test_formulas_with_gqa_give_ring_over_ulysses_p_over_5():
    B, H, H_kv, L, E = 1, 32, 8, 131072, 128
    for P in (2, 4, 8, 16):
        kw = dict(world=P, batch=B, heads=H, seq_len=L, head_dim=E, elem_bytes=2)
        shard_kv = B * H_kv * (L // P) * E
        r, u = ring.ring_comm_bytes(**kw, num_kv_heads=H_kv), ring.ulysses_comm_bytes(**kw, num_kv_heads=H_kv)
        assert r == 2 * (P - 1) * shard_kv * 2
        assert u == (P - 1) * B * (L // P) * E * (2 * H + 2 * H_kv) // P * 2
        assert r / u == pytest.approx(P / 5)
        assert ring.ring_comm_bytes(**kw) / ring.ulysses_comm_bytes(**kw) == pytest.approx(P / 2)     # MHA
    s = 1 * 2 * (64 // 4) * 16                                               # backward, fp32 and bf16 inputs
    assert ring.ring_comm_bytes(world=4, batch=1, heads=2, seq_len=64, head_dim=16, backward=True) == (2 * 3 + 2 * 4) * s * 4
    assert ring.ring_comm_bytes(world=4, batch=1, heads=2, seq_len=64, head_dim=16, elem_bytes=2,
                                backward=True) == 2 * 3 * s * 2 + 2 * 4 * s * 4
    with pytest.raises(ValueError, match="world=0"):
        ring.ring_comm_bytes(world=0, batch=1, heads=2, seq_len=64, head_dim=16)


def test_cli_help_shows_defaults_and_the_backend_option():
    out = subprocess.run([sys.executable, "-m", "attn_course.ring", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "--backend {auto,gloo,nccl}" in text and "--device" in text
    assert "(default: 1024)" in text and "(default: auto)" in text and "(default: 2)" in text
