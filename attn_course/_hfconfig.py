"""Reading a Hugging Face ``transformers`` config object by its attributes (the package never imports
``transformers``), and the partial, possibly YaRN-scaled RoPE those configs describe.

Lesson 15's modules (``sinks``, ``gated``, ``deltanet``, ``dsa``, ``diff``) build themselves from such a config
with ``Class.from_config(config)``; their parameter names follow the matching ``transformers`` module so
that ``load_state_dict(peer.state_dict(), strict=True)`` works.
"""
from __future__ import annotations

import torch

from .rope import apply_rope, yarn_inv_freq, yarn_mscale

__all__ = ["attr", "rope_params", "RopeSpec"]


def attr(config, name: str, default=None):
    """``config.name`` or ``default`` (``None`` attributes count as missing when a default is given)."""
    value = getattr(config, name, None)
    return default if value is None else value


class RopeSpec:
    """RoPE on the first ``rotary_dim`` channels of each head (half-split pairing, as Hugging Face's
    ``rotate_half``), the rest passing through unrotated. ``inv_freq`` is ``(rotary_dim/2,)`` fp64 (YaRN's
    when the config asks for it) and ``attention_scaling`` multiplies cos and sin (YaRN's temperature), so
    it multiplies every query–key dot product by its square."""

    def __init__(self, head_dim: int, base: float = 10000.0, *, partial_rotary_factor: float = 1.0,
                 inv_freq: torch.Tensor | None = None, attention_scaling: float = 1.0):
        self.rotary_dim = int(head_dim * partial_rotary_factor)
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= head_dim:
            raise ValueError(f"rotary_dim={self.rotary_dim} (head_dim={head_dim} × partial_rotary_factor="
                             f"{partial_rotary_factor}) must be even and in (0, head_dim]")
        self.base = float(base)
        self.inv_freq = (base ** (-torch.arange(0, self.rotary_dim, 2, dtype=torch.float64) / self.rotary_dim)
                         if inv_freq is None else inv_freq.to(torch.float64))
        self.attention_scaling = float(attention_scaling)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate ``x`` ``(..., L, head_dim)``: its first ``rotary_dim`` channels by position."""
        r = self.rotary_dim
        rot = apply_rope(x[..., :r], positions, inv_freq=self.inv_freq)
        if self.attention_scaling != 1.0:      # HF scales cos and sin: both the rotated part only
            rot = rot * self.attention_scaling
        return torch.cat((rot, x[..., r:]), dim=-1) if r < x.shape[-1] else rot

    def __repr__(self) -> str:
        return (f"RopeSpec(rotary_dim={self.rotary_dim}, base={self.base:g}, "
                f"attention_scaling={self.attention_scaling:.4g})")


def rope_params(config, head_dim: int) -> RopeSpec:
    """The RoPE a config asks for: ``config.rope_parameters`` (transformers ≥ 5) or the older
    ``rope_theta``/``rope_scaling``/``partial_rotary_factor`` attributes; types "default" and "yarn"."""
    params = dict(attr(config, "rope_parameters", {}) or {})
    if not params:
        params = dict(attr(config, "rope_scaling", {}) or {})
        params.setdefault("rope_theta", attr(config, "rope_theta", 10000.0))
    base = float(params.get("rope_theta", attr(config, "rope_theta", 10000.0)))
    partial = float(params.get("partial_rotary_factor", attr(config, "partial_rotary_factor", 1.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    dim = int(head_dim * partial)
    if kind == "default":
        return RopeSpec(head_dim, base, partial_rotary_factor=partial)
    if kind == "yarn":
        factor = float(params["factor"])
        inv = yarn_inv_freq(dim, base, factor, int(params.get("original_max_position_embeddings")
                                                     or attr(config, "max_position_embeddings")),
                            float(params.get("beta_fast") or 32), float(params.get("beta_slow") or 1),
                            truncate=bool(params.get("truncate", True)))
        scaling = params.get("attention_factor")
        if scaling is None:
            m, m_all = params.get("mscale"), params.get("mscale_all_dim")
            scaling = yarn_mscale(factor, m) / yarn_mscale(factor, m_all) if (m and m_all) else yarn_mscale(factor)
        return RopeSpec(head_dim, base, partial_rotary_factor=partial, inv_freq=inv,
                        attention_scaling=float(scaling))
    raise ValueError(f"rope_type {kind!r} is not supported (supported: 'default', 'yarn')")
