"""How many bytes the key/value cache of a decoder holds: the quantity GQA, MQA and TPA shrink.

While decoding, every layer keeps, for every past token, what later queries need:

    mha  K and V for every head            2 · H · d_h      elements per token per layer
    gqa  K and V for every kv head         2 · H_kv · d_h
    mqa  one shared K and V head           2 · d_h
    tpa  the factors A_k, B_k, A_v, B_v    (R_k + R_v) · (H + d_h)
    mla  the latent c_KV and shared k_rope d_c + d_R
    dsa  MLA plus DeepSeek-V3.2's indexer key  d_c + d_R + d_I
    delta  no per-token cache: a fixed state of H · d_k · d_v (+ the convolution's last K−1 inputs)

(``delta``: a linear-attention layer — Gated DeltaNet, Kimi's KDA — whose state does not grow with the length.)

``window=W`` (sliding-window layers) caches only the last ``min(seq_len, W)`` tokens.

(TPA: Zhang et al. 2025, "Tensor Product Attention Is All You Need", §3.3: A_k is (H, R_k) and B_k is
(R_k, d_h) per token, likewise for V. MLA: DeepSeek-AI 2024, "DeepSeek-V2", §2.1 and Table 1: the
d_c-wide latent and the d^R_h-wide rotated key shared by all heads, independent of H and d_h.) Total bytes = elements · seq_len · batch_size · num_layers ·
bytes per element of ``dtype``.
"""
from __future__ import annotations

import torch

from . import _validate

__all__ = ["kv_cache_bytes", "MECHANISMS", "open_models", "model_cache_bytes"]

MECHANISMS = ("mha", "mqa", "gqa", "tpa", "mla", "dsa", "delta")


