"""The course's pretrained language models: three small character-level decoders, trained once on the
docstrings of Python's standard library, that differ in one thing only — how a head may decline to attend::

    plain   softmax attention                                  p_ij = exp(s_ij) / Σ_j' exp(s_ij')
    gated   the same, each head's output times a sigmoid gate   o_i ⊙ σ(W_g x_i)            (Qwen3-Next, G1)
    sink    the same, one learned logit b_h per head in every   p_ij = exp(s_ij) / (exp(b_h) + Σ_j' exp(s_ij'))
            row's softmax, with no value behind it              (gpt-oss)

Everything else is the course's own pre-norm :class:`~attn_course.TransformerBlock` (RMSNorm, RoPE,
SwiGLU, no QK-norm) and the same seed, data stream and schedule. Every window the models saw in
training starts with the BOS token (ASCII 0x02, "start of text"), so position 0 always holds the same token
— the condition under which attention sinks form (Xiao et al. 2023).

``load(variant)`` reads the half-precision weights shipped in ``attn_course/data/pretrained/``; its
training record (recipe, loss curve, held-out loss, the attention paid to BOS and an induction score at
checkpoints during training, the machine) sits beside them as JSON. ``attn-course train-lm`` retrains a
model with the same recipe (:func:`train`).

The model's forward takes an optional ``keep`` mask: which keys each query may read (AND-ed with causality),
and ``renumber``: StreamingLLM's re-numbering of positions inside the cache (see
:func:`streaming_mask`). :func:`evaluate` measures held-out loss under such a mask.
"""
from __future__ import annotations

import json
import lzma
import math
import platform
import time
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from .block import TransformerBlock
from .functional import masked_softmax
from .norm import RMSNorm

__all__ = ["VARIANTS", "BOS", "RECIPE", "Tokenizer", "CourseLM", "load", "record", "held_out_text",
           "train_text", "windows", "evaluate", "streaming_mask", "first_token_share", "induction_score", "residual_max",
           "bigram_loss", "train"]

VARIANTS = ("plain", "gated", "sink")
BOS = 2                      # ASCII STX ("start of text"): never in the corpus
VOCAB = 128                  # ASCII
DATA = Path(__file__).resolve().parent / "data"
CORPUS = DATA / "stdlib_docs.txt.xz"
WEIGHTS = DATA / "pretrained"

# The recipe every shipped model was trained with (`attn-course train-lm` defaults).
RECIPE = dict(d_model=128, num_layers=4, num_heads=4, context=256, batch_size=16, steps=2000, lr=3e-3,
              min_lr_ratio=0.1, warmup=100, weight_decay=0.1, grad_clip=1.0, seed=0, eval_every=250,
              eval_windows=64)


# -- text -------------------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _splits() -> tuple[str, str]:
    body = lzma.decompress(CORPUS.read_bytes()).decode("ascii")
    _header, _, rest = body.partition("\n")
    train_part, held = rest.split("\x1e")
    return train_part, held


def train_text() -> str:
    """The corpus's training split (about 1.1 million characters)."""
    return _splits()[0]


def held_out_text() -> str:
    """The corpus's held-out split (about 60,000 characters), exactly as shipped: no model trained on it."""
    return _splits()[1]


def corpus_header() -> str:
    """The corpus's first line: which CPython froze it, its licence, its document counts."""
    return lzma.decompress(CORPUS.read_bytes()).decode("ascii").partition("\n")[0]


class Tokenizer:
    """Characters as their ASCII codes (anything else becomes '?'), with BOS = 2 in front."""

    bos, vocab_size = BOS, VOCAB

    def encode(self, text: str, *, bos: bool = True) -> torch.Tensor:
        codes = list(text.encode("ascii", errors="replace"))
        return torch.tensor(([BOS] if bos else []) + codes, dtype=torch.long)

    def decode(self, ids) -> str:
        return bytes(int(c) for c in ids if int(c) != BOS).decode("ascii", errors="replace")

    def __repr__(self) -> str:
        return "Tokenizer(ASCII, vocab 128, BOS=2)"


# -- the model --------------------------------------------------------------------------------------------

