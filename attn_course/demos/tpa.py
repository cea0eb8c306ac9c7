"""Lesson 07 demos: GQA written as a (non-contextual) TPA, and a tiny causal task to train TPA, MHA, GQA
and MQA on, with the cache each one holds while decoding.

The task, "reverse after the separator": a sequence s_0..s_{n-1} of random symbols, then SEP, then the
model must emit s_{n-1}, ..., s_0 one token per position (teacher forcing, causal attention). The
query at output position n+i must look at input position n-1-i, so a trained layer draws an
anti-diagonal in the lower-left block of its attention map.

Two sizes are used. ``SHOW`` (n = 8, 4 heads of width 8) is easy for every mechanism and gives clean
heatmaps. ``COMPARE`` (n = 16 over 32 symbols, 8 heads of width 4, as in lesson 03, and only 100
training steps) makes the keys' capacity matter: each query must pick one of 16 positions sharply
with 4-wide keys, and a layer whose heads share (or factorise) their keys learns that more slowly.
"""
from __future__ import annotations

import torch
from torch import nn

from ..gqa import GroupedQueryAttention, KVCache
from ..tpa import TensorProductAttention, TPACache
from ._train import SeedRuns, fit_many, token_accuracy

__all__ = ["with_constant_channel", "tpa_from_gqa", "reverse_batch", "TinyLM", "make_model", "KINDS",
           "SHOW", "COMPARE", "train_and_measure", "train_seeds"]


def with_constant_channel(x: torch.Tensor) -> torch.Tensor:
    """``(B, L, d) -> (B, L, d + 1)``: append a channel that is always 1 (the bias trick)."""
    return torch.cat((x, torch.ones_like(x[..., :1])), dim=-1)


@torch.no_grad()
def tpa_from_gqa(gqa: GroupedQueryAttention) -> TensorProductAttention:
    """A TPA (``rope=False``) whose output on ``with_constant_channel(x)`` is ``[gqa(x), 0]``.

    The paper (§4) writes MHA/MQA/GQA as TPA whose head factors are *constants*: with R_k = H_kv and
    ``A_k[h, r] = R_k · 1[r == h // G]`` (G = H / H_kv), ``(1/R_k) Σ_r A_k[h, r] B_k[r] = B_k[h // G]``, so
    K head h is kv head h // G; with ``B_k[r] = W_k[r] x`` that is exactly GQA's key. Q uses R_q = H and
    ``A_q[h, r] = H · 1[r == h]``; V as K. A bias-free linear layer of x cannot output a constant, so we
    feed it one: the last input channel is always 1, and only the A layers read it (only the B layers
    read x). The output projection is GQA's, with a zero row for the extra channel.
    """
    H, Hkv, d, D = gqa.num_heads, gqa.num_kv_heads, gqa.head_dim, gqa.d_model
    G = H // Hkv
    tpa = TensorProductAttention(D + 1, H, d, q_rank=H, k_rank=Hkv, v_rank=Hkv, rope=False)
    for W in tpa.parameters():
        W.zero_()
    heads = torch.arange(H)
    # A layers: weight rows are (h, r) head-major; only the constant channel (last column) is used.
    tpa.W_A_q.weight.view(H, H, D + 1)[heads, heads, D] = float(H)           # A_q[h, r] = H·1[r == h]
    for W_A in (tpa.W_A_k, tpa.W_A_v):
        W_A.weight.view(H, Hkv, D + 1)[heads, heads // G, D] = float(Hkv)     # A[h, r] = R·1[r == h // G]
    # B layers: rank r's token factor is head r's projection of x (rows (r, d) match GQA's (h, d)).
    tpa.W_B_q.weight[:, :D] = gqa.q_proj.weight
    tpa.W_B_k.weight[:, :D] = gqa.k_proj.weight
    tpa.W_B_v.weight[:, :D] = gqa.v_proj.weight
    tpa.out_proj.weight[:D] = gqa.out_proj.weight
    return tpa.to(gqa.q_proj.weight)                                     # GQA's device and dtype


def reverse_batch(gen: torch.Generator, batch: int = 64, n: int = 8, vocab: int = 10):
    """Inputs ``(batch, 2n)`` and targets ``(batch, 2n)`` (-100 where nothing is predicted).

    Symbols are 0..vocab-1 and SEP = vocab. Input: ``s_0..s_{n-1}, SEP, s_{n-1}, ..., s_1``; position
    n+i (SEP for i = 0) predicts ``s_{n-1-i}``, i.e. must look back at position n-1-i.
    """
    s = torch.randint(0, vocab, (batch, n), generator=gen)
    rev = s.flip(-1)                                                       # s_{n-1}, ..., s_0
    sep = torch.full((batch, 1), vocab)
    x = torch.cat((s, sep, rev[:, :-1]), dim=1)                            # (batch, 2n)
    y = torch.cat((torch.full((batch, n), -100), rev), dim=1)              # (batch, 2n)
    return x, y


class TinyLM(nn.Module):
    """Token + learned position embeddings, ONE causal attention layer (any of the course's modules
    taking ``(x, is_causal=True)``), a small MLP, and a read-out: enough for ``reverse_batch``."""

    def __init__(self, attn: nn.Module, d_model: int, vocab: int = 11, max_len: int = 16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.attn = attn
        self.mlp = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))
        self.head = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, vocab))

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))   # (B, L, d_model)

    def forward(self, x: torch.Tensor, *, need_weights: bool = False):
        h = self.embed(x)
        a, w = self.attn(h, is_causal=True, need_weights=need_weights)
        h = h + a
        logits = self.head(h + self.mlp(h))                                         # (B, L, vocab)
        return (logits, w) if need_weights else logits


