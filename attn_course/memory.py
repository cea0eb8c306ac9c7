"""How many bytes the key/value cache of a decoder holds: the quantity GQA, MQA and TPA shrink.

While decoding, every layer keeps, for every past token, what later queries need:

    mha  K and V for every head            2 · H · d_h      elements per token per layer
    gqa  K and V for every kv head         2 · H_kv · d_h
    mqa  one shared K and V head           2 · d_h
    tpa  the factors A_k, B_k, A_v, B_v    (R_k + R_v) · (H + d_h)
    mla  the latent c_KV and shared k_rope d_c + d_R

(TPA: Zhang et al. 2025, "Tensor Product Attention Is All You Need", §3.3: A_k is (H, R_k) and B_k is
(R_k, d_h) per token, likewise for V. MLA: DeepSeek-AI 2024, "DeepSeek-V2", §2.1 and Table 1: the
d_c-wide latent and the d^R_h-wide rotated key shared by all heads, independent of H and d_h.) Total bytes = elements · seq_len · batch_size · num_layers ·
bytes per element of ``dtype``.
"""
from __future__ import annotations

import torch

from . import _validate

__all__ = ["kv_cache_bytes", "MECHANISMS"]

MECHANISMS = ("mha", "mqa", "gqa", "tpa", "mla")


def kv_cache_bytes(mechanism: str, *, seq_len: int, num_heads: int, head_dim: int, batch_size: int = 1,
                   num_layers: int = 1, num_kv_heads: int | None = None, k_rank: int | None = None,
                   v_rank: int | None = None, kv_lora_rank: int | None = None,
                   qk_rope_head_dim: int | None = None, dtype: torch.dtype = torch.float16) -> int:
    """Bytes of the KV cache for ``seq_len`` tokens.

    Args:
        mechanism: ``"mha"``, ``"mqa"``, ``"gqa"``, ``"tpa"`` or ``"mla"``.
        seq_len, batch_size, num_layers: cached tokens per sequence, sequences, decoder layers.
        num_heads: H, query heads. head_dim: d_h.
        num_kv_heads: H_kv; required for ``"gqa"`` (must divide ``num_heads``); for ``"mha"`` it may be
            omitted or equal ``num_heads``, for ``"mqa"`` omitted or 1; ignored by ``"tpa"``.
        k_rank, v_rank: R_k, R_v; required for ``"tpa"``, ignored otherwise.
        kv_lora_rank, qk_rope_head_dim: d_c and d_R; required for ``"mla"`` (whose cache does not depend
            on num_heads or head_dim), ignored otherwise.
        dtype: element type of the cached tensors (fp16 by default, as served).

    Returns:
        the size in bytes (an ``int``).

    Raises:
        ValueError: unknown mechanism, a missing or inconsistent head count or rank, or H not
        divisible by H_kv.
    """
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown mechanism {mechanism!r}; expected one of {', '.join(MECHANISMS)}")
    for name, value in (("seq_len", seq_len), ("num_heads", num_heads), ("head_dim", head_dim),
                        ("batch_size", batch_size), ("num_layers", num_layers)):
        _validate.positive_int(name, value)
    H, d = num_heads, head_dim
    if mechanism == "mha":
        if num_kv_heads is not None and num_kv_heads != H:
            raise ValueError(f"mha has num_kv_heads == num_heads={H}, got num_kv_heads={num_kv_heads}; "
                             f"use mechanism='gqa'")
        per_token = 2 * H * d
    elif mechanism == "mqa":
        if num_kv_heads is not None and num_kv_heads != 1:
            raise ValueError(f"mqa has a single kv head, got num_kv_heads={num_kv_heads}; use mechanism='gqa'")
        per_token = 2 * d
    elif mechanism == "gqa":
        if num_kv_heads is None:
            raise ValueError("mechanism 'gqa' needs num_kv_heads")
        _validate.positive_int("num_kv_heads", num_kv_heads)
        _validate.divisible("num_heads", H, "num_kv_heads", num_kv_heads)
        per_token = 2 * num_kv_heads * d
    elif mechanism == "mla":
        if kv_lora_rank is None or qk_rope_head_dim is None:
            raise ValueError(f"mechanism 'mla' needs kv_lora_rank and qk_rope_head_dim, got "
                             f"kv_lora_rank={kv_lora_rank}, qk_rope_head_dim={qk_rope_head_dim}")
        _validate.positive_int("kv_lora_rank", kv_lora_rank)
        _validate.positive_int("qk_rope_head_dim", qk_rope_head_dim)
        per_token = kv_lora_rank + qk_rope_head_dim
    else:
        if k_rank is None or v_rank is None:
            raise ValueError(f"mechanism 'tpa' needs k_rank and v_rank, got k_rank={k_rank}, v_rank={v_rank}")
        _validate.positive_int("k_rank", k_rank)
        _validate.positive_int("v_rank", v_rank)
        per_token = (k_rank + v_rank) * (H + d)
    bytes_per_element = torch.empty((), dtype=dtype).element_size()
    return per_token * seq_len * batch_size * num_layers * bytes_per_element
