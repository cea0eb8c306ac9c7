"""Timings a lesson can print beside its prose: several methods side by side in one run, interleaved.

A timing cell answers "how much faster is A than B *here*?". Three habits make that answer hold up:

* **one run, interleaved** — every round calls each method once (in a rotated order), so a change in the
  machine's load during the cell slows all methods alike instead of one;
* **fixed threads** — ``threads`` (default 1) for the whole measurement, restored afterwards. One thread is the
  default because the course's loop-of-small-ops methods (``flash_attention``'s tiles) collapse when their
  threads share busy cores: each small op splits its work across the threads and waits for the slowest, so on a
  loaded 2-core machine two threads can take many times longer than one (lesson 08 §9 measures it);
* **medians and spread** — the median of ``repeats`` rounds, and the range of the per-round ratios, so a
  sentence like "A took 0.3× B's time" is printed from the measurement and says how much it varied.

On CUDA every call is followed by ``torch.cuda.synchronize()`` (kernels run asynchronously).

    t = compare({"naive": lambda: naive(q, k, v), "flash": lambda: flash(q, k, v)}, device=device)
    print(describe(t, "flash", "naive"))   # flash took 0.42× naive's time (median of 7 interleaved rounds; ...)
"""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["Timing", "compare", "describe", "num_threads", "ratio", "ratios", "ratio_cell", "NOISY_SPAN"]

#: A ratio whose per-round values span more than this factor (highest / lowest) is flagged as noise.
NOISY_SPAN = 3.0


@dataclass(frozen=True)
class Timing:
    """The wall-clock seconds of ``repeats`` calls of one method (one per interleaved round)."""
    name: str
    times_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    @property
    def max_s(self) -> float:
        return max(self.times_s)

    def __str__(self) -> str:
        return f"{self.name}: {_fmt(self.median_s)} (median of {len(self.times_s)}; {_fmt(self.min_s)}–{_fmt(self.max_s)})"


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


@contextlib.contextmanager
def num_threads(n: int | None):
    """Run the block with ``torch.set_num_threads(n)`` (``None``: leave the count alone); restore it after."""
    old = torch.get_num_threads()
    if n is not None:
        if n < 1:
            raise ValueError(f"threads must be >= 1 (or None), got {n}")
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def compare(fns: dict[str, Callable[[], object]], *, repeats: int = 7, warmup: int = 1, threads: int | None = 1,
            device: torch.device | str | None = None) -> dict[str, Timing]:
    """Time each ``fns[name]()`` ``repeats`` times, interleaved: round r calls every method once, starting
    from method r mod n. ``warmup`` untimed calls of each method come first. Returns ``{name: Timing}``."""
    if not fns:
        raise ValueError("compare needs at least one method to time")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    cuda = device is not None and torch.device(device).type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    with num_threads(threads):
        for _ in range(warmup):
            for name in names:
                fns[name]()
        sync()
        for r in range(repeats):
            for i in range(len(names)):
                name = names[(r + i) % len(names)]
                t0 = time.perf_counter()
                fns[name]()
                sync()
                times[name].append(time.perf_counter() - t0)
    return {name: Timing(name, tuple(times[name])) for name in names}


def ratios(timings: dict[str, Timing], a: str, b: str) -> list[float]:
    """Per-round ratios ``time(a) / time(b)`` (the rounds are interleaved, so each pair shared its moment)."""
    return [ta / tb for ta, tb in zip(timings[a].times_s, timings[b].times_s)]


def ratio(timings: dict[str, Timing], a: str, b: str) -> float:
    """Median of ``a``'s times over median of ``b``'s."""
    return timings[a].median_s / timings[b].median_s


def describe(timings: dict[str, Timing], a: str, b: str) -> str:
    """One sentence, printed from the measurement: how ``a``'s time compares with ``b``'s, and its spread."""
    r, per_round = ratio(timings, a, b), ratios(timings, a, b)
    lo, hi = min(per_round), max(per_round)
    if hi < 1:
        verdict = f"{a} was faster than {b} in every round"
    elif lo > 1:
        verdict = f"{a} was slower than {b} in every round"
    else:
        verdict = f"neither was faster in every round"
    fmt = _sig if hi > NOISY_SPAN * lo else _two_decimals               # a wide spread: only two figures mean anything
    return (f"{a} took {fmt(r)}× {b}'s time (median of {len(per_round)} interleaved rounds; "
            f"per-round ratios {fmt(lo)}–{fmt(hi)}): {verdict}")


def ratio_cell(timings: dict[str, Timing], a: str, b: str) -> str:
    """A table cell for ``time(a) / time(b)``: ``"1.8x (1.5–2.1)"``, the median ratio and the per-round range,
    or ``"noisy (0.05–11), re-run"`` when the rounds disagree by more than :data:`NOISY_SPAN` times."""
    per_round = ratios(timings, a, b)
    lo, hi = min(per_round), max(per_round)
    if hi > NOISY_SPAN * lo:
        return f"noisy ({_sig(lo)}–{_sig(hi)}), re-run"
    return f"{_sig(ratio(timings, a, b))}x ({_sig(lo)}–{_sig(hi)})"


def _two_decimals(x: float) -> str:
    return f"{x:.2f}" if x < 10 else _sig(x, 3)


def _sig(x: float, digits: int = 2) -> str:
    """``x`` to ``digits`` significant figures, without an exponent: 69.97 → "70", 120.08 → "120", 6.94 → "6.9"."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    decimals = digits - 1 - math.floor(math.log10(abs(x)))
    return f"{round(x, decimals):.{max(decimals, 0)}f}"
