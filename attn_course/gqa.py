"""Grouped-query attention (GQA), with multi-query (MQA) and multi-head (MHA) as its two extremes,
and a key/value cache for incremental decoding.

H query heads share H_kv key/value heads in groups of G = H / H_kv: query head i reads kv head
i // G. H_kv = H is ordinary multi-head attention, H_kv = 1 is multi-query attention. Only K and V
are cached while decoding, so the cache shrinks by the factor G, which is the whole point.

References:

- Ainslie et al. 2023, "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
  Checkpoints", §2 (grouping; up-training by mean-pooling the key/value heads of a group).
- Shazeer 2019, "Fast Transformer Decoding: One Write-Head is All You Need" (MQA).
- Jiang et al. 2023, "Mistral 7B", §2 (sliding-window attention and the rolling-buffer cache).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from . import _validate
from .functional import _check, attention
from .masks import sliding_window_mask

__all__ = ["GroupedQueryAttention", "KVCache", "StaticKVCache", "RollingKVCache"]


@dataclass
class KVCache:
    """The keys and values of every token seen so far, for ONE attention layer.

    ``k`` and ``v`` are ``(B, H_kv, L_cached, d_h)`` (``None`` until the first forward). Pass the same
    object to :meth:`GroupedQueryAttention.forward` at every step: it appends the new tokens' K/V in
    place. Its memory is exactly what :func:`attn_course.kv_cache_bytes` predicts for one layer.
    """
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    def __len__(self) -> int:
        """Number of cached positions L_cached."""
        return 0 if self.k is None else self.k.shape[-2]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new ``k, v`` ``(B, H_kv, L_new, d_h)`` along the length axis; return all cached K, V."""
        if self.k is not None and (self.k.shape[:2] != k.shape[:2] or self.k.shape[-1] != k.shape[-1]):
            raise ValueError(
                f"cache holds keys of shape (B, H_kv, L, d_h) = {tuple(self.k.shape)}, cannot append keys "
                f"of shape {tuple(k.shape)}: batch size, kv heads and head_dim must match")
        self.k = k if self.k is None else torch.cat([self.k, k], dim=-2)   # (B, H_kv, L_cached + L_new, d_h)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=-2)
        return self.k, self.v

    def nbytes(self) -> int:
        """Bytes held by the cached tensors (K and V)."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None)


class StaticKVCache:
    """A preallocated KV cache for ONE attention layer: ``max_len`` positions reserved up front.

    ``k`` and ``v`` buffers are ``(B, H_kv, max_len, d_h)``; :meth:`update` writes the new tokens'
    K/V into the next free slots (no new allocation, no copy of the old entries) and returns views of
    the filled part ``(B, H_kv, L_cached, d_h)``. A drop-in replacement for :class:`KVCache` in
    :meth:`GroupedQueryAttention.forward`. It holds ``max_len`` positions from the start, so
    :meth:`nbytes` is the reserved size (what ``kv_cache_bytes`` gives for ``seq_len=max_len``).
    """

    def __init__(self, batch_size: int, num_kv_heads: int, max_len: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device=None):
        for name, value in (("batch_size", batch_size), ("num_kv_heads", num_kv_heads), ("max_len", max_len),
                            ("head_dim", head_dim)):
            _validate.positive_int(name, value)
        shape = (batch_size, num_kv_heads, max_len, head_dim)
        self.k_buf = torch.zeros(shape, dtype=dtype, device=device)
        self.v_buf = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    def __len__(self) -> int:
        """Number of filled positions L_cached."""
        return self.length

    @property
    def k(self) -> torch.Tensor:
        return self.k_buf[:, :, :self.length]

    @property
    def v(self) -> torch.Tensor:
        return self.v_buf[:, :, :self.length]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k, v`` ``(B, H_kv, L_new, d_h)`` into slots ``L_cached … L_cached+L_new-1``; return the
        filled K, V ``(B, H_kv, L_cached + L_new, d_h)`` (views of the buffers)."""
        B, H_kv, max_len, d_h = self.k_buf.shape
        if k.shape[:2] != (B, H_kv) or k.shape[-1] != d_h or v.shape != k.shape:
            raise ValueError(f"cache holds (B, H_kv, max_len, d_h) = {tuple(self.k_buf.shape)}, cannot append keys "
                             f"{tuple(k.shape)} and values {tuple(v.shape)}: batch size, kv heads and head_dim "
                             f"must match")
        end = self.length + k.shape[-2]
        if end > max_len:
            raise ValueError(f"cache of max_len={max_len} holds {self.length} positions, cannot append "
                             f"{k.shape[-2]} more")
        self.k_buf[:, :, self.length:end] = k
        self.v_buf[:, :, self.length:end] = v
        self.length = end
        return self.k, self.v

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` positions (e.g. to drop rejected speculative tokens, or to time
        decode steps at a fixed context); the buffers stay allocated."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache holding {self.length} positions to length={length}")
        self.length = length

    def nbytes(self) -> int:
        """Bytes reserved by the two buffers (all ``max_len`` positions)."""
        return sum(t.numel() * t.element_size() for t in (self.k_buf, self.v_buf))


class RollingKVCache:
    """Mistral's rolling-buffer cache (Jiang et al. 2023, §2) for ONE layer with a sliding window ``W``.

    With a window, a new token never looks further back than ``W − 1`` positions, so only the last ``W``
    keys and values are kept: position ``p`` lives in slot ``p mod W`` of fixed ``(B, H_kv, W, d_h)``
    buffers and overwrites position ``p − W``, which no later query can see. ``len(cache) <= W`` and
    :meth:`nbytes` stay constant however many tokens are decoded (a :class:`KVCache` grows without bound).
    The slots are not in time order; attention does not care, because the mask is built from ``pos``.

    Attributes: ``k``, ``v`` the buffers (``None`` before the first update); ``pos`` ``(W,)`` the absolute
    position held by each slot (−1 = empty); ``seen`` the number of tokens written so far.
    """

    def __init__(self, window: int):
        self.window = _validate.positive_int("window", window)
        self.k = self.v = self.pos = None
        self.seen = 0

    def __len__(self) -> int:
        """Positions currently held (``min(seen, W)``)."""
        return min(self.seen, self.window)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Attend-then-store for ``L_new`` new tokens ``k, v`` ``(B, H_kv, L_new, d_h)``.

        Returns ``(k_all, v_all, mask)``: the buffer followed by the new tokens, ``(B, H_kv, W + L_new, d_h)``,
        and the bool ``(L_new, W + L_new)`` sliding-window mask (True = may attend) of the new queries over
        them, built from absolute positions. Then the last ``min(L_new, W)`` new tokens are written into
        their slots ``p mod W``.
        """
        B, Hkv, L, d = k.shape
        W = self.window
        if self.k is None:
            self.k = k.new_zeros(B, Hkv, W, d)
            self.v = v.new_zeros(B, Hkv, W, v.shape[-1])
            self.pos = torch.full((W,), -1, dtype=torch.long, device=k.device)
        elif self.k.shape[:2] != k.shape[:2] or self.k.shape[-1] != d:
            raise ValueError(
                f"cache holds keys of shape (B, H_kv, W, d_h) = {tuple(self.k.shape)}, cannot add keys of "
                f"shape {tuple(k.shape)}: batch size, kv heads and head_dim must match")
        new_pos = torch.arange(self.seen, self.seen + L, device=k.device)              # (L,)
        key_pos = torch.cat([self.pos, new_pos])                                       # (W + L,)
        d_ij = new_pos[:, None] - key_pos[None, :]                                     # i − j
        mask = (key_pos >= 0) & (d_ij >= 0) & (d_ij < W)                               # (L, W + L)
        k_all, v_all = torch.cat([self.k, k], dim=-2), torch.cat([self.v, v], dim=-2)
        keep = min(L, W)                                                               # older new tokens are out of reach
        slots = new_pos[-keep:] % W
        self.k[:, :, slots], self.v[:, :, slots] = k[:, :, -keep:], v[:, :, -keep:]
        self.pos[slots] = new_pos[-keep:]
        self.seen += L
        return k_all, v_all, mask

    def nbytes(self) -> int:
        """Bytes held by the K and V buffers (constant once allocated: ``2·B·H_kv·W·d_h·element size``)."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None)


class GroupedQueryAttention(nn.Module):
    """Grouped-query self-attention on batch-first ``(B, L, d_model)`` inputs.

    Args:
        d_model: model width; must be divisible by ``num_heads``. ``head_dim = d_model // num_heads``.
        num_heads: H, number of query heads.
        num_kv_heads: H_kv, number of key/value heads; must divide ``num_heads``
            (1 = MQA, ``num_heads`` = MHA).
        bias: bias in the four projections (off by default, as in LLaMA/Mistral).
        dropout: dropout on the attention weights while training.
        window: sliding window ``W`` (Mistral, Jiang et al. 2023) or ``None``. With ``is_causal=True`` query
            i sees keys ``i − W < j <= i`` (``masks.sliding_window_mask(L, W)``); with ``is_causal=False``
            keys ``|i − j| < W``. Decoding then takes a :class:`RollingKVCache` ``(W)`` (fixed buffers, slot
            ``p mod W``) or a plain :class:`KVCache`, which the module crops to the last ``W`` positions after
            every call; either way the cache keeps only the last ``W`` positions (a :class:`StaticKVCache`
            cannot roll and is refused). ``attn_mask`` cannot be combined with ``window``.

    Parameters: ``q_proj`` d_model → H·d_h, ``k_proj`` and ``v_proj`` d_model → H_kv·d_h,
    ``out_proj`` H·d_h → d_model. Query head i uses kv head ``i // (H // H_kv)``.
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, bias: bool = False,
                 dropout: float = 0.0, window: int | None = None):
        super().__init__()
        self.window = None if window is None else _validate.positive_int("window", window)
        _validate.positive_int("d_model", d_model)
        _validate.positive_int("num_heads", num_heads)
        _validate.positive_int("num_kv_heads", num_kv_heads)
        _validate.divisible("d_model", d_model, "num_heads", num_heads)
        _validate.divisible("num_heads", num_heads, "num_kv_heads", num_kv_heads)
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.head_dim = d_model // num_heads
        self.dropout = _validate.probability("dropout", dropout)
        self.q_proj = nn.Linear(d_model, num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * self.head_dim, d_model, bias=bias)

    @classmethod
    def from_multi_head(cls, mha: nn.Module, num_kv_heads: int, pool: str = "mean") -> "GroupedQueryAttention":
        """Convert a multi-head checkpoint into GQA by mean-pooling each group's key and value heads.

        The up-training recipe of Ainslie et al. 2023, §2.1: kv head j of the new module is the mean of
        heads j·G … j·G+G−1 of ``mha`` (G = num_heads // num_kv_heads, the heads whose queries will
        read it); queries and the output projection are copied. ``mha`` is a
        :class:`~attn_course.MultiHeadAttention` or a ``GroupedQueryAttention`` with
        ``num_kv_heads == num_heads``. A short fine-tuning ("up-training") then recovers most of the quality.
        ``pool`` picks the conversion the paper compares (its Figure 4): ``"mean"``, ``"first"`` (kv head j is
        head j·G of its group) or ``"random"`` (fresh key/value projections from the global RNG).
        """
        if pool not in ("mean", "first", "random"):
            raise ValueError(f"pool={pool!r}: expected 'mean', 'first' or 'random'")
        H, d_model = mha.num_heads, mha.q_proj.in_features
        if getattr(mha, "num_kv_heads", H) != H:
            raise ValueError(f"expected a multi-head module (num_kv_heads == num_heads={H}), got "
                             f"num_kv_heads={mha.num_kv_heads}")
        bias = mha.k_proj.bias is not None
        gqa = cls(d_model, H, num_kv_heads, bias=bias, dropout=mha.dropout).to(mha.q_proj.weight)
        groups = lambda t: rearrange(t, "(hkv g d) ... -> hkv g d ...", hkv=num_kv_heads, d=gqa.head_dim)
        reduce = {"mean": lambda t: groups(t).mean(1).flatten(0, 1), "first": lambda t: groups(t)[:, 0].flatten(0, 1)}
        with torch.no_grad():
            for name in ("q_proj", "out_proj"):
                getattr(gqa, name).load_state_dict(getattr(mha, name).state_dict())
            for name in ("k_proj", "v_proj") if pool != "random" else ():   # "random": keep the fresh init
                src, dst = getattr(mha, name), getattr(gqa, name)
                dst.weight.copy_(reduce[pool](src.weight))                # (H_kv·d_h, d_model)
                if bias:
                    dst.bias.copy_(reduce[pool](src.bias))
        return gqa

    def forward(self, x: torch.Tensor, *, attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                need_weights: bool = False, cache: KVCache | StaticKVCache | RollingKVCache | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend ``x`` ``(B, L, d_model)`` to itself (and to the cached tokens, if ``cache`` is given).

        Args:
            attn_mask: bool (True = may attend) or float (added), broadcastable to ``(B, H, L, L_k)``,
                where ``L_k = len(cache) + L`` with a cache, else ``L``.
            is_causal: a query may attend keys at its own position or earlier. Without a cache this is
                SDPA's ``is_causal``. With a cache the new tokens sit at positions
                ``len(cache) … len(cache)+L-1``, so the mask is aligned bottom-right: new query i sees
                every cached key and new keys 0..i.
            need_weights: also return the per-head weights ``(B, H, L, L_k)`` (explicit path).
            cache: a :class:`KVCache` or :class:`StaticKVCache`; this call's K/V are appended to it
                before attending. A module with ``window`` takes a :class:`RollingKVCache` of the same
                window (the weights then cover the ``W`` buffer slots followed by the new tokens) or a
                :class:`KVCache`, cropped to the last ``W`` positions after the call (the weights cover the
                cached positions, oldest first, then the new tokens); both need ``is_causal=True``.

        Returns:
            ``(out (B, L, d_model), weights or None)``.
        """
        _validate.tensor("x", x, dim=3)
        _validate.last_dim("x", x, self.d_model, "d_model")
        if attn_mask is not None and is_causal:
            raise ValueError("pass either attn_mask or is_causal=True, not both (as in SDPA)")
        q = rearrange(self.q_proj(x), "b l (h d) -> b h l d", h=self.num_heads)       # (B, H, L, d_h)
        k = rearrange(self.k_proj(x), "b l (h d) -> b h l d", h=self.num_kv_heads)    # (B, H_kv, L, d_h)
        v = rearrange(self.v_proj(x), "b l (h d) -> b h l d", h=self.num_kv_heads)    # (B, H_kv, L, d_h)
        if self.window is not None or isinstance(cache, RollingKVCache):
            k, v, attn_mask, is_causal = self._windowed(k, v, attn_mask, is_causal, cache)
        elif cache is not None:
            past = len(cache)
            k, v = cache.update(k, v)                                 # (B, H_kv, past + L, d_h)
            if is_causal:   # bottom-right alignment: new query i is at absolute position past + i
                L = q.shape[-2]
                i = torch.arange(L, device=x.device)[:, None]
                j = torch.arange(past + L, device=x.device)[None, :]
                attn_mask, is_causal = j <= past + i, False           # (L, past + L)
        p = self.dropout if self.training else 0.0
        if need_weights:   # explicit path: Eq. (1) of Vaswani et al. per head, kv head i // G for query head i
            y, weights = attention(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=is_causal,
                                   enable_gqa=True)
        else:              # fused kernel; SDPA's enable_gqa groups K/V (whether it copies them depends on the backend: the CPU kernel takes the H_kv heads as they are; lesson 03 measures it)
            _check(q, k, v, attn_mask, is_causal, enable_gqa=True)    # ValueErrors that name the sizes
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p,
                                               is_causal=is_causal, enable_gqa=True)
            weights = None
        y = rearrange(y, "b h l d -> b l (h d)")                      # re-assemble the heads side by side
        return self.out_proj(y), weights

    def _windowed(self, k, v, attn_mask, is_causal, cache):
        """Sliding-window keys, values and mask (with the rolling-buffer cache when decoding)."""
        W = self.window
        if W is None:
            raise ValueError("a RollingKVCache needs a module built with window=W")
        if attn_mask is not None:
            raise ValueError(f"window={W} builds the mask itself; pass attn_mask=None")
        if cache is None:                                             # (L, L) band, SDPA bool polarity
            L = k.shape[-2]                                           # L = 0: an empty (0, 0) mask, as SDPA takes
            band = (sliding_window_mask(L, W, causal=is_causal, device=k.device) if L
                    else torch.ones(0, 0, dtype=torch.bool, device=k.device))
            return k, v, band, False
        if type(cache) is KVCache:                                    # the growing cache, kept to the last W positions
            if not is_causal:
                raise ValueError("decoding with a cache needs is_causal=True (each token sees the past only)")
            n, L = len(cache), k.shape[-2]                            # cached: the n positions just before the new ones
            k, v = cache.update(k, v)                                 # (B, H_kv, n + L, d_h)
            d_ij = (n + torch.arange(L, device=k.device))[:, None] - torch.arange(n + L, device=k.device)[None, :]
            cache.k, cache.v = cache.k[..., -W:, :], cache.v[..., -W:, :]   # len(cache) <= W from now on
            return k, v, (d_ij >= 0) & (d_ij < W), False              # (L, n + L) band, bottom-right aligned
        if not isinstance(cache, RollingKVCache) or cache.window != W:
            raise ValueError(f"a module with window={W} decodes with RollingKVCache({W}) (or a KVCache, which it keeps "
                             f"to the last {W} positions), got "
                             f"{type(cache).__name__}{'' if not isinstance(cache, RollingKVCache) else f'({cache.window})'}")
        if not is_causal:
            raise ValueError("decoding with a RollingKVCache needs is_causal=True (each token sees the past only)")
        k, v, mask = cache.update(k, v)                               # (B, H_kv, W + L, d_h), (L, W + L)
        return k, v, mask, False
