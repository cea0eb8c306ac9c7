"""Sparse attention patterns as FlexAttention mask and score modifiers (``mask_mod``, ``score_mod``; PyTorch ≥ 2.5).

FlexAttention (``torch.nn.attention.flex_attention``) takes attention as two small functions instead of
dense tensors:

* a ``score_mod(score, b, h, q_idx, kv_idx) -> score`` edits one scaled score ``q·k/√d`` (ALiBi, soft-capping,
  a relative bias, …);
* a ``mask_mod(b, h, q_idx, kv_idx) -> bool`` says whether query ``q_idx`` may attend key ``kv_idx``
  (True = may attend, the course's polarity). ``create_block_mask`` evaluates it on **every** (q_idx, kv_idx)
  pair (vmapped; in eager mode that materialises an ``(Lq, Lk)`` bool tensor, per batch and head if the
  mask_mod depends on them), then reduces it tile by tile and records, per query block, which key blocks are
  *full*, *partial* or *empty*. Building it is O(L²) work — build it once and reuse it. What it keeps, the
  :class:`~torch.nn.attention.flex_attention.BlockMask`, takes O((L/BLOCK)²) bytes instead of the L² of a
  dense mask, and it is what makes the compiled kernel skip the empty tiles: the cost follows the number
  of non-empty tiles (O(L·W) for a window) — not the density, since a partial tile costs a full one.

``torch.compile(flex_attention)`` generates one fused kernel per (score_mod, mask_mod, shapes); on CPU that
first call compiles C++ and takes seconds to minutes, later calls reuse it (:func:`compiled_flex`).
Without compiling, ``flex_attention`` runs an eager reference that materialises the scores (correct,
slow, for checking and teaching).

Each pattern below is also a dense bool mask: :func:`dense` evaluates a mask_mod on all (i, j) pairs.

References: Dong, Feng, Guessous, Liang, He 2024, "Flex Attention: A Programming Model for Generating
Optimized Attention Kernels" (arXiv:2412.05496v1); Beltagy et al. 2020, "Longformer" (arXiv:2004.05150v2);
Zaheer et al. 2020, "Big Bird" (arXiv:2007.14062v2); Child et al. 2019, "Generating Long Sequences with
Sparse Transformers" (arXiv:1904.10509v1); Press et al. 2022, "ALiBi" (arXiv:2108.12409v2); Gemma Team
2024, "Gemma 2" (arXiv:2408.00118v3, logit soft-capping).
"""
from __future__ import annotations

import functools
import math

import torch

from . import _validate
from .positions import alibi_slopes

__all__ = ["causal", "sliding_window", "dilated", "global_local", "document", "bigbird", "block_sparse",
           "sparse_transformer_layout", "random_block_layout", "dense", "density", "tile_share", "tile_occupancy",
           "block_mask", "block_mask_bytes", "alibi", "soft_cap", "relative_bias", "compiled_flex", "flex"]


# ---- mask_mods: (b, h, q_idx, kv_idx) -> bool, True = may attend ---------------------------------------

def causal():
    """``j <= i``."""
    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx
    return mask_mod


def sliding_window(window: int, *, causal: bool = True):
    """``masks.sliding_window_mask``: ``0 <= i − j < W`` (causal) or ``|i − j| < W``."""
    _validate.positive_int("window", window)

    def mask_mod(b, h, q_idx, kv_idx):
        d = q_idx - kv_idx
        return (d >= 0) & (d < window) if causal else (d < window) & (d > -window)
    return mask_mod


def dilated(window: int, dilation: int, *, causal: bool = True):
    """``masks.dilated_mask``: ``(i − j) % r == 0`` and ``|i − j| < W·r`` (and ``j <= i`` if causal)."""
    _validate.positive_int("window", window)
    _validate.positive_int("dilation", dilation)
    reach = window * dilation

    def mask_mod(b, h, q_idx, kv_idx):
        d = q_idx - kv_idx
        keep = (d % dilation == 0) & (d < reach) & (d > -reach)
        return keep & (d >= 0) if causal else keep
    return mask_mod


def _global_flags(global_idx, q_len: int, device) -> torch.Tensor:
    g = torch.as_tensor(global_idx, dtype=torch.long).reshape(-1)
    if g.numel() and (int(g.min()) < 0 or int(g.max()) >= q_len):
        raise ValueError(f"every global index must be in [0, q_len={q_len}), got {g.tolist()}")
    flags = torch.zeros(q_len, dtype=torch.bool, device=device)
    flags[g.to(device)] = True
    return flags                                                        # (L,) True for a global position


def global_local(window: int, global_idx, q_len: int, *, device=None):
    """``masks.global_local_mask`` (Longformer): ``|i − j| < W``, or i global, or j global."""
    _validate.positive_int("window", window)
    flags = _global_flags(global_idx, q_len, device)
    local = sliding_window(window, causal=False)

    def mask_mod(b, h, q_idx, kv_idx):
        return local(b, h, q_idx, kv_idx) | flags[q_idx] | flags[kv_idx]
    return mask_mod


