"""demos.sparse: the local task is solved by a window; the first-token task needs the global token."""
import pytest
import torch

from attn_course import masks
from attn_course.demos.sparse import (MaskedAttentionModel, SparseTask, accuracy_by_position, train_masked,
                                      train_masked_many)


def test_sample_targets():
    x, y = SparseTask("shift", seq_len=10, shift=3).sample(torch.Generator().manual_seed(0), 4)
    assert torch.equal(y[:, 3:], x[:, :-3]) and bool((y[:, :3] == -100).all())
    x, y = SparseTask("first", seq_len=10).sample(torch.Generator().manual_seed(0), 4)
    assert torch.equal(y[:, 1:], x[:, :1].expand(4, 9)) and bool((y[:, 0] == -100).all())
    with pytest.raises(ValueError, match="kind"):
        SparseTask("middle")
    with pytest.raises(ValueError, match="mask"):
        MaskedAttentionModel(8, 10, torch.ones(9, 9, dtype=torch.bool))


def test_first_token_needs_a_global_token():
    task, L = SparseTask("first", seq_len=16), 16
    local = train_masked(task, masks.sliding_window_mask(L, 3, causal=False), steps=120, progress=False)
    glob = train_masked(task, masks.global_local_mask(L, 3, [0]), steps=120, progress=False)
    a_local, a_glob = accuracy_by_position(local, task), accuracy_by_position(glob, task)
    assert float(a_local[3:].mean()) < 0.2 < 0.95 < float(a_glob[3:].mean())
    assert bool(a_local[0].isnan())


def test_train_masked_follows_the_device_and_is_deterministic():
    task, L = SparseTask("shift", seq_len=8), 8
    mask = masks.sliding_window_mask(L, 3, causal=False)
    a = train_masked(task, mask, steps=5, progress=False)
    b = train_masked(task, mask, steps=5, progress=False, device=torch.device("cpu"))
    assert all(p.device.type == "cpu" for p in a.parameters()) and a.mask.device.type == "cpu"
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert len(a.losses) == 5 and a.losses == b.losses                   # the per-step losses, kept on the model
    acc_a, acc_b = accuracy_by_position(a, task, n=64), accuracy_by_position(b, task, n=64)
    assert torch.equal(acc_a.nan_to_num(-1.0), acc_b.nan_to_num(-1.0)) and bool(acc_a[:2].isnan().all())
    if torch.cuda.is_available():
        c = train_masked(task, mask.cuda(), steps=5, progress=False)
        assert next(c.parameters()).device.type == "cuda" and c.mask.device.type == "cuda"
        assert accuracy_by_position(c, task, n=64).shape == (L,)


def test_train_masked_many_equals_train_masked_per_mask_and_seed():
    task, L = SparseTask("first", seq_len=8), 8
    both = {"window": masks.sliding_window_mask(L, 3, causal=False), "global": masks.global_local_mask(L, 3, [0])}
    many = train_masked_many(task, both, seeds=(0, 1), steps=20, progress=False)
    assert list(many) == ["window", "global"] and all(len(ms) == 2 for ms in many.values())
    x, _ = task.sample(torch.Generator().manual_seed(5), 16)
    for name, ms in many.items():
        for s, m in zip((0, 1), ms):
            alone = train_masked(task, both[name], steps=20, seed=s, progress=False)
            torch.testing.assert_close(torch.tensor(m.losses), torch.tensor(alone.losses), rtol=1e-4, atol=1e-5)
            assert torch.equal(m.mask, both[name])
            with torch.no_grad():
                torch.testing.assert_close(m(x), alone(x), rtol=1e-4, atol=1e-4)
