"""Exercise set 16 — the capstone: your attention, in a tiny language model
(solutions/16_capstone_tiny_language_model.ipynb). One open exercise (kind "open").

The learner hands over ``make_model(vocab_size) -> nn.Module``: a character-level decoder with

* ``model(codes)``: codes (B, L) int64 -> logits (B, L, vocab_size);
* ``model.step(code, cache)``: code (B, 1), cache (None before the first token) -> (logits (B, 1, V), cache);
* ``model.kv_cache_bytes(n_tokens)``: the learner's count of the bytes the cache holds after n_tokens.

The course's trainer (:func:`attn_course.demos._train.fit`, a FIXED recipe, :data:`RECIPE`) trains it on the
training part of :func:`~attn_course.demos.textlm.stdlib_text`; the grader measures four things, one point each:

1. parameters and buffers ≤ :data:`PARAM_BUDGET` (a buffer is learned or looked-up data all the same);
2. the decode path: ``step`` reproduces ``model(codes)`` on two held-out sequences decoded *interleaved*
   (so all state must live in the returned cache), and the reported cache bytes equal the measured ones;
3. the KV cache, on one sequence of :data:`KV_CONTEXT` tokens: ≤ :data:`KV_BUDGET` bytes per token (measured:
   every tensor reachable from the returned cache, each storage counted once), and it is a real cache —
   every tensor in it is floating point (keys, values, latents, states; a position may be an int), the step
   at token :data:`KV_CONTEXT` costs at most :data:`STEP_GROWTH` × the FLOPs of the step at token
   :data:`STEP_EARLY` (a step that re-runs the model over the prefix costs 16×), and every one of the
   :data:`KV_CONTEXT` tokens reaches the last position's logits (the cache serves the whole context);
4. the held-out loss (nats/char, computed HERE from the logits the child returns) < :data:`BAR`, on the WHOLE
   held-out split cut into windows of :data:`KV_CONTEXT` characters (the length the cache is measured at),
   from a model that is causal, within the parameter budget and the compute budget (:data:`FLOP_BUDGET` per
   forward pass over a training batch, counted, so the same on every machine).

Seeds: the exercise ranks a class (``rank_by``), so :func:`~attn_course.grading.selfcheck.exercise_seed` gives
every submission the SAME seed (from the exercise id, or ``attn-course grade --seed``): the same training seed,
the same causality probe; editing a comment re-rolls nothing. Wall time: ``time_factor`` — the grader's limit
for this lesson is that many times the course's own solution's run, measured at grade time on the grader's
machine (:func:`attn_course.grading.runner.calibrate`), never below ``--timeout``.

``measure_fn`` reports the measured numbers (the loss with ± 2 standard errors over the held-out windows),
which ``attn-course grade`` ranks in ``leaderboard.csv``, marking designs within noise of each other.
"""
from __future__ import annotations

import math
import time
import types

import torch
import torch.nn.functional as F
from torch import nn

from ..spec import Case, Exercise, Verdict, randint

SANDBOX_ALLOW = ("attn_course.demos.textlm", "attn_course.demos._train", "attn_course.block", "attn_course.norm",
                 "attn_course.grading.exercises.lesson16", "fused attention kernels")   # the capstone's cells (open)
__all__ = ["EXERCISES", "PARAM_BUDGET", "KV_BUDGET", "KV_CONTEXT", "FLOP_BUDGET", "BAR", "RECIPE",
           "STEP_GROWTH", "STEP_EARLY", "REACH_MIN", "PROBE_WINDOWS", "TIME_FACTOR", "cache_bytes",
           "heldout_windows", "heldout_loss", "loss_with_se"]

