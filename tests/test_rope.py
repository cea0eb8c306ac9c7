"""apply_rope against an independent complex-number reference, and RoPE's defining properties."""
import pytest
import torch
from torch.testing import assert_close

from attn_course.rope import apply_rope, rotate_half


def rope_reference(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """fp64 reference: pair (x_i, x_{i+d/2}) as the complex number x_i + i·x_{i+d/2}, multiply by e^{i p θ_i}."""
    d = x.shape[-1]
    theta = base ** (-2.0 * torch.arange(d // 2, dtype=torch.float64) / d)
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2:].double())
    angle = positions.double()[..., None] * theta
    z = z * torch.polar(torch.ones_like(angle), angle)
    return torch.cat((z.real, z.imag), dim=-1)


@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 7, 8), (1, 1, 16, 64)])
def test_matches_complex_reference(shape):
    x = torch.randn(shape, dtype=torch.float64)
    positions = torch.arange(shape[-2])
    assert_close(apply_rope(x), rope_reference(x, positions))
    assert_close(apply_rope(x, positions, base=500.0), rope_reference(x, positions, base=500.0))


def test_rotate_half_convention():
    x = torch.arange(1.0, 7.0)
    assert_close(rotate_half(x), torch.tensor([-4.0, -5.0, -6.0, 1.0, 2.0, 3.0]))


def test_position_zero_is_identity_and_norm_is_preserved():
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    y = apply_rope(x)
    assert_close(y[:, 0], x[:, 0])
    assert_close(y.norm(dim=-1), x.norm(dim=-1))


@pytest.mark.parametrize("shift", [1, 5, 1000])
def test_scores_depend_only_on_relative_position(shift):
    q = torch.randn(3, 6, 32, dtype=torch.float64)
    k = torch.randn(3, 6, 32, dtype=torch.float64)
    pos = torch.tensor([0, 3, 4, 10, 11, 40])
    scores = apply_rope(q, pos) @ apply_rope(k, pos).transpose(-2, -1)
    shifted = apply_rope(q, pos + shift) @ apply_rope(k, pos + shift).transpose(-2, -1)
    assert_close(shifted, scores)
    # and they do depend on the relative position (the property is not vacuous)
    assert not torch.allclose(apply_rope(q, pos) @ apply_rope(k, pos + 1).transpose(-2, -1), scores)


def test_offset_positions_equal_slice_of_full_sequence():
    x = torch.randn(2, 4, 12, 8)
    full = apply_rope(x)
    assert_close(apply_rope(x[:, :, 7:], torch.arange(7, 12)), full[:, :, 7:])


def test_per_batch_positions():
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    pos = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    y = apply_rope(x, pos)
    assert_close(y[0], rope_reference(x[0], pos[0]))
    assert_close(y[1], rope_reference(x[1], pos[1]))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_low_precision_dtypes(dtype, tol):
    x = torch.randn(2, 10, 16)
    y = apply_rope(x.to(dtype))
    assert y.dtype == dtype
    assert_close(y.double(), rope_reference(x.to(dtype).double(), torch.arange(10)), atol=tol, rtol=tol)


def test_gradient_flows():
    x = torch.randn(3, 8, requires_grad=True, dtype=torch.float64)
    torch.autograd.gradcheck(lambda t: apply_rope(t, torch.arange(3)), (x,))


def test_value_errors():
    with pytest.raises(ValueError, match="even feature size, got d=5"):
        apply_rope(torch.randn(3, 5))
    with pytest.raises(ValueError, match="integer tensor"):
        apply_rope(torch.randn(3, 4), torch.arange(3.0))
    with pytest.raises(ValueError, match=r"positions of shape \(4,\) do not broadcast .*L=3"):
        apply_rope(torch.randn(3, 4), torch.arange(4))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        apply_rope(torch.randn(4))
    with pytest.raises(ValueError, match="must be a torch.Tensor"):
        apply_rope([[1.0, 2.0]])


# --- interleaved (GPT-J / complex) convention and multi-axis RoPE -------------------------------------
from attn_course.rope import apply_rope_nd, interleave_perm  # noqa: E402


def rope_reference_complex_interleaved(x, positions, base=10000.0):
    """fp64 reference in the form of a popular Chinese attention tutorial: view (x_{2i}, x_{2i+1}) as one complex number, multiply by e^{ipθ_i}."""
    d = x.shape[-1]
    theta = base ** (-2.0 * torch.arange(d // 2, dtype=torch.float64) / d)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    freqs_cis = torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64), positions.double()[:, None] * theta)
    return torch.view_as_real(z * freqs_cis).flatten(-2)


@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 7, 8), (1, 2, 16, 64)])
def test_interleaved_matches_view_as_complex(shape):
    x = torch.randn(shape, dtype=torch.float64)
    pos = torch.arange(shape[-2])
    assert_close(apply_rope(x, interleaved=True), rope_reference_complex_interleaved(x, pos))
    assert_close(apply_rope(x, pos + 3, base=77.0, interleaved=True), rope_reference_complex_interleaved(x, pos + 3, 77.0))