# name -> attention factory for (d_model, H): one row per mechanism compared in the lesson (d_h = d_model / H)
KINDS = {
    "MHA": lambda d, H: GroupedQueryAttention(d, H, H),
    "GQA (H_kv=2)": lambda d, H: GroupedQueryAttention(d, H, 2),
    "MQA (H_kv=1)": lambda d, H: GroupedQueryAttention(d, H, 1),
    "TPA (R=6,2,2)": lambda d, H: TensorProductAttention(d, H, d // H, q_rank=6, k_rank=2, v_rank=2),
    "TPA (R=2,1,1)": lambda d, H: TensorProductAttention(d, H, d // H, q_rank=2, k_rank=1, v_rank=1),
}

# task and model sizes: SHOW is easy for every mechanism (clean heatmaps); COMPARE separates them. Lesson 07 trains
# SHOW for 80 steps, already enough for all five KINDS (tests/test_tpa.py); lesson 12's MLA trains 80 steps too.
SHOW = dict(n=8, vocab=10, d_model=32, num_heads=4, steps=150)
COMPARE = dict(n=16, vocab=32, d_model=32, num_heads=8, steps=100)


def make_model(kind: str, *, n: int = 8, vocab: int = 10, d_model: int = 32, num_heads: int = 4,
               seed: int = 0) -> TinyLM:
    """A freshly initialised :class:`TinyLM` for ``reverse_batch(.., n, vocab)`` with the attention
    named ``kind`` (a key of ``KINDS``) of ``num_heads`` heads."""
    torch.manual_seed(seed)
    return TinyLM(KINDS[kind](d_model, num_heads), d_model, vocab=vocab + 1, max_len=2 * n)


@torch.no_grad()
def cache_elements_per_token(attn: nn.Module, h: torch.Tensor) -> float:
    """Decode ``h (B, L, d_model)`` token by token with the module's cache; return the elements the
    cache holds per token (measured: ``nbytes`` of the real cache tensors / (B · L · bytes per element))."""
    cache = TPACache() if isinstance(attn, TensorProductAttention) else KVCache()
    for t in range(h.shape[1]):
        attn(h[:, t:t + 1], is_causal=True, cache=cache)
    return cache.nbytes() / (h.shape[0] * h.shape[1] * h.element_size())


def train_and_measure(kind: str, *, steps: int = 150, n: int = 8, vocab: int = 10, d_model: int = 32,
                      num_heads: int = 4, seed: int = 0, progress: bool = True, device=None,
                      losses: list | None = None):
    """Train ``make_model(kind, ...)`` on ``reverse_batch(gen, 64, n, vocab)`` for ``steps`` steps; return
    ``(model, accuracy, cache elements/token)``. Pass ``**SHOW`` or ``**COMPARE`` for the lesson's sizes.
    Accuracy is the token accuracy on the reversed half of 512 fresh sequences (a different seed).
    ``device`` (default CPU) is where the model trains and is evaluated; the model is returned on CPU.
    ``losses``: a list that receives the per-step training losses (for ``viz.plot_loss_curves``)."""
    runs = train_seeds(kind, [seed], steps=steps, n=n, vocab=vocab, d_model=d_model, num_heads=num_heads,
                       progress=progress, device=device)
    if losses is not None:
        losses.extend(runs.losses[0])
    model = runs.models[0]
    return model, runs.accuracy[0], cache_per_token(model, seed, n=n, vocab=vocab)


def _batch_for(seed: int, n: int, vocab: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = reverse_batch(torch.Generator().manual_seed(seed + 1000), batch=512, n=n, vocab=vocab)
    return x.to(device), y.to(device)


@torch.no_grad()
def accuracy(model: TinyLM, seed: int, *, n: int, vocab: int) -> float:
    """Token accuracy on the reversed half of 512 fresh sequences (data seed ``seed + 1000``)."""
    x, y = _batch_for(seed, n, vocab, next(model.parameters()).device)
    return token_accuracy(model(x), y)


@torch.no_grad()
def cache_per_token(model: TinyLM, seed: int, *, n: int, vocab: int) -> float:
    """The cache elements per token ``model.attn`` holds while decoding 8 of those sequences."""
    x, _ = _batch_for(seed, n, vocab, next(model.parameters()).device)
    return cache_elements_per_token(model.attn, model.embed(x[:8]))


def train_seeds(kind: str, seeds, *, steps: int = 150, n: int = 8, vocab: int = 10, d_model: int = 32,
                num_heads: int = 4, schedule: str = "one-cycle", read_at=(), progress: bool = False,
                device=None) -> SeedRuns:
    """``make_model(kind, seed=s, ...)`` for every seed, trained together as one batch (:func:`fit_many`; model
    i ends where training it alone with seed i takes it). Accuracy as in :func:`train_and_measure`, at the end
    and right after each step in ``read_at`` (with ``schedule="constant"``: the accuracy of a shorter run).
    The models are returned on CPU."""
    models = [make_model(kind, n=n, vocab=vocab, d_model=d_model, num_heads=num_heads, seed=s).to(device or "cpu")
              for s in seeds]
    acc = lambda ms: [accuracy(m, s, n=n, vocab=vocab) for m, s in zip(ms, seeds)]
    at_acc: dict[int, list[float]] = {}
    curves = fit_many(models, lambda g: reverse_batch(g, n=n, vocab=vocab), steps=steps, lr=1e-2, seeds=list(seeds),
                      schedule=schedule, progress=progress, desc=kind,
                      at_steps={k: (lambda ms, k=k: at_acc.__setitem__(k, acc(ms))) for k in read_at})
    final = acc(models)
    return SeedRuns([m.cpu() for m in models], curves, final, at_acc)
