"""Linear attention (Katharopoulos et al. 2020): replace exp(qᵀk) by a kernel φ(q)ᵀφ(k), then reorder.

    out_i = Σ_j φ(q_i)ᵀφ(k_j) v_j / Σ_j φ(q_i)ᵀφ(k_j)                          Eq. (4)
          = φ(q_i)ᵀ S / (φ(q_i)ᵀ z),   S = Σ_j φ(k_j) v_jᵀ  (E × E_v),  z = Σ_j φ(k_j)  (E)    Eq. (5)

(φ(Q)φ(K)ᵀ)V = φ(Q)(φ(K)ᵀV): the right-hand order never forms the L × L matrix and costs O(L·E·E_v)
instead of O(L²·E) — linear in L, *quadratic* in the head size (a Chinese attention survey's "O(L d)" drops a d).
φ(x) = elu(x) + 1 (Eq. 7) keeps every similarity positive, so the normaliser never vanishes.

Causal (j ≤ i): S_i = S_{i−1} + φ(k_i) v_iᵀ, z_i = z_{i−1} + φ(k_i) — an RNN with a state of fixed
size E·E_v + E per head, whatever the length (§3.4, Eqs. 16–20). :func:`linear_attention_step` is that
recurrence; :func:`linear_attention` with ``is_causal=True`` computes the same outputs in parallel with a
**chunked scan**: within a chunk of C positions the masked C × C kernel matrix, across chunks the
prefix sums of the chunks' states — extra memory O(L·C + L·E·E_v/C) per head, never an (L, E, E_v)
cumulative sum.

Performer's positive random features (Choromanski et al. 2021, FAVOR+) pick φ so that the kernel
*approximates* softmax's exp(qᵀk/√d); :func:`performer_attention` converges to softmax attention as the
number of features grows.

References: Katharopoulos, Vyas, Pappas & Fleuret, "Transformers are RNNs: Fast Autoregressive
Transformers with Linear Attention", ICML 2020, arXiv:2006.16236v3. Choromanski et al., "Rethinking
Attention with Performers", ICLR 2021, arXiv:2009.14794v4.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from einops import rearrange

from . import _validate

__all__ = ["elu_feature_map", "linear_attention", "LinearAttentionState", "linear_attention_step",
           "linear_attention_recurrent", "linear_attention_weights", "random_features", "performer_features",
           "performer_attention"]

FeatureMap = Callable[[torch.Tensor], torch.Tensor]


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = elu(x) + 1 > 0, element-wise (Katharopoulos et al. 2020, Eq. 7)."""
    return F.elu(x) + 1


def _check_qkv(q, k, v) -> None:
    for name, t in (("query", q), ("key", k), ("value", v)):
        _validate.tensor(name, t, min_dim=2)
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"query and key must have the same feature size E, got query {tuple(q.shape)} "
                         f"and key {tuple(k.shape)}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"key and value must agree on every dimension but the last (same batch, heads and "
                         f"length), got key {tuple(k.shape)} and value {tuple(v.shape)}")
    if q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"query and key leading (batch, head) dimensions differ: query {tuple(q.shape)}, "
                         f"key {tuple(k.shape)}")


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                     eps: float = 1e-6, feature_map: FeatureMap = elu_feature_map,
                     chunk_size: int = 64) -> torch.Tensor:
    """Linear attention ``out_i = φ(q_i)ᵀ S / (φ(q_i)ᵀ z + eps)``, shapes like SDPA.

    Args:
        q: ``(..., Lq, E)``; k: ``(..., Lk, E)``; v: ``(..., Lk, Ev)``.
        is_causal: sums over j ≤ i only (requires Lq == Lk).
        eps: added to the normaliser.
        feature_map: φ, applied to q and k (default elu + 1; must return non-negative features).
        chunk_size: C, positions per chunk of the causal scan.

    Returns ``(..., Lq, Ev)`` in the input dtype (fp16/bf16 are computed in fp32). Never forms an
    Lq × Lk tensor.
    """
    _check_qkv(q, k, v)
    _validate.positive_int("chunk_size", chunk_size)
    acc = torch.promote_types(q.dtype, torch.float32)
    phi_q, phi_k = feature_map(q.to(acc)), feature_map(k.to(acc))
    return _linear_from_features(phi_q, phi_k, v.to(acc), is_causal, eps, chunk_size).to(q.dtype)


