"""The one training loop every tiny demo shares: seeded, CPU-fast, with a progress bar.

:func:`fit` trains one model; :func:`fit_many` trains several models of one architecture (seeds, or
variants that differ only in their weights) *together*: their parameters are stacked along a leading
model axis (``torch.func.stack_module_state``) and one ``vmap(functional_call)`` runs every model's step
at once, SDPA's fused kernel included (:class:`_FoldedSDPA`). On one CPU core, three seeds of the course's small
transformers cost 1.4–2.4× one seed's run (lesson 04's translator and encoder–decoder, lesson 03's LagTask model,
lesson 07's MHA: measured on a 2-core machine);
a convolutional model gains nothing (lesson 06's target finder: 3.2×), so lesson 06 trains its seeds side by
side instead. Each model sees exactly the data, schedule and optimizer
updates it would see alone under :func:`fit` with its own seed — the losses agree to round-off
(``tests/test_train_batched.py``).

:func:`side_by_side` runs independent training jobs (different architectures or schedules, each a
:func:`fit` or :func:`fit_many` run) at the same time, one CPU core each: a 2-core laptop trains two
variants in about the time of one, and every job's result is the one it gets run alone.
"""
from __future__ import annotations

import copy
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Mapping, NamedTuple, Sequence, TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from .._notebook import in_kernel, saved_box

__all__ = ["fit", "fit_many", "side_by_side", "token_accuracy", "SCHEDULES", "SeedRuns"]

Batch = tuple[torch.Tensor, torch.Tensor]

#: ``"one-cycle"``: 10 % warm-up to ``lr``, then cosine annealing to about 0 at the last step — the run's
#: length is part of its schedule. ``"constant"``: a warm-up of :data:`WARMUP_STEPS` steps, then ``lr``
#: until the end — a longer run is the shorter one continued, so a budget control changes only the steps.
SCHEDULES = ("one-cycle", "constant")
WARMUP_STEPS = 25


def _adamw(params, lr: float) -> torch.optim.AdamW:
    """AdamW without weight decay, as every lesson trains. Fused (one kernel per step instead of a Python loop of
    small ops per parameter) where torch has that kernel for the device: the same update to round-off, and
    15-30 % less time per step for the lessons' tiny models on a CPU (measured: a 300-step TinyLM 7.7 -> 6.5 s,
    three batched seeds 6.1 -> 4.2 s)."""
    params = list(params)
    fused = all(p.device.type in ("cpu", "cuda") for p in params) or None
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=fused)


def _scheduler(opt: torch.optim.Optimizer, lr: float, steps: int, schedule: str):
    if schedule == "one-cycle":
        # OneCycleLR divides by pct_start * steps - 1, zero at exactly 10 steps: warm up for 1.5 steps there
        pct_start = 0.15 if steps == 10 else 0.1
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=pct_start)
    if schedule == "constant":          # from lr/25 (OneCycle's start) linearly up to lr, then flat
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, 0.04 + 0.96 * s / WARMUP_STEPS))
    raise ValueError(f"schedule={schedule!r}: expected one of {SCHEDULES}")


class SeedRuns(NamedTuple):
    """What the demos' ``train_seeds`` wrappers return, one entry per seed (in the order of ``seeds``)."""
    models: list[nn.Module]
    losses: list[list[float]]                 # per-step training loss
    accuracy: list[float]                     # the demo's accuracy at the end
    accuracy_at: dict[int, list[float]]       # step -> that accuracy right after that step

    @classmethod
    def join(cls, parts: Sequence["SeedRuns"]) -> "SeedRuns":
        """The runs of several seed lists, in order, as one ``SeedRuns`` — e.g. seeds (0, 1) and (2,) trained
        side by side on two cores:
        ``SeedRuns.join(side_by_side([partial(train_seeds, task, s, ...) for s in ((0, 1), (2,))]))``."""
        steps = set(parts[0].accuracy_at) if parts else set()
        if any(set(p.accuracy_at) != steps for p in parts):
            raise ValueError("SeedRuns.join: the parts were read at different steps")
        chain = lambda lists: [x for xs in lists for x in xs]
        return cls(chain(p.models for p in parts), chain(p.losses for p in parts), chain(p.accuracy for p in parts),
                   {k: chain(p.accuracy_at[k] for p in parts) for k in sorted(steps)})


