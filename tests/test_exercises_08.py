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


# ---- 08_tiled_backward (build: FlashAttention's tiled, recomputing backward) ----

def make_tiled_bwd(p="lse", use_D=True, scale_ds=True, skip=True, strip=False):
    """The tiled backward (query tiles outside), with one mistake: ``p`` "lse" / "tile" (each tile normalised by
    its own row sums) / "exp"; ``use_D``; ``scale_ds``; ``skip=False``: causal visits every tile; ``strip``: each
    query block against all keys at once."""
    def tiled_backward(q, k, v, out, lse, dout, causal, block):
        L, d = q.shape[-2:]
        scale = 1 / math.sqrt(d)
        D = (dout * out).sum(-1, keepdim=True) if use_D else torch.zeros_like(out[..., :1])
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for q0 in range(0, L, block):
            q1 = min(q0 + block, L)
            kb = L if strip else block
            for k0 in range(0, q1 if (causal and skip) else L, kb):
                k1 = min(k0 + kb, L)
                s = q[..., q0:q1, :] @ k[..., k0:k1, :].transpose(-2, -1) * scale
                if causal:
                    s = s.masked_fill(torch.arange(k0, k1)[None, :] > torch.arange(q0, q1)[:, None], -math.inf)
                if p == "lse":
                    P = torch.exp(s - lse[..., q0:q1, None])
                elif p == "tile":
                    e = torch.exp(s - s.amax(-1, keepdim=True))
                    P = e / e.sum(-1, keepdim=True)
                else:
                    P = torch.exp(s)
                dv[..., k0:k1, :] += P.transpose(-2, -1) @ dout[..., q0:q1, :]
                dS = P * (dout[..., q0:q1, :] @ v[..., k0:k1, :].transpose(-2, -1) - D[..., q0:q1, :])
                g = scale if scale_ds else 1.0
                dq[..., q0:q1, :] += dS @ k[..., k0:k1, :] * g
                dk[..., k0:k1, :] += dS.transpose(-2, -1) @ q[..., q0:q1, :] * g
        return dq, dk, dv
    return tiled_backward


def test_tiled_backward():
    assert_all_pass("08_tiled_backward", make_tiled_bwd())
    assert_hint("08_tiled_backward", make_tiled_bwd(use_D=False), "D_i is missing")
    assert_hint("08_tiled_backward", make_tiled_bwd(p="tile"), "each tile's own row sums")
    assert_hint("08_tiled_backward", make_tiled_bwd(p="exp"), "exp(S) alone is not normalised")
    assert_hint("08_tiled_backward", make_tiled_bwd(scale_ds=False), "the scale is missing in dS")


def test_tiled_backward_reference_is_autograd_of_the_formula():
    """The judge's reference (autograd of SDPA, fp64) equals 8.3's reference (autograd of the explicit formula)
    and the hint model without mistakes, on the held-out shapes."""
    from attn_course.grading.exercises import get
    from attn_course.grading.exercises.lesson08 import _attn_ref, _tb_model
    ex = get("08_tiled_backward")
    for case in ex.cases(torch.Generator().manual_seed(5)):
        i = case.inputs
        q, k, v = (i[n].clone().requires_grad_() for n in "qkv")
        ref = torch.autograd.grad(_attn_ref(q, k, v, case.params["causal"])[0], (q, k, v), i["dout"])
        want, model = ex.expected(case), _tb_model(case)
        for key, r in zip(("dq", "dk", "dv"), ref):
            torch.testing.assert_close(want[key], r)
            torch.testing.assert_close(model[key], r)
        assert case.inputs["q"].shape[-2] % case.params["block"] != 0                   # ragged L on every case


def test_tiled_backward_properties_every_case():
    """8.3's dense backward, a dense backward by row strips, and (on the causal cases) every tile visited: right
    gradients, no point."""
    from attn_course.grading.exercises import get
    from exercise_kit import results
    from test_grading_learners import run_cell
    from learner_cells import CELLS
    dense = [c for c, hint in CELLS["08_tiled_backward"][2] if hint == "as large as the whole score matrix"][0]
    for fn, fragment in [(run_cell(dense)["tiled_backward"], "as large as the whole score matrix"),
                         (make_tiled_bwd(strip=True), "more than one tile's")]:
        res = results("08_tiled_backward", fn)
        assert not any(ok for ok, _ in res) and all(fragment in msg for _, msg in res), res
    res = results("08_tiled_backward", make_tiled_bwd(skip=False))
    causal = [c.params["causal"] for c in get("08_tiled_backward").cases(torch.Generator().manual_seed(0))]
    assert [ok for ok, _ in res] == [not c for c in causal], res
    assert all("skip the tiles above the diagonal" in msg for ok, msg in res if not ok), res
