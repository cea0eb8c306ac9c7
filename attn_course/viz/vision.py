"""Figures for lesson 06 (SE / CBAM): a spatial gate laid over its image; a bar chart of channel gates.

    plot_spatial_overlay(image, attn_map)   the (H', W') map, upsampled to the image, drawn over it -> Axes
    plot_channel_weights(weights)           one bar per channel, gates on a fixed [0, 1] scale      -> Axes

Gates are sigmoids, so both figures use a fixed 0–1 scale by default: a map that is 0.5 everywhere
(an untrained gate) looks flat instead of being stretched into false contrast.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from . import _to_numpy

__all__ = ["plot_spatial_overlay", "plot_channel_weights"]


def _image(image) -> np.ndarray:
    """(H, W), (H, W, 3|4) or channels-first (3|4, H, W); uint8 or float -> float (H, W[, 3]) in [0, 1]."""
    a = _to_numpy(image)
    shape = a.shape
    if a.ndim == 3 and a.shape[0] in (1, 3, 4) and a.shape[-1] not in (3, 4):
        a = np.moveaxis(a, 0, -1)                                   # (C, H, W) -> (H, W, C)
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if a.ndim == 3 and a.shape[-1] == 4:
        a = a[..., :3]                                              # drop alpha
    if not (a.ndim == 2 or (a.ndim == 3 and a.shape[-1] == 3)):
        raise ValueError(f"image must have shape (H, W), (H, W, 3) or (3, H, W), got {shape}")
    if a.dtype == np.uint8:
        return a.astype(np.float32) / 255.0
    a = a.astype(np.float32)
    lo, hi = float(a.min()), float(a.max())
    if lo < 0.0 or hi > 1.0:                                        # e.g. normalised features: rescale
        a = (a - lo) / (hi - lo if hi > lo else 1.0)
    return a


def _map(attn_map, size: tuple[int, int]) -> np.ndarray:
    """Drop leading size-1 axes, check (H', W'), upsample bilinearly to ``size``."""
    import torch
    import torch.nn.functional as F
    m = _to_numpy(attn_map).astype(np.float32)
    shape = m.shape
    while m.ndim > 2 and m.shape[0] == 1:
        m = m[0]
    if m.ndim != 2:
        raise ValueError(f"attention map must have shape (H, W) (or (1, 1, H, W)), got {shape}")
    t = torch.from_numpy(np.ascontiguousarray(m))[None, None]
    if tuple(t.shape[-2:]) != size:
        t = F.interpolate(t, size=size, mode="bilinear", align_corners=False)
    return t[0, 0].numpy()


def plot_spatial_overlay(image, attn_map, *, ax=None, alpha: float = 0.55, cmap: str = "inferno",
                         title: str | None = None, vmin: float = 0.0, vmax: float = 1.0,
                         colorbar: bool = True, label: str = "spatial gate $M_s$"):
    """Draw ``image`` and, on top of it, the spatial gate ``attn_map`` upsampled to the image size.

    Args:
        image: ``(H, W)``, ``(H, W, 3)`` or ``(3, H, W)``; uint8 (0–255) or float (values outside [0, 1]
            are min–max rescaled). Tensors on any device, or NumPy arrays.
        attn_map: ``(H', W')``, or with leading size-1 axes such as ``(1, 1, H', W')`` straight from
            ``SpatialAttention``; bilinearly upsampled to ``(H, W)`` when smaller.
        alpha: opacity of the map over the image.
        vmin, vmax: colour range of the map (default the gate's full range [0, 1]).
        label: colour-bar label.
    Returns the matplotlib ``Axes`` (its ``images`` are the photo, then the map).
    """
    import matplotlib.pyplot as plt
    img = _image(image)
    m = _map(attn_map, img.shape[:2])
    if ax is None:
        h, w = img.shape[:2]
        _, ax = plt.subplots(figsize=(4.2 * w / max(h, w) + 1.0, 4.2 * h / max(h, w)), layout="constrained")
    ax.imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=1, interpolation="nearest")
    im = ax.imshow(m, cmap=cmap, alpha=alpha, vmin=vmin, vmax=vmax, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    if title is not None:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, label=label, shrink=0.8)
    return ax


def plot_channel_weights(weights, *, labels: Sequence | None = None, ax=None, title: str | None = None,
                         highlight: int | Sequence[int] | None = None, ylim: tuple[float, float] = (0.0, 1.0)):
    """Bar chart of one channel gate, one bar per channel, on a fixed [0, 1] scale.

    Args:
        weights: ``(C,)`` or with size-1 axes such as ``(1, C, 1, 1)`` straight from a channel gate.
        labels: one name per channel (default the channel index).
        highlight: channel index (or indices) drawn in a contrasting colour, e.g. the informative one.
        ylim: value range (default [0, 1], the sigmoid's range); a dashed line marks 0.5.
    Returns the matplotlib ``Axes``.
    """
    import matplotlib.pyplot as plt
    a = np.squeeze(_to_numpy(weights).astype(np.float32))
    shape = np.shape(_to_numpy(weights))
    if a.ndim == 0:
        a = a[None]
    if a.ndim != 1:
        raise ValueError(f"weights must have shape (C,) or (1, C, 1, 1), got {shape}")
    c = a.shape[0]
    names = [str(i) for i in range(c)] if labels is None else [str(t) for t in labels]
    if len(names) != c:
        raise ValueError(f"labels has {len(names)} entries but there are {c} channels")
    hi = set() if highlight is None else ({highlight} if isinstance(highlight, int) else set(highlight))
    if ax is None:
        _, ax = plt.subplots(figsize=(min(10.0, 1.5 + 0.45 * c), 3.0), layout="constrained")
    colors = ["tab:orange" if i in hi else "tab:blue" for i in range(c)]
    ax.bar(range(c), a, color=colors)
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(c))
    ax.set_xticklabels(names, rotation=90 if max(len(n) for n in names) > 3 else 0)
    ax.set_ylim(*ylim)
    ax.set_xlabel("channel")
    ax.set_ylabel("gate $M_c$")
    if title is not None:
        ax.set_title(title)
    return ax
