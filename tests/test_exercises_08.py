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


# ---- 08_tiled_forward (the grader drives the tiles; the learner writes the tile step) ----

def make_tile(scale=True, mask=True, rescale=True, safe=True):
    def flash_tile(m, l, acc, q_i, k_j, v_j, visible):
        s = q_i @ k_j.transpose(-2, -1) * (1 / math.sqrt(q_i.shape[-1]) if scale else 1.0)
        s = s.masked_fill(~visible, -INF) if mask else s
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        m_sub = torch.where(m_new == -INF, torch.zeros_like(m_new), m_new) if safe else m_new
        p, alpha = torch.exp(s - m_sub), torch.exp(m - m_sub)
        return m_new, alpha * l + p.sum(-1, keepdim=True), (alpha * acc if rescale else acc) + p @ v_j
    return flash_tile


def test_tiled_forward():
    assert_all_pass("08_tiled_forward", make_tile())
    assert_hint("08_tiled_forward", make_tile(scale=False), "not scaled")
    assert_hint("08_tiled_forward", make_tile(mask=False), "`visible` is ignored")
    assert_hint("08_tiled_forward", make_tile(rescale=False), "accumulator is not rescaled")
    assert_hint("08_tiled_forward", make_tile(safe=False), "exp(−∞ + ∞) = NaN")


def test_tiled_forward_reference_is_the_softmax_over_keys_and_prior():
    """The dense reference with an all-empty prior state is attention and its logsumexp (fp64), and the grader's
    loop visits every tile a causal kernel visits, each once."""
    from attn_course.grading.exercises import get
    from attn_course.grading.exercises.lesson08 import _attn_ref, _tiled_expected, tile_grid
    for case in get("08_tiled_forward").cases(torch.Generator().manual_seed(4)):
        i, p = case.inputs, case.params
        empty = dict(case.inputs, m0=torch.full_like(i["m0"], -INF), l0=torch.zeros_like(i["l0"]),
                     acc0=torch.zeros_like(i["acc0"]))
        want = _tiled_expected(type(case)(case.name, empty, case.params))
        out, lse, _ = _attn_ref(i["q"], i["k"], i["v"], p["causal"])
        torch.testing.assert_close(want["out"], out)
        torch.testing.assert_close(want["lse"], lse)
        L = i["q"].shape[-2]
        tiles = tile_grid(L, p["block_q"], p["block_k"], p["causal"], p["order"])
        assert len(set(tiles)) == len(tiles) == sum(-(-min(L, q0 + p["block_q"]) // p["block_k"]) if p["causal"]
                                                    else -(-L // p["block_k"]) for q0 in range(0, L, p["block_q"]))
        assert bool((i["l0"] > 0).any()) and bool((i["l0"] == 0).any())          # both kinds of start state


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


def test_backward_reference_is_autograd_where_lse_and_out_are_true():
    """On the unperturbed cases the formula's reference is autograd of attention (fp64); on the perturbed ones
    autograd's answer — what a backward that ignores lse and out returns — misses it, with the hint."""
    from attn_course.grading.exercises import get
    from attn_course.grading.exercises.lesson08 import _true_grads
    from exercise_kit import results
    ex = get("08_backward_from_lse")
    cases = ex.cases(torch.Generator().manual_seed(0))
    for case in cases:
        same = [torch.allclose(ex.expected(case)[key], t) for key, t in _true_grads(case).items()]
        assert all(same) != case.params["perturbed"], case.name
    res = results("08_backward_from_lse", lambda q, k, v, out, lse, dout, causal: tuple(
        _true_grads(type(cases[0])("", {"q": q, "k": k, "v": v, "dout": dout}, {"causal": causal})).values()))
    assert [ok for ok, _ in res] == [not c.params["perturbed"] for c in cases], res
    assert all("not from the lse" in msg for ok, msg in res if not ok), res


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


# ---- 08_tiled_backward (the grader drives the tiles; the learner writes the tile step) ----

def make_tile_bwd(p="lse", use_D=True, scale_ds=True, mask=True, pad=0):
    """The backward's tile step with one mistake (``p`` "lse" / "tile" / "exp", ``use_D``, ``scale_ds``, ``mask``),
    or zero-padded to ``pad`` rows (a correct variant)."""
    def tile_step(q_i, k_j, v_j, do_i, lse_i, D_i, visible):
        bq, bk = q_i.shape[-2], k_j.shape[-2]
        if pad:
            P2 = lambda t: torch.nn.functional.pad(t, (0, 0, 0, pad - t.shape[-2]))  # noqa: E731
            q_i, k_j, v_j, do_i = P2(q_i), P2(k_j), P2(v_j), P2(do_i)
            lse_i, D_i = (torch.nn.functional.pad(t, (0, pad - bq)) for t in (lse_i, D_i))
            visible = torch.nn.functional.pad(visible, (0, pad - bk, 0, pad - bq))
        scale = 1 / math.sqrt(q_i.shape[-1])
        s = q_i @ k_j.transpose(-2, -1) * scale
        s = s.masked_fill(~visible, -INF) if mask else s
        if p == "lse":
            P = torch.exp(s - lse_i[..., None])
        elif p == "tile":
            e = torch.exp(s - s.amax(-1, keepdim=True))
            P = e / e.sum(-1, keepdim=True)
        else:
            P = torch.exp(s)
        dS = P * (do_i @ v_j.transpose(-2, -1) - (D_i[..., None] if use_D else 0.0)) * (scale if scale_ds else 1.0)
        return (dS @ k_j)[..., :bq, :], (dS.transpose(-2, -1) @ q_i)[..., :bk, :], (P.transpose(-2, -1) @ do_i)[..., :bk, :]
    return tile_step


def test_tiled_backward():
    assert_all_pass("08_tiled_backward", make_tile_bwd())
    assert_all_pass("08_tiled_backward", make_tile_bwd(pad=8))                          # review M8-1: padding is fine
    assert_all_pass("08_tiled_backward", lambda *a: torch.no_grad()(make_tile_bwd())(*a))   # and no_grad
    assert_hint("08_tiled_backward", make_tile_bwd(use_D=False), "D_i is missing")
    assert_hint("08_tiled_backward", make_tile_bwd(p="tile"), "each tile's own row sums")
    assert_hint("08_tiled_backward", make_tile_bwd(p="exp"), "exp(S) alone is not normalised")
    assert_hint("08_tiled_backward", make_tile_bwd(scale_ds=False), "the scale is missing in dS")
    assert_hint("08_tiled_backward", make_tile_bwd(mask=False), "`visible` is ignored")


def test_tiled_backward_reference_is_autograd_of_attention():
    """The judge's reference equals autograd of SDPA (fp64) on the unperturbed cases, and is the formula with the
    given lse and D on the perturbed one, which autograd's gradients miss; every case is ragged, blocks unequal."""
    import torch.nn.functional as F

    from attn_course.grading.exercises import get
    ex = get("08_tiled_backward")
    for case in ex.cases(torch.Generator().manual_seed(5)):
        i = case.inputs
        q, k, v = (i[n].clone().requires_grad_() for n in "qkv")
        ref = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=case.params["causal"]),
                                  (q, k, v), i["dout"])
        want = ex.expected(case)
        same = [torch.allclose(want[key], r) for key, r in zip(("dq", "dk", "dv"), ref)]
        assert all(same) != case.params["perturbed"], case.name
        L, bq, bk = i["q"].shape[-2], case.params["block_q"], case.params["block_k"]
        assert L % bq and L % bk and bq != bk
