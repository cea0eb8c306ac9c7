"""The trace budget: what a call costs, measured at the dispatcher, against the reference's cost on the same case.

:class:`Trace` is a context manager that records, over every ATen op run inside it (autograd's backward
included, whatever Python path reached the op):

* ``flops`` — multiply-adds × 2 of the product ops, counted by :class:`torch.utils.flop_counter.FlopCounterMode`
  (``mm``, ``bmm``, ``baddbmm``, convolutions, ...; ``einsum``, ``matmul``, ``F.linear`` and ``tensordot`` reach
  those), plus the products it does not count: ``mv``, ``dot``, ``addmv``, ``addbmm``, ``addr``, ``cdist``
  and a weighted ``embedding_bag`` (:data:`EXTRA_FLOPS`);
* ``written`` — the elements every op writes (the numel of each output; a view writes nothing, an in-place
  op writes its result). A product formed elementwise and then reduced, or passed through ``masked_fill``,
  ``where``, ``clone`` or a cast, is written at least once, so it shows here whatever op formed it;
* ``ops`` — the number of ATen ops dispatched (views included): a Python loop over elements shows here;
* ``largest`` / ``largest_shape`` — the largest output of any op that is not a view (the biggest tensor formed).

An exercise's answer function runs the learner's call under a :class:`Trace` and compares a metric with the
reference's on the same case (12.5 and 13.6 count FLOPs: :func:`.exercises.lesson12.counted_flops`;
:func:`.spec.limit_numel` reads ``largest``); :func:`over_budget` names the first metric above ``factor ×``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["Trace", "Cost", "OverBudget", "over_budget", "METRICS", "EXTRA_FLOPS"]

aten = torch.ops.aten
METRICS = ("flops", "written", "ops", "largest")


def _n(shape) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


# FlopCounterMode's formulas receive the operands' shapes; 2 FLOPs per multiply-add, like its own.
EXTRA_FLOPS = {
    aten.mv: lambda a, v, **_: 2 * _n(a),
    aten.dot: lambda a, b, **_: 2 * _n(a),
    aten.vdot: lambda a, b, **_: 2 * _n(a),
    aten.addmv: lambda s, a, v, *_, **__: 2 * _n(a),
    aten.addr: lambda s, u, v, *_, **__: 2 * _n(u) * _n(v),
    aten.addbmm: lambda s, a, b, *_, **__: 2 * a[0] * a[1] * a[2] * b[2],
    aten._cdist_forward: lambda a, b, *_, out_shape=None, **__: 2 * _n(out_shape) * a[-1],
    aten._euclidean_dist: lambda a, b, *_, out_shape=None, **__: 2 * _n(out_shape) * a[-1],
    aten._embedding_bag: lambda w, idx, *_, **__: 2 * _n(idx) * w[-1],
    aten._embedding_bag_forward_only: lambda w, idx, *_, **__: 2 * _n(idx) * w[-1],
}
"""Products FlopCounterMode does not count (it counts 0 for them), by ATen op."""


@dataclass
class Cost:
    """What one call cost (see :class:`Trace`)."""
    flops: int = 0
    written: int = 0
    ops: int = 0
    largest: int = 0
    largest_shape: tuple[int, ...] = field(default=())


class _Writes(TorchDispatchMode):
    """Counts ops, elements written and the largest output; sits above the flop counter."""

    def __init__(self, cost: Cost):
        super().__init__()
        self.cost = cost

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        cost = self.cost
        cost.ops += 1
        if not func.is_view:
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):
                    n = t.numel()
                    cost.written += n
                    if n > cost.largest:
                        cost.largest, cost.largest_shape = n, tuple(t.shape)
        return out


class OverBudget(Exception):
    """The learner's call cost more than the exercise's budget allows (the message names the metric)."""


class Trace(Cost):
    """``with Trace() as t: ...`` then ``t.flops``, ``t.written``, ``t.ops``, ``t.largest`` (see the module).

    Not reentrant. Leaving it raises :class:`OverBudget` when the code inside changed the dispatcher's mode
    stack (popped the trace, or left a mode of its own on top): the counts would not be the whole call's."""

    def __enter__(self):
        self._flops = FlopCounterMode(display=False, custom_mapping=EXTRA_FLOPS)
        self._flops.__enter__()
        self._writes = _Writes(self)
        self._writes.__enter__()
        return self

    def __exit__(self, *exc):
        intact = _get_current_dispatch_mode() is self._writes
        if intact:
            self._writes.__exit__(*exc)
        if _get_current_dispatch_mode() is self._flops.mode:
            self._flops.__exit__(*exc)
        self.flops = self._flops.get_total_flops()
        if not intact and exc[0] is None:
            raise OverBudget("rule: trace budget — your code changed torch's dispatch mode stack while it ran, "
                             "so its work cannot be counted")
        return False

    def cost(self) -> Cost:
        return Cost(self.flops, self.written, self.ops, self.largest, self.largest_shape)


def over_budget(got: Cost, ref: Cost, budget: dict[str, float]) -> str | None:
    """None when every metric of ``budget`` is within ``factor ×`` the reference's; else the hint
    "rule: trace budget — <metric> was N× the reference's (limit M×)" for the first one above it."""
    for metric, factor in budget.items():
        if metric not in METRICS:
            raise ValueError(f"unknown budget metric {metric!r}: use one of {', '.join(METRICS)}")
        mine, theirs = getattr(got, metric), max(getattr(ref, metric), 1)
        if mine > factor * theirs:
            what = {"flops": "counted FLOPs", "written": "elements written", "ops": "ATen ops",
                    "largest": f"the largest tensor (shape {tuple(got.largest_shape)})"}[metric]
            return (f"rule: trace budget — {what} ({mine:,}) was {mine / theirs:.1f}× the reference's "
                    f"({theirs:,}; limit {factor:g}×)")
    return None
