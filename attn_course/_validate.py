"""Input validation shared by every mechanism: user mistakes raise ``ValueError`` naming the sizes."""
from __future__ import annotations

import torch


def positive_int(name: str, value) -> int:
    """Return ``value`` if it is a positive int, else raise ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def divisible(name_a: str, a: int, name_b: str, b: int) -> None:
    """Raise ``ValueError`` unless ``a`` is divisible by ``b`` (e.g. d_model by num_heads)."""
    if a % b != 0:
        raise ValueError(f"{name_a}={a} is not divisible by {name_b}={b}")


def probability(name: str, p: float) -> float:
    if not 0.0 <= float(p) < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {p!r}")
    return float(p)


def tensor(name: str, x, *, min_dim: int = 1, dim: int | None = None) -> torch.Tensor:
    """Check that ``x`` is a floating-point tensor with the expected rank."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if dim is not None and x.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(x.shape)}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions, got shape {tuple(x.shape)}")
    return x


def last_dim(name: str, x: torch.Tensor, size: int, what: str) -> None:
    """Raise unless ``x.shape[-1] == size``; ``what`` names the expected size (e.g. 'd_model')."""
    if x.shape[-1] != size:
        raise ValueError(f"{name} has last dimension {x.shape[-1]} (shape {tuple(x.shape)}), expected {what}={size}")