def document(doc_ids, *, causal: bool = True, device=None):
    """Packed sequences: several documents concatenated into one row of length L, each token attending only
    within its own document (and causally, by default) — FlexAttention's canonical use, the mask that
    FlashAttention's variable-length API (``cu_seqlens``) implements natively.

    Args:
        doc_ids: ``(L,)`` integer document id of every position, non-decreasing (documents are contiguous).
    """
    ids = torch.as_tensor(doc_ids, dtype=torch.long, device=device).reshape(-1)
    if ids.numel() > 1 and bool((ids[1:] < ids[:-1]).any()):
        raise ValueError(f"doc_ids must be non-decreasing (contiguous documents), got {ids.tolist()}")

    def mask_mod(b, h, q_idx, kv_idx):
        same = ids[q_idx] == ids[kv_idx]
        return same & (kv_idx <= q_idx) if causal else same
    return mask_mod


def random_block_layout(n_blocks: int, per_row: int, *, generator: torch.Generator | None = None,
                        device=None) -> torch.Tensor:
    """``(n, n)`` bool: each query block gets ``per_row`` key blocks drawn uniformly without replacement."""
    _validate.positive_int("n_blocks", n_blocks)
    _validate.positive_int("per_row", per_row)
    if per_row > n_blocks:
        raise ValueError(f"per_row={per_row} random blocks cannot exceed n_blocks={n_blocks}")
    scores = torch.rand(n_blocks, n_blocks, generator=generator)
    idx = scores.topk(per_row, dim=-1).indices                          # (n, per_row) distinct per row
    return torch.zeros(n_blocks, n_blocks, dtype=torch.bool).scatter_(1, idx, True).to(device)


