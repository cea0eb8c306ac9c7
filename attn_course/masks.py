"""Boolean attention masks. Polarity everywhere in the course: **True = may attend** (SDPA's).

``nn.MultiheadAttention`` uses the opposite polarity (True = blocked): pass it ``~mask``.
All helpers return masks that broadcast to the scores' shape ``(B, H, Lq, Lk)``.
"""
from __future__ import annotations

import torch

from ._validate import positive_int

__all__ = ["causal_mask", "padding_mask", "sliding_window_mask", "dilated_mask", "global_local_mask", "combine"]


def causal_mask(q_len: int, k_len: int | None = None, *, device=None) -> torch.Tensor:
    """``(q_len, k_len)`` bool, query i may attend key j iff j <= i (top-left aligned, as SDPA's ``is_causal``)."""
    positive_int("q_len", q_len)
    k_len = q_len if k_len is None else positive_int("k_len", k_len)
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril()


def padding_mask(lengths, max_len: int) -> torch.Tensor:
    """``(B, 1, 1, max_len)`` bool, True for the first ``lengths[b]`` positions (the real tokens).

    ``lengths``: a sequence of ints or a 1-D integer tensor, each in ``[0, max_len]``.
    """
    positive_int("max_len", max_len)
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be a 1-D sequence of integers, got {lengths.dtype} of shape {tuple(lengths.shape)}")
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > max_len):
        raise ValueError(f"every length must be in [0, max_len={max_len}], got {lengths.tolist()}")
    keep = torch.arange(max_len, device=lengths.device) < lengths[:, None]     # (B, max_len)
    return keep[:, None, None, :]                                             # (B, 1, 1, max_len)


def sliding_window_mask(q_len: int, window: int, *, causal: bool = True, device=None) -> torch.Tensor:
    """``(q_len, q_len)`` bool local-attention mask.

    causal=True: key j visible to query i iff j <= i and i - j < window (the query itself counts);
    causal=False: iff ``|i - j| < window``.
    """
    positive_int("q_len", q_len)
    positive_int("window", window)
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(q_len, device=device)[None, :]
    d = i - j
    return (d >= 0) & (d < window) if causal else d.abs() < window


def dilated_mask(q_len: int, window: int, dilation: int, *, causal: bool = True, device=None) -> torch.Tensor:
    """``(q_len, q_len)`` bool dilated sliding window (Beltagy et al. 2020, Longformer §3.1).

    Key j visible to query i iff ``(i - j) % dilation == 0`` and ``|i - j| < window · dilation``
    (and ``j <= i`` when causal): each query sees ``window`` keys on its side, every ``dilation``-th one,
    so the reach is ``(window - 1) · dilation + 1`` positions for the same cost as a plain window.
    ``dilation=1`` is :func:`sliding_window_mask`.
    """
    positive_int("q_len", q_len)
    positive_int("window", window)
    positive_int("dilation", dilation)
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(q_len, device=device)[None, :]
    d = i - j
    keep = (d % dilation == 0) & (d.abs() < window * dilation)
    return keep & (d >= 0) if causal else keep


def global_local_mask(q_len: int, window: int, global_idx, *, device=None) -> torch.Tensor:
    """``(q_len, q_len)`` bool Longformer pattern (Beltagy et al. 2020, §3.1): a symmetric (non-causal)
    window ``|i - j| < window``, plus every position in ``global_idx`` attends to all keys (its row is
    True) and is attended by all queries (its column is True).

    ``global_idx``: ints or a 1-D integer tensor, each in ``[0, q_len)``. Duplicates are harmless (a set
    of positions); an empty ``global_idx`` gives the plain window ``sliding_window_mask(q_len, window,
    causal=False)``. Out-of-range or non-integer indices raise ``ValueError``.
    """
    positive_int("q_len", q_len)
    positive_int("window", window)
    g = torch.as_tensor(global_idx if not isinstance(global_idx, int) else [global_idx])
    if g.numel() == 0:
        g = g.to(torch.long)
    if g.dim() != 1 or g.is_floating_point() or g.dtype == torch.bool:
        raise ValueError(f"global_idx must be a 1-D sequence of integers, got {g.dtype} of shape {tuple(g.shape)}")
    if g.numel() and (int(g.min()) < 0 or int(g.max()) >= q_len):
        raise ValueError(f"every global index must be in [0, q_len={q_len}), got {g.tolist()}")
    mask = sliding_window_mask(q_len, window, causal=False, device=device)
    is_global = torch.zeros(q_len, dtype=torch.bool, device=device)
    is_global[g.to(device)] = True
    return mask | is_global[:, None] | is_global[None, :]


def combine(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Logical AND of boolean masks (``None`` entries are ignored), broadcasting their shapes."""
    out = None
    for m in masks:
        if m is None:
            continue
        if m.dtype != torch.bool:
            raise ValueError(f"combine expects boolean masks, got {m.dtype}")
        out = m if out is None else out & m
    return out
