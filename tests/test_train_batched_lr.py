"""fit_many with one learning rate per model (a sweep in one batch): model i must end where fit(lr=lr[i]) takes it."""
import pytest
import torch
import torch.nn.functional as F

from attn_course.demos import _train
from attn_course.demos.heads import IGNORE, KeyPairTask, make_model


def test_fit_many_per_model_lr_equals_fit_at_that_lr():
    task = KeyPairTask()
    seeds, lrs = (0, 1, 1), (1e-2, 3e-2, 1e-3)             # seed 1 twice: only the rate differs between them
    sample = lambda g: task.sample(g, 32)
    loss = lambda lg, y: F.cross_entropy(lg.flatten(0, -2), y.flatten(), ignore_index=IGNORE)
    batched = [make_model(task, seed=s, d_model=16, num_heads=2) for s in seeds]
    curves = _train.fit_many(batched, sample, seeds=seeds, lr=lrs, steps=25, progress=False, loss_fn=loss)
    x, _ = task.sample(torch.Generator().manual_seed(99), 8)
    for s, lr, m_b, curve in zip(seeds, lrs, batched, curves):
        alone = make_model(task, seed=s, d_model=16, num_heads=2)
        ref = _train.fit(alone, sample, seed=s, lr=lr, steps=25, progress=False, loss_fn=loss)
        torch.testing.assert_close(torch.tensor(curve), torch.tensor(ref), rtol=1e-4, atol=1e-5)
        with torch.no_grad():
            torch.testing.assert_close(m_b(x), alone(x), rtol=1e-4, atol=1e-4, msg=f"seed {s}, lr {lr}")
    assert curves[1] != curves[2]                             # same seed, different rate: different runs


def test_fit_many_refuses_wrong_number_of_rates():
    task = KeyPairTask()
    models = [make_model(task, seed=s, d_model=16, num_heads=2) for s in (0, 1)]
    with pytest.raises(ValueError, match="lr"):
        _train.fit_many(models, lambda g: task.sample(g, 16), seeds=(0, 1), lr=(1e-2,), steps=1, progress=False)
    with pytest.raises(ValueError, match="lr"):
        _train.fit_many(models, lambda g: task.sample(g, 16), seeds=(0, 1), lr=(1e-2, -1.0), steps=1, progress=False)
