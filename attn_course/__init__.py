"""attn_course — an interactive course on attention mechanisms in PyTorch.

Top-level names are loaded lazily, so ``import attn_course`` stays cheap and each lesson's module is
imported only when used. See DESIGN.md §3 for the public API.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> submodule that defines it (one mechanism per file)
_LAZY = {
    "attention": "functional",
    "MultiHeadAttention": "mha",
    "GroupedQueryAttention": "gqa",
    "CrossAttention": "cross",
    "TemporalAttention": "temporal",
    "SqueezeExcitation": "vision",
    "ChannelAttention": "vision",
    "SpatialAttention": "vision",
    "CBAM": "vision",
    "TensorProductAttention": "tpa",
    "kv_cache_bytes": "memory",
    "flash_attention": "flash",
    "TransformerBlock": "block",
    "RMSNorm": "norm",
    "MultiHeadLatentAttention": "mla",
    "AdditiveAttention": "additive",
    "linear_attention": "linear",
    "SinkAttention": "sinks",
    "GatedAttention": "gated",
    "GatedDeltaNet": "deltanet",
    "SparseIndexer": "dsa",
    "DifferentialAttention": "diff",
}
_SUBMODULES = {"functional", "masks", "rope", "positions", "ring", "viz", "widgets", "grading", "demos", "memory",
               "bench", "sparse", "paged", "decoding", "pretrained"}

__all__ = sorted(_LAZY) + sorted(_SUBMODULES)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'attn_course' has no attribute {name!r}")
    globals()[name] = value          # cache: later look-ups are plain attribute reads
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
