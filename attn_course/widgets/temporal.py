"""Lesson 05 explorer: one sentence, a period selector; see the attention move with time.

    explorer = PeriodExplorer(model)                         # a trained demos.temporal.PeriodModel
    explorer.compute("we used the pager and our ipod with the smartphone", period=2)   # no browser
    explorer.widget()                                        # sentence box + period buttons + heatmap
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..demos.temporal import PERIODS, VOCAB, encode
from . import interactive_figure

__all__ = ["PeriodExplorer", "PeriodView"]


@dataclass
class PeriodView:
    """The model's answer (``answer``) for ``tokens`` written in ``PERIODS[period]``, its attention
    ``weights`` ``(H, L, L)``, the key receiving the most weight summed over queries (``top_key``) and
    the fraction of queries whose own maximum is that key (``agree``; rank one makes this high)."""
    period: int
    tokens: list[str]
    answer: str
    weights: torch.Tensor
    top_key: int
    agree: float
    figure: object = field(default=None, repr=False)


class PeriodExplorer:
    def __init__(self, model):
        self.model = model

    @torch.no_grad()
    def compute(self, sentence: str, period: int) -> PeriodView:
        if isinstance(period, bool) or not isinstance(period, int) or not 0 <= period < len(PERIODS):
            raise ValueError(f"period must be an int in [0, {len(PERIODS)}), got {period!r}")
        tokens = encode(sentence)
        self.model.eval()
        logits, w = self.model(tokens, torch.tensor([period]), need_weights=True)
        w = w[0]                                                        # (H, L, L)
        top = int(w.sum((0, 1)).argmax())
        agree = float((w.argmax(-1) == top).float().mean())
        return PeriodView(period, sentence.split(), VOCAB[int(logits.mean(1).argmax())], w, top, agree)

    def update(self, sentence: str, period: int) -> PeriodView:
        """``compute`` plus its figure (head-averaged map)."""
        import matplotlib.pyplot as plt

        from ..viz import plot_attention

        v = self.compute(sentence, period)
        fig, ax = plt.subplots(figsize=(5.5, 4.2), layout="constrained")
        plot_attention(v.weights.mean(0), query_labels=v.tokens, key_labels=v.tokens, ax=ax, vmin=0, vmax=1,
                       title=f"written in {PERIODS[period]}: answer {v.answer!r}")
        v.figure = fig
        return v

    def widget(self, sentence: str = "we used the pager and our ipod with the smartphone"):
        import ipywidgets as W
        import matplotlib.pyplot as plt

        def render(sentence, period):
            try:
                return self.update(sentence, period).figure
            except ValueError as e:
                fig, ax = plt.subplots(figsize=(6, 1))
                ax.axis("off")
                ax.text(0, 0.5, str(e)[:120], fontsize=8)
                return fig

        controls = {
            "sentence": W.Text(value=sentence, description="sentence", continuous_update=False,
                               layout=W.Layout(width="32em")),
            "period": W.ToggleButtons(options=[(p, i) for i, p in enumerate(PERIODS)], value=0,
                                      description="written in"),
        }
        return interactive_figure(render, controls, title="Temporal attention: same sentence, different times")