VOCAB = 128                      # ASCII, as attn_course.demos.textlm
PARAM_BUDGET = 150_000           # every nn.Parameter and every buffer of the model (shared ones once), in elements
KV_CONTEXT = 128                 # the KV cache is measured after this many tokens; the loss at this length
KV_BUDGET = 512                  # bytes per token at KV_CONTEXT (float32 MHA, d=64, 2 layers: 1024)
STEP_EARLY = 8                   # step FLOPs at token KV_CONTEXT <= STEP_GROWTH x those at token STEP_EARLY:
STEP_GROWTH = 5.0                #   recomputing the prefix grows 128/8 = 16x; a real cache grows only by the
#   attention over the cache, 4 * (heads x head_dim) FLOPs per cached token and layer, against at least
#   4 * d_model * (heads x head_dim) for the query and output projections: at most 1 + 120 / d_model (< 5 for
#   d_model >= 30), and nothing at all where SDPA's fused CPU kernel does the attention (not counted)
REACH_MIN = 1e-5                 # changing token j (0 <= j < KV_CONTEXT) moves the last position's logits by more
FLOP_BUDGET = 1e9                # FLOPs of one forward pass over a training batch (16 x 128 characters), as
#   torch.utils.flop_counter counts them (matrix products; SDPA's fused CPU kernel is not counted)
BAR = 2.3                        # held-out nats/char (bigram table 2.57, unigram 3.15; Python 3.10-3.13 move them
#   by < 0.02: the corpus is the interpreter's own docstrings)
RECIPE = {"steps": 300, "batch_size": 16, "seq_len": KV_CONTEXT, "lr": 3e-3}   # AdamW + one-cycle, fit()'s loop
PROBE_WINDOWS = 16               # held-out windows of the causality probe (their second half re-drawn)
TIME_FACTOR = 4.0                # the grader's time limit: this many times the course's solution's run
YARDSTICK_STEPS = 20             # check() times this many steps of lesson 11's TinyLM and warns when the design
SLOW_WARNING = 2.5               #   trains more than this many times slower (the grader allows TIME_FACTOR)


def _data():
    from ...demos.textlm import TextData
    return TextData(seq_len=RECIPE["seq_len"], batch_size=RECIPE["batch_size"])


def heldout_windows(L: int = KV_CONTEXT) -> tuple[torch.Tensor, torch.Tensor]:
    """The WHOLE held-out split as consecutive windows of ``L`` characters: codes (n, L) and next characters
    (n, L); every held-out character but the last few (fewer than L) is predicted once."""
    val = _data().val
    n = (len(val) - 1) // L
    return val[: n * L].view(n, L).contiguous(), val[1: n * L + 1].view(n, L).contiguous()


def _windows(gen, n, L):
    """``n`` windows of held-out (validation) text at random places: codes (n, L) and next characters (n, L)."""
    val = _data().val
    start = torch.randint(len(val) - L - 1, (n,), generator=gen)
    chunk = val[start[:, None] + torch.arange(L + 1)]
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def cache_bytes(cache) -> int:
    """Bytes of every tensor reachable from ``cache`` (through lists, tuples, dicts and plain objects'
    attributes), each underlying storage counted once: a view of a big preallocated buffer counts the buffer.
    Parameters and modules inside the cache are not cache."""
    return sum(t.untyped_storage().nbytes() for t in _cache_tensors(cache))


def _cache_tensors(cache) -> list[torch.Tensor]:
    """One tensor per distinct storage reachable from ``cache`` (see :func:`cache_bytes`)."""
    seen_storage, seen, found = set(), set(), []
    stack = [(cache, 0)]
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, nn.Parameter) or isinstance(obj, nn.Module):
            continue
        if isinstance(obj, torch.Tensor):
            s = obj.untyped_storage()
            key = (s.data_ptr(), s.nbytes(), str(obj.device))
            if key not in seen_storage:
                seen_storage.add(key)
                found.append(obj)
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
    return found


def _non_float_elements(cache) -> int:
    """Elements of the cache's tensors that are not floating point (integer or boolean: e.g. token codes);
    a one-element integer tensor (a position) is allowed."""
    return sum(t.numel() for t in _cache_tensors(cache) if not t.is_floating_point() and t.numel() > 1)


# ---- running the learner's design (in the sandboxed child) -----------------------------------------------

def _build(make_model, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = make_model(VOCAB)
    if not isinstance(model, nn.Module):
        raise TypeError(f"make_model must return a torch.nn.Module, got {type(model).__name__}")
    return model.cpu()


def _params(model) -> torch.Tensor:
    """Parameters and buffers, each storage once (a tied weight counts once)."""
    seen, n = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes(), tuple(t.shape))
        if key not in seen:
            seen.add(key)
            n += t.numel()
    return torch.tensor(n, dtype=torch.int64)


