"""Lesson 15's experiments: what the new attention parts of open models change, measured small.

* :class:`OpenLM` — a tiny byte-level decoder (lesson 11's corpus, Python's own docstrings) whose attention
  layers are one of ``"softmax"`` (the control), ``"gated"`` (Qwen3-Next's output gate), ``"sink"`` (gpt-oss's
  sink logit) or ``"sink_frozen"`` (the sink layer with its logit fixed at −30: the control for the sink); the
  softmax control is the gated layer with its gate switched off, so the two differ in the gate only, and
  the frozen-sink control differs from ``"sink"`` in the sink only. :func:`train_open_lm` trains one with the course's :func:`~attn_course.demos._train.fit`, and
  :func:`attention_stats` measures the attention mass on the first token, the sink's share and the largest
  activation of the residual stream.
* :func:`nothing_to_read_batch` / :func:`nothing_to_read_stats` — a copying task where the rows before the one
  digit of a sequence have nothing to read: where a softmax head parks that attention, and what a sink absorbs.
* :func:`recall_accuracy` — associative recall with updates, at the level of the state: keys written several
  times with new values into a d_k × d_v memory, by plain linear attention (S += k vᵀ) or by the delta rule
  (S += k (v − Sᵀk)ᵀ, β = 1); each key read back must give its latest value.
* :func:`common_noise_mass` — two attention maps that share a noise pattern: how much weight lands on the
  target under one softmax, and under the difference of two (differential attention).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._hfconfig import RopeSpec
from ..gated import GatedAttention
from ..norm import RMSNorm
from ..sinks import SinkAttention
from ._train import fit, fit_many
from .textlm import VOCAB, TextData

__all__ = ["OpenLM", "train_open_lm", "train_open_lms", "attention_stats", "recall_accuracy", "common_noise_mass", "KINDS",
           "nothing_to_read_batch", "nothing_to_read_stats"]

KINDS = ("softmax", "gated", "sink", "sink_frozen")
FROZEN_SINK = -30.0          # exp(−30) ≈ 1e-13 of a row: a sink that takes nothing


class OpenLM(nn.Module):
    """Pre-norm decoder: embed → [x + attn(norm(x)); x + mlp(norm(x))] × layers → norm → head; (B, L) → (B, L, 128)."""

    def __init__(self, kind: str = "softmax", d_model: int = 64, num_layers: int = 2, num_heads: int = 4):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.kind = kind
        hd = d_model // num_heads
        self.embed = nn.Embedding(VOCAB, d_model)

        def attn():
            if kind.startswith("sink"):
                layer = SinkAttention(d_model, num_heads, num_heads, hd, bias=False, rope=RopeSpec(hd))
                if kind == "sink_frozen":
                    layer.sinks.data.fill_(FROZEN_SINK)
                    layer.sinks.requires_grad_(False)
                return layer
            return GatedAttention(d_model, num_heads, num_heads, hd, rope=RopeSpec(hd))
        self.attn = nn.ModuleList(attn() for _ in range(num_layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
                                 for _ in range(num_layers))
        self.norm1 = nn.ModuleList(RMSNorm(d_model) for _ in range(num_layers))
        self.norm2 = nn.ModuleList(RMSNorm(d_model) for _ in range(num_layers))
        self.norm = RMSNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB, bias=False)

    def _attend(self, i: int, h: torch.Tensor, need_weights: bool):
        if self.kind.startswith("sink"):
            return self.attn[i](h, need_weights=need_weights)
        return self.attn[i](h, need_weights=need_weights, gate=self.kind == "gated")

    def forward(self, idx: torch.Tensor, *, trace: list | None = None) -> torch.Tensor:
        x = self.embed(idx)
        for i in range(len(self.attn)):
            out, w = self._attend(i, self.norm1[i](x), trace is not None)
            x = x + out
            x = x + self.mlp[i](self.norm2[i](x))
            if trace is not None:
                trace.append((w, x))
        return self.head(self.norm(x))


def train_open_lm(kind: str, data: TextData | None, *, steps: int = 200, seed: int = 0, lr: float = 3e-3,
                  progress: bool = False, sample=None, **kw):
    """A fresh :class:`OpenLM` of ``kind`` trained for ``steps`` batches of ``data`` (or of ``sample(gen)``);
    returns ``(model, per-step losses)``."""
    torch.manual_seed(seed)
    model = OpenLM(kind, **kw)
    losses = fit(model, sample or data.sample, steps=steps, lr=lr, seed=seed, progress=progress,
                 desc=f"OpenLM ({kind})")
    return model, losses


def train_open_lms(kind: str, sample, seeds=(0, 1, 2), *, steps: int = 200, lr: float = 3e-3, progress: bool = False,
                   **kw):
    """:func:`train_open_lm` for several seeds as one batch (:func:`~attn_course.demos._train.fit_many`): each model
    starts from its seed's weights and sees its seed's batches, exactly as alone. Returns ``[(model, losses), ...]``."""
    models = []
    for s in seeds:
        torch.manual_seed(s)
        models.append(OpenLM(kind, **kw))
    curves = fit_many(models, sample, seeds=seeds, steps=steps, lr=lr, progress=progress, desc=f"OpenLM ({kind})")
    return list(zip(models, curves))


@torch.no_grad()
def attention_stats(model: OpenLM, data: TextData, *, seq_len: int = 64, batch_size: int = 16, seed: int = 123
                    ) -> dict[str, float]:
    """On validation windows: ``loss`` (nats/char), ``first_token`` (mean attention weight on position 0 of the
    queries at positions ≥ 8, over layers and heads), ``sink`` (mean mass the sink logit absorbs; 0 without
    sinks) and ``max_act`` (the largest absolute activation of the residual stream)."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    x, y = data.sample(gen, "val", seq_len=seq_len, batch_size=batch_size)
    trace: list = []
    logits = model(x, trace=trace)
    loss = F.cross_entropy(logits.transpose(1, 2), y).item()
    first = torch.stack([w[:, :, 8:, 0].mean() for w, _ in trace]).mean().item()
    sink = torch.stack([(1 - w[:, :, 8:].sum(-1)).mean() for w, _ in trace]).mean().item()
    act = max(h.abs().max().item() for _, h in trace)
    model.train()
    return {"loss": loss, "first_token": first, "sink": sink, "max_act": act}