class CourseBlock(TransformerBlock):
    """A :class:`~attn_course.TransformerBlock` whose heads may also be gated (``gate_proj``) or have a sink
    logit (``sinks``). ``forward(x, keep=None, renumber=None, need_weights=False)``."""

    def __init__(self, d_model: int, num_heads: int, variant: str = "plain"):
        super().__init__(d_model, num_heads, rope=True)
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        self.variant = variant
        if variant == "gated":
            self.gate_proj = nn.Linear(d_model, d_model, bias=False)           # g = W_g x, one gate per channel
        if variant == "sink":
            self.sinks = nn.Parameter(torch.zeros(num_heads))                   # b_h

    def attention(self, h: torch.Tensor, keep: torch.Tensor | None = None,
                  renumber: tuple[int, torch.Tensor] | None = None, need_weights: bool = False):
        """The attention sub-layer on ``h = norm1(x)`` (B, L, d): ``(out (B, L, d), weights (B, H, L, L) | None)``.

        ``keep`` (L, L) bool, True = may read (causality is added); ``renumber = (n, positions (L,))``: the
        position each query takes when it scores the first ``n`` keys (StreamingLLM's cache positions).
        """
        B, L, _ = h.shape
        if keep is None and renumber is None and not need_weights:
            q, k, v = self.qkv(h)                                               # (B, H, L, d_h), RoPE at 0..L-1
            if self.variant == "sink":      # the sink as one more key whose score is b_h and whose value is 0
                zero = q.new_zeros(B, self.num_heads, 1, self.head_dim)
                bias = torch.full((L, L), float("-inf"), dtype=q.dtype, device=h.device).triu(1)
                bias = torch.cat((bias.expand(self.num_heads, L, L),
                                  self.sinks.to(q.dtype)[:, None, None].expand(-1, L, 1)), dim=-1)
                o = F.scaled_dot_product_attention(q, torch.cat((k, zero), 2), torch.cat((v, zero), 2),
                                                   attn_mask=bias)
            else:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            w = None
        else:
            o, w = self._explicit(h, keep, renumber)
        if self.variant == "gated":
            o = o * torch.sigmoid(rearrange(self.gate_proj(h), "b l (h d) -> b h l d", h=self.num_heads))
        return self.attn.out_proj(rearrange(o, "b h l d -> b l (h d)")), (w if need_weights else None)

    def _explicit(self, h, keep, renumber):
        L = h.shape[1]
        q, k, v = self.qkv(h)
        s = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)                 # (B, H, L, L)
        if renumber is not None:      # scores against the first n keys, from the query's cache position
            n_first, positions = renumber
            q_alt, _, _ = self.qkv(h, positions=positions.to(h.device))
            s_alt = q_alt @ k[..., :n_first, :].transpose(-2, -1) / math.sqrt(self.head_dim)
            s = torch.cat((s_alt, s[..., n_first:]), dim=-1)
        allowed = torch.ones(L, L, dtype=torch.bool, device=h.device).tril()
        if keep is not None:
            allowed = allowed & keep.to(h.device)
        s = s.masked_fill(~allowed, float("-inf"))
        if self.variant == "sink":
            b = self.sinks.to(s.dtype)[:, None, None].expand(*s.shape[:-1], 1)
            p = torch.softmax(torch.cat((s, b), dim=-1), dim=-1)[..., :-1]
        else:
            p = masked_softmax(s)
        return p @ v, p

    def forward(self, x, keep=None, renumber=None, need_weights=False):
        out, w = self.attention(self.norm1(x), keep, renumber, need_weights)
        x = x + out
        return x + self.ffn(self.norm2(x)), w


