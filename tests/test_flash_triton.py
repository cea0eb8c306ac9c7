"""The Triton FlashAttention kernel, run on CPU by Triton's interpreter (TRITON_INTERPRET=1), against SDPA.

The interpreter flag is read when a kernel is decorated, so it is set before attn_course.flash_triton
(and triton) are imported. On a CUDA machine the same tests also run on the GPU.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attn_course.flash_triton import flash_attention_triton, flash_attention_triton_forward  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=2e-3, rtol=2e-3)}


def _qkv(B, H, Lq, Lk, E, dtype, device, grad=False):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, L, E, generator=g).to(device=device, dtype=dtype).requires_grad_(grad)
            for L in (Lq, Lk, Lk)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Lq,Lk,E", [(40, 40, 16), (37, 70, 24), (70, 33, 16)])
def test_forward_matches_sdpa(device, dtype, is_causal, Lq, Lk, E):
    q, k, v = _qkv(1, 2, Lq, Lk, E, dtype, device)
    out, lse = flash_attention_triton_forward(q, k, v, is_causal=is_causal, block_q=16, block_k=16)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=is_causal)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])
    s = (q.double() @ k.double().transpose(-2, -1)) / E ** 0.5
    if is_causal:
        s = s.masked_fill(~torch.ones(Lq, Lk, dtype=torch.bool, device=device).tril(), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Lq,Lk,block_q,block_k", [(33, 47, 16, 32), (50, 21, 32, 16), (40, 40, 16, 16)])
def test_backward_matches_sdpa(device, dtype, is_causal, Lq, Lk, block_q, block_k):
    """The two backward kernels (dK/dV per key block, dQ per query block) against SDPA's gradients in fp64."""
    q, k, v = _qkv(2, 1, Lq, Lk, 16, dtype, device, grad=True)
    out = flash_attention_triton(q, k, v, is_causal=is_causal, block_q=block_q, block_k=block_k)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q64, k64, v64, is_causal=is_causal)
    g = torch.randn(out.shape, dtype=torch.float64, device=device)
    got = torch.autograd.grad(out, (q, k, v), g.to(dtype))
    want = torch.autograd.grad(ref, (q64, k64, v64), g)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for a, b in zip(got, want):
        assert a.dtype == dtype
        torch.testing.assert_close(a.double(), b, **tol)


def test_custom_scale_and_three_dim_input():
    q, k, v = (t[0] for t in _qkv(1, 3, 20, 20, 16, torch.float32, "cpu"))    # (N, L, E)
    out = flash_attention_triton(q, k, v, scale=0.2, block_q=16, block_k=16)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.2), **TOL[torch.float32])


@pytest.mark.parametrize("kwargs,match", [
    (dict(block_q=24), r"block_q must be a power of two >= 16 for tl.dot, got 24"),
    (dict(block_k=8), r"block_k must be a power of two >= 16 for tl.dot, got 8"),
    (dict(v=torch.randn(1, 2, 20, 8)), r"v's width equal to q's: E=16, Ev=8"),
    (dict(k=torch.randn(1, 2, 20, 8)), r"same embedding size E"),
])
def test_value_errors(kwargs, match):
    args = dict(q=torch.randn(1, 2, 20, 16), k=torch.randn(1, 2, 20, 16), v=torch.randn(1, 2, 20, 16))
    args.update(kwargs)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(ValueError, match=match):
        flash_attention_triton(q, k, v, **args)


def test_cpu_without_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = torch.randn(1, 1, 16, 16)
    with pytest.raises(ValueError, match=r"needs CUDA tensors \(got q on cpu\).*TRITON_INTERPRET=1"):
        flash_attention_triton(q, q, q)


def test_gpu_benchmark_says_it_needs_cuda(monkeypatch, capsys):
    from attn_course import flash_triton
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert flash_triton._bench(["--bench"]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().out
