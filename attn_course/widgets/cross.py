"""Lesson 04 explorer: type digits, watch the toy translator's cross-attention align words to digits.

    explorer = TranslationExplorer(model)        # a trained attn_course.demos.cross.ToyTranslator
    explorer.compute("7 1 8 3")                  # the logic, without a browser: words, weights, alignment
    explorer.widget()                            # a text box above the (Lt, Ls) heatmap
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..demos.cross import MAX_LEN, MIN_LEN, PAD, WORDS, translate
from . import interactive_figure

__all__ = ["TranslationExplorer", "TranslationView", "parse_digits"]


def parse_digits(text: str) -> list[int]:
    """``"7 1 8 3"`` or ``"7183"`` -> ``[7, 1, 8, 3]``; ValueError unless MIN_LEN..MAX_LEN distinct digits."""
    digits = [int(ch) for ch in text if ch.isdigit()]
    if any(not (ch.isdigit() or ch.isspace() or ch == ",") for ch in text):
        raise ValueError(f"type digits only (spaces and commas allowed), got {text!r}")
    if not MIN_LEN <= len(digits) <= MAX_LEN or len(set(digits)) != len(digits):
        raise ValueError(f"type {MIN_LEN} to {MAX_LEN} distinct digits, got {len(digits)} digits in {text!r}")
    return digits


@dataclass
class TranslationView:
    """One translation: the output ``words``, the source ``tokens`` (padding shown as ``<pad>``), the
    cross-attention ``weights`` ``(H, Lt, MAX_LEN)`` and, per output word, the source position it looks at
    most (``alignment``) and the weight on padding (``pad_weight``, exactly 0)."""
    words: list[str]
    tokens: list[str]
    weights: torch.Tensor
    alignment: list[int]
    pad_weight: float
    figure: object = field(default=None, repr=False)


class TranslationExplorer:
    def __init__(self, model):
        self.model = model

    def compute(self, text: str) -> TranslationView:
        digits = parse_digits(text)
        n = len(digits)
        src = torch.tensor([digits + [PAD] * (MAX_LEN - n)])
        out, w = translate(self.model, src)
        w = w[0, :, :n]                                                     # (H, Lt=n, Ls) real output rows
        words = [WORDS[i] for i in out[0, :n].tolist()]
        tokens = [str(d) for d in digits] + ["<pad>"] * (MAX_LEN - n)
        return TranslationView(words, tokens, w, w.sum(0).argmax(-1).tolist(), float(w[..., n:].sum()))

    def update(self, text: str) -> TranslationView:
        """``compute(text)`` plus its figure (head-averaged map, rows labelled by the words produced)."""
        import matplotlib.pyplot as plt

        from ..viz import plot_attention

        v = self.compute(text)
        fig, ax = plt.subplots(figsize=(5.5, 3.5), layout="constrained")
        plot_attention(v.weights.mean(0), query_labels=v.words, key_labels=v.tokens, ax=ax, vmin=0, vmax=1,
                       title="cross-attention: output word (row) reads source digit (column)")
        ax.set_xlabel("source (keys/values)")
        ax.set_ylabel("output word (queries)")
        v.figure = fig
        return v

    def widget(self, text: str = "7 1 8 3"):
        """A text box for the source digits above the alignment heatmap."""
        import ipywidgets as W
        import matplotlib.pyplot as plt

        def render(text):
            try:
                return self.update(text).figure
            except ValueError as e:                       # a half-typed input: say what is wrong
                fig, ax = plt.subplots(figsize=(5.5, 1))
                ax.axis("off")
                ax.text(0, 0.5, str(e), fontsize=9)
                return fig

        controls = {"text": W.Text(value=text, description="digits", continuous_update=False)}
        return interactive_figure(render, controls, title="Toy translation: where does each word look?")
