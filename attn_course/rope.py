"""Rotary position embedding (RoPE), half-split ("rotate_half") convention.

    RoPE(x)_p = x_p ⊙ cos(p·θ) + rotate_half(x_p) ⊙ sin(p·θ),    θ_i = base^(−2i/d),  i < d/2

with ``rotate_half(x) = cat(−x[..., d/2:], x[..., :d/2])`` and the angle table repeated over both halves,
so coordinate i is paired with coordinate i + d/2 (the GPT-NeoX / Hugging Face LLaMA pairing; the
original paper pairs neighbours 2i, 2i+1 — a fixed permutation of the same rotation).
Each pair is rotated by the angle p·θ_i, so ⟨RoPE(q)_m, RoPE(k)_n⟩ depends on m − n only.

Reference: Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding" (arXiv:2104.09864).
"""
from __future__ import annotations

import torch

from ._validate import tensor

__all__ = ["apply_rope", "rotate_half", "rope_angles"]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``cat(−x[..., d/2:], x[..., :d/2])``: multiplies each pair (x_i, x_{i+d/2}) by the imaginary unit."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_angles(positions: torch.Tensor, dim: int, base: float = 10000.0, dtype=torch.float32) -> torch.Tensor:
    """Angles ``p·θ_i`` for every position, repeated over both halves: ``positions.shape + (dim,)``."""
    theta = base ** (-torch.arange(0, dim, 2, device=positions.device, dtype=dtype) / dim)   # (d/2,)
    angles = positions.to(dtype)[..., None] * theta                                         # (..., L, d/2)
    return torch.cat((angles, angles), dim=-1)                                              # (..., L, d)


def apply_rope(x: torch.Tensor, positions: torch.Tensor | None = None, base: float = 10000.0) -> torch.Tensor:
    """Rotate ``x`` of shape ``(..., L, d)`` by its positions; returns a tensor of the same shape and dtype.

    Args:
        x: ``(..., L, d)`` with ``d`` even; the second-to-last axis is the sequence.
        positions: integer positions of the L rows, ``(L,)`` or any shape broadcastable to ``x.shape[:-1]``
            (e.g. ``(B, L)``); default ``0..L-1``. Pass ``torch.arange(T, T + L)`` when decoding after T
            cached tokens.
        base: the RoPE base (10000 in the paper).

    The angles are computed in fp32 (fp64 for fp64 input) and the result is cast back to ``x.dtype``.
    """
    tensor("x", x, min_dim=2)
    L, d = x.shape[-2], x.shape[-1]
    if d % 2 != 0:
        raise ValueError(f"RoPE needs an even feature size, got d={d} (shape {tuple(x.shape)})")
    if positions is None:
        positions = torch.arange(L, device=x.device)
    elif not isinstance(positions, torch.Tensor) or positions.is_floating_point() or positions.dtype == torch.bool:
        raise ValueError(f"positions must be an integer tensor, got {getattr(positions, 'dtype', type(positions).__name__)}")
    else:
        try:
            ok = torch.broadcast_shapes(positions.shape, x.shape[:-1]) == x.shape[:-1]
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"positions of shape {tuple(positions.shape)} do not broadcast to x's "
                             f"(..., L={L}) = {tuple(x.shape[:-1])}")
    acc = torch.promote_types(x.dtype, torch.float32)
    angles = rope_angles(positions.to(x.device), d, base, dtype=acc)     # (..., L, d)
    xf = x.to(acc)
    return (xf * angles.cos() + rotate_half(xf) * angles.sin()).to(x.dtype)
