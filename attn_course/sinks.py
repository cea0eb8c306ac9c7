"""Attention with a learned sink per head (gpt-oss): each row's softmax gets one extra logit that no value
stands behind, so a head can put weight "nowhere" instead of on some token.

    p_ij = exp(s_ij) / (exp(b_h) + Σ_j' exp(s_ij')),    out_i = Σ_j p_ij v_j,    s_ij = q_i·k_j / √d

``b_h`` is the head's sink logit (``sinks``, one per head). The rows of ``p`` sum to ``1 − exp(b_h)/Z_i < 1``:
the missing mass is what the sink absorbs. Equivalently, the sink is one extra key whose score is ``b_h``
for every query and whose value is zero — which is how the fused path computes it with SDPA. gpt-oss
alternates layers with a sliding window of 128 tokens and full-attention layers, with grouped KV heads,
RoPE (YaRN-scaled) and biases on every projection.

Parameter names follow ``transformers``' ``GptOssAttention`` (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``,
``sinks``), so ``load_state_dict(peer.state_dict(), strict=True)`` works; :meth:`SinkAttention.from_config`
reads a ``GptOssConfig``'s attributes.

References: OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card"; Xiao et al. 2023, "Efficient Streaming
Language Models with Attention Sinks" (arXiv:2309.17453), whose sink is a token rather than a logit.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from . import _validate
from ._hfconfig import RopeSpec, attr, rope_params
from .functional import repeat_kv
from .masks import causal_mask, sliding_window_mask

__all__ = ["SinkAttention", "sink_attention"]


def sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor,
                   attn_mask: torch.Tensor | None = None, scale: float | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention whose every row also normalises over a per-head sink logit, explicitly.

    q ``(B, H, Lq, E)``, k ``(B, H, Lk, E)``, v ``(B, H, Lk, Ev)``, sinks ``(H,)``, attn_mask bool (True = may
    attend) broadcastable to ``(B, H, Lq, Lk)``. Returns ``(out, weights)`` with weights ``(B, H, Lq, Lk)``
    whose rows sum to less than one. A row with every key masked puts all its mass on the sink: zero output.
    """
    if sinks.shape != (q.shape[-3],):
        raise ValueError(f"sinks has shape {tuple(sinks.shape)}, expected (num_heads,) = ({q.shape[-3]},)")
    acc = torch.promote_types(q.dtype, torch.float32)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q.to(acc) @ k.to(acc).transpose(-2, -1)) * scale                                  # (B, H, Lq, Lk)
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf"))
    b = sinks.to(acc)[:, None, None].expand(*s.shape[:-1], 1)                             # (B, H, Lq, 1)
    p = torch.softmax(torch.cat((s, b), dim=-1), dim=-1)[..., :-1]                         # drop the sink column
    return (p @ v.to(acc)).to(q.dtype), p.to(q.dtype)


class SinkAttention(nn.Module):
    """gpt-oss attention: GQA with RoPE, an optional causal sliding window, and one sink logit per head.

    Args:
        hidden_size: model width ``d``.
        num_heads, num_kv_heads: query heads and shared key/value heads (``num_heads % num_kv_heads == 0``).
        head_dim: per-head width (gpt-oss: 64, independent of ``hidden_size / num_heads``).
        sliding_window: ``None`` (full causal attention) or W: query i sees keys ``i−W < j ≤ i``.
        bias: biases on the four projections (gpt-oss: True).
        rope: the :class:`~attn_course._hfconfig.RopeSpec` to apply (default: plain RoPE, base 10000).

    ``forward(x (B, L, d), positions=None, need_weights=False) -> (out (B, L, d), weights (B, H, L, L) | None)``.
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, *,
                 sliding_window: int | None = None, bias: bool = True, rope: RopeSpec | None = None):
        super().__init__()
        _validate.positive_int("hidden_size", hidden_size)
        _validate.positive_int("head_dim", head_dim)
        if num_heads <= 0 or num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be a positive multiple of num_kv_heads={num_kv_heads}")
        if sliding_window is not None and sliding_window <= 0:
            raise ValueError(f"sliding_window must be positive or None, got {sliding_window}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.sliding_window = sliding_window
        self.rope = rope if rope is not None else RopeSpec(head_dim)
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias)
        self.sinks = nn.Parameter(torch.zeros(num_heads))                                  # b_h, one per head

    @classmethod
    def from_config(cls, config, layer_idx: int = 0) -> "SinkAttention":
        """Build from a ``GptOssConfig`` (read by attributes): layer ``layer_idx``'s window from
        ``layer_types`` ("sliding_attention" → ``sliding_window``, else full attention)."""
        head_dim = attr(config, "head_dim", config.hidden_size // config.num_attention_heads)
        types = attr(config, "layer_types", None)
        window = config.sliding_window if types is not None and types[layer_idx] == "sliding_attention" else None
        return cls(config.hidden_size, config.num_attention_heads, config.num_key_value_heads, head_dim,
                   sliding_window=window, bias=bool(attr(config, "attention_bias", True)),
                   rope=rope_params(config, head_dim))

    def mask(self, L: int, device=None) -> torch.Tensor:
        """``(L, L)`` bool: causal, and within the window when there is one."""
        if self.sliding_window is None:
            return causal_mask(L, device=device)
        return sliding_window_mask(L, self.sliding_window, device=device)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, *, need_weights: bool = False):
        _validate.tensor("x", x, dim=3)
        _validate.last_dim("x", x, self.q_proj.in_features, "hidden_size")
        B, L, _ = x.shape
        q = rearrange(self.q_proj(x), "b l (h e) -> b h l e", h=self.num_heads)
        k = rearrange(self.k_proj(x), "b l (h e) -> b h l e", h=self.num_kv_heads)
        v = rearrange(self.v_proj(x), "b l (h e) -> b h l e", h=self.num_kv_heads)
        q, k = self.rope(q, positions), self.rope(k, positions)
        n_rep = self.num_heads // self.num_kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        allowed = self.mask(L, device=x.device)
        if need_weights:
            out, w = sink_attention(q, k, v, self.sinks, allowed)
        else:   # the sink as one more key: score b_h for every query, value zero — SDPA does the rest
            zero = q.new_zeros(B, self.num_heads, 1, self.head_dim)
            bias = torch.zeros(L, L, dtype=q.dtype, device=x.device).masked_fill(~allowed, float("-inf"))
            bias = torch.cat((bias.expand(self.num_heads, L, L),
                              self.sinks.to(q.dtype)[:, None, None].expand(-1, L, 1)), dim=-1)   # (H, L, L+1)
            out = F.scaled_dot_product_attention(q, torch.cat((k, zero), 2), torch.cat((v, zero), 2),
                                                 attn_mask=bias)
            w = None
        return self.o_proj(rearrange(out, "b h l e -> b l (h e)")), w
