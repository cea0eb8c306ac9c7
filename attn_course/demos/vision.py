"""Find the target among clutter: a tiny CNN with and without CBAM, trained in seconds on a CPU.

Each image is ``(3, S, S)`` RGB: dim noise and a grid of 5×5 cells, ``n_clutter + 1`` of which hold a
coloured 3×3 glyph: a plus, a cross (×), a T or an L (each has 5 pixels). Clutter glyphs are red, green
or yellow; exactly ONE glyph is blue: the target. The label is the target's shape. Clutter uses every
shape, so counting shapes over the image only says which shape is common, not which one is blue.

The network's front end is fixed and deliberately keeps *colour* and *shape* in separate channels, each
computed from a tiny neighbourhood (like the colour-opponent and edge cells of the early visual system)::

    light–dark, red–green, blue–yellow   1×1 colour-opponent channels of each pixel (signed)
    plus, cross, T, L                    3×3 matched filters on the brightness max_c(x), colour-blind,
                                         spread over the glyph's 3×3 box (3×3 max pool)

The classifier sums the shape channels over the image (global average pool × H·W / 9, so one glyph
counts 1) and applies a linear layer, which starts as the identity: the histogram's vote, each shape's count
is that shape's logit (with PyTorch's random start, a read-out that happens to vote *against* the shapes
present made training shut the gates for good on some seeds). Without attention the pooled vector is a
shape *histogram* of all glyphs, target and clutter alike: colour and shape are never bound. With CBAM the
channel gate can keep "blue–yellow", and the spatial gate, computed from the channel-gated features, can open
on the blue glyph and close on the clutter, so only the target's shape reaches the pool.

    make_batch(gen, n)              -> (x: (n, 3, S, S), y: (n,)), optionally masks of target / clutter boxes
    glyph_features(x)               the fixed front end -> (B, 7, S, S), channels named in CHANNEL_NAMES
    TargetFinder(attention=True)    features -> CBAM (or nothing) -> sum of shape channels / 9 -> linear
    train_target_finder(...)        fit() on fresh batches; returns the model
    accuracy(model, x, y), count_params(model), count_flops(model, shape)
    gate_means(model, x, target, clutter)  mean spatial gate on target / clutter / background pixels
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..vision import CBAM
from ._train import fit

__all__ = ["GLYPHS", "CLASSES", "COLOURS", "COLOUR_NAMES", "CHANNEL_NAMES", "make_batch", "glyph_features",
           "TargetFinder", "train_target_finder", "accuracy", "count_params", "count_flops",
           "gate_means", "FEATURE_NAMES", "load_photo", "photo_features", "hand_set_cbam"]

GLYPHS = torch.tensor([[[0, 1, 0], [1, 1, 1], [0, 1, 0]],      # plus
                       [[1, 0, 1], [0, 1, 0], [1, 0, 1]],      # cross
                       [[1, 1, 1], [0, 1, 0], [0, 1, 0]],      # T
                       [[1, 0, 0], [1, 0, 0], [1, 1, 1]]],     # L
                      dtype=torch.float32)                     # (4, 3, 3), 5 pixels each
CLASSES = ("plus", "cross", "T", "L")
COLOURS = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
COLOUR_NAMES = ("red", "green", "yellow", "blue")              # clutter colours, then the target's (last)
CHANNEL_NAMES = ("light–dark", "red–green", "blue–yellow") + CLASSES


def make_batch(gen: torch.Generator, n: int = 64, *, size: int = 20, n_clutter: int = 5, noise: float = 0.1,
               masks: bool = False):
    """Draw ``n`` images from ``gen``: a grid of 5×5 cells; ``n_clutter + 1`` random cells hold a 3×3 glyph
    (centred, so glyphs are 2 pixels apart) of a random shape; clutter is red, green or yellow, the target
    blue. Background pixels are uniform noise in ``[0, noise]`` per colour.

    Returns ``(x, y)`` with ``x: (n, 3, size, size)`` float32 in [0, 1] and ``y: (n,)`` int64, the target's
    shape (an index into ``CLASSES``). With ``masks=True`` also bool ``(n, size, size)`` masks of the
    target's 3×3 box and of the clutter glyphs' 3×3 boxes.
    """
    cells = size // 5                                              # cells per side
    k = n_clutter + 1                                              # glyphs per image; the last one is the target
    if cells * cells < k:
        raise ValueError(f"size={size} holds {cells * cells} cells, too few for n_clutter={n_clutter} + 1 target")
    slots = torch.rand(n, cells * cells, generator=gen).argsort(-1)[:, :k]          # (n, k) distinct cells
    shapes = torch.randint(0, len(CLASSES), (n, k), generator=gen)                 # (n, k)
    colour = torch.randint(0, len(COLOURS) - 1, (n, k), generator=gen)              # clutter colours
    colour[:, -1] = len(COLOURS) - 1                                               # the target is blue
    cell = torch.zeros(n, k, 4, 5, 5)                                              # [R, G, B, is-target]
    cell[:, :, :3, 1:4, 1:4] = GLYPHS[shapes][:, :, None] * COLOURS[colour][..., None, None]
    cell[:, :, 3, 1:4, 1:4] = torch.where(torch.arange(k) == k - 1, 1.0, -1.0)[:, None, None]   # box: ±1
    grid = torch.zeros(n, cells * cells, 4, 5, 5)
    grid.scatter_(1, slots[:, :, None, None, None].expand(n, k, 4, 5, 5), cell)
    # (n, row, col, 4, 5, 5) -> (n, 4, row*5, col*5)
    img = grid.view(n, cells, cells, 4, 5, 5).permute(0, 3, 1, 4, 2, 5).reshape(n, 4, 5 * cells, 5 * cells)
    full = torch.zeros(n, 4, size, size)
    full[:, :, : 5 * cells, : 5 * cells] = img
    x = torch.maximum(noise * torch.rand(n, 3, size, size, generator=gen), full[:, :3])
    y = shapes[:, -1]
    if not masks:
        return x, y
    return x, y, full[:, 3] > 0, full[:, 3] < 0


def glyph_features(x: torch.Tensor) -> torch.Tensor:
    """The fixed front end: ``x (B, 3, S, S)`` -> ``(B, 7, S, S)``, channels named in ``CHANNEL_NAMES``.

    Colour (1×1, signed): light–dark ``2·max_c(x) - 1``, red–green ``R - G``, blue–yellow ``B - (R + G)/2``;
    so the target's pixels are +1 in blue–yellow and the clutter's are -1 (yellow) or -1/2 (red, green).
    Shape (colour-blind): the brightness ``v = max_c(x)`` through the four glyphs' matched filters
    ``2·glyph - 1`` (3×3), ``ReLU(· - 4)`` (≈1 only where a glyph matches exactly), then a 3×3 max pool
    that spreads each detection over its glyph's 3×3 box.
    """
    r, g, b = x[:, 0:1], x[:, 1:2], x[:, 2:3]                                       # (B, 1, S, S) each
    v = x.amax(dim=1, keepdim=True)                                                 # (B, 1, S, S) brightness
    colour = torch.cat([2 * v - 1, r - g, b - (r + g) / 2], dim=1)                  # (B, 3, S, S)
    matched = (2 * GLYPHS - 1)[:, None].to(x)                                       # (4, 1, 3, 3)
    hit = F.relu(F.conv2d(v, matched, padding=1) - 4)                               # (B, 4, S, S)
    shape = _max_pool_3x3(hit)                                                      # (B, 4, S, S)
    return torch.cat([colour, shape], dim=1)


def _max_pool_3x3(x: torch.Tensor) -> torch.Tensor:
    """``F.max_pool2d(x, 3, stride=1, padding=1)``, the same values (a max is exact), as the max of shifted
    copies: a row pass, then a column pass. On a CPU, PyTorch's pooling kernel takes about ten times longer
    for these small maps, and the front end runs at every training step."""
    p = F.pad(x, (1, 1, 1, 1), value=float("-inf"))
    rows = torch.maximum(torch.maximum(p[..., :-2], p[..., 1:-1]), p[..., 2:])             # (B, C, S + 2, S)
    return torch.maximum(torch.maximum(rows[..., :-2, :], rows[..., 1:-1, :]), rows[..., 2:, :])


class TargetFinder(nn.Module):
    """``glyph_features (fixed, 7 ch) -> [CBAM(7) | nothing] -> shape channels summed over H, W / 9 -> linear``.

    forward(x: (B, 3, S, S)) -> logits (B, 4). ``forward_with_gates`` also returns CBAM's
    ``(M_c: (B, 7, 1, 1), M_s: (B, 1, S, S))`` (``None`` without attention). The pooled vector (B, 4) counts
    the glyphs of each shape that the gates let through (a glyph's box is 9 pixels). The head starts as the
    identity (zero bias): the untrained model votes for the most frequent shape it lets through.
    """

    def __init__(self, attention: bool = True, reduction: int = 2, kernel_size: int = 7):
        super().__init__()
        channels = len(CHANNEL_NAMES)
        self.cbam = CBAM(channels, reduction, kernel_size) if attention else None
        self.head = nn.Linear(len(CLASSES), len(CLASSES))
        with torch.no_grad():                                      # start as the histogram's vote:
            self.head.weight.copy_(torch.eye(len(CLASSES)))        # each shape's count is its logit
            self.head.bias.zero_()

    def forward_with_gates(self, x: torch.Tensor):
        f = glyph_features(x)                                      # (B, 7, S, S)
        gates = None
        if self.cbam is not None:
            f, gates = self.cbam(f)                                # (B, 7, S, S), ((B, 7, 1, 1), (B, 1, S, S))
        counts = f[:, 3:].sum(dim=(2, 3)) / 9                      # (B, 4)  glyphs of each shape let through
        return self.head(counts), gates                            # (B, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with_gates(x)[0]


def train_target_finder(attention: bool = True, *, steps: int = 150, batch: int = 64, lr: float = 7e-2,
                        seed: int = 0, progress: bool = True, device=None, model: TargetFinder | None = None,
                        **data) -> TargetFinder:
    """Build a ``TargetFinder`` (parameters seeded with ``seed``) and train it on fresh batches with ``fit``.

    ``model``: train this (e.g. modified) model instead of a fresh one; the data stream is the same.
    Returns the trained model on ``device`` (default CPU), its per-step losses in ``model.losses``.
    The seeds of a comparison train as separate runs (``side_by_side``), not as one ``fit_many`` batch: for this
    convolutional model, vmap's batching rules cost more per step than they save.
    """
    if model is None:
        torch.manual_seed(seed)
        model = TargetFinder(attention)
    model = model.to(device or "cpu")
    model.losses = fit(model, lambda g: make_batch(g, batch, **data), steps=steps, lr=lr, seed=seed,
                       progress=progress, desc="CBAM" if model.cbam is not None else "plain", loss_fn=F.cross_entropy)
    return model


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of images whose predicted class equals ``y``."""
    device = next(model.parameters()).device
    return (model(x.to(device)).argmax(-1).cpu() == y).float().mean().item()


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_flops(model: nn.Module, shape: tuple[int, ...]) -> int:
    """FLOPs of one forward pass on a zero input of ``shape``, counted by ``torch.utils.flop_counter``.

    The counter sees matrix products and convolutions (2 FLOPs per multiply-add); it ignores
    element-wise work (ReLU, sigmoid, the gating products, pooling), which is small next to the convs.
    """
    from torch.utils.flop_counter import FlopCounterMode
    device = next(model.parameters()).device
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(shape, device=device))
    return int(counter.get_total_flops())