def _linear_from_features(phi_q, phi_k, v, is_causal, eps, chunk_size=64):
    if not is_causal:
        S = phi_k.transpose(-2, -1) @ v                                     # (..., E, Ev)   Eq. (5)
        z = phi_k.sum(-2)                                                   # (..., E)
        den = (phi_q @ z[..., None]) + eps                                  # (..., Lq, 1)
        return (phi_q @ S) / den
    L = phi_q.shape[-2]
    if phi_k.shape[-2] != L:
        raise ValueError(f"causal linear attention needs Lq == Lk, got Lq={L}, Lk={phi_k.shape[-2]}")
    return _causal_chunked(phi_q, phi_k, v, eps, min(chunk_size, L))


def _causal_chunked(phi_q, phi_k, v, eps, C):
    """Chunked scan. Positions are cut into n = ⌈L/C⌉ chunks (the tail is zero-padded: φ(k) = 0 adds
    nothing to the sums). Output of query i in chunk c:
        num_i = φ(q_i)ᵀ S_{<c} + Σ_{j in c, j ≤ i} (φ(q_i)ᵀφ(k_j)) v_j,   den_i likewise with z and 1.
    """
    L = phi_q.shape[-2]
    pad = (-L) % C
    if pad:
        phi_q, phi_k, v = (F.pad(t, (0, 0, 0, pad)) for t in (phi_q, phi_k, v))
    Qc, Kc, Vc = (rearrange(t, "... (n c) e -> ... n c e", c=C) for t in (phi_q, phi_k, v))   # (..., n, C, ·)
    kv = Kc.transpose(-2, -1) @ Vc                                          # (..., n, E, Ev) per chunk
    S_prev = kv.cumsum(-3) - kv                                             # exclusive prefix sum over chunks
    z_chunk = Kc.sum(-2)                                                    # (..., n, E)
    z_prev = z_chunk.cumsum(-2) - z_chunk
    A = (Qc @ Kc.transpose(-2, -1)).tril()                                  # (..., n, C, C), j ≤ i in chunk
    num = Qc @ S_prev + A @ Vc                                              # (..., n, C, Ev)
    den = (Qc @ z_prev[..., None]).squeeze(-1) + A.sum(-1) + eps            # (..., n, C)
    out = rearrange(num / den[..., None], "... n c e -> ... (n c) e")
    return out[..., :L, :]


@dataclass
class LinearAttentionState:
    """The RNN state of causal linear attention: ``S (..., E, Ev) = Σ φ(k_j) v_jᵀ`` and ``z (..., E) = Σ φ(k_j)``
    over the tokens seen so far. Its size does not depend on how many tokens that is."""

    S: torch.Tensor
    z: torch.Tensor

    def nbytes(self) -> int:
        return self.S.numel() * self.S.element_size() + self.z.numel() * self.z.element_size()


def linear_attention_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          state: LinearAttentionState | None = None, *, eps: float = 1e-6,
                          feature_map: FeatureMap = elu_feature_map
                          ) -> tuple[torch.Tensor, LinearAttentionState]:
    """One decoding step (Katharopoulos et al. 2020, Eqs. 18–20): fold token t in, then read.

        S_t = S_{t−1} + φ(k_t) v_tᵀ,   z_t = z_{t−1} + φ(k_t),   out_t = φ(q_t)ᵀ S_t / (φ(q_t)ᵀ z_t + eps)

    q, k: ``(..., E)``; v: ``(..., Ev)`` — one token. ``state=None`` starts from S = 0, z = 0.
    Returns ``(out (..., Ev), new state)``; the input state is not modified.
    """
    _check_qkv(q[..., None, :], k[..., None, :], v[..., None, :])
    acc = torch.promote_types(q.dtype, torch.float32)
    phi_q, phi_k = feature_map(q.to(acc)), feature_map(k.to(acc))
    if state is None:
        state = LinearAttentionState(phi_k.new_zeros(*phi_k.shape, v.shape[-1]), phi_k.new_zeros(phi_k.shape))
    S = state.S + phi_k[..., :, None] * v.to(acc)[..., None, :]            # (..., E, Ev)   rank-one update
    z = state.z + phi_k                                                     # (..., E)
    num = (phi_q[..., None, :] @ S).squeeze(-2)                             # (..., Ev)
    den = (phi_q * z).sum(-1, keepdim=True) + eps
    return (num / den).to(q.dtype), LinearAttentionState(S, z)


def linear_attention_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, eps: float = 1e-6,
                               feature_map: FeatureMap = elu_feature_map) -> torch.Tensor:
    """Causal linear attention token by token with :func:`linear_attention_step` — ``(..., L, E)`` in,
    ``(..., L, Ev)`` out; equals ``linear_attention(q, k, v, is_causal=True)``. Memory: one state."""
    _check_qkv(q, k, v)
    state, outs = None, []
    for t in range(q.shape[-2]):
        out, state = linear_attention_step(q[..., t, :], k[..., t, :], v[..., t, :], state, eps=eps,
                                           feature_map=feature_map)
        outs.append(out)
    return torch.stack(outs, dim=-2)