@torch.no_grad()
def _decode(model, seqs: list[torch.Tensor], count: tuple[int, ...] = ()):
    """Decode the (1, T) sequences token by token, interleaved; returns (forward logits, decode logits,
    caches, step FLOPs of the first sequence at the 1-based tokens in ``count``), logits (n, T, V) float32."""
    from torch.utils.flop_counter import FlopCounterMode
    model.eval()
    full = torch.cat([model(s).float() for s in seqs])
    caches, outs, flops = [None] * len(seqs), [[] for _ in seqs], []
    for t in range(seqs[0].shape[1]):
        for n, s in enumerate(seqs):
            if n == 0 and t + 1 in count:
                with FlopCounterMode(display=False) as counter:
                    logits, caches[n] = model.step(s[:, t:t + 1], caches[n])
                flops.append(counter.get_total_flops())
            else:
                logits, caches[n] = model.step(s[:, t:t + 1], caches[n])
            outs[n].append(logits.float().reshape(1, 1, -1))
    return full, torch.cat([torch.cat(o, dim=1) for o in outs]), caches, flops


@torch.no_grad()
def _reach(model, seq: torch.Tensor, swap: torch.Tensor) -> torch.Tensor:
    """max |change of the last position's logits| when token j of ``seq`` (1, T) becomes ``swap[j]``, for
    j = 0 … T − 2: (T − 1,) float64. One batch, the unchanged sequence in it, so the rows compare exactly."""
    T = seq.shape[1]
    x = seq.repeat(T, 1)
    j = torch.arange(T - 1)
    x[j, j] = swap[: T - 1]
    last = model(x)[:, -1].double()                                          # (T, V); row T - 1 unchanged
    return (last[:-1] - last[-1:]).abs().amax(-1)


def _answer(make_model, case: Case) -> dict[str, torch.Tensor]:
    model = _build(make_model, case.params["seed"])
    what = case.params["what"]
    if what == "parameters":
        return {"parameters": _params(model)}
    if what == "decode":
        seqs = [case.inputs["a"], case.inputs["b"]]
        full, dec, caches, _ = _decode(model, seqs)
        return {"forward": full, "decode": dec, "measured": torch.tensor(cache_bytes(caches[0]), dtype=torch.int64),
                "reported": torch.tensor(float(model.kv_cache_bytes(seqs[0].shape[1])), dtype=torch.float64)}
    if what == "kv budget":
        seq = case.inputs["a"]
        full, dec, caches, flops = _decode(model, [seq], count=(STEP_EARLY, KV_CONTEXT))
        return {"forward": full, "decode": dec, "measured": torch.tensor(cache_bytes(caches[0]), dtype=torch.int64),
                "non_float": torch.tensor(_non_float_elements(caches[0]), dtype=torch.int64),
                "step_flops": torch.tensor([float(f) for f in flops], dtype=torch.float64),
                "reach": _reach(model.eval(), seq, case.inputs["swap"])}
    from ...demos._train import fit                           # "loss": the course's fixed recipe
    from torch.utils.flop_counter import FlopCounterMode
    data = _data()
    x, _ = data.sample(torch.Generator().manual_seed(case.params["seed"]))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    flops = counter.get_total_flops()
    t0 = time.perf_counter()
    fit(model, data.sample, steps=RECIPE["steps"], lr=RECIPE["lr"], seed=case.params["seed"], progress=False,
        desc="capstone")
    seconds = time.perf_counter() - t0
    yard = _yardstick_seconds(data, case.params["seed"])
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(chunk).float() for chunk in case.inputs["x"].split(32)])
        probe = model(case.inputs["probe"]).float()
    return {"logits": logits, "probe": probe, "parameters": _params(model),
            "flops": torch.tensor(float(flops), dtype=torch.float64),
            "seconds": torch.tensor(seconds, dtype=torch.float64),
            "yardstick": torch.tensor(yard, dtype=torch.float64)}


def _yardstick_seconds(data, seed: int) -> float:
    """The recipe's training time of a model of the course's size here and now (lesson 11's TinyLM: d_model 64,
    2 layers, 4 heads), estimated from :data:`YARDSTICK_STEPS` steps: what "slow" means on this machine."""
    from ...demos._train import fit
    from ...demos.textlm import TinyLM
    steps = min(YARDSTICK_STEPS, RECIPE["steps"])
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    fit(TinyLM(d_model=64, num_layers=2, num_heads=4), data.sample, steps=steps, lr=RECIPE["lr"], seed=seed,
        progress=False, desc="yardstick")
    return (time.perf_counter() - t0) * RECIPE["steps"] / steps


# ---- cases, templates and the judge (in the trusted grader) ---------------------------------------------

