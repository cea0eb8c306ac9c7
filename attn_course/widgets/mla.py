"""Lesson 12 explorer: MLA's latent rank d_c and rope width d_R against cache size and quality.

    explorer = LatentExplorer()
    view = explorer.compute(kv_lora_rank=16, qk_rope_head_dim=4)   # trains a tiny MLA (about a second)
    view.per_token, view.accuracy
    explorer.widget()                                                # dropdowns for d_c and d_R

Quality is the accuracy of lesson 07's tiny model on the hard reverse task (``demos.mla.COMPARE``), trained
with the MLA of the chosen shape; MHA, GQA-2 and MQA are trained once as fixed references. Results are
memoised, so revisiting a setting is instant. Cache sizes are elements per token per layer, measured on
the trained model's own cache, and the DeepSeek-V2-shaped formula from :func:`attn_course.kv_cache_bytes`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..memory import kv_cache_bytes
from . import interactive_figure

__all__ = ["LatentExplorer", "LatentView"]

REFERENCES = ("MHA", "GQA (H_kv=2)", "MQA (H_kv=1)")


@dataclass
class LatentView:
    """``per_token``: label -> cached elements per token (the MLA row first, then the references);
    ``accuracy``: label -> accuracy on fresh sequences; ``deepseek_groups``: with DeepSeek-V2's
    n_h = d_h = 128, how many GQA groups cache as much as this (d_c, d_R) (``(d_c + d_R) / (2·128)``)."""
    label: str
    per_token: dict[str, float]
    accuracy: dict[str, float]
    deepseek_groups: float
    figure: object = field(default=None, repr=False)


class LatentExplorer:
    """Train-on-demand explorer over ``kv_lora_rank`` (d_c) and ``qk_rope_head_dim`` (d_R)."""

    def __init__(self, *, seed: int = 0, steps: int | None = None, known: dict | None = None, device=None):
        from ..demos.mla import COMPARE
        self.sizes = dict(COMPARE, **({} if steps is None else {"steps": steps}))
        self.seed, self.device = seed, device          # where the explorer trains (default CPU)
        # label -> (accuracy, elements per token); ``known`` passes results already trained with the same
        # sizes and seed (e.g. the lesson's comparison table), so they are not trained twice
        self._results: dict[str, tuple[float, float]] = dict(known or {})

    def _train(self, label: str, kind) -> tuple[float, float]:
        if label not in self._results:
            from ..demos.mla import train_and_measure
            _, acc, per_token = train_and_measure(kind, seed=self.seed, progress=False, device=self.device, **self.sizes)
            self._results[label] = (acc, per_token)
        return self._results[label]

    def compute(self, *, kv_lora_rank: int = 16, qk_rope_head_dim: int = 2) -> LatentView:
        """Train (or recall) the tiny MLA with this (d_c, d_R) and the references; no drawing.

        Each head's content part is 2 wide (d_nope = 2), so its query·key width is 2 + d_R: d_R = 2
        matches MHA's d_h = 4 on this task; larger d_R also widens the scores (as DeepSeek-V2's 128 + 64)."""
        from ..demos.mla import mla_factory
        label = f"MLA (d_c={kv_lora_rank}, d_R={qk_rope_head_dim})"
        rows = {label: self._train(label, mla_factory(kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim=2))}
        rows.update({ref: self._train(ref, ref) for ref in REFERENCES})
        ds = kv_cache_bytes("mla", seq_len=1, num_heads=128, head_dim=128, kv_lora_rank=kv_lora_rank,
                            qk_rope_head_dim=qk_rope_head_dim, dtype=torch.float16)
        groups = ds / kv_cache_bytes("gqa", seq_len=1, num_heads=128, head_dim=128, num_kv_heads=1,
                                     dtype=torch.float16)
        return LatentView(label, {k: v[1] for k, v in rows.items()}, {k: v[0] for k, v in rows.items()}, groups)

    def update(self, **state) -> LatentView:
        """``compute(**state)`` plus a two-panel figure (cache per token; accuracy). Caller closes it."""
        import matplotlib.pyplot as plt

        view = self.compute(**state)
        labels = list(view.per_token)
        colors = ["tab:green"] + ["tab:gray"] * (len(labels) - 1)
        fig, (ax_c, ax_a) = plt.subplots(1, 2, figsize=(10, 3), layout="constrained", sharey=True)
        bars = ax_c.barh(labels, [view.per_token[k] for k in labels], color=colors)
        ax_c.bar_label(bars, [f"{view.per_token[k]:.0f}" for k in labels], padding=3)
        ax_c.set_xlim(0, 80)
        ax_c.set_xlabel("cached elements per token (measured)")
        ax_c.invert_yaxis()
        bars = ax_a.barh(labels, [100 * view.accuracy[k] for k in labels], color=colors)
        ax_a.bar_label(bars, [f"{100 * view.accuracy[k]:.0f}%" for k in labels], padding=3)
        ax_a.set_xlim(0, 115)
        ax_a.set_xlabel("accuracy, hard reverse task (%)")
        fig.suptitle(f"{view.label}: at DeepSeek-V2's n_h = d_h = 128 this latent caches as much as "
                     f"GQA with {view.deepseek_groups:.2f} groups", fontsize=10)
        view.figure = fig
        return view

    def widget(self):
        """Dropdowns for d_c and d_R; each new setting trains one tiny model (about a second on a CPU)."""
        import ipywidgets as W

        controls = {
            "kv_lora_rank": W.Dropdown(options=[2, 4, 8, 16, 32, 64], value=16, description="d_c"),
            "qk_rope_head_dim": W.Dropdown(options=[2, 4, 8], value=2, description="d_R"),
        }
        return interactive_figure(lambda **s: self.update(**s).figure, controls,
                                  title="MLA: latent rank and rope width vs cache and quality")
