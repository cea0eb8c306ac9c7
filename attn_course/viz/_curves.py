"""Training results as numbers with their spread, and loss curves over seeds.

    spread(values)                      -> Spread(mean, sd, lo, hi, n); str() is "0.812 ± 0.031 (n=3, 0.78–0.85)"
    plot_loss_curves({"name": [losses_seed0, losses_seed1, ...]}, smooth=20) -> Axes

A claim that one model beats another is shown with every run: the mean curve of each model and the band
between its best and worst seed, so the reader sees whether the gap is larger than the seed-to-seed noise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

__all__ = ["Spread", "spread", "plot_loss_curves"]


@dataclass(frozen=True)
class Spread:
    """Mean, sample standard deviation (0 for one value), min, max and count of a list of measurements."""
    mean: float
    sd: float
    lo: float
    hi: float
    n: int

    def format(self, digits: int = 3) -> str:
        """``"mean ± sd (n=N, lo–hi)"`` with ``digits`` decimals."""
        f = f"{{:.{digits}f}}"
        return (f"{f.format(self.mean)} ± {f.format(self.sd)} (n={self.n}, "
                f"{f.format(self.lo)}–{f.format(self.hi)})")

    def __str__(self) -> str:
        return self.format()


def spread(values: Sequence[float]) -> Spread:
    """Summarise repeated measurements (e.g. one accuracy per seed). Raises ``ValueError`` when empty or
    when a value is not finite."""
    a = np.asarray([float(v) for v in values], dtype=np.float64)
    if a.size == 0:
        raise ValueError("spread() needs at least one value, got 0")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"spread() got a non-finite value: {a.tolist()}")
    sd = float(a.std(ddof=1)) if a.size > 1 else 0.0
    return Spread(float(a.mean()), sd, float(a.min()), float(a.max()), int(a.size))


def _smooth(y: np.ndarray, k: int) -> np.ndarray:
    """Trailing moving average over ``k`` steps (the first points average what exists so far)."""
    if k <= 1 or y.size == 0:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    i = np.arange(1, y.size + 1)
    lo = np.maximum(i - k, 0)
    return (c[i] - c[lo]) / (i - lo)


def plot_loss_curves(runs: Mapping[str, Sequence[Sequence[float]]], *, smooth: int = 1, ax=None,
                     title: str | None = None, ylabel: str = "training loss", logy: bool = False,
                     ylim: tuple[float, float] | None = None):
    """One line per model (the mean over its seeds, smoothed over ``smooth`` steps) and a shaded band from
    its lowest to its highest seed. ``runs`` maps a label to a list of per-seed loss lists (equal lengths
    within a label). Returns the Axes."""
    import matplotlib.pyplot as plt
    if not runs:
        raise ValueError("plot_loss_curves() needs at least one model, got an empty mapping")
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.6))
    for label, seeds in runs.items():
        if len(seeds) == 0:
            raise ValueError(f"plot_loss_curves(): model {label!r} has no runs")
        lengths = {len(s) for s in seeds}
        if len(lengths) != 1:
            raise ValueError(f"plot_loss_curves(): the runs of {label!r} have different lengths {sorted(lengths)}")
        curves = np.stack([_smooth(np.asarray(s, dtype=np.float64), smooth) for s in seeds])
        x = np.arange(1, curves.shape[1] + 1)
        n = curves.shape[0]
        (line,) = ax.plot(x, curves.mean(0), lw=1.6, label=f"{label} (mean of {n} seed{'s' if n > 1 else ''})")
        if n > 1:
            ax.fill_between(x, curves.min(0), curves.max(0), color=line.get_color(), alpha=0.18, lw=0)
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    if ylim is not None:
        ax.set_ylim(*ylim)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    if smooth > 1:
        ax.text(0.99, 0.98, f"moving average over {smooth} steps; band: min–max over seeds",
                transform=ax.transAxes, ha="right", va="top", fontsize=7, color="0.35")
    return ax