def block_sparse(layout: torch.Tensor, block: int, *, causal: bool = False):
    """Block-sparse pattern (Sparse Transformer; FlashAttention's block-sparse mode): query i may attend
    key j iff ``layout[i // block, j // block]`` (and ``j <= i`` if causal: a causal layout still has
    whole diagonal blocks, whose upper triangles must be hidden element by element).
    ``layout``: bool ``(n_q_blocks, n_k_blocks)``."""
    _validate.positive_int("block", block)
    if layout.dtype != torch.bool or layout.dim() != 2:
        raise ValueError(f"layout must be a 2-D bool tensor, got {layout.dtype} of shape {tuple(layout.shape)}")

    def mask_mod(b, h, q_idx, kv_idx):
        on = layout[q_idx // block, kv_idx // block]
        return on & (kv_idx <= q_idx) if causal else on
    return mask_mod


def sparse_transformer_layout(n_blocks: int, stride: int, *, causal: bool = True, device=None) -> torch.Tensor:
    """The "fixed" pattern of Child et al. 2019 (§4.2) at block granularity, ``(n, n)`` bool: block (i, j)
    is on iff i and j are in the same group of ``stride`` blocks (``i // s == j // s``) or j is the last
    block of its group (a "summary" column, ``j % s == s − 1``); and ``j <= i`` if causal."""
    _validate.positive_int("n_blocks", n_blocks)
    _validate.positive_int("stride", stride)
    i = torch.arange(n_blocks, device=device)[:, None]
    j = torch.arange(n_blocks, device=device)[None, :]
    on = (i // stride == j // stride) | (j % stride == stride - 1)
    return on & (j <= i) if causal else on


def bigbird(window: int, global_idx, random_layout: torch.Tensor, block: int, q_len: int, *, device=None):
    """Big Bird (Zaheer et al. 2020, §2): window ``|i − j| < W`` ∪ global tokens (rows and columns) ∪
    random blocks (``random_layout[i // block, j // block]``, e.g. from :func:`random_block_layout`)."""
    local_global = global_local(window, global_idx, q_len, device=device)
    rand = block_sparse(random_layout.to(device), block)

    def mask_mod(b, h, q_idx, kv_idx):
        return local_global(b, h, q_idx, kv_idx) | rand(b, h, q_idx, kv_idx)
    return mask_mod


# ---- dense views, density, BlockMask ------------------------------------------------------------------

def dense(mask_mod, q_len: int, k_len: int | None = None, *, device=None) -> torch.Tensor:
    """The ``(q_len, k_len)`` bool mask a mask_mod describes (evaluated on all pairs, b = h = 0)."""
    k_len = q_len if k_len is None else k_len
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    zero = torch.zeros((), dtype=torch.long, device=device)
    return mask_mod(zero, zero, i, j).expand(q_len, k_len).clone()


def density(mask: torch.Tensor) -> float:
    """Fraction of (query, key) pairs that may attend: the share of the dense L² work an ideal kernel that
    skips single pairs would keep. Tile kernels (FlexAttention, block-sparse FlashAttention,
    ``flash_attention(window=)``) pay for every tile the pattern touches: see :func:`tile_share`."""
    return float(mask.float().mean())


def tile_share(mask: torch.Tensor, block: int) -> float:
    """Fraction of the ``block × block`` tiles a tile-skipping kernel visits (full or partial tiles of
    :func:`tile_occupancy`): its share of the dense work. At least :func:`density`, often several times it
    (a partial tile costs as much as a full one)."""
    full, partial = tile_occupancy(mask, block)
    return int((full | partial).sum()) / full.numel()               # exact: a count over a count


def tile_occupancy(mask: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(full, partial)`` bool ``(⌈Lq/block⌉, ⌈Lk/block⌉)`` of a dense ``(Lq, Lk)`` mask: tiles where every
    pair may attend, and tiles where some but not all may. The rest are empty — what a BlockMask records
    (``full_kv_num_blocks`` / ``kv_num_blocks`` per query block) and a block-sparse kernel skips."""
    _validate.positive_int("block", block)
    Lq, Lk = mask.shape
    nq, nk = -(-Lq // block), -(-Lk // block)
    pad = torch.zeros(nq * block, nk * block, dtype=torch.bool, device=mask.device)
    pad[:Lq, :Lk] = mask
    valid = torch.zeros_like(pad)
    valid[:Lq, :Lk] = True                                              # the padding of ragged edge tiles
    tiles = lambda t: t.reshape(nq, block, nk, block).transpose(1, 2)  # (nq, nk, block, block)
    anyv = tiles(pad).any(-1).any(-1)
    full = (tiles(pad) | ~tiles(valid)).all(-1).all(-1) & anyv
    return full, anyv & ~full


def block_mask(mask_mod, q_len: int, k_len: int | None = None, *, block: int = 128, device=None):
    """``create_block_mask`` for one head and batch (B = H = None broadcast): the tile-level summary that
    lets compiled FlexAttention skip empty tiles."""
    from torch.nn.attention.flex_attention import create_block_mask
    k_len = q_len if k_len is None else k_len
    return create_block_mask(mask_mod, None, None, q_len, k_len, device=device or "cpu", BLOCK_SIZE=block)


def block_mask_bytes(bm) -> int:
    """Bytes of the tensors a BlockMask holds (block counts and indices, for the mask and its transpose)."""
    return sum(t.numel() * t.element_size() for t in bm.as_tuple() if isinstance(t, torch.Tensor))


# ---- score_mods: (score, b, h, q_idx, kv_idx) -> score --------------------------------------------------

def alibi(num_heads: int, *, device=None):
    """ALiBi (Press et al. 2022): ``score − m_h·(i − j)`` with the slopes of
    :func:`attn_course.positions.alibi_slopes` (the bias of :func:`~attn_course.positions.alibi_bias`).
    ``device``: where the slopes live; without it they follow the scores to their device at the first call."""
    slopes = alibi_slopes(num_heads).to(device)

    def score_mod(score, b, h, q_idx, kv_idx):
        m = slopes if slopes.device == h.device else slopes.to(h.device)   # CPU slopes, GPU head index
        return score - m[h] * (q_idx - kv_idx)
    return score_mod


def soft_cap(cap: float):
    """Logit soft-capping (Gemma 2): ``cap · tanh(score / cap)`` keeps every score in ``(−cap, cap)``."""
    if not (isinstance(cap, (int, float)) and math.isfinite(cap) and cap > 0):
        raise ValueError(f"cap must be a positive finite number, got {cap!r}")

    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)
    return score_mod


def relative_bias(table: torch.Tensor):
    """A learned relative-position bias (T5-style, one entry per offset): ``score + table[h, i − j + L − 1]``
    with ``table`` ``(H, 2L − 1)`` (offsets −(L−1) … L−1)."""
    if table.dim() != 2 or table.shape[1] % 2 != 1:
        raise ValueError(f"table must be (H, 2L - 1), got shape {tuple(table.shape)}")
    L = (table.shape[1] + 1) // 2

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + L - 1]
    return score_mod


# ---- running it ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def compiled_flex():
    """``torch.compile(flex_attention, dynamic=False)``, created once per process and reused: each new
    (score_mod, mask_mod, shape) still compiles once (seconds to minutes on CPU), then runs fused."""
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention, dynamic=False)


def flex(q, k, v, *, score_mod=None, block_mask=None, compiled: bool = True, scale: float | None = None):
    """FlexAttention on ``(B, H, L, E)`` tensors: compiled (fused, skips empty tiles) or the eager
    reference (``compiled=False``: materialises the scores; for checking tiny inputs)."""
    if compiled:
        return compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    import warnings

    from torch.nn.attention import flex_attention as fa
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        warnings.filterwarnings("ignore", message=".*SOLUTION: Use torch.compile.*")
        return fa.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
