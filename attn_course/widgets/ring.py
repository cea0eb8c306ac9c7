"""Lesson 13's explorer: the ring schedule, step by step — which K/V shard each rank holds at step t,
which (query, key) scores it computes then, and how much work each rank has done so far."""
from __future__ import annotations

import numpy as np

from ..ring import LAYOUTS, ring_plan, ring_schedule, shard_positions

__all__ = ["RingExplorer"]


class RingExplorer:
    """``update(world, step, layout, causal)`` returns ``(work_so_far per rank, figure)``."""

    def __init__(self, seq_len: int = 16):
        self.L = seq_len

    def work_so_far(self, world: int, step: int, layout: str, causal: bool) -> list[int]:
        plan = ring_plan(world, self.L, layout, causal)
        return [int(((plan[shard_positions(r, world, self.L, layout)] >= 0)
                     & (plan[shard_positions(r, world, self.L, layout)] <= step)).sum()) for r in range(world)]

    def update(self, world: int = 4, step: int = 0, layout: str = "contiguous", causal: bool = True):
        import matplotlib.pyplot as plt

        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        step = max(0, min(step, world - 1))
        plan = ring_plan(world, self.L, layout, causal).numpy()
        owner = np.empty(self.L, dtype=int)
        for r in range(world):
            owner[shard_positions(r, world, self.L, layout).numpy()] = r
        # colour a computed score by the rank that computes it, faded if it is computed at another step
        img = np.full((self.L, self.L, 3), 1.0)
        colours = plt.get_cmap("tab10")(np.arange(world))[:, :3]
        for i in range(self.L):
            for j in range(self.L):
                if plan[i, j] >= 0:
                    c = colours[owner[i]]
                    img[i, j] = c if plan[i, j] == step else 0.75 + 0.25 * c
        work = self.work_so_far(world, step, layout, causal)
        fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [1.2, 1]})
        ax0.imshow(img, interpolation="nearest")
        ax0.set_xlabel("key position")
        ax0.set_ylabel("query position")
        holds = ", ".join(f"r{r}←{s}" for r, s in enumerate(ring_schedule(world)[step]))
        ax0.set_title(f"step {step}: scores computed now (bright)\nrank r holds the K/V shard of: {holds}",
                      fontsize=9)
        ax1.bar(range(world), work, color=colours)
        ax1.set_xticks(range(world), [f"rank {r}" for r in range(world)])
        ax1.set_ylabel("scores computed so far")
        total = ring_plan(world, self.L, layout, causal)
        ax1.set_ylim(0, max(1, int((total >= 0).sum()) // world * 2))
        ax1.set_title(f"{layout}, {'causal' if causal else 'bidirectional'}: work after step {step}", fontsize=9)
        fig.tight_layout()
        return work, fig

    def widget(self):
        import ipywidgets as W

        from . import interactive_figure
        # only world sizes both layouts can split L into (zigzag: 2P chunks), e.g. 2, 4, 8 for L = 16
        worlds = [P for P in range(2, 9) if self.L % (2 * P) == 0]
        controls = {"world": W.SelectionSlider(options=worlds, value=4 if 4 in worlds else worlds[0], description="P"),
                    "step": W.IntSlider(value=0, min=0, max=7, description="step t"),
                    "layout": W.Dropdown(options=list(LAYOUTS), value="contiguous", description="layout"),
                    "causal": W.Checkbox(value=True, description="causal")}
        return interactive_figure(lambda **s: self.update(**s)[1], controls, title="The ring, one step at a time")