def recall_accuracy(n_keys: int, d_k: int, rule: str, *, writes: int = 2, d_v: int | None = None, seed: int = 0
                    ) -> float:
    """Associative recall with updates, at the level of the state: ``n_keys`` random unit keys are each written
    ``writes`` times with a fresh random unit value (in a shuffled order) into one ``d_k × d_v`` state; then every
    key is read back (``Sᵀk``) and counts as recalled when the nearest (cosine) of all the values ever written is
    its LATEST value. Returns the fraction recalled.

    ``rule="linear"``: S ← S + k vᵀ (lesson 10's state: a sum, so old and new values add up).
    ``rule="delta"``: S ← S + k (v − Sᵀk)ᵀ (β = 1, no decay: what k held is replaced by v).
    """
    if rule not in ("linear", "delta"):
        raise ValueError(f"rule must be 'linear' or 'delta', got {rule!r}")
    d_v = d_k if d_v is None else d_v
    g = torch.Generator().manual_seed(seed)
    K = F.normalize(torch.randn(n_keys, d_k, generator=g, dtype=torch.float64), dim=-1)
    order = torch.arange(n_keys).repeat(writes)[torch.randperm(n_keys * writes, generator=g)]   # which key, each write
    V = F.normalize(torch.randn(len(order), d_v, generator=g, dtype=torch.float64), dim=-1)     # a fresh value each write
    S = torch.zeros(d_k, d_v, dtype=torch.float64)
    latest = torch.empty(n_keys, dtype=torch.long)
    for t, i in enumerate(order.tolist()):
        k, v = K[i], V[t]
        S = S + torch.outer(k, v if rule == "linear" else v - S.T @ k)
        latest[i] = t
    read = F.normalize(K @ S, dim=-1)                                      # (n_keys, d_v): Sᵀk for every key
    return (read @ V.T).argmax(-1).eq(latest).double().mean().item()


