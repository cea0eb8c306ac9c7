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
