"""Find the target among clutter: a tiny CNN with and without CBAM, trained in seconds on a CPU.

Each image is ``(3, S, S)`` RGB: dim noise and a grid of 5×5 cells, ``n_clutter + 1`` of which hold a
white 3×3 glyph, a "plus" or a "cross" (×), inside a coloured frame. Clutter frames are red or green;
exactly ONE frame is blue: the target. The label is the target glyph's shape (0 = plus, 1 = cross).
Clutter uses both shapes, so counting shapes over the image is useless: the network must find the
blue frame (what: a channel question) and read the glyph at its place (where: a spatial question).

The model is deliberately short-sighted: a 3×3 stem and a 1×1 conv before global average pooling, so
without attention a unit that reads the glyph barely sees its frame. CBAM's 7×7 spatial gate sees the
whole 5×5 cell and can route the target's glyph to the pooled features.

    make_batch(gen, n)              -> (x: (n, 3, S, S), y: (n,)), optionally masks of target / clutter
    TargetFinder(attention=True)    stem conv -> CBAM (or nothing) -> conv -> global average pool -> linear
    train_target_finder(...)        fit() on fresh batches; returns the model
    accuracy(model, x, y), count_params(model), count_flops(model, shape)
    channel_selectivity(model, x, target, clutter)   how much more each stem channel fires on the target
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..vision import CBAM
from ._train import fit

__all__ = ["GLYPHS", "CLASSES", "make_batch", "TargetFinder", "train_target_finder", "accuracy",
           "COLOURS", "count_params", "count_flops", "channel_selectivity", "stem_features", "spatial_logits",
           "FEATURE_NAMES", "load_photo", "photo_features", "hand_set_cbam"]

GLYPHS = torch.tensor([[[0, 1, 0], [1, 1, 1], [0, 1, 0]],      # plus
                       [[1, 0, 1], [0, 1, 0], [1, 0, 1]]],     # cross
                      dtype=torch.float32)
CLASSES = ("plus", "cross")
COLOURS = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])   # red, green (clutter), blue (target)
_FRAME = torch.ones(5, 5)
_FRAME[1:4, 1:4] = 0                                               # the 16-pixel border of a 5×5 cell


def make_batch(gen: torch.Generator, n: int = 64, *, size: int = 20, n_clutter: int = 7, noise: float = 0.1,
               masks: bool = False):
    """Draw ``n`` images from ``gen``: a grid of 5×5 cells; ``n_clutter + 1`` random cells hold a white 3×3
    glyph inside a coloured frame (clutter: red or green, target: blue); the rest is dim noise.

    Returns ``(x, y)`` with ``x: (n, 3, size, size)`` float32 in [0, 1] and ``y: (n,)`` int64, the target
    glyph's class (0 plus, 1 cross). With ``masks=True`` also bool ``(n, size, size)`` masks of the target
    cell (glyph and frame) and of the clutter cells.
    """
    cells = size // 5                                              # cells per side
    k = n_clutter + 1                                              # glyphs per image; the last one is the target
    if cells * cells < k:
        raise ValueError(f"size={size} holds {cells * cells} cells, too few for n_clutter={n_clutter} + 1 target")
    slots = torch.rand(n, cells * cells, generator=gen).argsort(-1)[:, :k]          # (n, k) distinct cells
    shapes = torch.randint(0, 2, (n, k), generator=gen)                            # (n, k)
    colour = torch.randint(0, 2, (n, k), generator=gen)
    colour[:, -1] = 2                                                              # the target's frame is blue
    glyph = torch.zeros(n, k, 5, 5)
    glyph[:, :, 1:4, 1:4] = GLYPHS[shapes]                                         # (n, k, 5, 5)
    cell = glyph[:, :, None] + COLOURS[colour][..., None, None] * _FRAME          # (n, k, 3, 5, 5)
    is_target = torch.zeros(n, k, 3, 5, 5)
    is_target[:, -1] = 1.0
    grid = torch.zeros(n, cells * cells, 2, 3, 5, 5)                               # [content, target flag]
    index = slots[:, :, None, None, None, None].expand(n, k, 2, 3, 5, 5)
    grid.scatter_(1, index, torch.stack([cell, is_target], dim=2))
    # (n, row, col, 2, 3, 5, 5) -> (2, n, 3, row*5, col*5)
    img = grid.view(n, cells, cells, 2, 3, 5, 5).permute(3, 0, 4, 1, 5, 2, 6).reshape(2, n, 3, 5 * cells, 5 * cells)
    x = torch.zeros(n, 3, size, size)
    x[:, :, : 5 * cells, : 5 * cells] = img[0]
    x = torch.maximum(noise * torch.rand(n, 3, size, size, generator=gen), x)
    y = shapes[:, -1]
    if not masks:
        return x, y
    target = torch.zeros(n, size, size, dtype=torch.bool)
    target[:, : 5 * cells, : 5 * cells] = img[1, :, 0] > 0
    used = torch.zeros(n, cells * cells, dtype=torch.bool).scatter_(1, slots, True).view(n, cells, cells)
    occupied = torch.zeros(n, size, size, dtype=torch.bool)
    occupied[:, : 5 * cells, : 5 * cells] = used.repeat_interleave(5, 1).repeat_interleave(5, 2)
    return x, y, target, occupied & ~target


class TargetFinder(nn.Module):
    """``stem (3->C, 3×3) -> ReLU -> [CBAM(C) | nothing] -> conv (C->2C, 1×1) -> ReLU -> mean over H, W -> linear``.

    forward(x: (B, 3, S, S)) -> logits (B, 2). ``forward_with_gates`` also returns CBAM's
    ``(M_c: (B, C, 1, 1), M_s: (B, 1, S, S))`` (``None`` without attention).
    """

    def __init__(self, attention: bool = True, channels: int = 8, reduction: int = 2, kernel_size: int = 7):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.cbam = CBAM(channels, reduction, kernel_size) if attention else None
        self.conv = nn.Conv2d(channels, 2 * channels, 1)
        self.head = nn.Linear(2 * channels, len(CLASSES))

    def forward_with_gates(self, x: torch.Tensor):
        f = F.relu(self.stem(x))                                   # (B, C, S, S)
        gates = None
        if self.cbam is not None:
            f, gates = self.cbam(f)                                # (B, C, S, S), ((B, C, 1, 1), (B, 1, S, S))
        f = F.relu(self.conv(f))                                   # (B, 2C, S, S)
        return self.head(f.mean(dim=(2, 3))), gates                # (B, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with_gates(x)[0]


def train_target_finder(attention: bool = True, *, steps: int = 150, batch: int = 64, lr: float = 1e-2,
                        seed: int = 0, progress: bool = True, device=None, **data) -> TargetFinder:
    """Build a ``TargetFinder`` (parameters seeded with ``seed``) and train it on fresh batches."""
    torch.manual_seed(seed)
    model = TargetFinder(attention).to(device or "cpu")
    threads = torch.get_num_threads()
    if model.stem.weight.device.type == "cpu":
        torch.set_num_threads(1)              # convs this small run ~10x faster on one thread than on many
    try:
        fit(model, lambda g: make_batch(g, batch, **data), steps=steps, lr=lr, seed=seed, progress=progress,
            desc="CBAM" if attention else "plain", loss_fn=F.cross_entropy)
    finally:
        torch.set_num_threads(threads)
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
def stem_features(model: TargetFinder, x: torch.Tensor) -> torch.Tensor:
    """The stem's ReLU features, the input of CBAM: ``(B, C, S, S)``."""
    return F.relu(model.stem(x.to(next(model.parameters()).device))).cpu()


