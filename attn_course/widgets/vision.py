"""Lesson 06 explorer: pick which feature channel CBAM keeps ("what") and watch where it looks ("where").

    cbam_view(features, emphasise, channel_gate=True, spatial_gate=True) -> dict   # the update logic
    vision_explorer(image=None)                                                  -> ipywidgets.VBox

The logic is plain PyTorch (unit-tested without a browser); the widget only draws its result.
"""
from __future__ import annotations

import torch

from ..demos.vision import FEATURE_NAMES, hand_set_cbam, load_photo, photo_features

__all__ = ["cbam_view", "vision_explorer"]


@torch.no_grad()
def cbam_view(features: torch.Tensor, emphasise: int, *, channel_gate: bool = True,
              spatial_gate: bool = True) -> dict[str, torch.Tensor]:
    """Run the hand-set CBAM of :func:`~attn_course.demos.vision.hand_set_cbam` on ``features (1, C, H, W)``.

    A gate that is switched off is replaced by ones (identity), so the spatial map of ``channel_gate=False``
    is computed from *all* channels: that shows why CBAM puts the channel gate first.
    Returns ``{"channel": (C,), "spatial": (H, W), "output": (1, C, H, W)}``.
    """
    C = features.shape[1]
    if not 0 <= emphasise < C:
        raise ValueError(f"emphasise={emphasise} is not a channel index for C={C} channels")
    cbam = hand_set_cbam(emphasise, C)
    f, M_c = cbam.channel(features) if channel_gate else (features, torch.ones(1, C, 1, 1))
    f, M_s = cbam.spatial(f) if spatial_gate else (f, torch.ones(1, 1, *features.shape[-2:]))
    return {"channel": M_c.flatten(), "spatial": M_s[0, 0], "output": f}


def vision_explorer(image: torch.Tensor | None = None):
    """Dropdown (kept channel) and two switches (channel gate, spatial gate) over a photo; returns the widget."""
    import ipywidgets as W
    import matplotlib.pyplot as plt

    from ..viz.vision import plot_channel_weights, plot_spatial_overlay
    from . import interactive_figure

    image = load_photo() if image is None else image
    features = photo_features(image)

    def render(emphasise, channel_gate, spatial_gate):
        view = cbam_view(features, emphasise, channel_gate=channel_gate, spatial_gate=spatial_gate)
        fig, (a0, a1) = plt.subplots(1, 2, figsize=(9, 3.8), width_ratios=[1.2, 1], layout="constrained")
        plot_spatial_overlay(image, view["spatial"], ax=a0, title="spatial gate $M_s$ over the photo")
        plot_channel_weights(view["channel"], labels=FEATURE_NAMES, ax=a1, highlight=emphasise,
                             title="channel gate $M_c$")
        return fig

    controls = {
        "emphasise": W.Dropdown(options=[(n, i) for i, n in enumerate(FEATURE_NAMES)], value=0,
                                description="keep"),
        "channel_gate": W.Checkbox(value=True, description="channel gate"),
        "spatial_gate": W.Checkbox(value=True, description="spatial gate"),
    }
    return interactive_figure(render, controls, title="CBAM: what (channel) and where (spatial)")
