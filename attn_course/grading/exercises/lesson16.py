"""Exercise set 16 — the capstone: your attention, in a tiny language model
(solutions/16_capstone_tiny_language_model.ipynb). One open exercise (kind "open").

The learner hands over ``make_model(vocab_size) -> nn.Module``: a character-level decoder with

* ``model(codes)``: codes (B, L) int64 -> logits (B, L, vocab_size);
* ``model.step(code, cache)``: code (B, 1), cache (None before the first token) -> (logits (B, 1, V), cache);
* ``model.kv_cache_bytes(n_tokens)``: the learner's count of the bytes the cache holds after n_tokens.

The course's trainer (:func:`attn_course.demos._train.fit`, a FIXED recipe, :data:`RECIPE`) trains it on the
training part of :func:`~attn_course.demos.textlm.stdlib_text`; the grader measures, on held-out inputs drawn
from its seed (training seed, held-out text windows, decode lengths), four things, one point each:

1. parameters ≤ :data:`PARAM_BUDGET`;
2. the decode path: ``step`` reproduces ``model(codes)`` on two held-out sequences decoded *interleaved*
   (so all state must live in the returned cache), and the reported cache bytes equal the measured ones;
3. the KV-cache budget: after :data:`KV_CONTEXT` tokens the cache holds ≤ :data:`KV_BUDGET` bytes per token
   (measured: every tensor reachable from the returned cache, each storage counted once);
4. the held-out loss (nats/char, computed HERE from the logits the child returns) < :data:`BAR`, the model
   causal (a later token never changes an earlier position's logits), within the parameter budget and the
   compute budget (:data:`FLOP_BUDGET` per forward pass over a training batch, counted, so the same on every
   machine). Wall time is bounded by the grader's own limit (``attn-course grade --timeout``, 60 s).

``measure_fn`` reports the measured numbers, which ``attn-course grade`` ranks in ``leaderboard.csv``.
"""
from __future__ import annotations

import math
import types

import torch
import torch.nn.functional as F
from torch import nn

from ..spec import Case, Exercise, Verdict, randint

__all__ = ["EXERCISES", "PARAM_BUDGET", "KV_BUDGET", "KV_CONTEXT", "FLOP_BUDGET", "BAR", "RECIPE",
           "EVAL_WINDOWS", "cache_bytes"]

VOCAB = 128                      # ASCII, as attn_course.demos.textlm
PARAM_BUDGET = 150_000           # parameters (every nn.Parameter of the model, shared ones once)
KV_CONTEXT = 128                 # the KV budget is measured after this many tokens of one sequence
KV_BUDGET = 512                  # bytes per token at KV_CONTEXT (float32 MHA, d=64, 2 layers: 1024)
FLOP_BUDGET = 1e9                # FLOPs of one forward pass over a training batch (32 x 64 characters), as
#   torch.utils.flop_counter counts them (matrix products and attention); the course's design: 0.41 GFLOP
BAR = 2.3                        # held-out nats/char (bigram table 2.57, unigram 3.15; the course's design ~1.9)
RECIPE = {"steps": 300, "batch_size": 32, "seq_len": 64, "lr": 3e-3}   # AdamW + one-cycle, fit()'s loop
EVAL_WINDOWS = 48                # held-out windows of RECIPE["seq_len"] characters


def _data():
    from ...demos.textlm import TextData
    return TextData(seq_len=RECIPE["seq_len"], batch_size=RECIPE["batch_size"])


