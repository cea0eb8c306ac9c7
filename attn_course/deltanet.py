"""Gated DeltaNet (Qwen3-Next's linear-attention layer): a fixed-size state updated by the delta rule
with a decay, in its recurrent form and its chunked (UT-transform) form.

The state S (d_k × d_v per head) is a fast-weight memory read with a query: o_t = S_tᵀ q_t. Each step
first decays it (α_t = exp(g_t) ≤ 1), then corrects what it returns for k_t towards v_t:

    S_t = α_t S_{t−1} + k_t u_tᵀ,    u_t = β_t (v_t − α_t S_{t−1}ᵀ k_t)          (Yang et al. 2025, Eq. 5)

which is S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ: "erase what key k_t held, write v_t". Plain
linear attention (lesson 10) only adds k_t v_tᵀ, so keys that are not orthogonal blur into each other; the
delta rule overwrites. Keys and queries are L2-normalised, queries scaled by 1/√d_k; β_t = σ(b_t) ∈ (0, 1)
is a per-token write strength and g_t = −exp(A)·softplus(a_t + dt_bias) < 0 a per-token decay (Mamba-2's).

The chunked form (:func:`gated_delta_rule_chunked`) processes C tokens at once. Inside a chunk, with the
cumulative log-decay γ_i = g_1 + … + g_i and S_0 the state entering the chunk, the corrections u solve a
unit lower-triangular system (the UT transform of the WY representation):

    (I + A) U = β ⊙ V − (β e^γ ⊙ K) S_0,          A_ij = β_i e^{γ_i−γ_j} k_iᵀk_j   (j < i)
    O = (e^γ ⊙ Q) S_0 + (Q Kᵀ ⊙ e^{γ_i−γ_j} [j ≤ i]) U
    S_C = e^{γ_C} S_0 + (e^{γ_C−γ} ⊙ K)ᵀ U

so a chunk costs a few C×C and C×d matmuls instead of C sequential rank-one updates; both forms give the
same outputs and final state.

Around the rule, the layer (:class:`GatedDeltaNet`) has a depthwise causal convolution (kernel 4) with SiLU
over the concatenated q, k, v channels, grouped value heads (several value heads share a key head), and a
gated RMSNorm on the output: RMSNorm(o) ⊙ SiLU(z), z another projection of the input.

Parameter names follow ``transformers``' ``Qwen3NextGatedDeltaNet`` (``in_proj_qkvz``, ``in_proj_ba``,
``conv1d``, ``dt_bias``, ``A_log``, ``norm``, ``out_proj``); :meth:`GatedDeltaNet.from_config` reads a
``Qwen3NextConfig``.

References: Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks: Improving Mamba2 with Delta Rule"
(arXiv:2412.06464); Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence
Length" (arXiv:2406.06484); Schlag, Irie & Schmidhuber 2021, "Linear Transformers Are Secretly Fast Weight
Programmers" (arXiv:2102.11174).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from . import _validate
from ._hfconfig import attr

__all__ = ["gated_delta_rule_recurrent", "gated_delta_rule_chunked", "GatedRMSNorm", "GatedDeltaNet"]


def _check_rule(q, k, v, g, beta, initial_state):
    for name, t in (("q", q), ("k", k), ("v", v)):
        _validate.tensor(name, t, dim=4)
    B, H, L, dk = k.shape
    if q.shape != k.shape:
        raise ValueError(f"q has shape {tuple(q.shape)}, k has {tuple(k.shape)}: they must match (B, H, L, d_k)")
    if v.shape[:3] != (B, H, L):
        raise ValueError(f"v has shape {tuple(v.shape)}, expected (B, H, L, d_v) = ({B}, {H}, {L}, d_v)")
    for name, t in (("g", g), ("beta", beta)):
        if t.shape != (B, H, L):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected (B, H, L) = ({B}, {H}, {L})")
    if initial_state is not None and initial_state.shape != (B, H, dk, v.shape[-1]):
        raise ValueError(f"initial_state has shape {tuple(initial_state.shape)}, expected (B, H, d_k, d_v) = "
                         f"({B}, {H}, {dk}, {v.shape[-1]})")


def gated_delta_rule_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, initial_state: torch.Tensor | None = None
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule one token at a time (the decoding form).

    q, k ``(B, H, L, d_k)`` (used as given: normalise and scale them first), v ``(B, H, L, d_v)``, g (log
    decay, ≤ 0) and beta ``(B, H, L)``, initial_state ``(B, H, d_k, d_v)`` or None (zeros). Returns
    ``(o (B, H, L, d_v), S_L (B, H, d_k, d_v))``, computed in fp32 (fp64 for fp64 input).
    """
    _check_rule(q, k, v, g, beta, initial_state)
    acc = torch.promote_types(v.dtype, torch.float32)
    q, k, v, g, beta = (t.to(acc) for t in (q, k, v, g, beta))
    B, H, L, dk = k.shape
    S = v.new_zeros(B, H, dk, v.shape[-1]) if initial_state is None else initial_state.to(acc)
    out = []
    for t in range(L):
        S = S * g[:, :, t, None, None].exp()                                            # α_t S_{t−1}
        u = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, :, t]))   # u_t
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, :, t], u)                            # + k_t u_tᵀ
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, :, t]))                        # o_t = S_tᵀ q_t
    o = torch.stack(out, dim=2) if out else v.new_zeros(B, H, 0, v.shape[-1])
    return o, S