class CourseLM(nn.Module):
    """``logits = head(RMSNorm(blocks(embed(ids))))``: (B, L) long -> (B, L, 128)."""

    def __init__(self, variant: str = "plain", d_model: int = 128, num_layers: int = 4, num_heads: int = 4,
                 context: int = 256):
        super().__init__()
        self.variant, self.context = variant, context
        self.embed = nn.Embedding(VOCAB, d_model)
        self.blocks = nn.ModuleList(CourseBlock(d_model, num_heads, variant) for _ in range(num_layers))
        self.norm = RMSNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB, bias=False)

    def init_weights(self, seed: int) -> "CourseLM":
        """GPT-2's initialisation: N(0, 0.02) everywhere, residual outputs scaled by 1/√(2·layers); sinks 0."""
        gen = torch.Generator().manual_seed(seed)
        n = len(self.blocks)
        for name, p in self.named_parameters():
            if name.endswith("sinks") or "norm" in name:
                continue
            std = 0.02 / math.sqrt(2 * n) if name.endswith(("out_proj.weight", "w2.weight")) else 0.02
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) * std)
        return self

    def forward(self, ids: torch.Tensor, keep: torch.Tensor | None = None,
                renumber: tuple[int, torch.Tensor] | None = None) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, keep, renumber)[0]
        return self.head(self.norm(x))

    @torch.no_grad()
    def attention_maps(self, ids: torch.Tensor, keep: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Per layer, the attention weights ``(B, H, L, L)`` on ``ids`` (rows of the sink variant sum to < 1)."""
        x, maps = self.embed(ids), []
        for block in self.blocks:
            x, w = block(x, keep, None, need_weights=True)
            maps.append(w)
        return maps


# -- loading ----------------------------------------------------------------------------------------------

def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")


def record(variant: str, root: Path | None = None) -> dict:
    """The training record shipped beside ``variant``'s weights (recipe, curves, machine, held-out loss)."""
    _check_variant(variant)
    return json.loads(((root or WEIGHTS) / f"{variant}.json").read_text())


def load(variant: str, *, device=None, root: Path | None = None) -> tuple[CourseLM, Tokenizer]:
    """``(model, tokenizer)`` for ``variant`` in {"plain", "gated", "sink"}: offline, fp32, eval mode."""
    _check_variant(variant)
    rec = record(variant, root)
    r = rec["recipe"]
    model = CourseLM(variant, r["d_model"], r["num_layers"], r["num_heads"], r["context"])
    state = torch.load((root or WEIGHTS) / f"{variant}.pt", map_location="cpu", weights_only=True)
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return model.to(device or "cpu").eval(), Tokenizer()


# -- measurements -----------------------------------------------------------------------------------------

def streaming_mask(L: int, window: int, n_sink: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """StreamingLLM's cache as a mask: query i reads its last ``window`` tokens and the first ``n_sink``.

    Returns ``(keep (L, L) bool, renumber)``, ``renumber = (n_sink, positions (L,))`` or None. Inside the cache positions are
    re-numbered (Xiao et al. 2023, §3.2): the cached tokens sit at 0..n_sink+window−1, so a query whose
    window has slid past the first tokens scores them from position ``min(i, n_sink + window − 1)``, while
    window keys keep their true distances. With ``n_sink = 0`` no re-numbering changes any distance.
    """
    i = torch.arange(L)
    keep = (i[:, None] - i[None, :] < window) | (i[None, :] < n_sink)
    if n_sink == 0:
        return keep, None
    return keep, (n_sink, torch.clamp(i, max=n_sink + window - 1))


def windows(text: str | None = None, context: int = 256, n: int | None = None) -> torch.Tensor:
    """Non-overlapping windows of ``context − 1`` characters of ``text`` (default: the held-out split), each with
    BOS in front: ``(N, context)``; the first ``n`` only if given."""
    codes = Tokenizer().encode(held_out_text() if text is None else text, bos=False)
    m = (len(codes) // (context - 1))
    if n is not None:
        m = min(m, n)
    body = codes[: m * (context - 1)].view(m, context - 1)
    return torch.cat((torch.full((m, 1), BOS), body), dim=1)


@torch.no_grad()
def evaluate(model: CourseLM, text: str | None = None, *, keep=None, renumber=None,
             context: int | None = None, positions: slice | None = None, batch_size: int = 16,
             max_windows: int | None = None, per_position: bool = False):
    """Mean next-character loss (nats) over ``text`` (default: the held-out split) cut into BOS-led windows
    (:func:`windows`), scoring the predictions made at query ``positions`` of each window (default: all; query i
    predicts character i+1). ``per_position=True``: the mean at each query position instead, ``(context − 1,)``."""
    L = context or model.context
    w = windows(held_out_text() if text is None else text, L, max_windows)
    dev = next(model.parameters()).device
    total, count, by_pos = 0.0, 0, torch.zeros(L - 1, dtype=torch.float64)
    for b in range(0, len(w), batch_size):
        x = w[b: b + batch_size].to(dev)
        logits = model(x[:, :-1], keep=None if keep is None else keep[: L - 1, : L - 1],
                       renumber=None if renumber is None else (renumber[0], renumber[1][: L - 1]))
        nll = F.cross_entropy(logits.transpose(1, 2).float(), x[:, 1:], reduction="none")   # (b, L-1)
        by_pos += nll.double().sum(0).cpu()
        if positions is not None:
            nll = nll[:, positions]
        total += nll.double().sum().item()
        count += nll.numel()
    return by_pos / len(w) if per_position else total / count


@torch.no_grad()
def first_token_share(model: CourseLM, ids: torch.Tensor, start: int = 16) -> torch.Tensor:
    """(layers, heads): the mean attention weight on position 0 (BOS) of queries at ``start`` and later."""
    return torch.stack([w[:, :, start:, 0].mean(dim=(0, 2)) for w in model.attention_maps(ids)])


@torch.no_grad()
def residual_max(model: CourseLM, ids: torch.Tensor) -> list[float]:
    """The largest absolute activation of the residual stream after each block (the "massive activations" that
    accompany attention sinks in large models, Sun et al. 2024), on ``ids`` (B, L)."""
    x, out = model.embed(ids), []
    for block in model.blocks:
        x = block(x)[0]
        out.append(x.abs().max().item())
    return out


@torch.no_grad()
def induction_score(model: CourseLM, n: int = 64, batch: int = 8, seed: int = 0) -> dict:
    """A repeated random sequence, BOS + r + r (r: ``n`` random printable characters).

    Returns the mean loss on the first and second copy, and per (layer, head) the mean attention from a token
    of the second copy to the token *after* its earlier occurrence (an induction head puts weight there;
    the uniform baseline is about 1 / position)."""
    gen = torch.Generator().manual_seed(seed)
    r = torch.randint(33, 127, (batch, n), generator=gen)
    ids = torch.cat((torch.full((batch, 1), BOS), r, r), dim=1)                       # (B, 1 + 2n)
    logits = model(ids[:, :-1])
    nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")       # targets 1..2n
    first, second = nll[:, : n].mean().item(), nll[:, n + 1:].mean().item()
    maps = model.attention_maps(ids)
    q = torch.arange(n + 2, 2 * n + 1)            # queries in the second copy (not its first token)
    target = q - n + 1                            # the token after the earlier occurrence of ids[q]
    score = torch.stack([w[:, :, q, target].mean(dim=(0, 2)) for w in maps])          # (layers, heads)
    return {"loss_first_copy": first, "loss_second_copy": second, "score": score}


def bigram_loss(text: str, fit_text: str | None = None) -> float:
    """Cross-entropy (nats/char) on ``text`` of an add-one bigram table counted on ``fit_text`` (default: the
    same text — a table that has seen the very characters it is scored on, the baseline issue's strict form)."""
    codes = Tokenizer().encode(text, bos=False)
    fit = codes if fit_text is None else Tokenizer().encode(fit_text, bos=False)
    counts = torch.ones(VOCAB, VOCAB, dtype=torch.float64)
    counts.index_put_((fit[:-1], fit[1:]), torch.ones(len(fit) - 1, dtype=torch.float64), accumulate=True)
    logp = (counts / counts.sum(1, keepdim=True)).log()
    return -logp[codes[:-1], codes[1:]].mean().item()


# -- training ---------------------------------------------------------------------------------------------

def _lr(step: int, r: dict) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio``·lr at the last step."""
    if step < r["warmup"]:
        return r["lr"] * (step + 1) / r["warmup"]
    t = (step - r["warmup"]) / max(1, r["steps"] - r["warmup"])
    return r["lr"] * (r["min_lr_ratio"] + (1 - r["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * t)))


def _machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads()}


def train(variant: str, out: Path | str | None = None, *, steps: int | None = None, log=print, **overrides) -> dict:
    """Train ``variant`` from scratch with :data:`RECIPE` (``overrides`` change entries: a reduced size for
    tests). Writes ``out/<variant>.pt`` (fp16 weights) and ``out/<variant>.json`` (the record); returns the record."""
    _check_variant(variant)
    r = dict(RECIPE, **overrides)
    if steps is not None:
        r["steps"] = int(steps)
        r["warmup"] = min(r["warmup"], max(1, r["steps"] // 10))
        r["eval_every"] = min(r["eval_every"], max(1, r["steps"] // 4))
    torch.manual_seed(r["seed"])
    model = CourseLM(variant, r["d_model"], r["num_layers"], r["num_heads"], r["context"]).init_weights(r["seed"])
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": r["weight_decay"]},
                             {"params": other, "weight_decay": 0.0}], lr=r["lr"], betas=(0.9, 0.95))
    data = Tokenizer().encode(train_text(), bos=False)
    gen = torch.Generator().manual_seed(r["seed"])
    probe = windows(held_out_text(), r["context"], 8)
    L = r["context"]
    curve, checkpoints = [], []
    t0 = time.time()

    def checkpoint(step):
        model.eval()
        ind = induction_score(model)
        checkpoints.append({"step": step,
                            "held_out_loss": evaluate(model, max_windows=r["eval_windows"]),
                            "first_token_share": first_token_share(model, probe).tolist(),
                            "induction": {"loss_first_copy": ind["loss_first_copy"],
                                          "loss_second_copy": ind["loss_second_copy"],
                                          "score": ind["score"].tolist()},
                            "seconds": round(time.time() - t0, 1)})
        model.train()
        log(f"[{variant}] step {step}: held-out {checkpoints[-1]['held_out_loss']:.4f}, "
            f"copy-2 loss {ind['loss_second_copy']:.3f}, {checkpoints[-1]['seconds']:.0f} s")

    model.train()
    checkpoint(0)
    for step in range(r["steps"]):
        start = torch.randint(len(data) - L, (r["batch_size"],), generator=gen)
        body = data[start[:, None] + torch.arange(L)]                                 # (B, L) characters
        x = torch.cat((torch.full((r["batch_size"], 1), BOS), body[:, :-1]), dim=1)   # BOS, c_0 .. c_{L-2}
        for g in opt.param_groups:
            g["lr"] = _lr(step, r)
        loss = F.cross_entropy(model(x).flatten(0, 1), body.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r["grad_clip"])
        opt.step()
        curve.append(round(loss.item(), 4))
        if (step + 1) % r["eval_every"] == 0 or step + 1 == r["steps"]:
            checkpoint(step + 1)
    model.eval()
    state = {k: v.half() for k, v in model.state_dict().items()}
    # the recorded held-out loss is measured on the weights as shipped (fp16, loaded back to fp32)
    shipped = CourseLM(variant, r["d_model"], r["num_layers"], r["num_heads"], r["context"])
    shipped.load_state_dict({k: v.float() for k, v in state.items()})
    shipped.eval()
    held = held_out_text()
    rec = {"variant": variant, "recipe": r, "corpus": corpus_header(),
           "train_loss": curve, "checkpoints": checkpoints,
           "held_out_loss": evaluate(shipped),
           "bigram_loss_fitted_on_held_out": bigram_loss(held),
           "bigram_loss_fitted_on_train": bigram_loss(held, train_text()),
           "parameters": sum(p.numel() for p in model.parameters()),
           "seconds": round(time.time() - t0, 1), "machine": _machine()}
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        torch.save(state, out / f"{variant}.pt")
        (out / f"{variant}.json").write_text(json.dumps(rec, indent=1))
    log(f"[{variant}] held-out {rec['held_out_loss']:.4f} nats/char; bigram fitted on held-out "
        f"{rec['bigram_loss_fitted_on_held_out']:.4f}")
    return rec


def main(argv: list[str] | None = None) -> int:
    """``attn-course train-lm --variant plain|gated|sink [--out DIR] [--steps N]``."""
    import argparse
    p = argparse.ArgumentParser(prog="attn-course train-lm",
                                description="Retrain one of the course's pretrained models with the shipped recipe "
                                            "(seeded; writes DIR/<variant>.pt and DIR/<variant>.json).")
    p.add_argument("--variant", required=True, choices=VARIANTS)
    p.add_argument("--out", default="pretrained-lm", help="output folder (default: ./pretrained-lm)")
    p.add_argument("--steps", type=int, default=None, help=f"training steps (default {RECIPE['steps']}, the recipe's)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be at least 1, got {args.steps}")
    if args.threads:
        torch.set_num_threads(args.threads)
    rec = train(args.variant, args.out, steps=args.steps, log=lambda s: print(s, flush=True))
    shipped = record(args.variant)
    if args.steps is None or args.steps == shipped["recipe"]["steps"]:
        print(f"shipped model: held-out {shipped['held_out_loss']:.4f}; this run: {rec['held_out_loss']:.4f} "
              f"(difference {rec['held_out_loss'] - shipped['held_out_loss']:+.4f})")
    return 0
