"""Exercise set 08: the reference solutions pass every case; each common mistake fails with its hint."""
import math
from functools import partial

import pytest
import torch

import exercise_kit
from exercise_kit import assert_all_pass

# some cases cannot tell two mistakes apart, so a mistake need only be named on the cases that can
assert_hint = partial(exercise_kit.assert_hint, every=False)

INF = float("inf")


# ---- 08_online_step ----

def make_step(rescale_acc=True, rescale_l=True, safe=True):
    def online_step(m, l, acc, s, v):
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        m_sub = torch.where(m_new == -INF, torch.zeros_like(m_new), m_new) if safe else m_new
        p = torch.exp(s - m_sub)
        alpha = torch.exp(m - m_sub)
        l_new = (alpha * l if rescale_l else l) + p.sum(-1, keepdim=True)
        acc_new = (alpha * acc if rescale_acc else acc) + p @ v
        return m_new, l_new, acc_new
    return online_step


def test_online_step():
    assert_all_pass("08_online_step", make_step())
    assert_hint("08_online_step", make_step(rescale_acc=False), "accumulator is not rescaled")
    assert_hint("08_online_step", make_step(rescale_acc=False, rescale_l=False), "accumulator is not rescaled")
    assert_hint("08_online_step", make_step(rescale_l=False), "denominator l is not rescaled")
    assert_hint("08_online_step", make_step(safe=False), "exp(−∞ + ∞) = NaN")


# ---- 08_tiled_forward ----

def make_tiled(scale=True, mask=True, rescale=True, lse_with_max=True):
    def tiled_attention(q, k, v, causal, block):
        L, d = q.shape[-2], q.shape[-1]
        sc = 1 / math.sqrt(d) if scale else 1.0
        outs, lses = [], []
        for q0 in range(0, L, block):
            qi = q[..., q0:q0 + block, :]
            m = torch.full((*qi.shape[:-1], 1), -INF, dtype=q.dtype)
            l = torch.zeros_like(m)
            acc = torch.zeros_like(qi)
            for k0 in range(0, L, block):
                s = qi @ k[..., k0:k0 + block, :].transpose(-2, -1) * sc
                if causal and mask:
                    rows = torch.arange(q0, q0 + qi.shape[-2])[:, None]
                    cols = torch.arange(k0, k0 + s.shape[-1])[None, :]
                    s = s.masked_fill(cols > rows, -INF)
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                p = torch.exp(s - m_new)
                alpha = torch.exp(m - m_new)
                l = alpha * l + p.sum(-1, keepdim=True)
                acc = (alpha * acc if rescale else acc) + p @ v[..., k0:k0 + block, :]
                m = m_new
            outs.append(acc / l)
            lses.append((m + torch.log(l) if lse_with_max else torch.log(l)).squeeze(-1))
        return torch.cat(outs, -2), torch.cat(lses, -1)
    return tiled_attention


def test_tiled_forward():
    assert_all_pass("08_tiled_forward", make_tiled())
    assert_hint("08_tiled_forward", make_tiled(scale=False), "not scaled")
    assert_hint("08_tiled_forward", make_tiled(mask=False), "causal mask is missing")
    assert_hint("08_tiled_forward", make_tiled(rescale=False), "rescale of acc")
    assert_hint("08_tiled_forward", make_tiled(lse_with_max=False), "add the running max back")


# ---- 08_backward_from_lse ----

def make_bwd(use_lse=True, use_D=True, scale_grads=True):
    def attention_backward(q, k, v, out, lse, dout, causal):
        scale = 1 / math.sqrt(q.shape[-1])
        s = q @ k.transpose(-2, -1) * scale
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -INF)
        P = torch.exp(s - lse[..., None]) if use_lse else torch.exp(s)
        dv = P.transpose(-2, -1) @ dout
        dP = dout @ v.transpose(-2, -1)
        D = (dout * out).sum(-1, keepdim=True) if use_D else 0.0
        dS = P * (dP - D)
        g = scale if scale_grads else 1.0
        return dS @ k * g, dS.transpose(-2, -1) @ q * g, dv
    return attention_backward


def test_backward_from_lse():
    assert_all_pass("08_backward_from_lse", make_bwd())
    assert_hint("08_backward_from_lse", make_bwd(use_lse=False), "exp(S − L)")
    assert_hint("08_backward_from_lse", make_bwd(use_D=False), "you left out D")
    assert_hint("08_backward_from_lse", make_bwd(scale_grads=False), "need the scale too")


# ---- 08_causal_tiles ----

def causal_tiles_ok(L, block_q, block_k):
    return sum(math.ceil(min(L, q0 + block_q) / block_k) for q0 in range(0, L, block_q))


def test_causal_tiles_matches_the_implementation():
    """The count equals the number of tiles flash_attention computes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from attn_course import flash_attention

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += func.overloadpacket.__name__ in ("bmm", "baddbmm", "baddbmm_")
            return func(*args, **(kwargs or {}))

    L, bq, bk = 50, 7, 13
    q = torch.randn(1, 1, L, 4)
    with Count():
        flash_attention(q, q, q, is_causal=True, block_q=bq, block_k=bk)
    assert Count.n == 2 * causal_tiles_ok(L, bq, bk)          # S = QKᵀ and P̃V: two matmuls per tile


@pytest.mark.parametrize("fn,fragment", [
    (causal_tiles_ok, None),
    (lambda L, block_q, block_k: math.ceil(L / block_q) * math.ceil(L / block_k), "that is every tile"),
    (lambda L, block_q, block_k: (lambda T: T * (T + 1) // 2)(math.ceil(L / block_q)), "T(T+1)/2"),
])
def test_causal_tiles(fn, fragment):
    if fragment is None:
        assert_all_pass("08_causal_tiles", fn)
    else:
        assert_hint("08_causal_tiles", fn, fragment)


# ---- 08_hbm_traffic ----

def traffic(N, d, block_q, block_k, kv=2, per="q", writes=True):
    blocks = math.ceil(N / (block_q if per == "q" else block_k))
    return N * d + blocks * kv * N * d + ((N * d + N) if writes else 0)


def test_traffic_matches_iosim():
    from attn_course import iosim
    for N, d, bq, bk in [(100, 8, 30, 7), (512, 64, 128, 64)]:
        assert traffic(N, d, bq, bk) == iosim.tiled_io(N, d, block_q=bq, block_k=bk).total


@pytest.mark.parametrize("kw,fragment", [
    (dict(), None), (dict(kv=1), "K and V are both"), (dict(per="k"), "QUERY blocks"), (dict(writes=False), "add the writes"),
])
def test_hbm_traffic(kw, fragment):
    fn = lambda N, d, block_q, block_k: traffic(N, d, block_q, block_k, **kw)  # noqa: E731
    if fragment is None:
        assert_all_pass("08_hbm_traffic", fn)
    else:
        assert_hint("08_hbm_traffic", fn, fragment)
