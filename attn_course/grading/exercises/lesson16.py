"""Exercise set 16 — the capstone: your attention, in a tiny language model
(solutions/16_capstone_tiny_language_model.ipynb). One open exercise (kind "open").

The learner hands over ``make_model(vocab_size) -> nn.Module``: a character-level decoder with

* ``model(codes)``: codes (B, L) int64 -> logits (B, L, vocab_size);
* ``model.step(code, cache)``: code (B, 1), cache (None before the first token) -> (logits (B, 1, V), cache);
* ``model.kv_cache_bytes(n_tokens)``: the learner's count of the bytes the cache holds after n_tokens.

The course's trainer (:func:`attn_course.demos._train.fit`, a FIXED recipe, :data:`RECIPE`) trains it on the
training split, which the grader hands to the sandboxed child as a tensor (the child never loads the corpus, so
the held-out split is not there to train on); the grader measures four things, one point each:

1. every number the model uses ≤ :data:`PARAM_BUDGET`, measured from what the submitted objects reach
   (:func:`reachable`: parameters, buffers, tensors in attributes, containers, closures, the globals its code
   names, bound methods, ``functools.partial`` — each storage once), not declared by them;
2. the decode path: ``step`` reproduces ``model(codes)`` on two held-out sequences decoded *interleaved*
   (so all state must live in the returned cache), and the reported cache bytes equal the measured ones;
3. the KV cache, on one sequence of :data:`KV_CONTEXT` tokens: ≤ :data:`KV_BUDGET` BYTES per token whatever the
   dtype (int8 keys with their float scales count both; :func:`cache_bytes`), and it is a real cache: the step
   that adds token :data:`KV_CONTEXT` costs at most :data:`CACHE_RATIO` × the forward's FLOPs per token over the
   same :data:`KV_CONTEXT` tokens (``FlopCounterMode``; re-running the model over the prefix costs
   :data:`KV_CONTEXT` × — whether the prefix grows or sits in a fixed buffer), and every one of the
   :data:`KV_CONTEXT` tokens reaches the last position's logits (the cache serves the whole context);
4. the held-out loss (nats/char, computed HERE from the logits the child returns) < :data:`BAR`, on the WHOLE
   held-out split cut into windows of :data:`KV_CONTEXT` characters, from a model that is causal, within the
   parameter budget and the compute budget (:data:`FLOP_BUDGET` per forward pass over a training batch).

Seeds: the exercise ranks a class (``rank_by``): every submission gets the SAME seed, the instructor's
(:func:`~attn_course.grading.selfcheck.exercise_seed`: ``attn-course grade --seed``, the environment variable
``ATTN_COURSE_CLASS_SEED``, or a secret drawn once per grading batch) — not derivable from the exercise; the
self-check uses the public self-check seed. Time: ``time_factor`` — the grader's limit is that many times the
CPU seconds of the course's own solution's run (:func:`attn_course.grading.runner.calibrate`), enforced as a
CPU-time limit (``RLIMIT_CPU``), so a loaded machine does not change it.

``measure_fn`` reports the measured numbers for ``leaderboard.csv``: the loss with ± 2 standard errors over the
held-out windows, the per-window losses (the leaderboard pairs two designs window by window) and the
training-seed spread :data:`SEED_SD`, measured once on the course's design and stored with the release
(``attn_course/data/capstone_seed_spread.json``, ``tools/capstone_seed_spread.py``). Why a stored spread rather
than training every design on several seeds: it would multiply the grader's time by the number of seeds, and an
SD from 2 seeds is itself uncertain by ±70 %; the review measured similar spreads for other designs (0.034–0.038).
"""
from __future__ import annotations

import functools
import json
import math
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..spec import Case, Exercise, Verdict, randint

__all__ = ["EXERCISES", "PARAM_BUDGET", "KV_BUDGET", "KV_CONTEXT", "FLOP_BUDGET", "BAR", "RECIPE", "CACHE_RATIO",
           "REACH_MIN", "PROBE_WINDOWS", "TIME_FACTOR", "SEED_SD", "SANDBOX_ALLOW", "cache_bytes", "reachable",
           "model_numbers", "heldout_windows", "training_codes", "sampler", "heldout_loss", "loss_with_se"]

