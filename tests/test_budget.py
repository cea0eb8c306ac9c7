"""The trace budget (``grading/budget.py``): its counts against sizes worked out by hand, the ways a product can
hide from a matmul counter (masked_fill, where, clone, casts, addbmm, conv1d, cdist, einsum), and the hook in
``Exercise.answer`` that check() and the bulk grader share."""
import pytest
import torch
import torch.nn.functional as F

from attn_course.grading import spec
from attn_course.grading.budget import OverBudget, Trace, over_budget


def traced(fn):
    with Trace() as t:
        fn()
    return t


def test_matmul_counts():
    m, k, n = 5, 7, 3
    a, b = torch.randn(m, k), torch.randn(k, n)
    t = traced(lambda: a @ b)
    assert t.flops == 2 * m * n * k
    assert t.written == m * n and t.largest == m * n and t.largest_shape == (m, n)
    assert t.ops == 1


@pytest.mark.parametrize("name", ["masked_fill", "where", "clone", "cast", "einsum-mul"])
def test_an_L_by_L_tensor_is_written(name):
    L, d = 12, 4
    q, k = torch.randn(L, d), torch.randn(L, d)
    mask = torch.rand(L, L) > 0.5
    run = {"masked_fill": lambda: (q @ k.T).masked_fill(mask, 0.0),
           "where": lambda: torch.where(mask, q @ k.T, 0.0),
           "clone": lambda: (q @ k.T).clone(),
           "cast": lambda: (q @ k.T).double(),
           "einsum-mul": lambda: (q[:, None, :] * k[None, :, :]).sum(-1)}[name]
    t = traced(run)
    assert t.written >= 2 * L * L and t.largest >= L * L
    if name == "einsum-mul":
        assert t.written >= L * L * d                      # the product formed elementwise is written


@pytest.mark.parametrize("name", ["addbmm", "baddbmm", "einsum", "mv", "dot", "addmv", "addr", "cdist", "conv1d",
                                  "embedding_bag"])
def test_products_matmul_counters_miss_are_counted(name):
    b, m, k, n = 3, 4, 5, 6
    A, B, x = torch.randn(b, m, k), torch.randn(b, k, n), torch.randn(k)
    want = {"addbmm": 2 * b * m * k * n, "baddbmm": 2 * b * m * k * n, "einsum": 2 * b * m * k * n,
            "mv": 2 * m * k, "dot": 2 * k, "addmv": 2 * m * k, "addr": 2 * k * k, "cdist": 2 * m * n * k,
            "conv1d": 2 * n * (m - 2 + 1) * k * 2, "embedding_bag": 2 * 3 * k}[name]
    run = {"addbmm": lambda: torch.addbmm(torch.zeros(m, n), A, B),
           "baddbmm": lambda: torch.baddbmm(torch.zeros(b, m, n), A, B),
           "einsum": lambda: torch.einsum("bmk,bkn->bmn", A, B),
           "mv": lambda: A[0] @ x, "dot": lambda: x @ x, "addmv": lambda: torch.addmv(torch.zeros(m), A[0], x),
           "addr": lambda: torch.addr(torch.zeros(k, k), x, x),
           "cdist": lambda: torch.cdist(A[0], B[0].T, compute_mode="donot_use_mm_for_euclid_dist"),
           # input (1, k, m) with k channels, n filters of width 2: (m − 1) outputs of k·2 multiply-adds each
           "conv1d": lambda: F.conv1d(A[0].T[None], torch.randn(n, k, 2)),
           "embedding_bag": lambda: F.embedding_bag(torch.tensor([0, 1, 2]), torch.randn(4, k), torch.tensor([0]),
                                                    per_sample_weights=torch.randn(3), mode="sum")}[name]
    assert traced(run).flops == want


def test_views_write_nothing_and_backward_counts():
    x = torch.randn(6, 8, requires_grad=True)
    t = traced(lambda: x.expand(4, 6, 8).transpose(0, 1))
    assert t.written == 0 and t.largest == 0 and t.ops == 2
    w = torch.randn(8, 3)
    t = traced(lambda: (x @ w).sum().backward())
    assert t.flops == 2 * 6 * 8 * 3 + 2 * 6 * 3 * 8       # forward mm + the backward's mm for x's gradient


def test_popping_the_trace_is_refused():
    from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode
    with pytest.raises(OverBudget, match="dispatch mode stack"):
        with Trace() as t:
            _pop_mode()                                     # the learner takes the trace off the stack ...
            torch.randn(100, 100) @ torch.randn(100, 100)   # ... and works unseen
    assert _get_current_dispatch_mode() is None


def test_over_budget_names_the_metric():
    ref = traced(lambda: torch.randn(10, 4) @ torch.randn(4, 10))
    mine = traced(lambda: (torch.randn(10, 1, 4) * torch.randn(1, 10, 4)).sum(-1))
    assert over_budget(ref, ref, {"written": 1.0, "flops": 1.0}) is None
    hint = over_budget(mine, ref, {"written": 2.0})
    assert hint.startswith("rule: trace budget — elements written") and "limit 2×" in hint
