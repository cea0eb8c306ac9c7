"""RMSNorm: rescale each vector by its root mean square, then by a learned gain (no centring, no bias).

    RMSNorm(x) = x / sqrt(mean(x²) + eps) ⊙ g          (Zhang & Sennrich 2019, Eq. 4)

Used by LLaMA, Mistral and DeepSeek for the pre-norm of every block, by DeepSeek-V2's MLA on the
latent vectors, and as QK-norm (timm ``q_norm``/``k_norm``, a popular Chinese attention tutorial) on each head's queries and keys.
It computes in fp32 (fp64 for fp64 input), multiplies by the gain in that precision and rounds to the input
dtype once at the end. In fp32 that equals ``torch.nn.RMSNorm`` to round-off. In bf16/fp16 the place of the
rounding matters: Hugging Face's LLaMA RMSNorm and the tutorial's ``RMSNorm.forward`` round the normalised
vector to the input dtype first and then multiply by the (bf16) gain, a second rounding, so about a quarter
of the bf16 outputs differ from ours by one bf16 step (lesson 11 measures it; ours is correctly rounded). For bit-parity with a checkpoint's
reference code in bf16, follow its order.

Reference: Zhang & Sennrich 2019, "Root Mean Square Layer Normalization" (arXiv:1910.07467).
"""
from __future__ import annotations

import torch
from torch import nn

from . import _validate

__all__ = ["RMSNorm"]


class RMSNorm(nn.Module):
    """RMSNorm over the last axis of size ``dim``; ``weight`` (the gain g) has shape ``(dim,)``, init 1.

    Same result as ``torch.nn.RMSNorm(dim, eps)`` in fp32, to round-off (and the same parameter name, so
    state dicts load); in bf16 the two can differ by one bf16 step (see the module docstring).
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.dim = _validate.positive_int("dim", dim)
        if not float(eps) > 0:
            raise ValueError(f"eps must be positive, got {eps!r}")
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _validate.tensor("x", x)
        _validate.last_dim("x", x, self.dim, "dim")
        acc = torch.promote_types(x.dtype, torch.float32)
        xf = x.to(acc)
        y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)     # (..., dim)
        return (y * self.weight.to(acc)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"