def linear_attention_weights(q: torch.Tensor, k: torch.Tensor, *, is_causal: bool = False, eps: float = 1e-6,
                             feature_map: FeatureMap = elu_feature_map) -> torch.Tensor:
    """The attention map linear attention *implies*, ``A_ij = φ(q_i)ᵀφ(k_j) / (Σ_j' φ(q_i)ᵀφ(k_j') + eps)``
    ``(..., Lq, Lk)`` — for plotting and teaching only: it forms the L × L matrix the fast path avoids.
    ``A @ v`` equals :func:`linear_attention`'s output."""
    _check_qkv(q, k, k)
    K = feature_map(q) @ feature_map(k).transpose(-2, -1)                   # (..., Lq, Lk) kernel matrix
    if is_causal:
        K = K.tril()
    return K / (K.sum(-1, keepdim=True) + eps)


# ---- Performer: positive random features for the softmax kernel -------------------------------------------

def random_features(num_features: int, dim: int, *, orthogonal: bool = True, generator: torch.Generator | None = None,
                    dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """ω ``(num_features, dim)``, rows ~ N(0, I_dim). ``orthogonal=True``: blocks of ``dim`` rows are made
    exactly orthogonal (Gram–Schmidt via QR) and rescaled to chi-distributed norms, so each row is still
    N(0, I) but the estimator's variance is lower (Choromanski et al. 2021, §2.4)."""
    _validate.positive_int("num_features", num_features)
    _validate.positive_int("dim", dim)
    if not orthogonal:
        return torch.randn(num_features, dim, generator=generator, dtype=dtype).to(device)
    n_blocks = -(-num_features // dim)
    G = torch.randn(n_blocks, dim, dim, generator=generator, dtype=torch.float64)
    Qm, R = torch.linalg.qr(G)                                              # (n_blocks, dim, dim), orthonormal columns
    # QR's Q is uniformly (Haar) distributed only once the signs of R's diagonal are made positive; without this
    # the rows lean towards fixed directions and the estimator of exp(qᵀk/√d) is biased
    Qm = Qm * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1))[:, None, :]
    rows = Qm.transpose(-2, -1).reshape(n_blocks * dim, dim)[:num_features]
    norms = torch.randn(num_features, dim, generator=generator, dtype=torch.float64).norm(dim=-1, keepdim=True)
    return (rows * norms).to(dtype=dtype, device=device)


def performer_features(x: torch.Tensor, omega: torch.Tensor, *, is_query: bool) -> torch.Tensor:
    """Positive random features of the softmax kernel (FAVOR+, Lemma 1):

        φ(x) = exp(ωᵀx̂ − ‖x̂‖²/2) / √m,   x̂ = x / d^{1/4},   so  E[φ(q)ᵀφ(k)] = exp(qᵀk/√d).

    x ``(..., L, d)``, ω ``(m, d)`` -> ``(..., L, m)``. For stability a constant is subtracted inside the
    exp — per row for queries, one for all keys (per leading index) — which cancels in attention's ratio.
    """
    d = x.shape[-1]
    if omega.dim() != 2 or omega.shape[-1] != d:
        raise ValueError(f"omega must be (num_features, d={d}) for inputs {tuple(x.shape)}, got {tuple(omega.shape)}")
    xh = x / d ** 0.25
    proj = xh @ omega.to(xh).T                                              # (..., L, m)
    proj = proj - (xh * xh).sum(-1, keepdim=True) / 2
    stab = proj.amax(-1, keepdim=True) if is_query else proj.amax((-2, -1), keepdim=True)
    return torch.exp(proj - stab.detach()) / math.sqrt(omega.shape[0])


def performer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, omega: torch.Tensor, *,
                        is_causal: bool = False, eps: float = 1e-6, chunk_size: int = 64) -> torch.Tensor:
    """Softmax attention approximated with positive random features ω ``(m, E)`` (see :func:`random_features`):
    linear attention with φ = :func:`performer_features`. Converges to ``softmax(QKᵀ/√E) V`` as m grows."""
    _check_qkv(q, k, v)
    acc = torch.promote_types(q.dtype, torch.float32)
    phi_q = performer_features(q.to(acc), omega, is_query=True)
    phi_k = performer_features(k.to(acc), omega, is_query=False)
    return _linear_from_features(phi_q, phi_k, v.to(acc), is_causal, eps, chunk_size).to(q.dtype)