def kv_cache_bytes(mechanism: str, *, seq_len: int, num_heads: int, head_dim: int, batch_size: int = 1,
                   num_layers: int = 1, num_kv_heads: int | None = None, k_rank: int | None = None,
                   v_rank: int | None = None, kv_lora_rank: int | None = None,
                   qk_rope_head_dim: int | None = None, dtype: torch.dtype = torch.float16,
                   window: int | None = None, index_head_dim: int | None = None, k_head_dim: int | None = None,
                   conv_channels: int = 0, conv_kernel: int = 1, state_dtype: torch.dtype | None = None) -> int:
    """Bytes of the KV cache for ``seq_len`` tokens.

    Args:
        mechanism: ``"mha"``, ``"mqa"``, ``"gqa"``, ``"tpa"``, ``"mla"``, ``"dsa"`` or ``"delta"``.
        seq_len, batch_size, num_layers: cached tokens per sequence, sequences, decoder layers.
        num_heads: H, query heads. head_dim: d_h.
        num_kv_heads: H_kv; required for ``"gqa"`` (must divide ``num_heads``); for ``"mha"`` it may be
            omitted or equal ``num_heads``, for ``"mqa"`` omitted or 1; ignored by ``"tpa"``.
        k_rank, v_rank: R_k, R_v; required for ``"tpa"``, ignored otherwise.
        kv_lora_rank, qk_rope_head_dim: d_c and d_R; required for ``"mla"`` (whose cache does not depend
            on num_heads or head_dim), ignored otherwise.
        dtype: element type of the cached tensors (fp16 by default, as served).
        window: a sliding window W: only the last ``min(seq_len, W)`` tokens are cached (any per-token kind).
        index_head_dim: d_I, the indexer key's width; required for ``"dsa"`` (with the MLA sizes).
        k_head_dim, conv_channels, conv_kernel: for ``"delta"``: the state is ``num_heads`` value heads of
            ``k_head_dim × head_dim`` plus ``conv_channels × (conv_kernel − 1)`` convolution inputs per
            sequence and layer; ``seq_len`` does not change it.
        state_dtype: for ``"delta"``: the element type of the recurrent state (default ``dtype``); served models
            keep it in fp32 — a sum over every token needs the precision — while the convolution inputs are in
            ``dtype`` (transformers' Qwen3-Next caches ``last_recurrent_state`` in fp32).

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
    if window is not None:
        _validate.positive_int("window", window)
        seq_len = min(seq_len, window)
    if mechanism == "delta":
        if k_head_dim is None:
            raise ValueError("mechanism 'delta' needs k_head_dim (the state is num_heads × k_head_dim × head_dim)")
        _validate.positive_int("k_head_dim", k_head_dim)
        if conv_channels < 0 or conv_kernel < 1:
            raise ValueError(f"conv_channels={conv_channels} must be >= 0 and conv_kernel={conv_kernel} >= 1")
        size = lambda t: torch.empty((), dtype=t).element_size()
        per_layer = H * k_head_dim * d * size(state_dtype or dtype) + conv_channels * (conv_kernel - 1) * size(dtype)
        return per_layer * batch_size * num_layers
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
    elif mechanism in ("mla", "dsa"):
        if kv_lora_rank is None or qk_rope_head_dim is None:
            raise ValueError(f"mechanism {mechanism!r} needs kv_lora_rank and qk_rope_head_dim, got "
                             f"kv_lora_rank={kv_lora_rank}, qk_rope_head_dim={qk_rope_head_dim}")
        _validate.positive_int("kv_lora_rank", kv_lora_rank)
        _validate.positive_int("qk_rope_head_dim", qk_rope_head_dim)
        per_token = kv_lora_rank + qk_rope_head_dim
        if mechanism == "dsa":
            if index_head_dim is None:
                raise ValueError("mechanism 'dsa' needs index_head_dim (the indexer's cached key width)")
            per_token += _validate.positive_int("index_head_dim", index_head_dim)
    else:
        if k_rank is None or v_rank is None:
            raise ValueError(f"mechanism 'tpa' needs k_rank and v_rank, got k_rank={k_rank}, v_rank={v_rank}")
        _validate.positive_int("k_rank", k_rank)
        _validate.positive_int("v_rank", v_rank)
        per_token = (k_rank + v_rank) * (H + d)
    bytes_per_element = torch.empty((), dtype=dtype).element_size()
    return per_token * seq_len * batch_size * num_layers * bytes_per_element


def open_models() -> dict[str, dict]:
    """The attention layers of today's open models, from their published configs (``data/open_models.json``):
    ``{name: {"source": ..., "layers": [{"kind": ..., "count": ..., sizes...}, ...]}}``."""
    import json
    from importlib import resources
    text = resources.files("attn_course").joinpath("data/open_models.json").read_text(encoding="utf-8")
    return json.loads(text)["models"]


def model_cache_bytes(layers: list[dict], seq_len: int, *, batch_size: int = 1,
                      dtype: torch.dtype = torch.bfloat16, state_dtype: torch.dtype | None = None) -> int:
    """Bytes a whole model keeps to decode after ``seq_len`` tokens: :func:`kv_cache_bytes` summed over its
    layer groups (``open_models()[name]["layers"]``; per-token caches grow with ``seq_len``, windowed ones stop
    at the window, linear-attention states do not grow). Caches and convolution inputs are in ``dtype`` (bf16, as
    served); a linear-attention state in its group's ``"state_dtype"`` (the table says ``"float32"``, as served),
    unless ``state_dtype`` overrides it."""
    total = 0
    for group in layers:
        g = dict(group)
        kind, count = g.pop("kind"), g.pop("count")
        if kind in ("mla", "dsa"):
            g.setdefault("num_heads", 1)
            g.setdefault("head_dim", 1)
        if kind == "delta" and (state_dtype is not None or "state_dtype" in g):
            g["state_dtype"] = state_dtype or getattr(torch, g["state_dtype"])
        total += kv_cache_bytes(kind, seq_len=seq_len, batch_size=batch_size, num_layers=count, dtype=dtype, **g)
    return total