def token_accuracy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> float:
    """Fraction of positions where ``argmax(logits) == targets`` (positions equal to ignore_index skipped)."""
    keep = targets != ignore_index
    return (logits.argmax(-1)[keep] == targets[keep]).float().mean().item()


class _Bar:
    """Progress of ``steps`` training steps: a widget in a notebook kernel, tqdm in a terminal.

    The widget's saved output reads ``"<desc>: <steps> training steps"`` (deterministic, so nbval
    can compare it, and what a not-yet-run notebook shows instead of ``HBox(children=...``).
    """

    def __init__(self, steps: int, desc: str, enabled: bool):
        self.steps, self.desc, self.widget, self.tqdm = steps, desc, None, None
        if not enabled:
            return
        if in_kernel():
            import ipywidgets as W
            from IPython.display import display

            self.bar = W.IntProgress(value=0, min=0, max=steps, description=desc,
                                     style={"description_width": "initial"})
            self.label = W.Label(f"0/{steps}")
            self.widget = saved_box("HBox")([self.bar, self.label])
            self.widget.saved_text = f"{desc}: {steps} training steps"
            display(self.widget)
        else:
            from tqdm import tqdm
            self.tqdm = tqdm(total=steps, desc=desc, leave=False)

    def update(self, step: int, loss: float):
        if self.widget is not None and (step == self.steps or step % max(1, self.steps // 50) == 0):
            self.bar.value = step
            self.label.value = f"{step}/{self.steps}, loss {loss:.3f}"
        elif self.tqdm is not None:
            self.tqdm.update(1)
            self.tqdm.set_postfix(loss=f"{loss:.3f}", refresh=False)

    def close(self):
        if self.tqdm is not None:
            self.tqdm.close()


def fit(model: nn.Module, sample: Callable[[torch.Generator], Batch], *, steps: int, lr: float = 3e-3,
        seed: int = 0, progress: bool = True, desc: str = "training", schedule: str = "one-cycle",
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        forward: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None) -> list[float]:
    """Train ``model`` with AdamW for ``steps`` batches drawn by ``sample(gen)``; return the losses.

    Deterministic for a given ``seed``: both the parameters' initialisation (the caller seeds it) and
    the data stream (``gen``) are seeded; we use no dropout and no non-deterministic kernels on CPU.
    Training runs on one CPU thread: models this small are faster that way (no thread hand-offs, no
    fighting a second notebook for the two cores), and the float reductions, hence the printed
    accuracies, do not depend on the machine's core count.
    ``forward(model, x)`` defaults to ``model(x)``; ``loss_fn(logits, y)`` defaults to token-level
    cross-entropy over the last axis. ``schedule`` is one of :data:`SCHEDULES`.
    """
    gen = torch.Generator().manual_seed(seed)
    loss_fn = loss_fn or (lambda logits, y: F.cross_entropy(logits.flatten(0, -2), y.flatten()))
    forward = forward or (lambda m, x: m(x))
    opt = _adamw(model.parameters(), lr)
    sched = _scheduler(opt, lr, steps, schedule)
    device = next(model.parameters()).device
    threads = _one_thread()
    model.train()
    losses = []
    bar = _Bar(steps, desc, progress)
    _training_started()
    try:
        for step in range(1, steps + 1):
            _stop_if_cancelled()
            x, y = sample(gen)
            loss = loss_fn(forward(model, x.to(device)), y.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
            bar.update(step, losses[-1])
    finally:
        bar.close()
        _restore_threads(threads)
        model.eval()
    return losses


def _step(opt: torch.optim.Optimizer, params: list[torch.Tensor], ratio: torch.Tensor | None) -> None:
    """``opt.step()``; with ``ratio`` (S,), model i's update (the parameters' slice i) is scaled by ratio[i]."""
    if ratio is None:
        opt.step()
        return
    before = [p.detach().clone() for p in params]
    opt.step()
    with torch.no_grad():
        for p, b in zip(params, before):
            p.copy_(torch.lerp(b, p, ratio.view(-1, *(1,) * (p.dim() - 1)).to(p.dtype)))


class _Forward(nn.Module):
    """Wraps a model so that ``functional_call`` can run a custom ``forward(model, x)``."""

    def __init__(self, model: nn.Module, forward: Callable[[nn.Module, torch.Tensor], torch.Tensor]):
        super().__init__()
        self.model, self._fwd = model, forward

    def forward(self, x):
        return self._fwd(self.model, x)


def fit_many(models: Sequence[nn.Module], sample: Callable[[torch.Generator], Batch], *, steps: int,
             seeds: Sequence[int], lr: float | Sequence[float] = 3e-3, progress: bool = True,
             desc: str = "training", schedule: str = "one-cycle",
             at_steps: Mapping[int, Callable[[list[nn.Module]], None]] | None = None,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
             forward: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None) -> list[list[float]]:
    """Train ``models[i]`` on the data stream of ``seeds[i]``, all in one batched loop; return each one's losses.

    The same contract as :func:`fit` (AdamW, one-cycle schedule, one CPU thread), applied to every model:
    ``fit_many(models, sample, seeds=s, ...)[i]`` equals ``fit(models[i], sample, seed=s[i], ...)`` to
    round-off. The models must share one architecture (the same parameter names and shapes; their values
    differ); they are trained in place and left in eval mode. Dropout is not supported (the models'
    random streams would differ from :func:`fit`'s).
    ``lr`` may also be one peak learning rate per model (a learning-rate sweep in one batch): model i then
    follows ``fit(..., lr=lr[i])``. AdamW's step is ``lr × schedule × (a function of the gradients alone)``
    (no weight decay), so each model's step is the step at the largest rate, scaled by ``lr[i] / max(lr)``.
    ``at_steps={k: f}`` calls ``f(models)`` right after step ``k``, with the models holding that step's
    weights in eval mode — e.g. to read each model's accuracy at step 250 of a longer constant-rate run.
    """
    models = list(models)
    lrs = [float(lr)] * len(models) if isinstance(lr, (int, float)) else [float(r) for r in lr]
    if len(lrs) != len(models) or min(lrs, default=0) <= 0:
        raise ValueError(f"fit_many needs one positive lr (or one per model), got {len(lrs)} for {len(models)} models")
    if len(models) != len(seeds) or not models:
        raise ValueError(f"fit_many needs one seed per model, got {len(models)} models and {len(seeds)} seeds")
    shapes = {n: p.shape for n, p in models[0].named_parameters()}
    for m in models[1:]:
        if {n: p.shape for n, p in m.named_parameters()} != shapes:
            raise ValueError("fit_many: the models must share one architecture (parameter names and shapes)")
    loss_fn = loss_fn or (lambda logits, y: F.cross_entropy(logits.flatten(0, -2), y.flatten()))
    forward = forward or (lambda m, x: m(x))
    device = next(models[0].parameters()).device
    wrapped = [_Forward(m, forward) for m in models]
    params, buffers = torch.func.stack_module_state(wrapped)        # name -> (S, ...) leaf tensors
    base = copy.deepcopy(wrapped[0]).to("meta")
    base.train()

    def one_loss(p, b, x, y):
        return loss_fn(torch.func.functional_call(base, (p, b), (x,)), y)

    batched_loss = torch.vmap(one_loss)
    opt = _adamw(params.values(), max(lrs))
    sched = _scheduler(opt, max(lrs), steps, schedule)
    ratio = None if len(set(lrs)) == 1 else torch.tensor(lrs, device=device) / max(lrs)      # (S,)
    at_steps = dict(at_steps or {})
    gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
    threads = _one_thread()
    losses: list[list[float]] = [[] for _ in models]
    bar = _Bar(steps, desc, progress)
    _training_started()
    try:
        for step in range(1, steps + 1):
            _stop_if_cancelled()
            xs, ys = zip(*(sample(g) for g in gens))
            with _FoldedSDPA():
                per_model = batched_loss(params, buffers, torch.stack(xs).to(device), torch.stack(ys).to(device))
            opt.zero_grad(set_to_none=True)
            per_model.sum().backward()                  # model i's parameters get model i's gradient only
            _step(opt, list(params.values()), ratio)
            sched.step()
            for i, v in enumerate(per_model.tolist()):
                losses[i].append(v)
            bar.update(step, sum(per_model.tolist()) / len(models))
            if step in at_steps:
                _unstack(wrapped, params, buffers)
                at_steps[step](models)
    finally:
        bar.close()
        _restore_threads(threads)
    _unstack(wrapped, params, buffers)
    return losses


class _FoldedSDPA(TorchFunctionMode):
    """Under ``vmap``, ``F.scaled_dot_product_attention`` runs SDPA's fused kernel once on the models' axis folded
    into the batch axis, in this thread only.

    SDPA treats every axis before the heads as batch, so ``S`` models' ``(B, H, L, E)`` inputs are one
    ``(S·B, H, L, E)`` call; each model gets what its own call would give (the kernel is the one :func:`fit`
    uses). Without this rule vmap has none for the fused CPU kernel and would loop over the models with a
    warning. Unbatched ``(L, E)`` inputs, which SDPA computes by its math form, keep vmap's own rule for it.
    The fused kernel is not faster at every shape: three seeds of lesson 07's hard MHA (32 tokens, heads of
    width 4) train 60 steps in 2.85 s against SDPA's math form's 3.42 s, three of lesson 02's one-head
    KeyPairTask model (8 tokens, one head of width 32) in 1.62 s against 1.23 s (one core, best of 3).
    A torch-function mode is per thread: :func:`side_by_side`'s other threads are untouched."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            bound = _sdpa_args(*args, **kwargs)
            tensors = [t for t in bound[:4] if t is not None]
            if bound[0].dim() >= 3 and any(torch._C._functorch.is_batchedtensor(t) for t in tensors):
                return _sdpa_folded(*bound)
        return func(*args, **kwargs)


def _sdpa_args(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return query, key, value, attn_mask, float(dropout_p), bool(is_causal), scale, bool(enable_gqa)


@torch.library.custom_op("attn_course::sdpa_folded", mutates_args=(), schema="(Tensor query, Tensor key, Tensor value, "
                         "Tensor? attn_mask, float dropout_p, bool is_causal, float? scale, bool enable_gqa) -> Tensor")
def _sdpa_folded(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                                          enable_gqa=enable_gqa)


@_sdpa_folded.register_fake
def _(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


@_sdpa_folded.register_vmap
def _(info, in_dims, query, key, value, attn_mask, *rest):
    """The batching rule: the models' axis S first, then folded into the first batch axis."""
    S = info.batch_size
    front = lambda t, d: t.expand(S, *t.shape) if d is None else t.movedim(d, 0)
    q, k, v = (front(t, d) for t, d in zip((query, key, value), in_dims))
    if attn_mask is not None:                   # broadcast to (S, ..., Lq, Lk) first: the folded axis has S·B rows
        m = front(attn_mask, in_dims[3])
        attn_mask = m.view(S, *(1,) * (q.dim() - m.dim()), *m.shape[1:]).expand(*q.shape[:-1], k.shape[-2])
    fold = lambda t: None if t is None else t.flatten(0, 1)
    out = F.scaled_dot_product_attention(fold(q), fold(k), fold(v), fold(attn_mask), *rest[:2], scale=rest[2],
                                         enable_gqa=rest[3])
    return out.unflatten(0, (S, -1)), 0


def _unstack(wrapped: list[nn.Module], params: dict, buffers: dict) -> None:
    """Copy model i's slice of the stacked ``params``/``buffers`` into ``wrapped[i]``; eval mode."""
    with torch.no_grad():
        for i, w in enumerate(wrapped):
            for name, p in w.named_parameters():
                p.copy_(params[name][i])
            for name, b in w.named_buffers():
                b.copy_(buffers[name][i])
            w.eval()


T = TypeVar("T")
_job = threading.local()          # .next_turn: lets the next job of side_by_side() start building its models
_cancelled = threading.Event()    # set when the cell running side_by_side() is interrupted or a job fails


class _Stopped(KeyboardInterrupt):
    """A side_by_side job stopped because the cell was interrupted or another job failed."""


def _training_started() -> None:
    """Called by :func:`fit` and :func:`fit_many` once their models are built and their progress bar is shown."""
    next_turn = getattr(_job, "next_turn", None)
    if next_turn is not None:
        _job.next_turn = None
        next_turn.set()


def _stop_if_cancelled() -> None:
    if getattr(_job, "in_side_by_side", False) and _cancelled.is_set():
        raise _Stopped("side_by_side: stopped (the cell was interrupted or another job failed)")


def _one_thread() -> int:
    """Train on one CPU thread; return the count to restore (side_by_side's workers leave it to side_by_side)."""
    if getattr(_job, "in_side_by_side", False):
        return 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    return threads


def _restore_threads(threads: int) -> None:
    if threads:
        torch.set_num_threads(threads)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))          # what taskset / a container leaves this process
    except AttributeError:                           # macOS, Windows
        return os.cpu_count() or 1


def side_by_side(jobs: Sequence[Callable[[], T]], *, workers: int | None = None) -> list[T]:
    """``[job() for job in jobs]``, with the jobs' training loops running at the same time, one core each.

    Each job builds its models (seeding torch's global generator, as the demos do) and trains them with
    :func:`fit` or :func:`fit_many`. The jobs *start* one after another, in order: job ``i + 1`` begins
    only once job ``i`` has built its models and entered its training loop, so every model gets exactly
    the initial weights, and every progress bar the place, that it gets in the plain loop. The loops then
    run concurrently in threads (torch releases the GIL inside its kernels), every one on a single CPU
    thread, as :func:`fit` always trains — so each result is the one ``job()`` gets run alone, the same
    kernels in the same order (``tests/test_train_batched.py``). ``workers`` defaults to the cores this process may use
    (``taskset``-aware), at most ``len(jobs)``; with one core, or a CUDA device present, the jobs simply
    run one after another. A job must not seed or draw from torch's global generator after its training
    starts. Interrupting the cell stops every job at its next step.
    """
    jobs = list(jobs)
    if workers is None:
        workers = 1 if torch.cuda.is_available() else _cores()
    workers = min(int(workers), len(jobs))
    if workers <= 1:
        return [job() for job in jobs]
    turns = [threading.Event() for _ in jobs]
    turns[0].set()

    def run(i: int):
        turns[i].wait()
        if _cancelled.is_set():
            raise _Stopped("side_by_side: not started (the cell was interrupted or another job failed)")
        _job.in_side_by_side = True
        _job.next_turn = turns[i + 1] if i + 1 < len(jobs) else None
        try:
            return jobs[i]()
        except BaseException:
            _cancelled.set()
            raise
        finally:
            _training_started()         # a job that never trained (or failed) lets the next one start
            _job.in_side_by_side = False

    threads = torch.get_num_threads()
    torch.set_num_threads(1)            # before any worker starts: every worker thread then runs single-threaded
    _cancelled.clear()
    pool = ThreadPoolExecutor(workers, thread_name_prefix="side_by_side")
    futures = [pool.submit(run, i) for i in range(len(jobs))]
    try:
        wait(futures)
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:                      # the job that failed first, not the others it stopped
            raise next((e for e in errors if not isinstance(e, _Stopped)), errors[0])
        return [f.result() for f in futures]
    except BaseException:
        _cancelled.set()
        for t in turns:
            t.set()
        raise
    finally:
        pool.shutdown(wait=True)
        _cancelled.clear()
        torch.set_num_threads(threads)
