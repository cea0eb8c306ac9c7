"""Lesson 11: a tiny decoder-only character LM made of :class:`~attn_course.TransformerBlock` s, trained
on real English that every Python installation already holds — the docstrings of the standard library.

* :func:`stdlib_text` reads the docstrings of a fixed list of standard-library modules with ``inspect``
  (no download). The exact text depends a little on the Python version; the lesson's assertions keep
  wide margins for that reason.
* :class:`TinyLM`: ASCII bytes (vocabulary 128) -> embedding -> ``num_layers`` blocks -> RMSNorm -> logits.
  ``post_norm=True`` arranges the same sub-layers the original way (norm after each residual add).
  ``position`` chooses how order enters: ``"rope"`` (inside every block), ``"learned"`` (a trained
  table added to the embeddings), ``"alibi"`` (a per-head linear bias on the scores) or ``"none"``.
* :func:`train_lm` trains one with the shared :func:`~attn_course.demos._train.fit` loop;
  :func:`train_lm_many` trains several (seeds, learning rates) as one batch with
  :func:`~attn_course.demos._train.fit_many`;
  :func:`head_scores` measures which heads look at the previous token, at the first token (a sink) or
  act like induction heads (attend to the token *after* an earlier occurrence of the current one), or
  look back to the space that opens the current word (a word-boundary head).

Everything runs on the model's device: :func:`train_lm` takes ``device=``, the data stay on the CPU (their
random windows are drawn there, so a seed gives the same batches everywhere) and move to the model per batch.
"""
from __future__ import annotations

import importlib
import inspect
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..block import TransformerBlock
from ..norm import RMSNorm
from ..positions import alibi_bias
from ._train import fit, fit_many

__all__ = ["STDLIB_MODULES", "stdlib_text", "encode", "decode", "TextData", "TinyLM", "train_lm", "train_lm_many",
           "loss_by_position", "head_scores", "unigram_loss"]

# Pure-Python modules with long, stable docstrings (present in every CPython 3.9+).
STDLIB_MODULES = ("textwrap", "string", "json", "fractions", "statistics", "heapq", "bisect", "shlex",
                  "difflib", "argparse", "functools", "collections", "calendar", "pathlib", "random",
                  "tempfile", "shutil", "csv", "email.message", "http.client", "urllib.parse", "inspect")
VOCAB = 128   # ASCII


def _docs(module) -> list[str]:
    """The module's docstring, then those of its public functions/classes (and their methods) defined there."""
    docs = [inspect.getdoc(module)]
    for name in sorted(vars(module)):
        obj = vars(module)[name]
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            docs.append(inspect.getdoc(obj))
        elif inspect.isclass(obj):
            docs.append(inspect.getdoc(obj))
            for meth in sorted(vars(obj)):
                f = vars(obj)[meth]
                if not meth.startswith("_") and inspect.isfunction(f):
                    docs.append(inspect.getdoc(f))
    return [d for d in docs if d]


def stdlib_text(modules=STDLIB_MODULES) -> str:
    """Docstrings of ``modules`` (in order, duplicates dropped), separated by blank lines, as ASCII."""
    seen, parts = set(), []
    for m in modules:
        for d in _docs(importlib.import_module(m)):
            if d not in seen:
                seen.add(d)
                parts.append(d)
    text = "\n\n".join(parts)
    return text.encode("ascii", errors="replace").decode("ascii")


def encode(text: str) -> torch.Tensor:
    """ASCII text -> int64 codes (L,); other characters become '?'."""
    return torch.tensor(list(text.encode("ascii", errors="replace")), dtype=torch.long)


def decode(codes) -> str:
    return bytes(int(c) for c in codes).decode("ascii", errors="replace")


