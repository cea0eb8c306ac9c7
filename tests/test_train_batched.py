"""fit_many trains several models as one batch; each model must end exactly where fit() alone takes it."""
import threading

import pytest
import torch
import torch.nn.functional as F

from attn_course.demos import _train
from attn_course.demos.heads import KeyPairTask, IGNORE, make_model


def _task_and_models(seeds):
    task = KeyPairTask() if hasattr(KeyPairTask, "sample") else None
    return task, [make_model(task, seed=s, d_model=16, num_heads=2) for s in seeds]


@pytest.mark.parametrize("seeds", [(0, 1, 2), (5,)])
def test_fit_many_equals_fit_per_seed(seeds):
    task, batched = _task_and_models(seeds)
    _, alone = _task_and_models(seeds)
    sample = lambda g: task.sample(g, 32)
    loss = lambda lg, y: F.cross_entropy(lg.flatten(0, -2), y.flatten(), ignore_index=IGNORE)
    curves = _train.fit_many(batched, sample, seeds=seeds, steps=25, lr=1e-2, progress=False, loss_fn=loss)
    for s, m_b, m_a, curve in zip(seeds, batched, alone, curves):
        ref = _train.fit(m_a, sample, seed=s, steps=25, lr=1e-2, progress=False, loss_fn=loss)
        assert len(curve) == len(ref) == 25
        torch.testing.assert_close(torch.tensor(curve), torch.tensor(ref), rtol=1e-4, atol=1e-5)
        # the trained models compute the same function (parameters with an identically zero gradient, such as
        # a key bias under softmax, move by Adam-normalised round-off, so the outputs are what is compared)
        x, _ = task.sample(torch.Generator().manual_seed(99), 8)
        with torch.no_grad():
            torch.testing.assert_close(m_b(x), m_a(x), rtol=1e-4, atol=1e-4, msg=f"seed {s}")
        assert not m_b.training


def test_fit_many_seeds_differ_and_refuses_mismatch():
    task, models = _task_and_models((0, 1))
    curves = _train.fit_many(models, lambda g: task.sample(g, 16), seeds=(0, 1), steps=3, progress=False,
                             loss_fn=lambda lg, y: F.cross_entropy(lg.flatten(0, -2), y.flatten(), ignore_index=IGNORE))
    assert curves[0] != curves[1]
    other = make_model(task, seed=0, d_model=32, num_heads=2)
    with pytest.raises(ValueError, match="architecture"):
        _train.fit_many([models[0], other], lambda g: task.sample(g, 16), seeds=(0, 1), steps=1, progress=False)
    with pytest.raises(ValueError, match="one seed per model"):
        _train.fit_many(models, lambda g: task.sample(g, 16), seeds=(0,), steps=1, progress=False)


def test_constant_schedule_longer_run_continues_shorter_and_read_at():
    """With schedule="constant" a run's first k steps do not depend on its length; at_steps reads step k."""
    from attn_course.demos.heads import train, train_seeds, evaluate
    task = KeyPairTask()
    short = train_seeds(task, (0, 1), steps=30, schedule="constant", d_model=16, num_heads=2, batch_size=32)
    long_ = train_seeds(task, (0, 1), steps=40, schedule="constant", read_at=(30,), d_model=16, num_heads=2,
                        batch_size=32)
    for i in range(2):
        torch.testing.assert_close(torch.tensor(long_.losses[i][:30]), torch.tensor(short.losses[i]), rtol=1e-5, atol=1e-6)
        assert abs(long_.accuracy_at[30][i] - short.accuracy[i]) < 1e-6
    # one-cycle: the length changes the first steps' learning rates, hence the losses
    oc_short, oc_long = (train_seeds(task, (0,), steps=n, d_model=16, num_heads=2, batch_size=32) for n in (30, 40))
    assert oc_short.losses[0][5:30] != oc_long.losses[0][5:30]
    # the batched constant-rate run equals fit() with the same schedule
    m = make_model(task, seed=1, d_model=16, num_heads=2)
    ref = train(m, task, steps=30, seed=1, schedule="constant", batch_size=32, progress=False)
    torch.testing.assert_close(torch.tensor(short.losses[1]), torch.tensor(ref), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="schedule"):
        train(m, task, steps=3, schedule="cosine", progress=False)


