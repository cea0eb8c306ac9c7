"""Lesson 10 explorer: pick a scoring function or feature map, see the attention map it gives and what it costs.

:class:`ScoringExplorer` holds one small example — queries built so that query i resembles key L−1−i (the
reversal pattern), plus noise — and for each choice computes the ``(L, L)`` map and the cost of one head at a
long length ``L_cost``: FLOPs of the matmuls (:func:`flops`) and the size of the largest intermediate tensor.
:meth:`ScoringExplorer.update` returns a :class:`ScoringView` and draws it; :meth:`ScoringExplorer.widget`
adds the controls.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..additive import AdditiveAttention
from ..functional import attention
from ..linear import elu_feature_map, linear_attention_weights, performer_features, random_features

__all__ = ["KINDS", "flops", "largest_intermediate", "ScoringView", "ScoringExplorer"]

KINDS = ("scaled dot product", "dot product (no scale)", "additive (Bahdanau)", "linear (elu + 1)",
         "Performer random features")


def flops(kind: str, L: int, E: int, Ev: int | None = None, *, hidden: int | None = None,
          num_features: int = 64) -> int:
    """FLOPs of one head's matmuls (a multiply-add = 2) at length L (self-attention, non-causal).

    softmax kinds: QKᵀ 2L²E + PV 2L²Ev; additive: W_q q and W_k k 2·2·L·E·h, the pair sums L²h, w_v 2L²h, the
    tanh L²h (counted as one each: 4L²h in all) and PV 2L²Ev — of which the matmuls are 4LEh + 2L²h + 2L²Ev;
    linear: S = φ(K)ᵀV 2LEEv, φ(Q)S 2LEEv, z LE, φ(Q)z 2LE; Performer: the features 2·2·L·E·m, then linear
    attention with m features.
    """
    Ev = E if Ev is None else Ev
    h = E if hidden is None else hidden
    if kind in KINDS[:2]:
        return 2 * L * L * E + 2 * L * L * Ev
    if kind == KINDS[2]:
        return 4 * L * E * h + 4 * L * L * h + 2 * L * L * Ev
    m = E if kind == KINDS[3] else num_features
    extra = 0 if kind == KINDS[3] else 4 * L * E * m
    return extra + 4 * L * m * Ev + 3 * L * m


def largest_intermediate(kind: str, L: int, E: int, Ev: int | None = None, *, hidden: int | None = None,
                         num_features: int = 64) -> int:
    """Elements of the largest tensor one head creates: L² scores, L²h pair features, or L times a feature size."""
    Ev = E if Ev is None else Ev
    if kind in KINDS[:2]:
        return L * L
    if kind == KINDS[2]:
        return L * L * (E if hidden is None else hidden)
    m = E if kind == KINDS[3] else num_features
    return max(L * m, L * Ev, m * Ev)


@dataclass
class ScoringView:
    kind: str
    weights: torch.Tensor = field(repr=False)     # (L, L), rows sum to 1
    anti_diagonal_mass: float                     # mean weight on the "right" key L-1-i
    flops: int
    largest: int
    figure: object = field(default=None, repr=False)


class ScoringExplorer:
    """A reversal-shaped example: ``q_i = k_{L−1−i}·sharpness + noise`` with ``L`` tokens and ``E`` features."""

    def __init__(self, L: int = 12, E: int = 16, *, sharpness: float = 1.5, noise: float = 0.3, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.L, self.E = L, E
        self.k = torch.randn(L, E, generator=g, dtype=torch.float64)
        self.q = self.k.flip(0) * sharpness + noise * torch.randn(L, E, generator=g, dtype=torch.float64)
        # A tanh layer without biases has no x·y term (tanh is odd), so no hand-set W_q, W_k, w_v scores a
        # dot product; instead the Bahdanau weights are *fitted*: 150 Adam steps of cross-entropy towards
        # key L−1−i (deterministic, fp64, a fraction of a second).
        torch.manual_seed(seed)
        self.additive = AdditiveAttention(E, E, 2 * E).double()
        opt = torch.optim.Adam(self.additive.parameters(), lr=0.05)
        target = torch.arange(L - 1, -1, -1)
        for _ in range(150):
            scores = self.additive.score(self.q[None], self.k[None])[0]
            loss = torch.nn.functional.cross_entropy(scores, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
        self.omega = random_features(4096, E, generator=g, dtype=torch.float64)

    def weights(self, kind: str, num_features: int = 64) -> torch.Tensor:
        q, k = self.q, self.k
        if kind == KINDS[0]:
            return attention(q, k, k)[1]
        if kind == KINDS[1]:
            return attention(q, k, k, scale=1.0)[1]
        if kind == KINDS[2]:
            with torch.no_grad():
                return self.additive(q[None], k[None], k[None])[1][0]
        if kind == KINDS[3]:
            return linear_attention_weights(q, k, feature_map=elu_feature_map)
        if kind == KINDS[4]:
            om = self.omega[:num_features]
            Kmat = performer_features(q, om, is_query=True) @ performer_features(k, om, is_query=False).T
            return Kmat / Kmat.sum(-1, keepdim=True)
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")

    def update(self, kind: str = KINDS[0], num_features: int = 64, L_cost: int = 4096, draw: bool = True) -> ScoringView:
        w = self.weights(kind, num_features)
        mass = w.flip(1).diagonal().mean().item()
        view = ScoringView(kind, w, mass, flops(kind, L_cost, self.E, num_features=num_features),
                           largest_intermediate(kind, L_cost, self.E, num_features=num_features))
        if draw:
            view.figure = self.render(view, L_cost)
        return view

    def render(self, view: ScoringView, L_cost: int):
        import matplotlib.pyplot as plt
        fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [1, 1.1]})
        im = ax0.imshow(view.weights.float().numpy(), cmap="viridis", vmin=0)
        ax0.set_xlabel("key j")
        ax0.set_ylabel("query i")
        ax0.set_title(f"{view.kind}\nmean weight on key L−1−i: {view.anti_diagonal_mass:.2f}", fontsize=9)
        fig.colorbar(im, ax=ax0, fraction=0.046)
        Ls = [2 ** p for p in range(6, 15)]
        for kind in KINDS:
            ax1.loglog(Ls, [flops(kind, L, self.E) for L in Ls], "-", lw=3 if kind == view.kind else 1, label=kind,
                       base=2)
        ax1.axvline(L_cost, color="gray", ls=":")
        ax1.set_xlabel("sequence length L")
        ax1.set_ylabel(f"FLOPs, one head, E={self.E}")
        ax1.set_title(f"at L={L_cost}: {view.flops / 1e6:,.1f} MFLOP, largest tensor {view.largest:,} elements",
                      fontsize=9)
        ax1.legend(fontsize=7)
        fig.tight_layout()
        return fig

    def widget(self):
        import ipywidgets as W

        from . import interactive_figure
        controls = {"kind": W.Dropdown(options=list(KINDS), value=KINDS[0], description="scoring"),
                    "num_features": W.IntSlider(value=64, min=4, max=4096, step=4,
                                                description="Performer's features m", disabled=True),
                    "L_cost": W.Dropdown(options=[256, 1024, 4096, 16384], value=4096, description="cost at L")}

        def follow_kind(change):             # m only means something for random features: grey it out otherwise
            controls["num_features"].disabled = change["new"] != KINDS[4]
        controls["kind"].observe(follow_kind, names="value")
        return interactive_figure(lambda **s: self.update(**s).figure, controls,
                                  title="Scoring function / feature map → map and cost")
