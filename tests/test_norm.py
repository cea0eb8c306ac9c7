"""RMSNorm against torch.nn.RMSNorm and the fp64 formula."""
import pytest
import torch
from torch.testing import assert_close

from attn_course import RMSNorm


@pytest.mark.parametrize("shape", [(3, 8), (2, 5, 16), (1, 2, 3, 64)])
def test_matches_torch_rmsnorm_and_formula(shape):
    torch.manual_seed(0)
    x = torch.randn(shape) * 3
    ours, ref = RMSNorm(shape[-1], eps=1e-5), torch.nn.RMSNorm(shape[-1], eps=1e-5)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 2.0)
        ref.weight.copy_(ours.weight)
    assert_close(ours(x), ref(x))
    xd = x.double()
    formula = xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * ours.weight.double()
    assert_close(ours(x).double(), formula, atol=1e-6, rtol=1e-5)
    ours.load_state_dict(ref.state_dict())        # same parameter name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_keeps_dtype_and_handles_large_values(dtype):
    x = (torch.randn(4, 32) * 1000).to(dtype)      # x² overflows fp16: computed in fp32
    y = RMSNorm(32)(x)
    assert y.dtype == dtype and torch.isfinite(y).all()
    assert_close(y.float(), RMSNorm(32)(x.float()), atol=2e-2, rtol=2e-2)


def test_scale_invariance_and_zero_input():
    x = torch.randn(3, 16, dtype=torch.float64)
    norm = RMSNorm(16).double()
    assert_close(norm(x * 37.0), norm(x), atol=1e-6, rtol=1e-6)
    assert torch.equal(norm(torch.zeros(2, 16)), torch.zeros(2, 16))


def test_bad_input():
    with pytest.raises(ValueError, match="dim=8"):
        RMSNorm(8)(torch.randn(2, 7))
    with pytest.raises(ValueError, match="dim"):
        RMSNorm(0)
    with pytest.raises(ValueError, match="eps"):
        RMSNorm(4, eps=0)


def test_bf16_rounds_once_unlike_the_cast_then_gain_order():
    """bf16 in, bf16 gains: ours is the correctly rounded fp64 value (≤ ½ step); the order "normalise in fp32,
    cast to bf16, multiply by the bf16 gain" (HF LLaMA) rounds twice and differs on a sizeable share."""
    torch.manual_seed(0)
    x = (torch.randn(8, 512) * 3).bfloat16()
    norm = RMSNorm(512)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.weight.copy_(norm.weight.bfloat16())
    ours = norm(x).double()
    xd = x.double()
    exact = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight.double()
    step = 2.0 ** (torch.floor(torch.log2(exact.abs())) - 7)               # one bf16 step at each value
    assert ((ours - exact).abs() <= 0.5 * step * (1 + 1e-6)).all()
    xf = x.float()
    twice = ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16() * norm.weight.bfloat16()).double()
    differ = (twice != ours).double().mean().item()
    assert 0.1 < differ < 0.5 and ((twice - ours).abs() <= step).all()
