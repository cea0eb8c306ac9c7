"""linear_attention (Katharopoulos et al. 2020) against an O(L²) fp64 reference that builds the kernel matrix
φ(Q)φ(K)ᵀ explicitly; the recurrent form; memory (no L×L tensor, no (L, E, Ev) cumsum); Performer features."""
import math

import pytest
import torch
import torch.nn.functional as F

from attn_course import bench, linear_attention
from attn_course.linear import (LinearAttentionState, linear_attention_recurrent, linear_attention_step,
                                linear_attention_weights, performer_attention, performer_features,
                                random_features)

F64 = torch.float64


def kernel_reference(q, k, v, causal, eps=1e-6):
    """out_i = Σ_j K_ij v_j / (Σ_j K_ij + eps), K = φ(Q)φ(K)ᵀ (L × L), φ = elu + 1, in fp64."""
    phi = lambda x: torch.where(x > 0, x + 1, torch.exp(x))          # elu(x) + 1 written out
    K = phi(q.double()) @ phi(k.double()).transpose(-2, -1)
    if causal:
        K = K * torch.ones(K.shape[-2:], dtype=F64).tril()
    return (K @ v.double()) / (K.sum(-1, keepdim=True) + eps)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape,Ev,chunk", [((2, 3, 37, 8), 5, 8), ((1, 1, 64, 16), 16, 64), ((4, 10, 3), 2, 4),
                                             ((2, 1, 1, 4), 3, 64), ((1, 2, 100, 6), 7, 7)])
def test_fp64_matches_kernel_reference(causal, shape, Ev, chunk):
    q, k = torch.randn(shape, dtype=F64), torch.randn(shape, dtype=F64)
    v = torch.randn(*shape[:-1], Ev, dtype=F64)
    out = linear_attention(q, k, v, is_causal=causal, chunk_size=chunk)
    torch.testing.assert_close(out, kernel_reference(q, k, v, causal), atol=1e-12, rtol=0)


def test_cross_lengths_non_causal():
    q, k, v = torch.randn(2, 7, 4, dtype=F64), torch.randn(2, 11, 4, dtype=F64), torch.randn(2, 11, 3, dtype=F64)
    torch.testing.assert_close(linear_attention(q, k, v), kernel_reference(q, k, v, False), atol=1e-12, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_fp32_parity_with_fp64(causal):
    q, k, v = (torch.randn(2, 4, 300, 32) for _ in range(3))
    out = linear_attention(q, k, v, is_causal=causal)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), kernel_reference(q, k, v, causal), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs(dtype):
    q, k, v = (torch.randn(1, 2, 200, 16) * 4 for _ in range(3))
    out = linear_attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=True)
    assert out.dtype == dtype and torch.isfinite(out).all()
    ref = kernel_reference(q.to(dtype), k.to(dtype), v.to(dtype), True)
    torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("causal", [False, True])
