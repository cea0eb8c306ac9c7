"""Lesson 12 demos: MLA trained on lesson 07's "reverse after the separator" task beside MHA, GQA, MQA
and TPA, and the cost of one decoding step with and without weight absorption.

The task, the tiny model (:class:`~attn_course.demos.tpa.TinyLM`) and the two sizes (``SHOW``, easy;
``COMPARE``, hard: n = 16 symbols, 8 heads of width 4, 100 steps) are lesson 07's, so the numbers can be
read against lessons 03 and 07.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ..gqa import KVCache
from ..mla import MLACache, MultiHeadLatentAttention
from ..tpa import TensorProductAttention, TPACache
from ._train import fit, token_accuracy
from .tpa import COMPARE, KINDS as _BASE_KINDS, SHOW, TinyLM, reverse_batch

__all__ = ["mla_factory", "KINDS", "SHOW", "COMPARE", "make_model", "train_and_measure",
           "cache_elements_per_token", "decode_step_flops", "DECODE_SCHEMES", "per_head_kv_decode"]


def mla_factory(kv_lora_rank: int, qk_rope_head_dim: int, qk_nope_head_dim: int | None = None,
                q_lora_rank: int | None = None) -> Callable[[int, int], MultiHeadLatentAttention]:
    """``(d_model, H) -> MultiHeadLatentAttention`` with a d_c = ``kv_lora_rank`` latent, values of width
    d_h = d_model / H and ``qk_rope_head_dim`` rope channels. ``qk_nope_head_dim`` defaults to
    d_h − d_R, so each head's query·key width d_nope + d_R equals MHA's d_h (a like-for-like comparison)."""
    def build(d_model: int, H: int) -> MultiHeadLatentAttention:
        d_h = d_model // H
        d_nope = d_h - qk_rope_head_dim if qk_nope_head_dim is None else qk_nope_head_dim
        return MultiHeadLatentAttention(d_model, H, kv_lora_rank=kv_lora_rank, qk_nope_head_dim=d_nope,
                                        qk_rope_head_dim=qk_rope_head_dim, v_head_dim=d_h,
                                        q_lora_rank=q_lora_rank)
    return build


# name -> attention factory for (d_model, H): lesson 07's rows (MHA, GQA, MQA, TPA) plus MLA with the
# same query·key width per head as MHA (d_nope + d_R = d_h)
KINDS: dict[str, Callable[[int, int], nn.Module]] = {
    **{k: v for k, v in _BASE_KINDS.items() if k != "TPA (R=2,1,1)"},
    "MLA (d_c=8, d_R=2)": mla_factory(8, 2),
    "MLA (d_c=16, d_R=2)": mla_factory(16, 2),
}


def make_model(kind: str | Callable[[int, int], nn.Module], *, n: int = 8, vocab: int = 10, d_model: int = 32,
               num_heads: int = 4, seed: int = 0) -> TinyLM:
    """A freshly initialised :class:`TinyLM` whose attention is ``KINDS[kind]`` (or the factory ``kind``)."""
    factory = KINDS[kind] if isinstance(kind, str) else kind
    torch.manual_seed(seed)
    return TinyLM(factory(d_model, num_heads), d_model, vocab=vocab + 1, max_len=2 * n)


def _new_cache(attn: nn.Module):
    if isinstance(attn, MultiHeadLatentAttention):
        return MLACache()
    return TPACache() if isinstance(attn, TensorProductAttention) else KVCache()


@torch.no_grad()
def cache_elements_per_token(attn: nn.Module, h: torch.Tensor) -> float:
    """Decode ``h (B, L, d_model)`` token by token with the module's own cache and return the elements
    it holds per token: ``nbytes`` of the real cache tensors / (B · L · bytes per element)."""
    cache = _new_cache(attn)
    for t in range(h.shape[1]):
        attn(h[:, t:t + 1], is_causal=True, cache=cache)
    return cache.nbytes() / (h.shape[0] * h.shape[1] * h.element_size())


def train_and_measure(kind: str | Callable[[int, int], nn.Module], *, steps: int = 150, n: int = 8,
                      vocab: int = 10, d_model: int = 32, num_heads: int = 4, seed: int = 0,
                      progress: bool = True, device: torch.device | str | None = None, return_losses: bool = False):
    """Train ``make_model(kind, ...)`` on lesson 07's ``reverse_batch`` for ``steps`` steps on ``device``
    (default CPU); return ``(model, accuracy, cache elements per token)`` — the same protocol as lesson 07's
    ``train_and_measure`` (AdamW, lr 1e-2, one-cycle; accuracy on 512 fresh sequences, another seed) — and,
    with ``return_losses=True``, the per-step training losses as a fourth item.
    The model is initialised and the batches drawn on the CPU, so a seed means the same start anywhere."""
    model = make_model(kind, n=n, vocab=vocab, d_model=d_model, num_heads=num_heads, seed=seed).to(device or "cpu")
    losses = fit(model, lambda g: reverse_batch(g, n=n, vocab=vocab), steps=steps, lr=1e-2, seed=seed,
        progress=progress, desc=kind if isinstance(kind, str) else "MLA")
    x, y = reverse_batch(torch.Generator().manual_seed(seed + 1000), batch=512, n=n, vocab=vocab)
    x, y = x.to(model.tok.weight.device), y.to(model.tok.weight.device)
    with torch.no_grad():
        acc = token_accuracy(model(x), y)
        per_token = cache_elements_per_token(model.attn, model.embed(x[:8]))
    return (model, acc, per_token, losses) if return_losses else (model, acc, per_token)


# The three ways to run one MLA decoding step (lesson 12 §7):
#   "reproject":   cache the latents, up-project ALL of them into per-head K/V at every step
#                  (MultiHeadLatentAttention(absorb=False) with an MLACache);
#   "per_head_kv": up-project only the new tokens and cache per-head K/V (DeepSeek-V3's reference
#                  inference code, attn_impl="naive": k_cache (B, S, H, d_nope + d_R), v_cache (B, S, H, d_v));
#   "absorbed":    cache the latents and attend over them as one-head attention (absorb=True; DeepSeek's
#                  default, attn_impl="absorb").
DECODE_SCHEMES = ("reproject", "per_head_kv", "absorbed")


def per_head_kv_decode(attn: MultiHeadLatentAttention, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """One causal call of ``attn`` on the new tokens ``x (B, L, d_model)`` with a **per-head K/V cache**, as
    DeepSeek-V3's reference code does with ``attn_impl="naive"``: only the new tokens' latents are
    up-projected (Eqs. 10, 11); their keys ``[k_nope ; k_rope] (B, H, L, d_nope + d_R)`` and values
    ``(B, H, L, d_v)`` are appended to ``cache`` (a :class:`~attn_course.gqa.KVCache` with H_kv = H), and the
    queries attend over everything cached. Returns ``(B, L, d_model)``, equal to
    ``attn(x, is_causal=True, cache=...)`` with an :class:`MLACache`; the cache holds H·(d_nope + d_R + d_v)
    numbers per token instead of d_c + d_R."""
    T, L, H = len(cache), x.shape[1], attn.num_heads
    positions = torch.arange(T, T + L, device=x.device)
    q_nope, q_rope = attn.queries(x, positions)                        # (B, H, L, d_nope), (B, H, L, d_R)
    c_kv, k_rope = attn.latents(x, positions)                          # new tokens only: (B, L, d_c), (B, L, d_R)
    kv = rearrange(attn.kv_b_proj(c_kv), "b l (h e) -> b h l e", h=H)  # Eqs. (10), (11) for the new tokens
    k_nope, v = kv.split((attn.qk_nope_head_dim, attn.v_head_dim), dim=-1)
    k = torch.cat((k_nope, k_rope[:, None].expand(-1, H, -1, -1)), dim=-1)   # Eq. (17): (B, H, L, d_nope + d_R)
    k, v = cache.update(k, v)                                          # (B, H, T + L, ·)
    visible = torch.ones(L, T + L, dtype=torch.bool, device=x.device).tril(diagonal=T)   # query i sits at T + i
    out = F.scaled_dot_product_attention(torch.cat((q_nope, q_rope), dim=-1), k, v, attn_mask=visible,
                                         scale=attn.scale)             # Eq. (18): (B, H, L, d_v)
    return attn.o_proj(rearrange(out, "b h l v -> b l (h v)"))         # Eq. (19)


def decode_step_flops(*, context: int, num_heads: int, kv_lora_rank: int, qk_nope_head_dim: int,
                      qk_rope_head_dim: int, v_head_dim: int, absorb: bool | None = None,
                      scheme: str | None = None, new_tokens: int = 1) -> int:
    """FLOPs (2 per multiply-add) of the attention core of one MLA call: from the new tokens' queries and
    the cache (``context`` tokens, the new ones included) to the per-head outputs, batch 1.

    ``scheme`` is one of :data:`DECODE_SCHEMES`; ``absorb=False`` / ``True`` is short for "reproject" /
    "absorbed" (give one of the two).

    reproject:   up-project every cached latent to per-head K_nope and V  2·S·d_c·H·(d_nope + d_v)
                 scores over d_nope + d_R, weighted sum of d_v-wide values 2·L·H·S·(d_nope + d_R + d_v)
    per_head_kv: up-project the new tokens' latents only                  2·L·d_c·H·(d_nope + d_v)
                 scores and weighted sum as in reproject                   2·L·H·S·(d_nope + d_R + d_v)
    absorbed:    fold W^UK into the queries and W^UV into the outputs     2·L·H·d_c·(d_nope + d_v)
                 scores over d_c + d_R, weighted sum of d_c-wide latents  2·L·H·S·(2·d_c + d_R)

    (S = context, L = new_tokens.) The projections of the new tokens (q, kv_a, o) are the same in all three.
    """
    if (absorb is None) == (scheme is None):
        raise ValueError(f"give exactly one of absorb= and scheme=, got absorb={absorb!r}, scheme={scheme!r}")
    if scheme is None:
        scheme = "absorbed" if absorb else "reproject"
    if scheme not in DECODE_SCHEMES:
        raise ValueError(f"scheme must be one of {DECODE_SCHEMES}, got {scheme!r}")
    S, L, H = context, new_tokens, num_heads
    dc, dn, dr, dv = kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
    if scheme == "absorbed":
        return 2 * L * H * dc * (dn + dv) + 2 * L * H * S * (2 * dc + dr)
    up = S if scheme == "reproject" else L                              # latents up-projected in this call
    return 2 * up * dc * H * (dn + dv) + 2 * L * H * S * (dn + dr + dv)
