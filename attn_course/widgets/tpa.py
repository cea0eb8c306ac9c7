"""Lesson 07 explorer: how big is the decoding cache of MHA, GQA, MQA and TPA for a given shape?

    explorer = CacheExplorer()
    explorer.widget()                                            # sliders for H, d_h, H_kv, R_k, R_v
    explorer.compute(num_heads=32, head_dim=128, num_kv_heads=8, k_rank=2, v_rank=2).per_token

The numbers come from :func:`attn_course.kv_cache_bytes`; this module only arranges and draws them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..memory import kv_cache_bytes
from . import interactive_figure

__all__ = ["CacheExplorer", "CacheView"]


@dataclass
class CacheView:
    """Elements cached per token per layer (``per_token``: label -> int), bytes of one layer's cache
    for ``seq_len`` tokens in fp16 (``total_bytes``), and the label of the smallest cache."""
    per_token: dict[str, int]
    total_bytes: dict[str, int]
    smallest: str
    figure: object = field(default=None, repr=False)


class CacheExplorer:
    """Compare the per-token KV cache of the four mechanisms for one attention shape."""

    def compute(self, *, num_heads: int = 12, head_dim: int = 64, num_kv_heads: int = 2, k_rank: int = 2,
                v_rank: int = 2, seq_len: int = 4096) -> CacheView:
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads={num_heads} is not divisible by num_kv_heads={num_kv_heads}")
        shape = dict(seq_len=seq_len, num_heads=num_heads, head_dim=head_dim, dtype=torch.float16)
        total = {
            "MHA": kv_cache_bytes("mha", **shape),
            f"GQA (H_kv={num_kv_heads})": kv_cache_bytes("gqa", num_kv_heads=num_kv_heads, **shape),
            "MQA": kv_cache_bytes("mqa", **shape),
            f"TPA (R_k={k_rank}, R_v={v_rank})": kv_cache_bytes("tpa", k_rank=k_rank, v_rank=v_rank, **shape),
        }
        per_token = {k: v // (2 * seq_len) for k, v in total.items()}          # fp16: 2 bytes per element
        return CacheView(per_token, total, min(per_token, key=per_token.get))

    def update(self, **state) -> CacheView:
        """``compute(**state)`` plus a bar chart of elements per token (the caller closes the figure)."""
        import matplotlib.pyplot as plt

        view = self.compute(**state)
        fig, ax = plt.subplots(figsize=(7.5, 3.2), layout="constrained")
        labels = list(view.per_token)
        values = [view.per_token[k] for k in labels]
        colors = ["tab:green" if k == view.smallest else "tab:blue" for k in labels]
        bars = ax.barh(labels, values, color=colors)
        ax.bar_label(bars, [f"{v:,} elements" for v in values], padding=3)
        ax.set_xlim(0, max(values) * 1.35)
        ax.invert_yaxis()
        ax.set_xlabel("cached elements per token per layer")
        mib = view.total_bytes[view.smallest] / 2**20
        ax.set_title(f"smallest: {view.smallest} ({mib:.1f} MiB per layer at {state.get('seq_len', 4096)} tokens, fp16)")
        view.figure = fig
        return view

    def widget(self):
        """Sliders for H, d_h, H_kv (must divide H), R_k and R_v; redraws the bar chart."""
        import ipywidgets as W

        controls = {
            "num_heads": W.Dropdown(options=[4, 8, 12, 16, 32, 64], value=12, description="H"),
            "head_dim": W.Dropdown(options=[32, 64, 128, 256], value=64, description="d_h"),
            "num_kv_heads": W.Dropdown(options=[1, 2, 4], value=2, description="H_kv"),
            "k_rank": W.IntSlider(value=2, min=1, max=8, description="R_k"),
            "v_rank": W.IntSlider(value=2, min=1, max=8, description="R_v"),
        }
        return interactive_figure(lambda **s: self.update(**s).figure, controls,
                                  title="KV cache per token: MHA vs GQA vs MQA vs TPA")
