"""AdditiveAttention (Bahdanau et al. 2015) against a loop-per-pair fp64 reference of the paper's formula."""
import math

import pytest
import torch

from attn_course import AdditiveAttention, bench


def loop_reference(module, query, key, value, mask=None):
    """score(i, j) = w_vᵀ tanh(W_q q_i + W_k k_j), one (b, i, j) at a time, softmax with math.exp."""
    Wq, Wk, wv = (p.detach().double() for p in (module.W_q.weight, module.W_k.weight, module.w_v.weight[0]))
    q, k, v = query.double(), key.double(), value.double()
    B, Lq, Lk = q.shape[0], q.shape[1], k.shape[1]
    out = torch.zeros(B, Lq, v.shape[-1], dtype=torch.float64)
    weights = torch.zeros(B, Lq, Lk, dtype=torch.float64)
    for b in range(B):
        for i in range(Lq):
            visible = [j for j in range(Lk) if mask is None or bool(mask[min(b, mask.shape[0] - 1), min(i, mask.shape[1] - 1), j])]
            scores = {j: float(wv @ torch.tanh(Wq @ q[b, i] + Wk @ k[b, j])) for j in visible}
            if not scores:
                continue                                              # fully masked: zeros
            top = max(scores.values())
            total = sum(math.exp(s - top) for s in scores.values())
            for j, s in scores.items():
                weights[b, i, j] = math.exp(s - top) / total
                out[b, i] += weights[b, i, j] * v[b, j]
    return out, weights


@pytest.mark.parametrize("B,Lq,Lk,dq,dk,h,dv", [(2, 3, 5, 4, 6, 7, 3), (1, 6, 2, 8, 8, 4, 5), (3, 1, 1, 2, 3, 5, 1)])
def test_matches_loop_reference(B, Lq, Lk, dq, dk, h, dv):
    m = AdditiveAttention(dq, dk, h).double()
    q, k, v = torch.randn(B, Lq, dq, dtype=torch.float64), torch.randn(B, Lk, dk, dtype=torch.float64), \
        torch.randn(B, Lk, dv, dtype=torch.float64)
    out, w = m(q, k, v)
    ref_out, ref_w = loop_reference(m, q, k, v)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=0)
    torch.testing.assert_close(w, ref_w, atol=1e-12, rtol=0)


def test_fp32_close_to_fp64_reference():
    m = AdditiveAttention(5, 3, 16)
    q, k, v = torch.randn(2, 4, 5), torch.randn(2, 7, 3), torch.randn(2, 7, 2)
    out, w = m(q, k, v)
    ref_out, ref_w = loop_reference(m, q, k, v)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w.double(), ref_w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(2, 4, 6), (1, 4, 6), (2, 1, 6), (1, 1, 6)])
def test_masks_broadcast_and_fully_masked_rows_are_zero(shape):
    m = AdditiveAttention(4, 4, 8).double()
    q, k, v = (torch.randn(2, L, 4, dtype=torch.float64) for L in (4, 6, 6))
    mask = torch.rand(shape) > 0.4
    mask[..., 0, :] = False                                            # a fully masked row (or all rows)
    q.requires_grad_()
    out, w = m(q, k, v, attn_mask=mask)
    ref_out, ref_w = loop_reference(m, q.detach(), k, v, mask)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=0)
    torch.testing.assert_close(w, ref_w, atol=1e-12, rtol=0)
    assert (out[:, 0] == 0).all() and (w[:, 0] == 0).all()
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_builds_the_pair_tensor():
    """Every (query, key) pair gets its own hidden vector: the largest tensor is (B, Lq, Lk, hidden)."""
    B, Lq, Lk, h = 2, 30, 40, 16
    m = AdditiveAttention(8, 8, h)
    q, k, v = torch.randn(B, Lq, 8), torch.randn(B, Lk, 8), torch.randn(B, Lk, 8)
    with torch.no_grad():
        assert bench.largest_tensor_created(m, q, k, v) == B * Lq * Lk * h * 4


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision(dtype):
    m = AdditiveAttention(8, 8, 16)
    q, k, v = torch.randn(2, 5, 8) * 30, torch.randn(2, 9, 8) * 30, torch.randn(2, 9, 4)   # saturated tanh
    ref, _ = m(q, k, v)
    out, w = m.to(dtype)(q.to(dtype), k.to(dtype), v.to(dtype))
    assert out.dtype == w.dtype == dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=5e-2, rtol=5e-2)


def test_dropout_only_in_training_and_weights_are_pre_dropout():
    m = AdditiveAttention(4, 4, 8, dropout=0.5)
    q, k, v = torch.randn(1, 3, 4), torch.randn(1, 5, 4), torch.randn(1, 5, 2)
    m.eval()
    out_eval, w_eval = m(q, k, v)
    m.train()
    out_train, w_train = m(q, k, v)
    torch.testing.assert_close(w_train, w_eval)
    assert not torch.allclose(out_train, out_eval)


def test_errors_name_the_sizes():
    m = AdditiveAttention(4, 6, 8)
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 6), torch.randn(2, 5, 7)
    with pytest.raises(ValueError, match=r"query has last dimension 5.*query_dim=4"):
        m(torch.randn(2, 3, 5), k, v)
    with pytest.raises(ValueError, match=r"key has last dimension 4.*key_dim=6"):
        m(q, torch.randn(2, 5, 4), v)
    with pytest.raises(ValueError, match=r"key \(2, 5, 6\) and value \(2, 4, 7\)"):
        m(q, k, torch.randn(2, 4, 7))
    with pytest.raises(ValueError, match="batch sizes differ"):
        m(torch.randn(3, 3, 4), k, v)
    with pytest.raises(ValueError, match=r"attn_mask of shape \(2, 3, 4\) must be .*5"):
        m(q, k, v, attn_mask=torch.ones(2, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        m(q, k, v, attn_mask=torch.zeros(2, 3, 5))
    with pytest.raises(ValueError, match="3 dimensions"):
        m(q[0], k, v)
    with pytest.raises(ValueError, match="hidden_dim"):
        AdditiveAttention(4, 4, 0)


@pytest.mark.parametrize("Lq,Lk,d,h,dv", [(16, 16, 8, 8, 8), (5, 9, 3, 7, 4)])
def test_matmul_flops_match_the_lessons_row(Lq, Lk, d, h, dv):
    """FlopCounterMode counts the matmuls: projections 2·Lq·d·h + 2·Lk·d·h, w_v 2·Lq·Lk·h, PV 2·Lq·Lk·dv — lesson 10's
    additive row (4LEh + 2L²h + 2L²E_v for Lq = Lk = L; the L²h pair sums and L²h tanh are not matmuls)."""
    from torch.utils.flop_counter import FlopCounterMode
    add = AdditiveAttention(d, d, h)
    q, k, v = torch.randn(1, Lq, d), torch.randn(1, Lk, d), torch.randn(1, Lk, dv)
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        add(q, k, v)
    assert fc.get_total_flops() == 2 * (Lq + Lk) * d * h + 2 * Lq * Lk * h + 2 * Lq * Lk * dv