def _cases(gen):
    seed = randint(gen, 0, 2**31 - 1)
    T = randint(gen, 24, 72)
    a, _ = _windows(gen, 2, T)
    kv, _ = _windows(gen, 1, KV_CONTEXT)
    swap = (kv[0] - 32 + torch.randint(1, 95, (KV_CONTEXT,), generator=gen)) % 95 + 32     # another printable
    x, y = heldout_windows()
    half = KV_CONTEXT // 2
    probe = x[:PROBE_WINDOWS].clone()
    probe[:, half:] = torch.randint(32, 127, (PROBE_WINDOWS, KV_CONTEXT - half), generator=gen)
    return [
        Case(f"parameters and buffers ≤ {PARAM_BUDGET:,}", {}, {"what": "parameters", "seed": seed}),
        Case(f"step() reproduces model(codes) on two sequences decoded interleaved, and kv_cache_bytes({T}) "
             f"is what the cache holds", {"a": a[:1], "b": a[1:]}, {"what": "decode", "seed": seed}),
        Case(f"a real KV cache ≤ {KV_BUDGET} bytes per token after {KV_CONTEXT} tokens", {"a": kv, "swap": swap},
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
    if what == "decode":
        T = case.inputs["a"].shape[1]
        return {"forward": torch.zeros(2, T, VOCAB), "decode": torch.zeros(2, T, VOCAB), "measured": i64,
                "reported": f64}
    if what == "kv budget":
        T = case.inputs["a"].shape[1]
        return {"forward": torch.zeros(1, T, VOCAB), "decode": torch.zeros(1, T, VOCAB), "measured": i64,
                "non_float": i64, "step_flops": torch.zeros(2, dtype=torch.float64),
                "reach": torch.zeros(T - 1, dtype=torch.float64)}
    return {"logits": torch.zeros(*case.inputs["x"].shape, VOCAB),
            "probe": torch.zeros(*case.inputs["probe"].shape, VOCAB), "parameters": i64, "flops": f64,
            "seconds": f64, "yardstick": f64}


def heldout_loss(logits: torch.Tensor, y: torch.Tensor) -> float:
    """Mean cross-entropy in nats per character, in float64."""
    return float(F.cross_entropy(logits.double().flatten(0, 1), y.flatten()))


def loss_with_se(logits: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(mean loss, its standard error): logits (n, L, V), y (n, L); the s.e. is that of the mean over the n
    windows (per-window mean losses; characters within a window are not independent)."""
    per = F.cross_entropy(logits.double().flatten(0, 1), y.flatten(), reduction="none").view(y.shape).mean(1)
    return float(per.mean()), float(per.std() / math.sqrt(len(per)))


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


def _judge_kv(got, T: int, measured: int) -> Verdict:
    """The KV-cache point: within budget, and a real cache (floating point, constant per-token work outside
    attention, serving the whole context)."""
    per = measured / T
    if per > KV_BUDGET:
        return Verdict(False, f"after {T} tokens your cache holds {measured:,} bytes = {per:g} bytes per token, "
                              f"over the budget of {KV_BUDGET}: use fewer KV heads (GQA/MQA), a latent cache (MLA), "
                              f"a smaller head_dim or fewer layers.")
    if int(got["non_float"]) > 0:
        return Verdict(False, f"your cache holds {int(got['non_float']):,} integer or boolean elements (token codes?): "
                              f"a KV cache holds floating-point keys and values, latents or states — what the model "
                              f"computed — so that step does not re-run the model over the prefix.")
    early, late = (float(f) for f in got["step_flops"])
    growth = late / early if early > 0 else (1.0 if late == 0 else float("inf"))
    if growth > STEP_GROWTH:
        return Verdict(False, f"your step at token {T} costs {late / 1e6:.2f} MFLOP, {growth:.1f}× the "
                              f"{early / 1e6:.2f} MFLOP of the step at token {STEP_EARLY} (limit {STEP_GROWTH:g}×): "
                              f"step re-runs the model over the prefix instead of reading a cache of keys and values.")
    reach = got["reach"]
    blind = (~(reach > REACH_MIN)).nonzero().flatten()
    if len(blind):
        j = int(blind[0])
        return Verdict(False, f"changing token {j} (of {T}) does not change the logits at the last position "
                              f"({len(blind)} of the {T - 1} earlier tokens do not reach it): the cache measured "
                              f"after {T} tokens must serve the whole {T}-token context — a sliding window W in L "
                              f"layers reaches only L·(W − 1) tokens back.")
    return Verdict(True, note=f"{per:g} bytes per token, step at token {T}: {growth:.2f}× the work at token "
                              f"{STEP_EARLY}, every token reaches the last")


def _judge(got, want, case) -> Verdict:
    what = case.params["what"]
    if what == "parameters":
        n = int(got["parameters"])
        if n <= PARAM_BUDGET:
            return Verdict(True, note=f"{n:,} parameters and buffers")
        return Verdict(False, f"your model has {n:,} parameters and buffers, over the budget of {PARAM_BUDGET:,}: "
                              f"make it narrower or shallower, tie the head to the embedding, or use fewer KV heads.")
    if what in ("decode", "kv budget"):
        ok, hint = _decode_ok(got)
        if not ok:
            return Verdict(False, hint)
        measured = int(got["measured"])
        T = case.inputs["a"].shape[1]
        if what == "kv budget":
            return _judge_kv(got, T, measured)
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
    half, k = logits.shape[1] // 2, probe.shape[0]
    if not torch.allclose(probe[:, :half].double(), logits[:k, :half].double(), atol=1e-4, rtol=1e-3):
        return Verdict(False, "your model looks at later characters: changing characters after position i changed "
                              "the logits at i — a decoder must mask the future (a causal mask), else it learns to "
                              "copy the next character and its loss means nothing.")
    loss = heldout_loss(logits, case.inputs["y"])
    if n > PARAM_BUDGET:
        return Verdict(False, f"held-out loss {loss:.2f}, but with {n:,} parameters and buffers (budget {PARAM_BUDGET:,}) it "
                              f"does not count.")
    if flops > FLOP_BUDGET:
        return Verdict(False, f"held-out loss {loss:.2f}, but one forward pass over a training batch costs "
                              f"{flops / 1e9:.2f} GFLOP, over the budget of {FLOP_BUDGET / 1e9:g}: your model computes "
                              f"too much per character, so it does not count.")
    slow = _slow(got)
    if loss < BAR:
        return Verdict(True, note=f"held-out loss {loss:.1f} < {BAR} nats/char" + slow)
    return Verdict(False, f"held-out loss {loss:.2f} nats/char is not below the bar {BAR} (a bigram table reaches "
                          f"2.57): does every layer attend to earlier characters, and does the residual stream reach "
                          f"the head?" + slow)


def _slow(got) -> str:
    """A warning when the design trains more than :data:`SLOW_WARNING` × slower than a model of the course's size
    on this machine (the grader allows :data:`TIME_FACTOR` × the course's design), else ""."""
    seconds, yard = float(got["seconds"]), float(got["yardstick"])
    if not (yard > 0 and seconds > SLOW_WARNING * yard):
        return ""
    return (f" — ⚠ it trained in {seconds:.0f} s, {seconds / yard:.1f}× a model of the course's size here: the "
            f"grader stops a run at {TIME_FACTOR:g}× the course's design, so this is close to the limit")


def _measure(got, case) -> dict:
    """The leaderboard's numbers from one case's answer (plain values; booleans are budget checks)."""
    what = case.params["what"]
    if what == "parameters":
        n = int(got["parameters"])
        return {"parameters": n, "parameters within budget": n <= PARAM_BUDGET}
    if what == "kv budget":
        ok, _ = _decode_ok(got)
        T = case.inputs["a"].shape[1]
        per = int(got["measured"]) / T if ok else float("nan")
        return {"KV bytes/token": per, "KV within budget": ok and _judge_kv(got, T, int(got["measured"])).ok}
    if what == "loss":
        flops = float(got["flops"])
        loss, se = loss_with_se(got["logits"], case.inputs["y"])
        return {"held-out loss": round(loss, 4), "± 2 s.e.": round(2 * se, 4),
                "GFLOP per batch": round(flops / 1e9, 3), "compute within budget": flops <= FLOP_BUDGET}
    return {}


EXERCISES = [
    Exercise("16_capstone", 4, "Your attention, in a tiny language model",
             "a function make_model(vocab_size) -> nn.Module with forward(codes), step(code, cache) and "
             "kv_cache_bytes(n_tokens)",
             _cases, _answer, _expected, _judge, kind="open", measure_fn=_measure, rank_by="held-out loss",
             rank_noise="± 2 s.e.", time_factor=TIME_FACTOR),
]
