"""Absolute and relative position signals besides RoPE: sinusoidal embeddings and ALiBi biases.

Sinusoidal (Vaswani et al. 2017, §3.5)::

    PE(p, 2i) = sin(p / base^(2i/d)),   PE(p, 2i+1) = cos(p / base^(2i/d))

(a popular Chinese attention tutorial's ``sinusoidal_embedding_1d`` puts all cosines first, then all sines — the same numbers in
another channel order; pass ``interleaved=False`` for that layout.)

ALiBi (Press et al. 2022, "Train Short, Test Long", §3): no position embedding at all; head h adds
``−m_h·(i − j)`` to the score of query i and key j ≤ i, with head slopes m_h a geometric sequence
(2^(−8/H), 2^(−16/H), …, 2^(−8)) for H a power of two, and the paper's interleaving otherwise.
"""
from __future__ import annotations

import math

import torch

from . import _validate

__all__ = ["sinusoidal_embedding", "alibi_slopes", "alibi_bias"]


def sinusoidal_embedding(positions: torch.Tensor | int, dim: int, base: float = 10000.0, *,
                         interleaved: bool = True, dtype=torch.float32, device=None) -> torch.Tensor:
    """``(L, dim)`` sinusoidal encodings of ``positions`` (an int L means ``0..L-1`` on ``device``), on the
    positions' device.

    ``interleaved=True``: channels (2i, 2i+1) = (sin, cos) of p·ω_i, ω_i = base^(−2i/dim) (the paper);
    ``False``: all cosines then all sines (the tutorial / Wan's ``sinusoidal_embedding_1d``).
    """
    _validate.positive_int("dim", dim)
    if dim % 2:
        raise ValueError(f"sinusoidal embeddings need an even dim, got dim={dim}")
    if isinstance(positions, int):
        positions = torch.arange(_validate.positive_int("positions", positions), device=device)
    omega = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim)   # (dim/2,)
    angle = positions.to(torch.float64)[:, None] * omega                              # (L, dim/2)
    if interleaved:
        pe = torch.stack((angle.sin(), angle.cos()), dim=-1).flatten(-2)            # sin, cos, sin, cos, ...
    else:
        pe = torch.cat((angle.cos(), angle.sin()), dim=-1)
    return pe.to(dtype)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """``(H,)`` ALiBi slopes m_h; for H not a power of two, the paper's rule: the 2^⌊log2 H⌋ slopes,
    then every other slope of the 2·2^⌊log2 H⌋ sequence until H are found."""
    _validate.positive_int("num_heads", num_heads)

    def geometric(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    n = 2 ** math.floor(math.log2(num_heads))
    slopes = geometric(n)
    if n < num_heads:
        slopes += geometric(2 * n)[0::2][: num_heads - n]
    return torch.tensor(slopes, dtype=torch.float64).float()


def alibi_bias(num_heads: int, q_len: int, k_len: int | None = None, *, device=None,
               dtype=torch.float32) -> torch.Tensor:
    """``(H, Lq, Lk)`` additive bias ``−m_h·(i − j)`` for query i and key j (queries aligned to the last
    ``q_len`` keys, as when decoding after a cache). Combine with a causal mask: for j > i the bias is
    positive and must be masked out, ALiBi itself does not hide the future."""
    k_len = q_len if k_len is None else k_len
    _validate.positive_int("q_len", q_len)
    _validate.positive_int("k_len", k_len)
    i = torch.arange(k_len - q_len, k_len, device=device)[:, None]                  # (Lq, 1) absolute positions
    j = torch.arange(k_len, device=device)[None, :]                                   # (1, Lk)
    slopes = alibi_slopes(num_heads).to(device=device, dtype=dtype)
    return -slopes[:, None, None] * (i - j).to(dtype)                                 # (H, Lq, Lk)