class TextData:
    """The corpus split 90/10 into train and validation codes, and random training windows."""

    def __init__(self, text: str | None = None, seq_len: int = 64, batch_size: int = 32):
        self.text = stdlib_text() if text is None else text
        codes = encode(self.text)
        n = int(0.9 * len(codes))
        self.train, self.val = codes[:n], codes[n:]
        self.seq_len, self.batch_size = seq_len, batch_size

    def sample(self, gen: torch.Generator, split: str = "train", seq_len: int | None = None,
               batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of shape (B, L): windows of the corpus and the same windows shifted by one."""
        data = self.train if split == "train" else self.val
        L, B = seq_len or self.seq_len, batch_size or self.batch_size
        start = torch.randint(len(data) - L - 1, (B,), generator=gen)
        idx = start[:, None] + torch.arange(L + 1)
        chunk = data[idx]
        return chunk[:, :-1], chunk[:, 1:]


def unigram_loss(data: TextData) -> float:
    """The course's unigram baseline, in nats per character: a model that predicts every character from the
    character frequencies of the **training** split, add-one smoothed over the 128 ASCII codes, scored by its
    cross-entropy on the **validation** split — the same split and measure as a trained model's validation loss.

    (Not the training split's own entropy −Σ p log p: that is the model's loss on the text it was counted on.)
    """
    counts = torch.bincount(data.train, minlength=VOCAB).double() + 1          # add-one: no code has p = 0
    log_p = (counts / counts.sum()).log()                                     # (128,)
    return -log_p[data.val].mean().item()


class TinyLM(nn.Module):
    """Byte-level decoder: ``logits = head(RMSNorm(blocks(embed(x) [+ pos])))``; (B, L) -> (B, L, 128).

    ``max_len`` only sizes the learned position table (position="learned"); the other schemes work
    at any length.
    """

    POSITIONS = ("rope", "learned", "alibi", "none")

    def __init__(self, d_model: int = 64, num_layers: int = 2, num_heads: int = 4, *, position: str = "rope",
                 qk_norm: bool = False, post_norm: bool = False, max_len: int = 512):
        super().__init__()
        if position not in self.POSITIONS:
            raise ValueError(f"position must be one of {self.POSITIONS}, got {position!r}")
        self.position, self.num_heads, self.post_norm = position, num_heads, post_norm
        self.embed = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Embedding(max_len, d_model) if position == "learned" else None
        if self.pos is not None:
            nn.init.normal_(self.pos.weight, std=0.02)          # GPT-2's init: rows never trained stay small
        self.blocks = nn.ModuleList(TransformerBlock(d_model, num_heads, qk_norm=qk_norm, rope=position == "rope")
                                    for _ in range(num_layers))
        self.norm = RMSNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB, bias=False)

    def _bias(self, L: int, device) -> torch.Tensor | None:
        return alibi_bias(self.num_heads, L, device=device) if self.position == "alibi" else None   # (H, L, L)

    def _embed(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        if self.pos is not None:
            if idx.shape[1] > self.pos.num_embeddings:
                raise ValueError(f"sequence length {idx.shape[1]} exceeds max_len={self.pos.num_embeddings}")
            x = x + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return x

    def _layer(self, block: TransformerBlock, x: torch.Tensor, bias, need_weights: bool = False):
        """One block, pre-norm (the block's own forward) or post-norm; returns (x, weights or None)."""
        if self.post_norm:
            out, w = block.attend(x, attn_mask=bias, need_weights=need_weights)
            h = block.norm1(x + out)
            return block.norm2(h + block.ffn(h)), w
        out, w = block.attend(block.norm1(x), attn_mask=bias, need_weights=need_weights)
        x = x + out
        return x + block.ffn(block.norm2(x)), w

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x, bias = self._embed(idx), self._bias(idx.shape[1], idx.device)
        for block in self.blocks:
            x = self._layer(block, x, bias)[0]
        return self.head(self.norm(x))

    @torch.no_grad()
    def attention_maps(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """Per layer, the attention weights ``(B, H, L, L)`` (explicit path) of the forward pass on ``idx``."""
        x, bias, maps = self._embed(idx), self._bias(idx.shape[1], idx.device), []
        for block in self.blocks:
            x, w = self._layer(block, x, bias, need_weights=True)
            maps.append(w)
        return maps

    @torch.no_grad()
    def max_logit(self, idx: torch.Tensor) -> float:
        """Largest pre-softmax attention logit q·k/√d_h over all layers, heads and causal pairs."""
        x, bias, best = self._embed(idx), self._bias(idx.shape[1], idx.device), -math.inf
        L = idx.shape[1]
        future = torch.ones(L, L, dtype=torch.bool, device=idx.device).triu(1)
        for block in self.blocks:
            q, k, _ = block.qkv(x if self.post_norm else block.norm1(x))
            k = k.repeat_interleave(block.num_heads // block.num_kv_heads, dim=1)
            s = (q @ k.transpose(-2, -1)) / math.sqrt(block.head_dim)
            best = max(best, float(s.masked_fill(future, -math.inf).max()))
            x = self._layer(block, x, bias)[0]
        return best

    @torch.no_grad()
    def generate(self, prompt: str, n: int, *, temperature: float = 0.8, seed: int = 0, window: int = 64) -> str:
        """Sample ``n`` characters after ``prompt`` (the last ``window`` characters as context: keep it
        at the training length — beyond it RoPE's loss rises, see the lesson)."""
        gen = torch.Generator().manual_seed(seed)
        idx, device = encode(prompt)[None], self.head.weight.device
        for _ in range(n):
            logits = self(idx[:, -window:].to(device))[0, -1] / temperature
            # sample on the CPU from fp64 probabilities: the same seed draws the same characters on any device
            nxt = torch.multinomial(torch.softmax(logits.double().cpu(), -1), 1, generator=gen)
            idx = torch.cat([idx, nxt[None]], dim=1)
        return decode(idx[0, len(prompt):])


def train_lm(data: TextData, *, steps: int = 600, lr: float = 3e-3, seed: int = 0, progress: bool = True,
             record_every: int = 0, device: torch.device | str | None = None, **model_kwargs):
    """Train a :class:`TinyLM` on ``data`` (on ``device``; default CPU); returns ``(model, losses, record)``.

    ``record_every=k``: every k steps, ``record`` gets ``(step, max attention logit, mean attention
    entropy in nats)`` measured on the current training batch (for the logit-growth experiment).
    """
    torch.manual_seed(seed)
    model = TinyLM(**model_kwargs).to(device or "cpu")        # initialised on the CPU: same weights anywhere
    record, step = [], [0]

    def forward(m, x):
        if record_every and step[0] % record_every == 0:
            was = m.training
            m.eval()
            maps = m.attention_maps(x[:8])
            ent = torch.stack([-(w * w.clamp_min(1e-30).log()).sum(-1).mean() for w in maps]).mean()
            record.append((step[0], m.max_logit(x[:8]), float(ent)))
            m.train(was)
        step[0] += 1
        return m(x)

    losses = fit(model, data.sample, steps=steps, lr=lr, seed=seed, progress=progress,
                 desc=f"TinyLM ({model.position})", forward=forward)
    return model, losses, record


def train_lm_many(data: TextData, *, seeds=(0, 1, 2), lrs=None, steps: int = 600, lr: float = 3e-3,
                  progress: bool = True, device: torch.device | str | None = None, **model_kwargs):
    """:func:`train_lm` for every seed (and, with ``lrs``, one peak learning rate per seed entry), as one batch;
    returns ``(models, losses)``, one entry per seed. Model i is the one ``train_lm(data, seed=seeds[i],
    lr=lrs[i])`` trains, to round-off (:func:`~attn_course.demos._train.fit_many`). Repeat a seed in ``seeds``
    to train it at several rates."""
    lrs = [lr] * len(seeds) if lrs is None else list(lrs)
    models = []
    for s in seeds:
        torch.manual_seed(s)
        models.append(TinyLM(**model_kwargs).to(device or "cpu"))
    losses = fit_many(models, data.sample, seeds=seeds, lr=lrs, steps=steps, progress=progress,
                      desc=f"{len(models)} TinyLMs ({models[0].position})")
    return models, losses


@torch.no_grad()
def loss_by_position(model: TinyLM, data: TextData, seq_len: int, *, batches: int = 4, batch_size: int = 16,
                     seed: int = 0) -> torch.Tensor:
    """Mean validation cross-entropy (nats) at every position 0..seq_len-1: ``(seq_len,)`` on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    device = model.head.weight.device
    total = torch.zeros(seq_len)
    for _ in range(batches):
        x, y = data.sample(gen, "val", seq_len=seq_len, batch_size=batch_size)
        logits = model(x.to(device))
        total += F.cross_entropy(logits.transpose(1, 2), y.to(device), reduction="none").mean(0).cpu()
    return total / batches


@torch.no_grad()
def head_scores(maps: list[torch.Tensor], idx: torch.Tensor, separator: int = 32) -> dict[str, torch.Tensor]:
    """Per (layer, head) scores in [0, 1] of four patterns, averaged over queries i ≥ 1:

    * ``previous``: weight on key i − 1 (a previous-token head);
    * ``first``: weight on key 0 (an "attention sink", Xiao et al. 2023);
    * ``induction``: weight on the keys j + 1 for which token j equals the current token i (and
      j + 1 < i − 1, so the previous token never counts) — "look at what followed this token last time" (Olsson et al. 2022), averaged over
      the queries that have such an earlier occurrence;
    * ``word boundary``: weight on the latest ``separator`` (ASCII space) before the previous token — the
      boundary just before the current word (the space itself, not the word's first letter) — averaged
      over the queries that have one.

    ``maps``: per layer ``(B, H, L, L)`` on any device; ``idx``: the tokens ``(B, L)``. Returns (layers, H)
    tensors on the CPU.
    """
    maps = [w.cpu() for w in maps]
    idx = idx.cpu()
    B, L = idx.shape
    i = torch.arange(L)
    prev = torch.stack([w[..., i[1:], i[1:] - 1].mean((0, 2)) for w in maps])          # (layers, H)
    first = torch.stack([w[..., 1:, 0].mean((0, 2)) for w in maps])
    same = idx[:, :, None] == idx[:, None, :]                                            # (B, i, j): x_i == x_j
    k = torch.arange(L)
    after = torch.zeros(B, L, L, dtype=torch.bool)                                       # (B, i, k): x_{k-1} == x_i
    after[:, :, 1:] = same[:, :, :-1]
    after &= (k[None, :] < k[:, None] - 1)[None]                # key k strictly before the previous token
    has = after.any(-1)                                                                  # (B, L) queries with a match
    ind = torch.stack([((w * after[:, None]).sum(-1) * has[:, None]).sum((0, 2)) / has.sum() for w in maps])
    # word boundary: the latest space j < i - 1 before query i (so the previous token never counts)
    is_sep = idx == separator                                                            # (B, L)
    last = torch.where(is_sep, k[None, :], torch.full_like(idx, -1)).cummax(-1).values  # latest separator <= i
    prev_sep = torch.cat([torch.full_like(last[:, :1], -1), last[:, :-1]], dim=-1)        # latest separator < i
    ok = (prev_sep >= 0) & (prev_sep < k[None, :] - 1)                                   # (B, L)
    word = torch.stack([(w.gather(-1, prev_sep.clamp_min(0)[:, None, :, None].expand(-1, w.shape[1], -1, 1))[..., 0]
                         * ok[:, None]).sum((0, 2)) / ok.sum() for w in maps])
    return {"previous": prev, "first": first, "induction": ind, "word boundary": word}
