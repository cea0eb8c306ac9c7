"""Rotary position embedding (RoPE): half-split ("rotate_half") and interleaved conventions, 1-D and n-D.

    RoPE(x)_p = x_p ⊙ cos(p·θ) + rotate_half(x_p) ⊙ sin(p·θ),    θ_i = base^(−2i/d),  i < d/2

with ``rotate_half(x) = cat(−x[..., d/2:], x[..., :d/2])`` and the angle table repeated over both halves,
so coordinate i is paired with coordinate i + d/2 (the GPT-NeoX / Hugging Face LLaMA pairing; the
original paper pairs neighbours 2i, 2i+1 — a fixed permutation of the same rotation).
Each pair is rotated by the angle p·θ_i, so ⟨RoPE(q)_m, RoPE(k)_n⟩ depends on m − n only.

``interleaved=True`` pairs neighbours (2i, 2i+1) instead — the GPT-J / complex-number form
(``torch.view_as_complex`` on ``x.view(..., d/2, 2)``, as in a popular Chinese attention tutorial's ``precompute_freqs_cis``). Both
rotate pair i by p·θ_i; they differ only in which channels form pair i, i.e. by the fixed permutation
``perm = interleave_perm(d)``: ``apply_rope(x[..., perm], interleaved=True) == apply_rope(x)[..., perm]``.

``apply_rope_nd`` rotates consecutive channel slices by different coordinates (row / column for image
patches; frame / row / column for video tokens, the tutorial's ``precompute_freqs_cis_3d``).

``yarn_inv_freq`` and ``yarn_mscale`` give YaRN's context extension (Peng et al. 2023), as the released
DeepSeek-V2/V3 checkpoints use it: frequencies that turn many times within the original context keep θ_i,
those that turn less than once are divided by the extension factor (position interpolation), a linear ramp
in between; pass the result to ``apply_rope(..., inv_freq=)``.

References: Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding" (arXiv:2104.09864);
Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models" (arXiv:2309.00071).
"""
from __future__ import annotations

import math

import torch

from ._validate import tensor