@torch.no_grad()
def gate_means(model: TargetFinder, x: torch.Tensor, target: torch.Tensor, clutter: torch.Tensor) -> dict[str, float]:
    """Mean of the spatial gate ``M_s`` over the target's 3×3 box, the clutter boxes, and the background
    (all other pixels), pooled over the batch: ``{"target": .., "clutter": .., "background": ..}``."""
    _, (_, M_s) = model.forward_with_gates(x.to(next(model.parameters()).device))
    m = M_s[:, 0].cpu()                                            # (B, S, S)
    return {"target": m[target].mean().item(), "clutter": m[clutter].mean().item(),
            "background": m[~(target | clutter)].mean().item()}


# --- a real photograph through a fixed, hand-designed feature extractor ---------------------------------
FEATURE_NAMES = ("red", "green", "blue", "bright", "dark", "edge |", "edge —")


def load_photo(name: str = "grace_hopper.jpg", size: int = 128) -> torch.Tensor:
    """A sample photo shipped inside matplotlib (no download), as float ``(3, H, W)`` in [0, 1], resized so
    its longer side is ``size`` pixels."""
    from matplotlib import cbook
    from matplotlib import image as mpimg
    a = torch.from_numpy(mpimg.imread(cbook.get_sample_data(name)).copy())
    a = a.float() / 255.0 if a.dtype == torch.uint8 else a.float()
    x = a[..., :3].permute(2, 0, 1)[None]                                              # (1, 3, H, W)
    scale = size / max(x.shape[-2:])
    x = F.interpolate(x, scale_factor=scale, mode="bilinear", antialias=True, align_corners=False)
    return x[0].clamp(0, 1)