def _variant_jobs(log):
    """Three jobs of different architectures (one a plain fit()), each building its own seeded models."""
    from attn_course.demos.heads import LagTask, make_model, train, train_seeds
    task = LagTask(vocab_size=8, seq_len=8, lag=2)

    def seeds_job(num_kv_heads):
        def job():
            log.append(("build", num_kv_heads))
            return train_seeds(task, (0, 1), steps=12, d_model=16, num_heads=4, num_kv_heads=num_kv_heads)
        return job

    def single_job():
        log.append(("build", "fit"))
        model = make_model(task, seed=3, d_model=16, num_heads=2)
        return model, train(model, task, steps=12, batch_size=32, seed=3, progress=False)

    return [seeds_job(4), single_job, seeds_job(1)]


def _flat(result):
    if isinstance(result, tuple) and isinstance(result[0], torch.nn.Module):       # (model, losses)
        return [result[1]], [result[0]]
    return result.losses, result.models


def test_side_by_side_equals_one_after_another(three_threads):
    """Each job ends where it ends alone. Not compared bit for bit: a parameter whose gradient is pure
    round-off (an unused token's embedding row) moves by Adam-normalised noise that differs between two
    plain runs of the same job in one process (buffers at other addresses); the losses and the functions
    the models compute are compared instead, as in test_fit_many_equals_fit_per_seed."""
    threads = torch.get_num_threads()
    alone_log, both_log = [], []
    alone = [job() for job in _variant_jobs(alone_log)]
    both = _train.side_by_side(_variant_jobs(both_log), workers=2)
    assert torch.get_num_threads() == threads
    assert both_log == alone_log                                    # models built in the same order
    x = torch.randint(8, (16, 8), generator=torch.Generator().manual_seed(7))
    for a, b in zip(alone, both):
        (la, ma), (lb, mb) = _flat(a), _flat(b)
        torch.testing.assert_close(torch.tensor(la), torch.tensor(lb), rtol=1e-6, atol=1e-7)
        for m_a, m_b in zip(ma, mb):
            with torch.no_grad():
                torch.testing.assert_close(m_a(x), m_b(x), rtol=1e-5, atol=1e-6)
    assert _train.side_by_side([lambda: 1, lambda: 2], workers=1) == [1, 2]


def test_side_by_side_reports_the_failing_job_and_stops_the_others(three_threads):
    from attn_course.demos.heads import LagTask, train_seeds
    task = LagTask(vocab_size=8, seq_len=8, lag=2)
    started = []

    def long_job():
        started.append("long")
        return train_seeds(task, (0,), steps=100_000, d_model=16, num_heads=2)   # stopped after the failure

    def failing():
        raise ValueError("job 1 failed")

    threads = torch.get_num_threads()
    with pytest.raises(ValueError, match="job 1 failed"):
        _train.side_by_side([long_job, failing, lambda: started.append("never")], workers=2)
    assert started == ["long"] and torch.get_num_threads() == threads


