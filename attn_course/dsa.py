"""DeepSeek Sparse Attention (DeepSeek-V3.2): a small "lightning indexer" scores every earlier token for
each query, and attention then runs over the top-k tokens only.

    I_ts = Σ_h w_{t,h} · ReLU(q^I_{t,h} · k^I_s / √d_I)        (DeepSeek-AI 2025, Eq. 1; w scaled by 1/√H_I)
    S_t  = top-k_s I_ts   (s ≤ t),     out_t = Attn(q_t, {k_s, v_s : s ∈ S_t})

The indexer has H_I heads that share ONE key per token (MQA-like, width d_I) and a per-query weight per
head; in the released model it runs in FP8 with a Hadamard rotation (which leaves dot products unchanged).
Its cost is still O(L²), but in a few cheap heads, while the main attention (MLA, lesson 12) becomes
O(L·k): with k = 2048 keys per query at 128k context, the expensive part touches 1/64 of the pairs.

:class:`SparseIndexer` follows ``transformers``' ``DeepseekV32Indexer`` (``wq_b`` on the query's low-rank
latent, ``wk``, ``k_norm`` (LayerNorm), ``weights_proj``; half-split RoPE on the first ``qk_rope_head_dim``
channels), so ``load_state_dict(peer.state_dict(), strict=True)`` works. :func:`topk_attention` is attention
restricted to the selected keys, gathered (what a sparse kernel computes) — equal to dense attention with
every other key masked.

Reference: DeepSeek-AI 2025, "DeepSeek-V3.2: Pushing the Frontier of Open Large Language Models"
(DeepSeek Sparse Attention).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from . import _validate
from ._hfconfig import RopeSpec, rope_params

__all__ = ["SparseIndexer", "topk_attention", "topk_mask"]


class SparseIndexer(nn.Module):
    """The lightning indexer: ``index_scores(x, q_latent)`` → ``(B, L, L)`` (−inf above the diagonal) and
    ``forward(x, q_latent)`` → the top-k key indices ``(B, L, min(k, L))`` (int64) of each query.

    Args:
        hidden_size: model width ``d``.
        q_lora_rank: width of the query latent ``c_q`` it reads (MLA's ``q_a_layernorm(q_a_proj(x))``).
        n_heads, head_dim: indexer heads H_I and their width d_I.
        qk_rope_head_dim: channels of each indexer query/key that RoPE rotates (the first ones).
        topk: keys kept per query.
    """

    def __init__(self, hidden_size: int, q_lora_rank: int, n_heads: int, head_dim: int, qk_rope_head_dim: int,
                 topk: int, *, rope: RopeSpec | None = None):
        super().__init__()
        for name, val in (("hidden_size", hidden_size), ("q_lora_rank", q_lora_rank), ("n_heads", n_heads),
                          ("head_dim", head_dim), ("topk", topk)):
            _validate.positive_int(name, val)
        if not 0 < qk_rope_head_dim <= head_dim or qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim={qk_rope_head_dim} must be even and in (0, head_dim={head_dim}]")
        self.n_heads, self.head_dim, self.topk = n_heads, head_dim, topk
        self.rope = rope if rope is not None else RopeSpec(qk_rope_head_dim)
        if self.rope.rotary_dim != qk_rope_head_dim:
            raise ValueError(f"the RoPE rotates {self.rope.rotary_dim} channels, expected qk_rope_head_dim="
                             f"{qk_rope_head_dim}")
        self.wq_b = nn.Linear(q_lora_rank, n_heads * head_dim, bias=False)
        self.wk = nn.Linear(hidden_size, head_dim, bias=False)                  # one key per token, shared by heads
        self.k_norm = nn.LayerNorm(head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(hidden_size, n_heads, bias=False)         # w_{t,h}

    @classmethod
    def from_config(cls, config) -> "SparseIndexer":
        """Build from a ``DeepseekV32Config`` (``index_n_heads``, ``index_head_dim``, ``index_topk``,
        ``q_lora_rank``, ``qk_rope_head_dim``, read by name)."""
        rope_dim = config.qk_rope_head_dim
        return cls(config.hidden_size, config.q_lora_rank, config.index_n_heads, config.index_head_dim,
                   rope_dim, config.index_topk, rope=rope_params(config, rope_dim))

    def index_scores(self, x: torch.Tensor, q_latent: torch.Tensor, positions: torch.Tensor | None = None
                     ) -> torch.Tensor:
        """I_ts for every query t and key s of one sequence, ``(B, L, L)`` in fp32 (fp64 for fp64 input);
        −inf where s > t. ``positions``: ``(L,)`` for the whole batch or ``(B, L)`` per sequence; default 0..L-1."""
        _validate.tensor("x", x, dim=3)
        _validate.tensor("q_latent", q_latent, dim=3)
        if q_latent.shape[:2] != x.shape[:2]:
            raise ValueError(f"q_latent has shape {tuple(q_latent.shape)}, x has {tuple(x.shape)}: "
                             f"their (B, L) must match")
        acc = torch.promote_types(x.dtype, torch.float32)
        r = self.rope.rotary_dim
        q = rearrange(self.wq_b(q_latent), "b l (h d) -> b h l d", h=self.n_heads)      # (B, H_I, L, d_I)
        k = self.k_norm(self.wk(x))                                                     # (B, L, d_I)
        B, L = x.shape[:2]
        if positions is not None:      # (L,) shared by the batch, or (B, L) per sequence (transformers' position_ids)
            if not isinstance(positions, torch.Tensor) or positions.shape not in ((L,), (B, L)):
                raise ValueError(f"positions must have shape (L,) = ({L},) or (B, L) = ({B}, {L}), got "
                                 f"{tuple(getattr(positions, 'shape', ())) or type(positions).__name__}")
        q_pos = positions[:, None, :] if positions is not None and positions.dim() == 2 else positions   # (B, 1, L)
        q = torch.cat((self.rope(q[..., :r], q_pos), q[..., r:]), dim=-1)
        k = torch.cat((self.rope(k[..., :r], positions), k[..., r:]), dim=-1)
        s = F.relu(q.to(acc) @ k.to(acc).transpose(-2, -1)[:, None] * self.head_dim ** -0.5)   # (B, H_I, L, L)
        w = self.weights_proj(x).to(acc) * self.n_heads ** -0.5                          # (B, L, H_I)
        scores = torch.einsum("blh,bhls->bls", w, s)
        L = x.shape[1]
        future = torch.ones(L, L, dtype=torch.bool, device=x.device).triu(1)
        return scores.masked_fill(future, float("-inf"))

    def forward(self, x: torch.Tensor, q_latent: torch.Tensor, positions: torch.Tensor | None = None
                ) -> torch.Tensor:
        scores = self.index_scores(x, q_latent, positions)
        return scores.topk(min(self.topk, scores.shape[-1]), dim=-1).indices


def topk_mask(indices: torch.Tensor, num_keys: int) -> torch.Tensor:
    """``(..., Lq, num_keys)`` bool, True at the selected keys of each query (``indices (..., Lq, k)``)."""
    mask = torch.zeros(*indices.shape[:-1], num_keys, dtype=torch.bool, device=indices.device)
    return mask.scatter(-1, indices.long(), True)


def topk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, *,
                   allowed: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """Attention of each query over its own ``k`` selected keys, gathered: O(L·k) work and memory.

    q ``(B, H, Lq, E)``, k ``(B, H, Lk, E)``, v ``(B, H, Lk, Ev)``, indices ``(B, Lq, k)`` (shared by the heads,
    as DSA's indexer picks tokens, not per-head keys), optional ``allowed (B, Lq, k)`` bool to drop entries
    (e.g. indices that point at future keys when a query has fewer than k earlier ones). Returns
    ``(B, H, Lq, Ev)``; equals ``attention(q, k, v, attn_mask=topk_mask(indices, Lk)[:, None])``.
    """
    B, H, Lq, E = q.shape
    if indices.shape[:2] != (B, Lq):
        raise ValueError(f"indices has shape {tuple(indices.shape)}, expected (B, Lq, k) = ({B}, {Lq}, k)")
    idx = indices.long()
    kg = k[:, :, None].expand(B, H, Lq, *k.shape[2:]).gather(
        3, idx[:, None, :, :, None].expand(B, H, Lq, idx.shape[-1], E))                  # (B, H, Lq, k, E)
    vg = v[:, :, None].expand(B, H, Lq, *v.shape[2:]).gather(
        3, idx[:, None, :, :, None].expand(B, H, Lq, idx.shape[-1], v.shape[-1]))       # (B, H, Lq, k, Ev)
    scale = E ** -0.5 if scale is None else scale
    s = torch.einsum("bhqe,bhqke->bhqk", q, kg) * scale
    if allowed is not None:
        s = s.masked_fill(~allowed[:, None], float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bhqke->bhqe", p, vg)