def common_noise_mass(L: int = 64, *, signal: float = 3.0, noise: float = 1.0, lam: float = 0.8, seed: int = 0
                      ) -> tuple[float, float]:
    """Attention weight on the target key (index 0) for one query whose scores are ``noise`` (a pattern z shared
    by both maps, std ``noise``) plus ``signal`` on the target in map 1 only. Returns ``(single, differential)``:
    softmax(z + signal·e₀)[0] and the target's share of the positive part of softmax₁ − λ·softmax₂ (normalised)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(L, generator=g, dtype=torch.float64) * noise
    s1 = z.clone()
    s1[0] += signal
    p1, p2 = torch.softmax(s1, 0), torch.softmax(z, 0)
    d = (p1 - lam * p2).clamp_min(0)
    return p1[0].item(), (d[0] / d.sum()).item()


# ---- a task where some rows have nothing to read -------------------------------------------------------------

NONE, DIGITS, LETTERS = 0, range(1, 11), range(11, 31)


def nothing_to_read_batch(gen: torch.Generator, *, L: int = 24, batch_size: int = 32, p_digit: float = 0.7):
    """``(x, y)`` (B, L): letters, and in most sequences ONE digit at a random position; the target at every
    position is the digit seen so far, or ``NONE`` (0) before it (and everywhere when there is none). A query
    before the digit has nothing to read: whatever it attends to is wrong to copy."""
    x = torch.randint(LETTERS.start, LETTERS.stop, (batch_size, L), generator=gen)
    has = torch.rand(batch_size, generator=gen) < p_digit
    pos = torch.randint(1, L, (batch_size,), generator=gen)
    digit = torch.randint(DIGITS.start, DIGITS.stop, (batch_size,), generator=gen)
    rows = torch.arange(batch_size)[has]
    x[rows, pos[has]] = digit[has]
    seen = (torch.arange(L)[None] >= pos[:, None]) & has[:, None]
    y = torch.where(seen, digit[:, None].expand(-1, L), torch.full_like(x, NONE))
    return x, y


@torch.no_grad()
def nothing_to_read_stats(model: OpenLM, *, seed: int = 99, batch_size: int = 256) -> dict[str, float]:
    """For a trained one-layer :class:`OpenLM`: accuracy, and where the attention of the rows with nothing to
    read goes — ``sink`` (the share the sink absorbs), ``first`` (weight on position 0), ``self`` (on the query
    itself) — against the rows after the digit: the weight they put on it (``on_digit``) and the sink's share
    there (``sink_seen``)."""
    gen = torch.Generator().manual_seed(seed)
    x, y = nothing_to_read_batch(gen, batch_size=batch_size)
    trace: list = []
    logits = model(x, trace=trace)
    w = trace[0][0].mean(1)                                                  # (B, L, L), mean over heads
    is_digit = (x >= DIGITS.start) & (x < DIGITS.stop)
    seen = is_digit.long().cumsum(1) > 0
    empty = ~seen
    empty[:, 0] = False                                                      # position 0 can only see itself
    L = x.shape[1]
    eye = torch.eye(L, dtype=torch.bool).expand_as(w)
    return {"accuracy": (logits.argmax(-1) == y).double().mean().item(),
            "sink": (1 - w.sum(-1))[empty].mean().item(),
            "sink_seen": (1 - w.sum(-1))[seen & ~is_digit].mean().item(),
            "first": w[..., 0][empty].mean().item(),
            "self": w[eye].view(w.shape[0], L)[empty].mean().item(),
            "on_digit": (w * is_digit[:, None, :]).sum(-1)[seen & ~is_digit].mean().item()}