@pytest.mark.parametrize("case", ["bool mask", "causal, scale", "GQA", "per-model float mask", "shared keys", "2-D"])
def test_fit_many_sdpa_folds_the_models_into_the_batch(case):
    """Under vmap, fit_many's torch-function mode gives each model exactly its own fused SDPA call (outputs to the
    bit, gradients to 1e-6), with no per-model loop (no fallback warning); another thread's SDPA call does not
    go through the mode."""
    import warnings
    g = torch.Generator().manual_seed(0)
    S = 3
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float32)
    q, k, v = r(S, 2, 4, 9, 8), r(S, 2, 4, 11, 8), r(S, 2, 4, 11, 6)
    mask, kw, dims = None, {}, (0, 0, 0, None)
    if case == "bool mask":
        mask = torch.rand(9, 11, generator=g) > 0.3
    elif case == "causal, scale":
        k, v, kw = r(S, 2, 4, 9, 8), r(S, 2, 4, 9, 6), dict(is_causal=True, scale=0.3)
    elif case == "GQA":
        k, v, kw = r(S, 2, 2, 11, 8), r(S, 2, 2, 11, 6), dict(enable_gqa=True)
    elif case == "per-model float mask":
        mask, dims = r(S, 4, 9, 11), (0, 0, 0, 0)
    elif case == "shared keys":
        k, v, dims = k[0], v[0], (0, None, None, None)
    else:
        q, k, v = q[:, 0, 0], k[:, 0, 0], v[:, 0, 0]
    for t in (q, k, v):
        t.requires_grad_(True)

    def one(q_, k_, v_, m_):
        return F.scaled_dot_product_attention(q_, k_, v_, attn_mask=m_, **kw)

    calls = []

    class Counting(_train._FoldedSDPA):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is F.scaled_dot_product_attention:
                calls.append(threading.get_ident())
            return super().__torch_function__(func, types, args, kwargs)

    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # vmap's "no batching rule" warning would fail here
        with Counting():
            got = torch.vmap(one, in_dims=dims)(q, k, v, mask)
            t = threading.Thread(target=lambda: F.scaled_dot_product_attention(q[0], q[0], q[0]))
            t.start(); t.join()
    grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    pick = lambda t, d, i: t if d is None else t[i]
    for i in range(S):
        args = [pick(t, d, i) for t, d in zip((q, k, v, mask), dims)]
        want = one(*args)
        if case == "2-D":                               # SDPA's math form, vmap's own batching rule: round-off
            torch.testing.assert_close(got[i], want, rtol=0, atol=1e-6)
        else:
            assert torch.equal(got[i], want), case
        want_g = torch.autograd.grad(want.square().sum(), [a for a, d in zip(args[:3], dims) if d is not None])
        for gr, w in zip([gr for gr, d in zip(grads, dims) if d is not None], want_g):
            torch.testing.assert_close(gr[i], w, rtol=0, atol=1e-6)
    assert calls and set(calls) == {threading.get_ident()}     # the other thread's call did not go through the mode


@pytest.mark.parametrize("steps", [1, 9, 10, 11, 20])
def test_one_cycle_schedule_any_length(steps):
    """One-cycle warms up to the peak rate and ends near 0 for any run length (PyTorch's OneCycleLR alone
    divides by zero at exactly 10 steps)."""
    opt = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = _train._scheduler(opt, 1.0, steps, "one-cycle")
    rates = [opt.param_groups[0]["lr"]]
    for _ in range(steps - 1):
        opt.step()
        sched.step()
        rates.append(opt.param_groups[0]["lr"])
    assert len(rates) == steps and max(rates) <= 1.0 + 1e-9
    if steps >= 10:                     # shorter runs: OneCycleLR's warm-up is under one step, they start at the peak
        assert max(rates) > 0.9 and rates[-1] < 0.01 and rates[0] < 0.1


def test_seed_runs_join_equals_one_batch():
    """Seeds (0, 1) and (2,) trained side by side and joined: the same runs, in seed order, as (0, 1, 2) in one batch."""
    from attn_course.demos.heads import train_seeds
    task = KeyPairTask()
    kw = dict(steps=30, schedule="constant", read_at=(20,), d_model=16, num_heads=2, batch_size=32)
    whole = train_seeds(task, (0, 1, 2), **kw)
    joined = _train.SeedRuns.join(_train.side_by_side([lambda: train_seeds(task, (0, 1), **kw),
                                                       lambda: train_seeds(task, (2,), **kw)]))
    assert len(joined.models) == len(joined.losses) == len(joined.accuracy) == 3 and set(joined.accuracy_at) == {20}
    torch.testing.assert_close(torch.tensor(joined.losses), torch.tensor(whole.losses), rtol=1e-4, atol=1e-5)
    for k, got, want in [("end", joined.accuracy, whole.accuracy), (20, joined.accuracy_at[20], whole.accuracy_at[20])]:
        assert max(abs(a - b) for a, b in zip(got, want)) < 0.02, k
    with pytest.raises(ValueError, match="different steps"):
        _train.SeedRuns.join([whole, whole._replace(accuracy_at={})])
