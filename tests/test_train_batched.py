"""fit_many trains several models as one batch; each model must end exactly where fit() alone takes it."""
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