VOCAB = 128                      # ASCII, as attn_course.demos.textlm
PARAM_BUDGET = 150_000           # every number the model uses (reachable from it), each storage once
KV_CONTEXT = 128                 # the KV cache is measured after this many tokens; the loss at this length
KV_BUDGET = 512                  # BYTES per token at KV_CONTEXT, whatever the dtype (float32 MHA, d=64, 2 layers: 1024)
CACHE_RATIO = 2.0                # FLOPs of the step adding token KV_CONTEXT <= CACHE_RATIO x FLOPs(forward over those
#   KV_CONTEXT tokens) / KV_CONTEXT: a real cache does per token what the forward does per token (ratio ~1: the same
#   projections, attention over the cached keys as the forward's masked attention row); re-running the model over
#   the prefix, or over a fixed buffer of it, does the forward's whole work in one step (ratio KV_CONTEXT = 128)
REACH_MIN = 1e-5                 # changing token j (0 <= j < KV_CONTEXT) moves the last position's logits by more
FLOP_BUDGET = 1e9                # FLOPs of one forward pass over a training batch (16 x 128 characters), as
#   torch.utils.flop_counter counts them (matrix products; SDPA's fused CPU kernel is not counted)
BAR = 2.3                        # held-out nats/char (bigram table 2.57, unigram 3.15; Python 3.10-3.13 move them
#   by < 0.02: the corpus is the interpreter's own docstrings)
RECIPE = {"steps": 300, "batch_size": 16, "seq_len": KV_CONTEXT, "lr": 3e-3}   # AdamW + one-cycle, fit()'s loop
PROBE_WINDOWS = 16               # held-out windows of the causality probe (their second half re-drawn)
TIME_FACTOR = 4.0                # the grader's CPU-time limit: this many times the course's solution's run
YARDSTICK_STEPS = 20             # check() times (CPU) this many steps of a model of the course's size and warns when
SLOW_WARNING = 2.5               #   the design trains more than this many times slower (the grader allows TIME_FACTOR)
SEED_SPREAD_FILE = Path(__file__).resolve().parents[2] / "data" / "capstone_seed_spread.json"
SEED_SD = json.loads(SEED_SPREAD_FILE.read_text(encoding="utf-8"))["sd"]   # held-out loss s.d. over training seeds
# The course's parts a design may import in the sandbox (issue 39's SANDBOX_ALLOW): the model blocks and the
# trainer — not attn_course.demos.textlm, whose TextData holds the held-out split.
SANDBOX_ALLOW = ("attn_course.block", "attn_course.norm", "attn_course.gqa", "attn_course.mha", "attn_course.rope",
                 "attn_course.masks", "attn_course.functional", "attn_course._validate", "attn_course.mla",
                 "attn_course.linear", "attn_course.positions", "attn_course.demos._train", "attn_course._notebook",
                 "fused attention kernels")                       # an open design: SDPA is allowed


@functools.lru_cache(maxsize=1)
def _corpus():
    from ...demos.textlm import TextData
    return TextData(seq_len=RECIPE["seq_len"], batch_size=RECIPE["batch_size"])


def training_codes() -> torch.Tensor:
    """The training split (N,) int64 — what the grader hands the child to train on (trusted side)."""
    return _corpus().train


def heldout_windows(L: int = KV_CONTEXT) -> tuple[torch.Tensor, torch.Tensor]:
    """The WHOLE held-out split as consecutive windows of ``L`` characters: codes (n, L) and next characters
    (n, L); every held-out character but the last few (fewer than L) is predicted once (trusted side)."""
    val = _corpus().val
    n = (len(val) - 1) // L
    return val[: n * L].view(n, L).contiguous(), val[1: n * L + 1].view(n, L).contiguous()


def sampler(train: torch.Tensor):
    """``sample(gen) -> (x, y)``: RECIPE's batches (B, L) of random windows of ``train`` (N,) and the same windows
    shifted by one — what :func:`~attn_course.demos._train.fit` draws (the same draws as ``TextData.sample``)."""
    train = train.long()
    L, B = RECIPE["seq_len"], RECIPE["batch_size"]

    def sample(gen):
        start = torch.randint(len(train) - L - 1, (B,), generator=gen)
        chunk = train[start[:, None] + torch.arange(L + 1)]
        return chunk[:, :-1], chunk[:, 1:]
    return sample


def _windows(gen, n, L):
    """``n`` windows of held-out (validation) text at random places: codes (n, L) and next characters (n, L)."""
    val = _corpus().val
    start = torch.randint(len(val) - L - 1, (n,), generator=gen)
    chunk = val[start[:, None] + torch.arange(L + 1)]
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


# ---- what an object reaches: the parameter count and the cache's bytes ----------------------------------

