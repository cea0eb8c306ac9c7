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