def photo_features(image: torch.Tensor) -> torch.Tensor:
    """Seven fixed feature maps of an RGB image ``(3, H, W)`` -> ``(1, 7, H, W)``, named in ``FEATURE_NAMES``:
    the colour channels, brightness, darkness, and the absolute Sobel vertical / horizontal edges of the brightness.
    Each map is standardised over the image (zero mean, unit variance): positive = more than usual here."""
    x = image[None].float()                                                            # (1, 3, H, W)
    lum = x.mean(dim=1, keepdim=True)                                                  # (1, 1, H, W)
    sobel = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])
    kernels = torch.stack([sobel, sobel.T])[:, None]                                   # (2, 1, 3, 3)
    edges = F.conv2d(F.pad(lum, (1, 1, 1, 1), mode="replicate"), kernels).abs()        # (1, 2, H, W)
    f = torch.cat([x, lum, 1 - lum, edges], dim=1)                                     # (1, 7, H, W)
    return (f - f.mean(dim=(2, 3), keepdim=True)) / (f.std(dim=(2, 3), keepdim=True) + 1e-6)


def hand_set_cbam(emphasise: int, channels: int = len(FEATURE_NAMES), *, logit: float = 4.0,
                  gain: float = 3.0, kernel_size: int = 7) -> CBAM:
    """A CBAM whose weights are SET by hand, to see what each gate does before any training.

    Channel gate: zero MLP weights, biases chosen so ``M_c = σ(±logit)``: ≈0.98 for channel ``emphasise``
    and ≈0.02 for the others (both MLP branches add ``fc2.bias``, hence ``logit / 2``). Spatial gate: a
    Gaussian blur of the channel *mean* (times ``gain · C``, undoing the 1/C of the mean), nothing on the
    max, so ``M_s ≈ σ(gain · blur(F_emphasised))`` is bright where the kept feature is above its average.
    """
    cbam = CBAM(channels, reduction=1, kernel_size=kernel_size)
    with torch.no_grad():
        for p in cbam.parameters():
            p.zero_()
        cbam.channel.fc2.bias.fill_(-logit / 2)
        cbam.channel.fc2.bias[emphasise] = logit / 2
        r = torch.arange(kernel_size) - kernel_size // 2
        g = torch.exp(-(r[:, None] ** 2 + r[None] ** 2) / (2 * (kernel_size / 4) ** 2))
        cbam.spatial.conv.weight[0, 0] = gain * channels * g / g.sum()
    return cbam
