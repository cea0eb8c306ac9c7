"""Explorer of the course's pretrained LMs (lessons 11, 14, 15): one layer and head of one model on one text —
its attention map, the share each query puts on the first token (BOS), and what evicting BOS does to it."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import pretrained as P

__all__ = ["PretrainedExplorer", "PretrainedView", "SNIPPETS"]

# Texts to look at: the first characters of a few held-out documents, and a repeated random string (induction).
SNIPPETS = {
    "held-out text 1": None, "held-out text 2": None, "held-out text 3": None,
    "repeated random string": "xq7#Lp;2vR!eK9 xq7#Lp;2vR!eK9 xq7#Lp;2vR!eK9",
}


@dataclass
class PretrainedView:
    """What the explorer shows: ``weights (L, L)`` of the chosen head, ``first (L,)`` each query's weight on
    BOS, ``share`` their mean over queries from position 8 on, ``loss`` the mean next-character loss of the text."""
    weights: torch.Tensor = field(repr=False)
    first: torch.Tensor = field(repr=False)
    share: float
    loss: float
    figure: object = field(default=None, repr=False)


class PretrainedExplorer:
    """``update(variant, layer, head, text, evict_first)`` on :func:`attn_course.pretrained.load`'s models."""

    def __init__(self, length: int = 48):
        self.length = length
        self.models = {v: P.load(v)[0] for v in P.VARIANTS}
        self.tokenizer = P.Tokenizer()
        docs = [d for d in P.held_out_text().split("\n\n") if len(d) >= length]
        self.texts = {name: (text if text is not None else docs[int(name[-1]) * 7][: length - 1])
                      for name, text in SNIPPETS.items()}

    def compute(self, variant: str = "plain", layer: int = 0, head: int = 0, text: str = "held-out text 1",
                evict_first: bool = False) -> PretrainedView:
        model = self.models[variant]
        if not 0 <= layer < len(model.blocks) or not 0 <= head < model.blocks[0].num_heads:
            raise ValueError(f"layer must be in [0, {len(model.blocks)}) and head in [0, {model.blocks[0].num_heads}), "
                             f"got layer={layer}, head={head}")
        ids = self.tokenizer.encode(self.texts[text])[None]
        L = ids.shape[1]
        keep = None
        if evict_first:
            keep = torch.ones(L, L, dtype=torch.bool)
            keep[1:, 0] = False                           # every query but BOS itself loses BOS
        with torch.no_grad():
            w = model.attention_maps(ids, keep=keep)[layer][0, head]
            logits = model(ids, keep=keep)
            loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:]).item()
        first = w[:, 0]
        return PretrainedView(w, first, first[8:].mean().item(), loss)

    def update(self, **state) -> PretrainedView:
        import matplotlib.pyplot as plt

        from .. import viz
        view = self.compute(**state)
        labels = ["BOS"] + list(self.texts[state.get("text", "held-out text 1")])
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [1.4, 1]})
        viz.plot_attention(view.weights, query_labels=labels, key_labels=labels, ax=a,
                           title=f"{state.get('variant', 'plain')}: layer {state.get('layer', 0)}, head {state.get('head', 0)}")
        b.plot(view.first.numpy(), marker=".", color="tab:red")
        b.set_ylim(0, 1)
        b.set_xlabel("query position")
        b.set_ylabel("weight on BOS")
        b.set_title(f"on BOS: {view.share:.2f} (queries ≥ 8); loss {view.loss:.2f} nats/char", fontsize=9)
        fig.tight_layout()
        view.figure = fig
        return view

    def widget(self):
        import ipywidgets as W

        from . import interactive_figure
        n_layers, n_heads = len(self.models["plain"].blocks), self.models["plain"].blocks[0].num_heads
        controls = {"variant": W.Dropdown(options=list(P.VARIANTS), value="plain", description="model"),
                    "layer": W.IntSlider(value=0, min=0, max=n_layers - 1, description="layer"),
                    "head": W.IntSlider(value=0, min=0, max=n_heads - 1, description="head"),
                    "text": W.Dropdown(options=list(self.texts), value="held-out text 1", description="text"),
                    "evict_first": W.Checkbox(value=False, description="evict BOS")}
        return interactive_figure(lambda **s: self.update(**s).figure, controls,
                                  title="The course's pretrained models: attention and the first token")