@torch.no_grad()
def channel_selectivity(model: TargetFinder, x: torch.Tensor, target: torch.Tensor, clutter: torch.Tensor):
    """Per stem channel: mean activation on target pixels minus mean activation on clutter pixels, ``(C,)``.

    Positive = the channel fires more in the target's cell (blue frame) than in clutter cells (red/green).
    """
    f = stem_features(model, x)                                    # (B, C, S, S)
    on_target = (f * target[:, None]).sum(dim=(0, 2, 3)) / target.sum()
    on_clutter = (f * clutter[:, None]).sum(dim=(0, 2, 3)) / clutter.sum()
    return on_target - on_clutter


@torch.no_grad()
def spatial_logits(model: TargetFinder, x: torch.Tensor) -> torch.Tensor:
    """The spatial gate *before* its sigmoid, ``conv([mean_c; max_c](M_c ⊗ F))``: ``(B, 1, S, S)``.

    A trained gate often saturates (σ ≈ 1 everywhere in float32); its logits still show where it looks.
    """
    f, _ = model.cbam.channel(stem_features(model, x).to(next(model.parameters()).device))
    pooled = torch.cat([f.mean(dim=1, keepdim=True), f.amax(dim=1, keepdim=True)], dim=1)   # (B, 2, S, S)
    return model.cbam.spatial.conv(pooled).cpu()


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
    the colour channels, brightness, darkness, and |Sobel| vertical / horizontal edges of the brightness.
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