def _windows(gen, n, L):
    """``n`` windows of held-out (validation) text: codes (n, L) and next characters (n, L)."""
    val = _data().val
    start = torch.randint(len(val) - L - 1, (n,), generator=gen)
    chunk = val[start[:, None] + torch.arange(L + 1)]
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def cache_bytes(cache) -> int:
    """Bytes of every tensor reachable from ``cache`` (through lists, tuples, dicts and plain objects'
    attributes), each underlying storage counted once: a view of a big preallocated buffer counts the buffer.
    Parameters and modules inside the cache are not cache."""
    seen_storage, seen = set(), set()
    total, stack = 0, [(cache, 0)]
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, nn.Parameter) or isinstance(obj, nn.Module):
            continue
        if isinstance(obj, torch.Tensor):
            s = obj.untyped_storage()
            key = (s.data_ptr(), s.nbytes(), str(obj.device))
            if key not in seen_storage:
                seen_storage.add(key)
                total += s.nbytes()
            continue
        if depth > 16 or id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool, type,
                                                                               types.ModuleType)):
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            stack += [(v, depth + 1) for v in obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack += [(v, depth + 1) for v in obj]
        elif hasattr(obj, "__dict__"):
            stack += [(v, depth + 1) for v in vars(obj).values()]
    return total


# ---- running the learner's design (in the sandboxed child) -----------------------------------------------

def _build(make_model, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = make_model(VOCAB)
    if not isinstance(model, nn.Module):
        raise TypeError(f"make_model must return a torch.nn.Module, got {type(model).__name__}")
    return model.cpu()


def _params(model) -> torch.Tensor:
    return torch.tensor(sum(p.numel() for p in model.parameters()), dtype=torch.int64)


@torch.no_grad()
def _decode(model, seqs: list[torch.Tensor]):
    """Decode the (1, T) sequences token by token, interleaved; returns (forward logits, decode logits,
    caches), logits (n, T, V) float32."""
    model.eval()
    full = torch.cat([model(s).float() for s in seqs])
    caches, outs = [None] * len(seqs), [[] for _ in seqs]
    for t in range(seqs[0].shape[1]):
        for n, s in enumerate(seqs):
            logits, caches[n] = model.step(s[:, t:t + 1], caches[n])
            outs[n].append(logits.float().reshape(1, 1, -1))
    return full, torch.cat([torch.cat(o, dim=1) for o in outs]), caches


def _answer(make_model, case: Case) -> dict[str, torch.Tensor]:
    model = _build(make_model, case.params["seed"])
    what = case.params["what"]
    if what == "parameters":
        return {"parameters": _params(model)}
    if what in ("decode", "kv budget"):
        seqs = [case.inputs[k] for k in sorted(case.inputs)]
        full, dec, caches = _decode(model, seqs)
        out = {"forward": full, "decode": dec, "measured": torch.tensor(cache_bytes(caches[0]), dtype=torch.int64)}
        if what == "decode":
            out["reported"] = torch.tensor(float(model.kv_cache_bytes(seqs[0].shape[1])), dtype=torch.float64)
        return out
    from ...demos._train import fit                           # "loss": the course's fixed recipe
    from torch.utils.flop_counter import FlopCounterMode
    data = _data()
    x, _ = data.sample(torch.Generator().manual_seed(case.params["seed"]))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    flops = counter.get_total_flops()
    fit(model, data.sample, steps=RECIPE["steps"], lr=RECIPE["lr"], seed=case.params["seed"], progress=False,
        desc="capstone")
    model.eval()
    with torch.no_grad():
        logits = model(case.inputs["x"]).float()
        probe = model(case.inputs["probe"]).float()
    return {"logits": logits, "probe": probe, "parameters": _params(model),
            "flops": torch.tensor(float(flops), dtype=torch.float64)}


# ---- cases, templates and the judge (in the trusted grader) ---------------------------------------------

def _cases(gen):
    seed = randint(gen, 0, 2**31 - 1)
    T = randint(gen, 24, 72)
    a, _ = _windows(gen, 2, T)
    kv, _ = _windows(gen, 1, KV_CONTEXT)
    x, y = _windows(gen, EVAL_WINDOWS, RECIPE["seq_len"])
    half = RECIPE["seq_len"] // 2
    probe = x.clone()
    probe[:, half:] = torch.randint(32, 127, (EVAL_WINDOWS, RECIPE["seq_len"] - half), generator=gen)
    return [
        Case(f"parameters ≤ {PARAM_BUDGET:,}", {}, {"what": "parameters", "seed": seed}),
        Case(f"step() reproduces model(codes) on two sequences decoded interleaved, and kv_cache_bytes({T}) "
             f"is what the cache holds", {"a": a[:1], "b": a[1:]}, {"what": "decode", "seed": seed}),
        Case(f"KV cache ≤ {KV_BUDGET} bytes per token after {KV_CONTEXT} tokens", {"a": kv},
             {"what": "kv budget", "seed": seed}),
        Case(f"held-out loss < {BAR} nats/char after the course's training recipe", {"x": x, "y": y, "probe": probe},
             {"what": "loss", "seed": seed}),
    ]


def _expected(case: Case) -> dict[str, torch.Tensor]:
    """Templates (dtype and shape) of the answers; the judge measures, it has no reference values."""
    i64, f64 = torch.tensor(0, dtype=torch.int64), torch.tensor(0.0, dtype=torch.float64)
    what = case.params["what"]
    if what == "parameters":
        return {"parameters": i64}
    if what in ("decode", "kv budget"):
        n, T = len(case.inputs), case.inputs["a"].shape[1]
        out = {"forward": torch.zeros(n, T, VOCAB), "decode": torch.zeros(n, T, VOCAB), "measured": i64}
        return out | ({"reported": f64} if what == "decode" else {})
    return {"logits": torch.zeros(*case.inputs["x"].shape, VOCAB), "probe": torch.zeros(*case.inputs["x"].shape, VOCAB),
            "parameters": i64, "flops": f64}


def heldout_loss(logits: torch.Tensor, y: torch.Tensor) -> float:
    """Mean cross-entropy in nats per character, in float64."""
    return float(F.cross_entropy(logits.double().flatten(0, 1), y.flatten()))


def _decode_ok(got) -> tuple[bool, str]:
    f, d = got["forward"].double(), got["decode"].double()
    if not (torch.isfinite(f).all() and torch.isfinite(d).all()):
        return False, "your logits are not finite (NaN or inf)."
    bad = ~torch.isclose(d, f, atol=1e-3, rtol=1e-3).all(-1)                   # (n, T)
    if not bad.any():
        return True, ""
    t = int(bad.any(0).nonzero()[0])
    return False, (f"step()'s logits differ from model(codes)'s at token {t}: give each step its true position "
                   f"(RoPE/ALiBi at t, not 0), attend over every cached key (with the same window and masks as the "
                   f"forward), and keep each sequence's state in the cache step returns — the grader decodes two "
                   f"sequences interleaved, so state kept in the model or a global breaks.")


def _judge(got, want, case) -> Verdict:
    what = case.params["what"]
    if what == "parameters":
        n = int(got["parameters"])
        if n <= PARAM_BUDGET:
            return Verdict(True, note=f"{n:,} parameters")
        return Verdict(False, f"your model has {n:,} parameters, over the budget of {PARAM_BUDGET:,}: make it "
                              f"narrower or shallower, tie the head to the embedding, or use fewer KV heads.")
    if what in ("decode", "kv budget"):
        ok, hint = _decode_ok(got)
        if not ok:
            return Verdict(False, hint)
        measured = int(got["measured"])
        T = case.inputs["a"].shape[1]
        if what == "kv budget":
            per = measured / T
            if per <= KV_BUDGET:
                return Verdict(True, note=f"{per:g} bytes per token")
            return Verdict(False, f"after {T} tokens your cache holds {measured:,} bytes = {per:g} bytes per token, "
                                  f"over the budget of {KV_BUDGET}: use fewer KV heads (GQA/MQA), a window, a "
                                  f"latent cache (MLA), a smaller head_dim or fewer layers.")
        rep = float(got["reported"])
        if math.isfinite(rep) and abs(rep - measured) <= 0.01 * measured + 0.5:
            return Verdict(True, note=f"{measured:,} bytes after {T} tokens, as you report")
        hint = (f"kv_cache_bytes({T}) returns {rep:g}, but the cache your step returned holds {measured:,} bytes "
                f"(every tensor reachable from it, float32 = 4 bytes each)")
        for factor, why in [(T, "you report bytes per token: return the total after n_tokens"),
                            (4, "you count elements, not bytes: a float32 is 4 bytes"),
                            (2, "you count only the keys or only the values: the cache holds both")]:
            if measured and abs(rep * factor - measured) <= 0.01 * measured + 0.5 and math.isfinite(rep):
                hint += f" — {why}"
                break
        return Verdict(False, hint + ".")
    # loss
    n, flops = int(got["parameters"]), float(got["flops"])
    logits, probe = got["logits"], got["probe"]
    if not torch.isfinite(logits).all():
        return Verdict(False, "your model's held-out logits are not finite (NaN or inf) after training.")
    half = logits.shape[1] // 2
    if not torch.allclose(probe[:, :half].double(), logits[:, :half].double(), atol=1e-4, rtol=1e-3):
        return Verdict(False, "your model looks at later characters: changing characters after position i changed "
                              "the logits at i — a decoder must mask the future (a causal mask), else it learns to "
                              "copy the next character and its loss means nothing.")
    loss = heldout_loss(logits, case.inputs["y"])
    if n > PARAM_BUDGET:
        return Verdict(False, f"held-out loss {loss:.2f}, but with {n:,} parameters (budget {PARAM_BUDGET:,}) it "
                              f"does not count.")
    if flops > FLOP_BUDGET:
        return Verdict(False, f"held-out loss {loss:.2f}, but one forward pass over a training batch costs "
                              f"{flops / 1e9:.2f} GFLOP, over the budget of {FLOP_BUDGET / 1e9:g}: your model computes "
                              f"too much per character, so it does not count.")
    if loss < BAR:
        return Verdict(True, note=f"held-out loss {loss:.1f} < {BAR} nats/char")
    return Verdict(False, f"held-out loss {loss:.2f} nats/char is not below the bar {BAR} (a bigram table reaches "
                          f"2.57): does every layer attend to earlier characters, and does the residual stream reach "
                          f"the head?")


def _measure(got, case) -> dict:
    """The leaderboard's numbers from one case's answer (plain values; booleans are budget checks)."""
    what = case.params["what"]
    if what == "parameters":
        n = int(got["parameters"])
        return {"parameters": n, "parameters within budget": n <= PARAM_BUDGET}
    if what == "kv budget":
        per = int(got["measured"]) / case.inputs["a"].shape[1] if _decode_ok(got)[0] else float("nan")
        return {"KV bytes/token": per, "KV within budget": per <= KV_BUDGET}
    if what == "loss":
        flops = float(got["flops"])
        return {"held-out loss": round(heldout_loss(got["logits"], case.inputs["y"]), 4),
                "GFLOP per batch": round(flops / 1e9, 3), "compute within budget": flops <= FLOP_BUDGET}
    return {}


EXERCISES = [
    Exercise("16_capstone", 4, "Your attention, in a tiny language model",
             "a function make_model(vocab_size) -> nn.Module with forward(codes), step(code, cache) and "
             "kv_cache_bytes(n_tokens)",
             _cases, _answer, _expected, _judge, kind="open", measure_fn=_measure, rank_by="held-out loss"),
]
