"""Attention as gating for convolutional feature maps: "what" (channels) and "where" (space).

References
----------
* SE   — Hu, Shen, Sun. "Squeeze-and-Excitation Networks", CVPR 2018 (arXiv:1709.01507).
* CBAM — Woo, Park, Lee, Kweon. "CBAM: Convolutional Block Attention Module", ECCV 2018 (arXiv:1807.06521).

Unlike softmax attention, these gates do not mix positions: each gate is a sigmoid in (0, 1) that
*rescales* its input, ``y = x * weights`` with ``weights`` broadcast over the pooled axes. There is no
softmax, so the gates do not sum to one and several channels (or positions) can be fully "on".

Every module takes ``x: (B, C, H, W)`` and returns ``(y, weights)`` with ``y`` shaped like ``x``:
channel gates are ``(B, C, 1, 1)``, spatial maps ``(B, 1, H, W)``; ``CBAM`` returns both as a tuple.

Hidden width of the excitation MLP: ``hidden = max(1, channels // reduction)`` (floor division, at
least one unit), so a reduction that does not divide the channels is accepted (``C=10, r=4 -> 2``)
and ``reduction > channels`` gives a one-unit bottleneck rather than an error.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import _validate

__all__ = ["SqueezeExcitation", "ChannelAttention", "SpatialAttention", "CBAM"]


def _hidden(channels: int, reduction: int) -> int:
    _validate.positive_int("channels", channels)
    _validate.positive_int("reduction", reduction)
    return max(1, channels // reduction)


def _check_input(x, channels: int | None) -> None:
    _validate.tensor("x", x, dim=4)
    if channels is not None and x.shape[1] != channels:
        raise ValueError(f"x has {x.shape[1]} channels (shape {tuple(x.shape)}, expected (B, C, H, W)), "
                         f"but the module was built for channels={channels}")


class SqueezeExcitation(nn.Module):
    """Squeeze-and-Excitation block (Hu et al. 2018).

    ``z_c = mean_{i,j} x_c(i, j)`` (squeeze, Eq. 2), ``s = σ(W_2 δ(W_1 z))`` (excitation, Eq. 3, δ = ReLU),
    ``y_c = s_c · x_c`` (scale, Eq. 4). ``fc1 = W_1: Linear(C, C // r)``, ``fc2 = W_2: Linear(C // r, C)``,
    both with bias, as in the official code.

    forward(x: (B, C, H, W)) -> (y: (B, C, H, W), s: (B, C, 1, 1))
    """

    def __init__(self, channels: int, reduction: int = 16):
        super().__init__()
        self.channels, self.hidden = channels, _hidden(channels, reduction)
        self.fc1 = nn.Linear(channels, self.hidden)   # W_1
        self.fc2 = nn.Linear(self.hidden, channels)   # W_2

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _check_input(x, self.channels)
        z = x.mean(dim=(2, 3))                                  # (B, C)  Eq. (2): global average pool
        s = torch.sigmoid(self.fc2(F.relu(self.fc1(z))))        # (B, C)  Eq. (3)
        s = s[:, :, None, None]                                 # (B, C, 1, 1)
        return x * s, s                                         # Eq. (4): broadcast over H, W


class ChannelAttention(nn.Module):
    """CBAM channel gate (Woo et al. 2018, Eq. 2): "what" to look at.

    ``M_c(F) = σ(MLP(AvgPool(F)) + MLP(MaxPool(F)))`` with ONE MLP ``fc2(ReLU(fc1(·)))`` shared by both
    pooled descriptors (pooling over H and W). Compared with SE, CBAM adds the max-pooled descriptor.

    forward(x: (B, C, H, W)) -> (y = x * M_c: (B, C, H, W), M_c: (B, C, 1, 1))
    """

    def __init__(self, channels: int, reduction: int = 16):
        super().__init__()
        self.channels, self.hidden = channels, _hidden(channels, reduction)
        self.fc1 = nn.Linear(channels, self.hidden)   # W_0
        self.fc2 = nn.Linear(self.hidden, channels)   # W_1

    def mlp(self, f: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(f)))                    # (B, C)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _check_input(x, self.channels)
        f_avg = x.mean(dim=(2, 3))                              # (B, C)  F^c_avg
        f_max = x.amax(dim=(2, 3))                              # (B, C)  F^c_max
        M_c = torch.sigmoid(self.mlp(f_avg) + self.mlp(f_max))  # (B, C)  Eq. (2)
        M_c = M_c[:, :, None, None]                             # (B, C, 1, 1)
        return x * M_c, M_c


class SpatialAttention(nn.Module):
    """CBAM spatial gate (Woo et al. 2018, Eq. 3): "where" to look.

    ``M_s(F) = σ(f^{k×k}([AvgPool(F); MaxPool(F)]))``, pooling over the channel axis, so the conv sees a
    2-channel map ``[mean_c, max_c]`` (in that order, as in the paper); ``conv = Conv2d(2, 1, k,
    padding=k // 2, bias=False)`` keeps H×W, which needs an odd ``kernel_size``.

    The official CBAM code differs from the paper in two details: its ``ChannelPool`` concatenates
    max *before* mean, and its 7×7 conv is followed by a BatchNorm2d(1) before the sigmoid. We follow
    the paper (mean first, no BatchNorm); a checkpoint from the official code needs its two input
    channels swapped and its BatchNorm folded into the conv.

    forward(x: (B, C, H, W)) -> (y = x * M_s: (B, C, H, W), M_s: (B, 1, H, W))
    """

    def __init__(self, kernel_size: int = 7):
        super().__init__()
        _validate.positive_int("kernel_size", kernel_size)
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size={kernel_size} must be odd: padding=kernel_size//2="
                             f"{kernel_size // 2} would change the map's size by one")
        self.kernel_size = kernel_size
        self.conv = nn.Conv2d(2, 1, kernel_size, padding=kernel_size // 2, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _check_input(x, None)
        f_avg = x.mean(dim=1, keepdim=True)                     # (B, 1, H, W)  F^s_avg
        f_max = x.amax(dim=1, keepdim=True)                     # (B, 1, H, W)  F^s_max
        M_s = torch.sigmoid(self.conv(torch.cat([f_avg, f_max], dim=1)))  # (B, 1, H, W)  Eq. (3)
        return x * M_s, M_s                                     # broadcast over C


class CBAM(nn.Module):
    """Convolutional Block Attention Module (Woo et al. 2018, Eq. 1): channel gate, then spatial gate.

    ``F' = M_c(F) ⊗ F``, ``F'' = M_s(F') ⊗ F'`` — the spatial map is computed from the
    *channel-gated* features, so what the channel gate keeps decides where the spatial gate looks.

    forward(x: (B, C, H, W)) -> (F'': (B, C, H, W), (M_c: (B, C, 1, 1), M_s: (B, 1, H, W)))
    """

    def __init__(self, channels: int, reduction: int = 16, kernel_size: int = 7):
        super().__init__()
        self.channel = ChannelAttention(channels, reduction)
        self.spatial = SpatialAttention(kernel_size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        x, M_c = self.channel(x)                                # (B, C, H, W), (B, C, 1, 1)
        x, M_s = self.spatial(x)                                # (B, C, H, W), (B, 1, H, W)
        return x, (M_c, M_s)
