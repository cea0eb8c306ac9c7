"""The one training loop every tiny demo shares: seeded, CPU-fast, with a progress bar."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .._notebook import in_kernel, saved_box

__all__ = ["fit", "token_accuracy"]

Batch = tuple[torch.Tensor, torch.Tensor]


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
        seed: int = 0, progress: bool = True, desc: str = "training",
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        forward: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None) -> list[float]:
    """Train ``model`` with AdamW for ``steps`` batches drawn by ``sample(gen)``; return the losses.

    Deterministic for a given ``seed``: both the parameters' initialisation (the caller seeds it) and
    the data stream (``gen``) are seeded; we use no dropout and no non-deterministic kernels on CPU.
    Training runs on one CPU thread: models this small are faster that way (no thread hand-offs, no
    fighting a second notebook for the two cores), and the float reductions, hence the printed
    accuracies, do not depend on the machine's core count.
    ``forward(model, x)`` defaults to ``model(x)``; ``loss_fn(logits, y)`` defaults to token-level
    cross-entropy over the last axis.
    """
    gen = torch.Generator().manual_seed(seed)
    loss_fn = loss_fn or (lambda logits, y: F.cross_entropy(logits.flatten(0, -2), y.flatten()))
    forward = forward or (lambda m, x: m(x))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    device = next(model.parameters()).device
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model.train()
    losses = []
    bar = _Bar(steps, desc, progress)
    try:
        for step in range(1, steps + 1):
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
        torch.set_num_threads(threads)
        model.eval()
    return losses