__all__ = ["apply_rope", "apply_rope_nd", "rotate_half", "rotate_interleaved", "rope_angles", "interleave_perm",
           "yarn_inv_freq", "yarn_mscale"]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``cat(−x[..., d/2:], x[..., :d/2])``: multiplies each pair (x_i, x_{i+d/2}) by the imaginary unit."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_interleaved(x: torch.Tensor) -> torch.Tensor:
    """Pairs (x_{2i}, x_{2i+1}) -> (−x_{2i+1}, x_{2i}): multiplies each neighbour pair by the imaginary unit."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def interleave_perm(d: int) -> torch.Tensor:
    """The channel permutation between the conventions: ``[0, d/2, 1, d/2+1, ...]``.

    Channel 2i of the interleaved layout holds half-split channel i, and 2i+1 holds i + d/2, so
    ``apply_rope(x[..., perm], interleaved=True) == apply_rope(x)[..., perm]`` — and permuting a
    half-split checkpoint's q and k projection rows by ``perm`` (within each head) gives an interleaved
    checkpoint with identical attention scores.
    """
    if d % 2 != 0:
        raise ValueError(f"RoPE needs an even feature size, got d={d}")
    return torch.stack((torch.arange(d // 2), torch.arange(d // 2, d)), dim=-1).flatten()


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature term ``0.1·mscale·ln(factor) + 1`` (1 when ``factor <= 1``)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_inv_freq(dim: int, base: float, factor: float, original_max_position_embeddings: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0, *, truncate: bool = True) -> torch.Tensor:
    """YaRN's ``(dim/2,)`` fp64 frequencies θ'_i for a context ``factor`` times the original one.

    Pair i turns ``L₀·θ_i / 2π`` times over the original context L₀. Pairs that turn more than ``beta_fast``
    times keep θ_i (extrapolation), pairs that turn fewer than ``beta_slow`` times get θ_i / factor
    (interpolation); the pairs between blend the two along a linear ramp over i (the ramp's ends rounded
    outwards to whole pairs, as Hugging Face's ``_compute_yarn_parameters`` does with ``truncate=True``;
    ``truncate=False``, gpt-oss's setting, keeps the fractional ends).
    """
    if dim % 2 or dim <= 0:
        raise ValueError(f"YaRN needs a positive even dim, got dim={dim}")
    if not factor >= 1:
        raise ValueError(f"factor must be >= 1, got factor={factor}")

    def pair_turning(turns: float) -> float:      # the (fractional) pair index that turns `turns` times over L₀
        return dim * math.log(original_max_position_embeddings / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_turning(beta_fast), pair_turning(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    theta = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)                    # (dim/2,)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
    return theta * (1 - ramp) + theta / factor * ramp


def rope_angles(positions: torch.Tensor, dim: int, base: float = 10000.0, dtype=torch.float32, *,
                inv_freq: torch.Tensor | None = None) -> torch.Tensor:
    """Angles ``p·θ_i`` for every position, repeated over both halves: ``positions.shape + (dim,)``.
    ``inv_freq`` (``(dim/2,)``, e.g. :func:`yarn_inv_freq`) replaces ``θ_i = base^(−2i/dim)``.

    Recomputed (with their cos and sin) on every call, which keeps the code short; real implementations
    cache the cos/sin tables per position, so part of what lesson 11's timing charges to RoPE is this."""
    if inv_freq is None:
        theta = base ** (-torch.arange(0, dim, 2, device=positions.device, dtype=dtype) / dim)   # (d/2,)
    elif inv_freq.shape != (dim // 2,):
        raise ValueError(f"inv_freq has shape {tuple(inv_freq.shape)}, expected (dim/2,) = ({dim // 2},)")
    else:
        theta = inv_freq.to(device=positions.device, dtype=dtype)
    angles = positions.to(dtype)[..., None] * theta                                         # (..., L, d/2)
    return torch.cat((angles, angles), dim=-1)                                              # (..., L, d)


def apply_rope(x: torch.Tensor, positions: torch.Tensor | None = None, base: float = 10000.0, *,
               interleaved: bool = False, inv_freq: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate ``x`` of shape ``(..., L, d)`` by its positions; returns a tensor of the same shape and dtype.

    Args:
        x: ``(..., L, d)`` with ``d`` even; the second-to-last axis is the sequence.
        positions: integer positions of the L rows, ``(L,)`` or any shape broadcastable to ``x.shape[:-1]``
            (e.g. ``(B, L)``); default ``0..L-1``. Pass ``torch.arange(T, T + L)`` when decoding after T
            cached tokens.
        base: the RoPE base (10000 in the paper).
        interleaved: ``False`` (default) pairs channel i with i + d/2 (rotate_half, GPT-NeoX / HF LLaMA);
            ``True`` pairs 2i with 2i+1 (GPT-J, Meta's LLaMA reference code, complex-number form).
        inv_freq: optional ``(d/2,)`` frequencies replacing ``base^(−2i/d)`` (e.g. :func:`yarn_inv_freq`).

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
    angles = rope_angles(positions.to(x.device), d, base, dtype=acc, inv_freq=inv_freq)   # (..., L, d), halves repeated
    xf = x.to(acc)
    if interleaved:   # the same angles, each repeated for its neighbour pair (θ_0, θ_0, θ_1, θ_1, ...)
        angles = angles[..., : d // 2].repeat_interleave(2, dim=-1)
        return (xf * angles.cos() + rotate_interleaved(xf) * angles.sin()).to(x.dtype)
    return (xf * angles.cos() + rotate_half(xf) * angles.sin()).to(x.dtype)


def apply_rope_nd(x: torch.Tensor, coords: torch.Tensor, dims, base: float = 10000.0) -> torch.Tensor:
    """Multi-axis RoPE: channel slice a (of size ``dims[a]``) is rotated by ``coords[:, a]``.

    Args:
        x: ``(..., L, d)``.
        coords: ``(L, n)`` integer positions of every token along n axes (e.g. (frame, row, col)).
        dims: n even channel counts summing to d; slice a is ``x[..., sum(dims[:a]) : sum(dims[:a+1])]``,
            rotated with :func:`apply_rope` (half-split within the slice) at ``base``.

    Scores ⟨q_m, k_n⟩ then depend only on the per-axis differences coords[m] − coords[n]; with one
    axis this is exactly :func:`apply_rope`.
    """
    tensor("x", x, min_dim=2)
    L, d = x.shape[-2], x.shape[-1]
    dims = [int(v) for v in dims]
    if not isinstance(coords, torch.Tensor) or coords.is_floating_point() or coords.dtype == torch.bool:
        raise ValueError(f"coords must be an integer tensor of shape (L, n), got {getattr(coords, 'dtype', type(coords).__name__)}")
    if coords.dim() != 2 or coords.shape[0] != L or coords.shape[1] != len(dims):
        raise ValueError(f"coords has shape {tuple(coords.shape)}, expected (L={L}, n={len(dims)}) for dims={dims}")
    if any(v <= 0 or v % 2 for v in dims) or sum(dims) != d:
        raise ValueError(f"dims={dims} must be positive even sizes summing to d={d}")
    parts = torch.split(x, dims, dim=-1)
    return torch.cat([apply_rope(part, coords[:, a].to(x.device), base) for a, part in enumerate(parts)], dim=-1)
