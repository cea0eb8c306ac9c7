"""Lesson 04's digit task with a whole encoder–decoder: the three attentions of Vaswani et al. (2017, §3.2.3).

Same data as :mod:`attn_course.demos.cross` (3–6 distinct digits -> their names, smallest first), but the
model now has all three attention blocks of an encoder–decoder, one layer each:

* **encoder self-attention** — every source digit reads the other source digits (padding masked);
* **decoder self-attention**, causal — each output word reads the words produced so far (learned positions);
* **cross-attention** — each output word reads the encoded source (padding masked).

All three are :class:`~attn_course.cross.CrossAttention`: self-attention is cross-attention whose keys and
values come from the same sequence as its queries.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..cross import CrossAttention
from .cross import BOS, MAX_LEN, PAD, sample_batch, train_seq2seq

__all__ = ["ToyEncoderDecoder", "train_encoder_decoder", "train_encoder_decoders", "translate", "exact_match"]


def _mlp(d: int) -> nn.Module:
    return nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))


class ToyEncoderDecoder(nn.Module):
    """One encoder layer (self-attention + MLP) and one decoder layer (causal self-attention, cross-attention, MLP).

    ``forward(src (B, Ls), tgt_in (B, Lt), need_weights=False) -> (logits (B, Lt, 10), weights)`` with
    ``weights = (encoder self (B, H, Ls, Ls), decoder self (B, H, Lt, Lt), cross (B, H, Lt, Ls))`` (or Nones).
    """

    def __init__(self, d_model: int = 64, num_heads: int = 1):
        super().__init__()
        self.src_emb = nn.Embedding(11, d_model)           # digits 0..9 and PAD; no positions: the source is a set
        self.tgt_emb = nn.Embedding(11, d_model)           # words 0..9 and BOS
        self.tgt_pos = nn.Embedding(MAX_LEN, d_model)      # the decoder's output positions
        self.enc_self = CrossAttention(d_model, num_heads)
        self.enc_mlp = _mlp(d_model)
        self.dec_self = CrossAttention(d_model, num_heads)
        self.cross = CrossAttention(d_model, num_heads)
        self.dec_mlp = _mlp(d_model)
        self.head = nn.Linear(d_model, 10)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, need_weights: bool = False):
        keep = (src != PAD)[:, None, None, :]            # (B, 1, 1, Ls): padding_mask, written so vmap can batch it
        e = self.src_emb(src)                                                       # (B, Ls, d)
        a, w_enc = self.enc_self(e, e, attn_mask=keep, need_weights=need_weights)  # Q, K, V from the source
        e = e + a
        e = e + self.enc_mlp(e)                                                     # the encoder's output C
        Lt = tgt_in.shape[1]
        h = self.tgt_emb(tgt_in) + self.tgt_pos(torch.arange(Lt, device=tgt_in.device))
        causal = torch.ones(Lt, Lt, dtype=torch.bool, device=h.device).tril()      # word i reads words <= i
        a, w_dec = self.dec_self(h, h, attn_mask=causal, need_weights=need_weights)
        h = h + a
        a, w_cross = self.cross(h, e, attn_mask=keep, need_weights=need_weights)   # Q from the decoder, K, V from C
        h = h + a
        h = h + self.dec_mlp(h)
        return self.head(h), (w_enc, w_dec, w_cross)


def train_encoder_decoder(steps: int = 300, *, seed: int = 0, d_model: int = 64, num_heads: int = 1,
                          lr: float = 5e-3, progress: bool = True, device=None):
    """Train a fresh :class:`ToyEncoderDecoder` on the digit task; returns ``(model, losses)``."""
    return train_encoder_decoders(steps, seeds=[seed], d_model=d_model, num_heads=num_heads, lr=lr,
                                  progress=progress, device=device)[0]


def train_encoder_decoders(steps: int = 300, *, seeds: Sequence[int] = (0, 1, 2), d_model: int = 64,
                           num_heads: int = 1, lr: float = 5e-3, progress: bool = False,
                           device=None) -> list[tuple[ToyEncoderDecoder, list[float]]]:
    """:func:`train_encoder_decoder` for every seed, trained together as one batch; ``[(model, losses)]``."""
    return train_seq2seq(ToyEncoderDecoder, steps, seeds=seeds, d_model=d_model, num_heads=num_heads, lr=lr,
                         progress=progress, device=device, desc="encoder-decoder")


@torch.no_grad()
def translate(model: ToyEncoderDecoder, src: torch.Tensor):
    """Greedy decoding, one word per source position: ``src (B, Ls)`` -> ``(words (B, Ls), (w_enc, w_dec,
    w_cross))`` from the last decoding step (CPU tensors; rows past a sentence's length are meaningless)."""
    model.eval()
    src = src.to(next(model.parameters()).device)
    tgt_in = torch.full_like(src, BOS)
    for i in range(src.shape[1]):
        logits, w = model(src, tgt_in, need_weights=True)
        if i + 1 < src.shape[1]:
            tgt_in[:, i + 1] = logits[:, i].argmax(-1)
    return logits.argmax(-1).cpu(), tuple(t.cpu() for t in w)


def exact_match(model: ToyEncoderDecoder, n: int = 1000, seed: int = 1) -> float:
    """Fraction of ``n`` fresh sentences translated entirely right by greedy decoding."""
    src, _, tgt_out, _ = sample_batch(torch.Generator().manual_seed(seed), n)
    words, _ = translate(model, src)
    return ((words == tgt_out) | (tgt_out == -100)).all(-1).float().mean().item()