def test_gradients(causal):
    q, k, v = (torch.randn(1, 2, 9, 3, dtype=F64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(lambda a, b, c: linear_attention(a, b, c, is_causal=causal, chunk_size=4),
                                    (q, k, v))
    g = torch.randn(1, 2, 9, 3, dtype=F64)
    got = torch.autograd.grad(linear_attention(q, k, v, is_causal=causal, chunk_size=4), (q, k, v), g)
    want = torch.autograd.grad(kernel_reference(q, k, v, causal), (q, k, v), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_recurrent_form_equals_causal_parallel_form():
    q, k, v = torch.randn(2, 3, 50, 8, dtype=F64), torch.randn(2, 3, 50, 8, dtype=F64), torch.randn(2, 3, 50, 5, dtype=F64)
    torch.testing.assert_close(linear_attention_recurrent(q, k, v), linear_attention(q, k, v, is_causal=True),
                               atol=1e-12, rtol=0)
    torch.testing.assert_close(linear_attention_recurrent(q, k, v), kernel_reference(q, k, v, True), atol=1e-12, rtol=0)


def test_state_has_constant_size_and_is_not_mutated():
    E, Ev = 8, 5
    state, sizes = None, []
    for t in range(100):
        q, k, v = torch.randn(2, E), torch.randn(2, E), torch.randn(2, Ev)
        before = None if state is None else (state.S.clone(), state.z.clone())
        _, new = linear_attention_step(q, k, v, state)
        if before is not None:
            assert torch.equal(state.S, before[0]) and torch.equal(state.z, before[1])
        state = new
        sizes.append(state.nbytes())
    assert set(sizes) == {2 * (E * Ev + E) * 4}
    assert isinstance(state, LinearAttentionState) and state.S.shape == (2, E, Ev) and state.z.shape == (2, E)


def test_step_is_the_paper_recurrence():
    """S_t = S_{t-1} + φ(k_t) v_tᵀ, z_t = z_{t-1} + φ(k_t); out = φ(q)ᵀS / (φ(q)ᵀz + eps) — by hand."""
    E, Ev = 4, 3
    S0, z0 = torch.rand(E, Ev, dtype=F64), torch.rand(E, dtype=F64)
    q, k, v = torch.randn(E, dtype=F64), torch.randn(E, dtype=F64), torch.randn(Ev, dtype=F64)
    phi = lambda x: torch.where(x > 0, x + 1, torch.exp(x))
    S1 = S0 + torch.outer(phi(k), v)
    z1 = z0 + phi(k)
    out, st = linear_attention_step(q, k, v, LinearAttentionState(S0, z0), eps=0.0)
    torch.testing.assert_close(st.S, S1)
    torch.testing.assert_close(st.z, z1)
    torch.testing.assert_close(out, phi(q) @ S1 / (phi(q) @ z1))


def test_never_forms_an_L_by_L_tensor():
    B, H, L, E = 1, 2, 2048, 32
    q, k, v = (torch.randn(B, H, L, E) for _ in range(3))
    LL = B * H * L * L * 4
    assert bench.largest_tensor_created(F.scaled_dot_product_attention, q, k, v) < LL   # sanity: SDPA fused
    non_causal = bench.largest_tensor_created(linear_attention, q, k, v)
    assert non_causal == B * H * L * E * 4                       # the inputs' size: φ(Q), the output
    C = 64
    causal = bench.largest_tensor_created(lambda: linear_attention(q, k, v, is_causal=True, chunk_size=C))
    per_head = max(L * C, (L // C) * E * E, L * E)                # C×C per chunk; one E×E state per chunk
    assert causal == B * H * per_head * 4
    assert causal <= LL / 32 and causal < B * H * L * E * E * 4 / 8     # no (L, E, Ev) cumsum either


def test_implied_weights_reproduce_the_output():
    q, k, v = (torch.randn(2, 12, 4, dtype=F64) for _ in range(3))
    for causal in (False, True):
        A = linear_attention_weights(q, k, is_causal=causal)
        assert (A >= 0).all()
        torch.testing.assert_close(A.sum(-1), torch.ones(2, 12, dtype=F64), atol=1e-5, rtol=0)
        torch.testing.assert_close(A @ v, linear_attention(q, k, v, is_causal=causal), atol=1e-12, rtol=0)
        if causal:
            assert (A.triu(1) == 0).all()


def test_errors_name_the_sizes():
    q = torch.randn(2, 5, 4)
    with pytest.raises(ValueError, match=r"same feature size E.*\(2, 5, 4\).*\(2, 5, 3\)"):
        linear_attention(q, torch.randn(2, 5, 3), torch.randn(2, 5, 3))
    with pytest.raises(ValueError, match=r"key \(2, 5, 4\) and value \(2, 6, 4\)"):
        linear_attention(q, q, torch.randn(2, 6, 4))
    with pytest.raises(ValueError, match="Lq == Lk, got Lq=5, Lk=7"):
        linear_attention(q, torch.randn(2, 7, 4), torch.randn(2, 7, 4), is_causal=True)
    with pytest.raises(ValueError, match="chunk_size"):
        linear_attention(q, q, q, chunk_size=0)
    with pytest.raises(ValueError, match="floating-point"):
        linear_attention(q.long(), q.long(), q.long())
    with pytest.raises(ValueError, match="leading"):
        linear_attention(q, torch.randn(3, 5, 4), torch.randn(3, 5, 4))


# ---- Performer ----

def test_orthogonal_random_features():
    d, m = 8, 20
    om = random_features(m, d, generator=torch.Generator().manual_seed(0), dtype=F64)
    assert om.shape == (m, d)
    block = om[:d] / om[:d].norm(dim=-1, keepdim=True)
    torch.testing.assert_close(block @ block.T, torch.eye(d, dtype=F64), atol=1e-10, rtol=0)
    big = random_features(4000, d, generator=torch.Generator().manual_seed(1), dtype=F64)
    assert abs((big ** 2).sum(-1).mean().item() - d) < 0.3       # E‖ω‖² = d, as for ω ~ N(0, I)


def test_positive_features_are_an_unbiased_softmax_kernel():
    """Without the stabiliser (one q, one k, stabilisers known), mean of φ(q)ᵀφ(k) over many features → exp(qᵀk/√d)."""
    d = 4
    q, k = torch.randn(1, d, dtype=F64) * 0.5, torch.randn(1, d, dtype=F64) * 0.5
    om = random_features(200_000, d, orthogonal=False, generator=torch.Generator().manual_seed(0), dtype=F64)
    fq, fk = performer_features(q, om, is_query=True), performer_features(k, om, is_query=True)
    # undo the per-row stabiliser: it subtracted max_j (ω_jᵀx̂ − ‖x̂‖²/2) inside the exp
    xs = lambda x: (x / d ** 0.25 @ om.T - (x / d ** 0.25).pow(2).sum(-1, keepdim=True) / 2).amax(-1)
    est = (fq @ fk.T).item() * math.exp(xs(q).item() + xs(k).item())
    assert (fq > 0).all()
    assert abs(est / math.exp((q @ k.T).item() / math.sqrt(d)) - 1) < 0.02


@pytest.mark.parametrize("orthogonal", [False, True])
def test_the_softmax_kernel_estimate_is_unbiased(orthogonal):
    """FAVOR+'s estimate of exp(qᵀk/√d), averaged over independent feature draws, lands on it — with orthogonal
    blocks too (QR's Q is Haar only after fixing the signs of R's diagonal; without that the estimate of
    exp(0.35) = 1.42 stayed near 1.10 whatever the number of features)."""
    d, m, draws = 16, 2048, 40
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(d, generator=g, dtype=F64), torch.randn(d, generator=g, dtype=F64)
    k = k - (k @ q) / (q @ q) * q + q                              # a k with qᵀk = |q|², then scale both
    q, k = q / q.norm() * 0.75 * d ** 0.25, k / k.norm() * 0.75 * d ** 0.25
    target = math.exp((q @ k).item() / math.sqrt(d))
    ests = []
    for s in range(draws):
        om = random_features(m, d, orthogonal=orthogonal, generator=torch.Generator().manual_seed(100 + s), dtype=F64)
        f = lambda x: torch.exp(om @ (x / d ** 0.25) - (x / d ** 0.25).pow(2).sum() / 2)
        ests.append((f(q) * f(k)).mean().item())
    ests = torch.tensor(ests, dtype=F64)
    se = ests.std() / math.sqrt(draws)
    assert abs(ests.mean().item() - target) < 4 * se.item() + 1e-3 * target, (ests.mean().item(), target, se.item())


def test_orthogonal_rows_are_gaussian():
    """Each row of the orthogonal features is N(0, I): zero mean and identity second moment over many blocks."""
    d = 4
    om = random_features(4 * 20_000, d, generator=torch.Generator().manual_seed(3), dtype=F64)
    assert om.mean(0).abs().max() < 0.03                           # biased QR: first coordinate's mean ≈ −0.9
    torch.testing.assert_close(om.T @ om / om.shape[0], torch.eye(d, dtype=F64), atol=0.05, rtol=0)


@pytest.mark.parametrize("d", [4, 16])
def test_orthogonal_rows_have_chi_distributed_norms(d):
    """Rows are N(0, I) only if their norms are chi_d like an iid Gaussian vector's (Choromanski et al. 2021, §2.4):
    ‖ω‖² has mean d and variance 2d, and each coordinate has the Gaussian fourth moment 3. Rows rescaled to a
    fixed norm √d (a common shortcut) have variance 0 and fourth moment 3d/(d + 2)."""
    om = random_features(30_000, d, generator=torch.Generator().manual_seed(5), dtype=F64)
    sq = (om ** 2).sum(-1)
    n = om.shape[0]
    assert abs(sq.mean().item() - d) < 5 * math.sqrt(2 * d / n)
    assert abs(sq.var().item() / (2 * d) - 1) < 0.06
    assert abs((om ** 4).mean().item() - 3) < 0.1
    # rows of one block are orthogonal, rows of different blocks are not
    assert abs(om[0] @ om[1]).item() < 1e-9 and abs(om[0] @ om[d]).item() > 1e-6


def test_performer_converges_to_softmax_attention():
    q, k, v = (torch.randn(2, 2, 40, 16, dtype=F64) * s for s in (0.5, 0.5, 1.0))
    exact = F.scaled_dot_product_attention(q, k, v)
    def err(m):
        return sum((performer_attention(q, k, v, random_features(m, 16, generator=torch.Generator().manual_seed(s),
                                                                 dtype=F64)) - exact).abs().mean().item()
                   for s in range(4)) / 4
    e16, e256, e4096 = err(16), err(256), err(4096)
    assert e4096 < e256 < e16 and e4096 < 0.3 * e16 and e4096 < 0.01
    causal = performer_attention(q, k, v, random_features(4096, 16, generator=torch.Generator().manual_seed(0),
                                                          dtype=F64), is_causal=True)
    assert (causal - F.scaled_dot_product_attention(q, k, v, is_causal=True)).abs().mean() < 0.02