_LIBRARIES = ("torch", "numpy", "einops", "attn_course", "builtins", "typing", "functools", "collections", "abc",
              "enum", "dataclasses", "math", "tqdm", "IPython", "ipykernel")
_NUMBER = (int, float, complex)
FREE_NUMBERS = 64                # numbers held outside tensors that are settings, shapes or a position, not data


def _library(obj) -> bool:
    mod = getattr(obj, "__module__", None) or ""
    return isinstance(mod, str) and mod.split(".")[0] in _LIBRARIES


def _code_names(code: types.CodeType) -> set[str]:
    """The global names ``code`` and the code nested in it (comprehensions, inner functions, class bodies) use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def reachable(*roots, stop=(), cache: bool = False) -> tuple[dict, int]:
    """What ``roots`` reach: ``({storage key: (tensor, bytes, elements)}, loose)``, ``loose`` counting the numbers
    held outside tensors (Python numbers in lists/tuples/sets/dicts, numpy arrays' elements, strings and bytes
    longer than 64 by their length); a lone number in an attribute or a closure is a setting (d_model), not data.

    Walked: ``nn.Module`` attributes (parameters, buffers, submodules, plain attributes), tensors (each storage
    once — a view of a buffer counts the whole buffer), lists/tuples/sets/dicts, plain objects' ``__dict__`` and
    ``__slots__``, functions (closure cells, defaults, and the globals their code names), bound methods
    (``__self__``), ``functools.partial``, properties and static/class methods, and the learner's classes
    (class attributes and methods); with a cycle guard. Library functions and classes (torch, numpy, attn_course,
    …) are not walked into, nor torch's own objects other than modules and tensors. ``cache=True``: modules and parameters are not walked (a cache's link to
    its model is not cache); ``stop``: storage keys not to count (the model's own, for the cache)."""
    seen, found, loose = set(), {}, 0
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if obj is None or isinstance(obj, (bool, types.ModuleType)) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if cache and isinstance(obj, nn.Parameter):
                continue
            s = obj.untyped_storage()
            key = (s.data_ptr(), s.nbytes(), str(obj.device)) if s.data_ptr() else ("tensor", id(obj))
            if key not in found and key not in stop:
                nbytes = s.nbytes() if s.data_ptr() else obj.numel() * obj.element_size()
                found[key] = (obj, nbytes, nbytes // max(obj.element_size(), 1))
            continue
        if isinstance(obj, nn.Module):
            if not cache:
                stack += list(vars(obj).values())
                stack.append(type(obj))
            continue
        if isinstance(obj, (str, bytes, bytearray)):
            loose += len(obj) if len(obj) > 64 else 0            # a name is not data; a text table is
            continue
        if isinstance(obj, (dict, list, tuple, set, frozenset)):      # numbers held in a container are data
            items = [v for k, v in obj.items() if not (isinstance(k, str) and k.startswith("__"))] + \
                [k for k in obj if not isinstance(k, str)] if isinstance(obj, dict) else list(obj)
            numbers = [v for v in items if isinstance(v, _NUMBER) and not isinstance(v, bool)]
            loose += len(numbers)
            stack += [v for v in items if not isinstance(v, _NUMBER)]
        elif isinstance(obj, functools.partial):
            stack += [obj.func, obj.args, obj.keywords]
        elif isinstance(obj, types.MethodType):
            stack += [obj.__self__, obj.__func__]
        elif isinstance(obj, (staticmethod, classmethod)):
            stack.append(obj.__func__)
        elif isinstance(obj, property):
            stack += [obj.fget, obj.fset, obj.fdel]
        elif isinstance(obj, types.FunctionType):
            if _library(obj):
                continue
            stack += [c.cell_contents for c in obj.__closure__ or () if _cell_full(c)]
            stack += [obj.__defaults__, obj.__kwdefaults__]
            g = obj.__globals__
            stack += [g[n] for n in _code_names(obj.__code__) if n in g]
        elif isinstance(obj, type):
            if not _library(obj):
                stack += [v for k, v in vars(obj).items() if not k.startswith("__")]
                stack += [b for b in obj.__mro__[1:]]
        elif type(obj).__module__.split(".")[0] == "numpy" and hasattr(obj, "size"):
            loose += int(obj.size)
        elif type(obj).__module__.split(".")[0] != "torch":     # a plain object (the course's KVCache too)
            if hasattr(obj, "__dict__"):
                stack += list(vars(obj).values())
            for name in getattr(type(obj), "__slots__", ()):
                stack.append(getattr(obj, name, None))
            stack.append(type(obj))
    return found, loose


def _cell_full(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:                       # an empty cell (a name assigned later)
        return False
    return True


def model_numbers(*roots) -> int:
    """Every number ``roots`` (the model, and the learner's ``make_model``) reach: tensor elements (each storage
    once) plus the numbers held outside tensors beyond the first :data:`FREE_NUMBERS` (see :func:`reachable`)."""
    found, loose = reachable(*roots)
    return sum(n for _, _, n in found.values()) + max(0, loose - FREE_NUMBERS)


def cache_bytes(cache, model=None) -> int:
    """Bytes of everything reachable from ``cache`` (see :func:`reachable`), whatever the dtype — an int8 key
    is 1 byte, its float32 scale 4 — each storage counted once (a view of a big preallocated buffer counts the
    buffer), a Python number 8 beyond the first :data:`FREE_NUMBERS` (a position); modules and parameters are not cache, nor is anything ``model`` reaches."""
    stop = set(reachable(model)[0]) if model is not None else set()
    found, loose = reachable(cache, stop=stop, cache=True)
    return sum(b for _, b, _ in found.values()) + 8 * max(0, loose - FREE_NUMBERS)


# ---- running the learner's design (in the sandboxed child) -----------------------------------------------

def _build(make_model, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = make_model(VOCAB)
    if not isinstance(model, nn.Module):
        raise TypeError(f"make_model must return a torch.nn.Module, got {type(model).__name__}")
    return model.cpu()


def _flops(fn, *args):
    """(what ``fn(*args)`` returns, the FLOPs ``FlopCounterMode`` counts in it)."""
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        out = fn(*args)
    return out, counter.get_total_flops()


@torch.no_grad()
def _decode(model, seqs: list[torch.Tensor], count_last: bool = False):
    """Decode the (1, T) sequences token by token, interleaved; returns (forward logits, decode logits,
    caches, FLOPs of the first sequence's last step (with ``count_last``, else 0)), logits (n, T, V) float32."""
    model.eval()
    full = torch.cat([model(s).float() for s in seqs])
    caches, outs, flops = [None] * len(seqs), [[] for _ in seqs], 0
    T = seqs[0].shape[1]
    for t in range(T):
        for n, s in enumerate(seqs):
            if n == 0 and count_last and t == T - 1:
                (logits, caches[n]), flops = _flops(model.step, s[:, t:t + 1], caches[n])
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


def _i64(n) -> torch.Tensor:
    return torch.tensor(int(n), dtype=torch.int64)


def _f64(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def _answer(make_model, case: Case) -> dict[str, torch.Tensor]:
    model = _build(make_model, case.params["seed"])
    what = case.params["what"]
    if what == "parameters":
        return {"parameters": _i64(model_numbers(model, make_model))}
    if what == "decode":
        seqs = [case.inputs["a"], case.inputs["b"]]
        full, dec, caches, _ = _decode(model, seqs)
        return {"forward": full, "decode": dec, "measured": _i64(cache_bytes(caches[0], model)),
                "reported": _f64(float(model.kv_cache_bytes(seqs[0].shape[1])))}
    if what == "kv budget":
        seq = case.inputs["a"]
        full, dec, caches, step = _decode(model, [seq], count_last=True)
        with torch.no_grad():
            _, forward = _flops(model, seq)
        return {"forward": full, "decode": dec, "measured": _i64(cache_bytes(caches[0], model)),
                "step_flops": _f64(float(step)), "forward_flops": _f64(float(forward)),
                "reach": _reach(model.eval(), seq, case.inputs["swap"])}
    from ...demos._train import fit                           # "loss": the course's fixed recipe
    sample = sampler(case.inputs["train"])
    x, _ = sample(torch.Generator().manual_seed(case.params["seed"]))
    with torch.no_grad():
        _, flops = _flops(model, x)
    t0 = time.process_time()                                  # CPU seconds: what the grader's limit counts
    fit(model, sample, steps=case.params["steps"], lr=RECIPE["lr"], seed=case.params["seed"], progress=False,
        desc="capstone")
    seconds = time.process_time() - t0
    yard = _yardstick_seconds(sample, case.params["seed"], case.params["steps"])
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(chunk).float() for chunk in case.inputs["x"].split(32)])
        probe = model(case.inputs["probe"]).float()
    return {"logits": logits, "probe": probe, "parameters": _i64(model_numbers(model, make_model)),
            "flops": _f64(float(flops)), "seconds": _f64(seconds), "yardstick": _f64(yard)}


class _Yardstick(nn.Module):
    """A model of the course's size (d_model 64, 2 pre-norm layers of 4-head causal attention and a 4× MLP), in
    plain torch: (B, L) -> (B, L, V)."""

    def __init__(self, d: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.heads, self.embed, self.head = heads, nn.Embedding(VOCAB, d), nn.Linear(d, VOCAB)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
                                 for _ in range(layers))

    def forward(self, codes):
        x, L = self.embed(codes), codes.shape[1]
        mask = torch.ones(L, L, dtype=torch.bool).triu(1)
        for qkv, out, mlp in zip(self.qkv, self.out, self.mlp):
            q, k, v = qkv(F.layer_norm(x, x.shape[-1:])).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
            a = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(mask, float("-inf")).softmax(-1)
            x = x + out((a @ v).transpose(1, 2).flatten(2))
            x = x + mlp(x)
        return self.head(x)


def _yardstick_seconds(sample, seed: int, steps: int) -> float:
    """CPU seconds ``steps`` training steps of a model of the course's size take here (:class:`_Yardstick`),
    estimated from at most :data:`YARDSTICK_STEPS` steps: what "slow" means on this machine, whatever its load."""
    from ...demos._train import fit
    timed = min(YARDSTICK_STEPS, steps)
    torch.manual_seed(seed)
    model = _Yardstick()
    t0 = time.process_time()
    fit(model, sample, steps=timed, lr=RECIPE["lr"], seed=seed, progress=False, desc="yardstick")
    return (time.process_time() - t0) * steps / timed


# ---- cases, templates and the judge (in the trusted grader) ---------------------------------------------

def _cases(gen):
    seed = randint(gen, 0, 2**31 - 1)
    T = randint(gen, 24, 72)
    a, _ = _windows(gen, 2, T)
    kv, _ = _windows(gen, 1, KV_CONTEXT)
    swap = (kv[0] - 32 + torch.randint(1, 95, (KV_CONTEXT,), generator=gen)) % 95 + 32     # another printable
    x, _ = heldout_windows()
    half = KV_CONTEXT // 2
    probe = x[:PROBE_WINDOWS].clone()
    probe[:, half:] = torch.randint(32, 127, (PROBE_WINDOWS, KV_CONTEXT - half), generator=gen)
    # the loss case hands the child the training split and the held-out windows' codes only (the targets stay
    # here: heldout_windows()); the corpus itself is never loaded there
    return [
        Case(f"every number the model uses ≤ {PARAM_BUDGET:,}", {}, {"what": "parameters", "seed": seed}),
        Case(f"step() reproduces model(codes) on two sequences decoded interleaved, and kv_cache_bytes({T}) "
             f"is what the cache holds", {"a": a[:1], "b": a[1:]}, {"what": "decode", "seed": seed}),
        Case(f"a real KV cache ≤ {KV_BUDGET} bytes per token after {KV_CONTEXT} tokens", {"a": kv, "swap": swap},
             {"what": "kv budget", "seed": seed}),
        Case(f"held-out loss < {BAR} nats/char after the course's training recipe",
             {"train": training_codes().to(torch.uint8), "x": x, "probe": probe},
             {"what": "loss", "seed": seed, "steps": RECIPE["steps"]}),     # the child trains the grader's recipe
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
                "step_flops": f64, "forward_flops": f64, "reach": torch.zeros(T - 1, dtype=torch.float64)}
    return {"logits": torch.zeros(*case.inputs["x"].shape, VOCAB),
            "probe": torch.zeros(*case.inputs["probe"].shape, VOCAB), "parameters": i64, "flops": f64,
            "seconds": f64, "yardstick": f64}


def heldout_loss(logits: torch.Tensor, y: torch.Tensor) -> float:
    """Mean cross-entropy in nats per character, in float64."""
    return float(F.cross_entropy(logits.double().flatten(0, 1), y.flatten()))


def per_window_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each window, float64: logits (n, L, V), y (n, L) -> (n,)."""
    return F.cross_entropy(logits.double().flatten(0, 1), y.flatten(), reduction="none").view(y.shape).mean(1)


def loss_with_se(logits: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(mean loss, its standard error): logits (n, L, V), y (n, L); the s.e. is that of the mean over the n
    windows (per-window mean losses; characters within a window are not independent)."""
    per = per_window_loss(logits, y)
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
    """The KV-cache point: within budget (bytes, any dtype), and a real cache (the step that adds token T costs
    at most CACHE_RATIO × the forward's FLOPs per token over the same T tokens; every token reaches the last)."""
    per = measured / T
    if per > KV_BUDGET:
        return Verdict(False, f"after {T} tokens your cache holds {measured:,} bytes = {per:g} bytes per token, "
                              f"over the budget of {KV_BUDGET}: use fewer KV heads (GQA/MQA), a latent cache (MLA), "
                              f"a smaller head_dim, fewer layers, or store keys and values in fewer bytes (int8 "
                              f"with scales, lesson 14).")
    step, forward = float(got["step_flops"]), float(got["forward_flops"])
    per_token = forward / T
    ratio = step / per_token if per_token > 0 else (1.0 if step == 0 else float("inf"))
    if ratio > CACHE_RATIO:
        return Verdict(False, f"your step at token {T} costs {step / 1e6:.2f} MFLOP, {ratio:.1f}× your forward's "
                              f"{per_token / 1e6:.3f} MFLOP per token over the same {T} tokens (limit "
                              f"{CACHE_RATIO:g}×): step re-runs the model over the prefix (or over a buffer of it) "
                              f"instead of reading a cache of what earlier steps computed.")
    reach = got["reach"]
    blind = (~(reach > REACH_MIN)).nonzero().flatten()
    if len(blind):
        j = int(blind[0])
        return Verdict(False, f"changing token {j} (of {T}) does not change the logits at the last position "
                              f"({len(blind)} of the {T - 1} earlier tokens do not reach it): the cache measured "
                              f"after {T} tokens must serve the whole {T}-token context — a sliding window W in L "
                              f"layers reaches only L·(W − 1) tokens back.")
    return Verdict(True, note=f"{per:g} bytes per token; the step at token {T}: {ratio:.2f}× the forward's FLOPs "
                              f"per token; every token reaches the last")


def _judge(got, want, case) -> Verdict:
    what = case.params["what"]
    if what == "parameters":
        n = int(got["parameters"])
        if n <= PARAM_BUDGET:
            return Verdict(True, note=f"{n:,} numbers (parameters, buffers and every other tensor it reaches)")
        return Verdict(False, f"your model uses {n:,} numbers (parameters, buffers and every tensor, table or list "
                              f"it reaches), over the budget of {PARAM_BUDGET:,}: make it narrower or shallower, "
                              f"tie the head to the embedding, or use fewer KV heads.")
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
                f"(every tensor reachable from it, in its dtype's bytes: float32 4, float16 2, int8 1)")
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
    loss = heldout_loss(logits, heldout_windows()[1])
    if n > PARAM_BUDGET:
        return Verdict(False, f"held-out loss {loss:.2f}, but with {n:,} numbers (budget {PARAM_BUDGET:,}) it "
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
    """A warning when the design's training takes more than :data:`SLOW_WARNING` × the CPU seconds of a model of
    the course's size on this machine (the grader allows :data:`TIME_FACTOR` × the course's design), else ""."""
    seconds, yard = float(got["seconds"]), float(got["yardstick"])
    if not (yard > 0 and seconds > SLOW_WARNING * yard):
        return ""
    return (f" — ⚠ it trained in {seconds:.0f} CPU s, {seconds / yard:.1f}× a model of the course's size here: the "
            f"grader stops a run at {TIME_FACTOR:g}× the CPU time of the course's design, so this is close to the "
            f"limit")


def _measure(got, case) -> dict:
    """The leaderboard's numbers from one case's answer (plain values; booleans are budget checks; the per-window
    losses pair two designs on the leaderboard, :func:`attn_course.grading.runner.tie_band`)."""
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
        y = heldout_windows()[1]
        loss, se = loss_with_se(got["logits"], y)
        return {"held-out loss": round(loss, 4), "± 2 s.e.": round(2 * se, 4), "seed s.d.": SEED_SD,
                "per-window loss": [round(float(v), 6) for v in per_window_loss(got["logits"], y)],
                "GFLOP per batch": round(flops / 1e9, 3), "compute within budget": flops <= FLOP_BUDGET}
    return {}


EXERCISES = [
    Exercise("16_capstone", 4, "Your attention, in a tiny language model",
             "a function make_model(vocab_size) -> nn.Module with forward(codes), step(code, cache) and "
             "kv_cache_bytes(n_tokens)",
             _cases, _answer, _expected, _judge, kind="open", measure_fn=_measure, rank_by="held-out loss",
             rank_noise="± 2 s.e.", time_factor=TIME_FACTOR),
]