def test_conventions_differ_by_a_fixed_permutation():
    d = 16
    x = torch.randn(2, 9, d, dtype=torch.float64)
    perm = interleave_perm(d)
    assert perm.tolist()[:4] == [0, 8, 1, 9]
    assert_close(apply_rope(x[..., perm], interleaved=True), apply_rope(x)[..., perm])
    assert not torch.allclose(apply_rope(x, interleaved=True), apply_rope(x))
    # scores are invariant when q and k are both permuted: a checkpoint converts by permuting q/k rows
    q, k = torch.randn(9, d, dtype=torch.float64), torch.randn(9, d, dtype=torch.float64)
    s_half = apply_rope(q) @ apply_rope(k).T
    s_int = apply_rope(q[..., perm], interleaved=True) @ apply_rope(k[..., perm], interleaved=True).T
    assert_close(s_half, s_int)


def test_interleaved_scores_depend_only_on_relative_position():
    q, k = torch.randn(1, 32, dtype=torch.float64), torch.randn(1, 32, dtype=torch.float64)
    def score(m, n):
        return (apply_rope(q, torch.tensor([m]), interleaved=True) * apply_rope(k, torch.tensor([n]), interleaved=True)).sum()
    assert_close(score(7, 3), score(107, 103))


def test_nd_with_one_axis_equals_1d():
    x = torch.randn(2, 10, 12, dtype=torch.float64)
    coords = torch.arange(10)[:, None] * 3
    assert_close(apply_rope_nd(x, coords, [12]), apply_rope(x, coords[:, 0]))


def test_nd_rotates_each_slice_by_its_axis_and_is_relative_per_axis():
    T, Hh, W = 2, 3, 4
    grid = torch.stack(torch.meshgrid(torch.arange(T), torch.arange(Hh), torch.arange(W), indexing="ij"), -1).reshape(-1, 3)
    dims = [4, 6, 6]
    x = torch.randn(grid.shape[0], 16, dtype=torch.float64)
    y = apply_rope_nd(x, grid, dims)
    assert_close(y[:, :4], apply_rope(x[:, :4], grid[:, 0]))
    assert_close(y[:, 4:10], apply_rope(x[:, 4:10], grid[:, 1]))
    assert_close(y[:, 10:], apply_rope(x[:, 10:], grid[:, 2]))
    q, k = torch.randn(1, 16, dtype=torch.float64), torch.randn(1, 16, dtype=torch.float64)
    def score(cq, ck):
        return (apply_rope_nd(q, torch.tensor([cq]), dims) * apply_rope_nd(k, torch.tensor([ck]), dims)).sum()
    assert_close(score([1, 2, 3], [0, 1, 1]), score([5, 7, 9], [4, 6, 7]))
    assert not torch.allclose(score([1, 2, 3], [0, 1, 1]), score([1, 3, 2], [0, 1, 1]))


@pytest.mark.parametrize("coords, dims", [
    (torch.zeros(10, 2, dtype=torch.long), [6, 4]),        # sums to 10, d is 12
    (torch.zeros(10, 2, dtype=torch.long), [5, 7]),        # odd
    (torch.zeros(9, 2, dtype=torch.long), [6, 6]),         # wrong L
    (torch.zeros(10, 3, dtype=torch.long), [6, 6]),        # wrong n
    (torch.zeros(10, 2), [6, 6]),                          # float coords
])
def test_nd_bad_input(coords, dims):
    with pytest.raises(ValueError, match="coords|dims"):
        apply_rope_nd(torch.randn(10, 12), coords, dims)


def test_inv_freq_replaces_the_base_frequencies_and_bad_inputs_name_sizes():
    from attn_course.rope import yarn_inv_freq
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    theta = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    torch.testing.assert_close(apply_rope(x, inv_freq=theta), apply_rope(x))
    torch.testing.assert_close(apply_rope(x, inv_freq=theta, interleaved=True), apply_rope(x, interleaved=True))
    assert not torch.allclose(apply_rope(x, inv_freq=theta / 3), apply_rope(x))
    with pytest.raises(ValueError, match=r"inv_freq has shape \(3,\), expected \(dim/2,\) = \(4,\)"):
        apply_rope(x, inv_freq=theta[:3])
    with pytest.raises(ValueError, match="dim=7"):
        yarn_inv_freq(7, 10000.0, 4, 4096)
    with pytest.raises(ValueError, match="factor=0.5"):
        yarn_inv_freq(8, 10000.0, 0.5, 4096)
    torch.testing.assert_close(yarn_inv_freq(8, 10000.0, 1.0, 4096), theta)       # factor 1: plain RoPE