def gated_delta_rule_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                             beta: torch.Tensor, chunk_size: int = 64, initial_state: torch.Tensor | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rule, ``chunk_size`` tokens at a time (the training/prefill form); see the module docstring
    for the equations. Same arguments and results as :func:`gated_delta_rule_recurrent`."""
    _check_rule(q, k, v, g, beta, initial_state)
    C = _validate.positive_int("chunk_size", chunk_size)
    acc = torch.promote_types(v.dtype, torch.float32)
    q, k, v, g, beta = (t.to(acc) for t in (q, k, v, g, beta))
    B, H, L, dk = k.shape
    S = v.new_zeros(B, H, dk, v.shape[-1]) if initial_state is None else initial_state.to(acc)
    pad = (-L) % C                                        # pad with β = 0, g = 0 tokens: they change nothing
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    q, k, v = (rearrange(t, "b h (n c) d -> b h n c d", c=C) for t in (q, k, v))
    g, beta = (rearrange(t, "b h (n c) -> b h n c", c=C) for t in (g, beta))
    gamma = g.cumsum(-1)                                                                # γ_i within each chunk
    causal = torch.ones(C, C, dtype=torch.bool, device=v.device).tril()                 # j ≤ i
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~causal, float("-inf")).exp()   # e^{γ_i−γ_j}
    kb = k * beta[..., None]
    A = (kb @ k.transpose(-2, -1) * decay).tril(-1)                                     # A_ij, j < i
    I = torch.eye(C, dtype=acc, device=v.device)
    T_v = torch.linalg.solve_triangular(I + A, v * beta[..., None], upper=False, unitriangular=True)
    T_k = torch.linalg.solve_triangular(I + A, kb * gamma.exp()[..., None], upper=False, unitriangular=True)
    QK = q @ k.transpose(-2, -1) * decay                                                # (…, C, C), j ≤ i
    out = []
    for n in range(q.shape[2]):
        U = T_v[:, :, n] - T_k[:, :, n] @ S                                             # corrections u
        out.append((q[:, :, n] * gamma[:, :, n, :, None].exp()) @ S + QK[:, :, n] @ U)
        last = gamma[:, :, n, -1:]                                                      # γ_C
        S = S * last[..., None].exp() + (k[:, :, n] * (last - gamma[:, :, n]).exp()[..., None]).transpose(-2, -1) @ U
    o = torch.cat(out, dim=2)[:, :, :L] if out else v.new_zeros(B, H, 0, v.shape[-1])
    return o, S


_ACTIVATIONS = {"silu": F.silu, "swish": F.silu, "gelu": F.gelu, "relu": F.relu,
                "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
                "gelu_new": lambda x: F.gelu(x, approximate="tanh")}


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


class GatedRMSNorm(nn.Module):
    """``RMSNorm(o) ⊙ SiLU(z)`` over the last axis (gain ``weight``, init 1): the output norm of Gated DeltaNet."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(_validate.positive_int("dim", dim)))

    def forward(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        acc = torch.promote_types(o.dtype, torch.float32)
        of = o.to(acc)
        y = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.to(acc)
        return (y * F.silu(z.to(acc))).to(o.dtype)


class GatedDeltaNet(nn.Module):
    """Qwen3-Next's linear-attention layer; ``forward(x (B, L, d), mode="chunked"|"recurrent") -> (B, L, d)``.

    Args:
        hidden_size: model width ``d``.
        num_k_heads, num_v_heads: key/query heads and value heads (``num_v_heads % num_k_heads == 0``; each key
            head serves ``num_v_heads / num_k_heads`` consecutive value heads).
        head_k_dim, head_v_dim: per-head widths (the state is ``head_k_dim × head_v_dim`` per value head).
        conv_kernel: width of the depthwise causal convolution (4).
        activation: the non-linearity after the convolution, ``config.hidden_act`` in the peer ("silu" in
            Qwen3-Next; also "gelu", "gelu_pytorch_tanh", "relu"); the output gate's SiLU is fixed, as in the peer.
    """

    def __init__(self, hidden_size: int, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
                 *, conv_kernel: int = 4, eps: float = 1e-6, chunk_size: int = 64, activation: str = "silu"):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        self.activation = activation
        for name, val in (("hidden_size", hidden_size), ("num_k_heads", num_k_heads), ("num_v_heads", num_v_heads),
                          ("head_k_dim", head_k_dim), ("head_v_dim", head_v_dim), ("conv_kernel", conv_kernel)):
            _validate.positive_int(name, val)
        if num_v_heads % num_k_heads:
            raise ValueError(f"num_v_heads={num_v_heads} must be a multiple of num_k_heads={num_k_heads}")
        self.num_k_heads, self.num_v_heads = num_k_heads, num_v_heads
        self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
        self.chunk_size = chunk_size
        key_dim, value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
        self.conv_dim = 2 * key_dim + value_dim
        self.in_proj_qkvz = nn.Linear(hidden_size, 2 * key_dim + 2 * value_dim, bias=False)
        self.in_proj_ba = nn.Linear(hidden_size, 2 * num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, conv_kernel, groups=self.conv_dim,
                                padding=conv_kernel - 1, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads))
        self.A_log = nn.Parameter(torch.log(torch.empty(num_v_heads).uniform_(1, 16)))
        self.norm = GatedRMSNorm(head_v_dim, eps)
        self.out_proj = nn.Linear(value_dim, hidden_size, bias=False)

    @classmethod
    def from_config(cls, config) -> "GatedDeltaNet":
        """Build from a ``Qwen3NextConfig`` (its ``linear_*`` attributes, read by name)."""
        return cls(config.hidden_size, config.linear_num_key_heads, config.linear_num_value_heads,
                   config.linear_key_head_dim, config.linear_value_head_dim,
                   conv_kernel=attr(config, "linear_conv_kernel_dim", 4), eps=attr(config, "rms_norm_eps", 1e-6),
                   activation=attr(config, "hidden_act", "silu"))

    def state_bytes(self, batch_size: int = 1, dtype=torch.float32, conv_dtype=None) -> int:
        """Bytes of the decoding state per layer: the delta-rule state (in ``dtype``, fp32 as served) and the
        convolution's last K−1 inputs (in ``conv_dtype``, default the module's weights' dtype — as transformers
        keeps Qwen3-Next's ``conv_state``; a bf16 model: 2 bytes) — constant in the sequence length."""
        size = lambda dt: torch.empty(0, dtype=dt).element_size()
        state = self.num_v_heads * self.head_k_dim * self.head_v_dim
        conv = self.conv_dim * (self.conv1d.kernel_size[0] - 1)
        return batch_size * (state * size(dtype) + conv * size(conv_dtype or self.conv1d.weight.dtype))

    def project(self, x: torch.Tensor):
        """q, k ``(B, Hv, L, d_k)`` (L2-normalised, q scaled by 1/√d_k, key heads repeated per value head),
        v ``(B, Hv, L, d_v)``, z ``(B, L, Hv, d_v)``, g and β ``(B, Hv, L)``."""
        B, L, _ = x.shape
        r = self.num_v_heads // self.num_k_heads
        dk, dv = self.head_k_dim, self.head_v_dim
        qkvz = self.in_proj_qkvz(x).view(B, L, self.num_k_heads, 2 * dk + 2 * r * dv)   # grouped per key head
        q, k, v, z = qkvz.split([dk, dk, r * dv, r * dv], dim=-1)
        b, a = self.in_proj_ba(x).view(B, L, self.num_k_heads, 2 * r).split([r, r], dim=-1)
        mixed = torch.cat([t.reshape(B, L, -1) for t in (q, k, v)], dim=-1).transpose(1, 2)   # (B, conv_dim, L)
        mixed = _ACTIVATIONS[self.activation](self.conv1d(mixed)[..., :L]).transpose(1, 2)   # causal: drop the tail
        q, k, v = mixed.split([self.num_k_heads * dk, self.num_k_heads * dk, self.num_v_heads * dv], dim=-1)
        q = rearrange(q, "b l (h d) -> b h l d", d=dk).repeat_interleave(r, dim=1)
        k = rearrange(k, "b l (h d) -> b h l d", d=dk).repeat_interleave(r, dim=1)
        v = rearrange(v, "b l (h d) -> b h l d", d=dv)
        acc = torch.promote_types(x.dtype, torch.float32)
        q, k = _l2norm(q.to(acc)) * dk ** -0.5, _l2norm(k.to(acc))
        beta = rearrange(b.reshape(B, L, -1), "b l h -> b h l").to(acc).sigmoid()
        g = -self.A_log.to(acc).exp()[:, None] * F.softplus(
            rearrange(a.reshape(B, L, -1), "b l h -> b h l").to(acc) + self.dt_bias.to(acc)[:, None])
        return q, k, v, z.reshape(B, L, self.num_v_heads, dv), g, beta

    def forward(self, x: torch.Tensor, *, mode: str = "chunked") -> torch.Tensor:
        _validate.tensor("x", x, dim=3)
        _validate.last_dim("x", x, self.in_proj_qkvz.in_features, "hidden_size")
        if mode not in ("chunked", "recurrent"):
            raise ValueError(f"mode must be 'chunked' or 'recurrent', got {mode!r}")
        q, k, v, z, g, beta = self.project(x)
        if mode == "chunked":
            o, _ = gated_delta_rule_chunked(q, k, v, g, beta, self.chunk_size)
        else:
            o, _ = gated_delta_rule_recurrent(q, k, v, g, beta)
        o = self.norm(rearrange(o, "b h l d -> b l h d").to(x.dtype), z)                  # RMSNorm(o) ⊙ SiLU(z)
        return self.out_proj(rearrange(o, "b l h d -> b l (h d)"))
