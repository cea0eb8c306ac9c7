"""A ring of P ranks simulated in one process: write the ring loop against it (exercise 13.6).

:mod:`attn_course.ring` runs ring attention on P real processes. To write (and grade) the loop itself in
one process, :class:`SimulatedRing` plays the part of ``torch.distributed`` for one rank: it hands the rank
the K/V shard a real ring would have delivered and enforces what a real rank can do —

* ``kv()`` returns ``(k, v)``, the shard the rank holds now: at step t (after t calls of ``pass_on``) the
  one that started on rank ``(r − t) mod P`` (a fresh copy for this rank);
* ``pass_on()`` sends it to rank r + 1 and receives the next one from rank r − 1. It refuses (raises
  :class:`RingRuleError`) a P-th pass — after P − 1 every rank has seen every shard — and refuses to go on
  while the rank's code still refers (by a variable, a list, a view) to more than one of the shards it
  received: a rank holds one shard at a time and keeps only its running output and log-sum-exp.

:func:`run_ring` runs a rank function ``fn(q_shard, rank, world, ring, *args)`` for every rank, one after
another (each rank sees exactly what it would see in a real ring, so the order does not matter), and
returns the ranks' results and how many times each passed its shard on. The ring does not check what the
code computes, and a *copy* of a shard (``.clone()``) is not tracked: the grader compares the result with
full attention and watches the largest tensor, so a gathered K/V (``torch.cat`` of the shards) is refused
there.
"""
from __future__ import annotations

import weakref

import torch

__all__ = ["SimulatedRing", "RingRuleError", "run_ring"]


class RingRuleError(RuntimeError):
    """A rank did something a real ring rank cannot (or should not) do."""


class SimulatedRing:
    """Rank ``rank``'s view of a ring over the K/V shards ``k_shards[s]``, ``v_shards[s]`` (s = 0 … P−1)."""

    def __init__(self, k_shards: list[torch.Tensor], v_shards: list[torch.Tensor], rank: int):
        self.rank, self.world = rank, len(k_shards)
        self._k, self._v = k_shards, v_shards
        self.passes = 0                  # calls of pass_on so far: the step is ``passes``
        self._now = None                 # the (k, v) handed out at this step
        self._received = []              # weak references to every shard handed out

    def kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The K/V shard this rank holds now, ``(…, L/P, E)`` and ``(…, L/P, Ev)``."""
        if self._now is None:
            src = (self.rank - self.passes) % self.world          # the ring schedule: (r − t) mod P
            self._now = (self._k[src].clone(), self._v[src].clone())
            self._received.append(tuple(weakref.ref(t) for t in self._now))
        return self._now

    def held(self) -> int:
        """How many of the shards handed out so far the rank's code still refers to."""
        return sum(any(ref() is not None for ref in refs) for refs in self._received)

    def pass_on(self) -> None:
        """Send the shard to rank r + 1, receive the next one from rank r − 1."""
        if self.passes >= self.world - 1:
            raise RingRuleError(f"rank {self.rank} called pass_on() a {self.passes + 1}th time with P = "
                                f"{self.world}: after P − 1 passes every rank has seen every shard, one more "
                                f"would only send each shard back where it started.")
        self._now = None
        if self.held() > 1:
            raise RingRuleError(f"rank {self.rank} still holds {self.held()} K/V shards when it passes one on "
                                f"(step {self.passes}): a rank keeps ONE shard at a time — merge it into the "
                                f"running output and log-sum-exp, then let it go (no list of shards).")
        self.passes += 1


def run_ring(fn, q_shards: list[torch.Tensor], k_shards: list[torch.Tensor], v_shards: list[torch.Tensor],
             *args) -> tuple[list, list[int]]:
    """``fn(q_shards[r], r, P, ring_r, *args)`` for every rank r, one after another, each with its own
    :class:`SimulatedRing`. Returns the list of their results and the number of passes each rank made."""
    results, passes = [], []
    for r in range(len(q_shards)):
        ring = SimulatedRing(k_shards, v_shards, r)
        results.append(fn(q_shards[r], r, len(q_shards), ring, *args))
        passes.append(ring.passes)
    return results, passes
