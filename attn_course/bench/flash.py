"""``attn-course bench --suite flash``: the pure-PyTorch FlashAttention forward against SDPA, one tuning step at a time.

Forward (no grad), fp32, ``(B, H, L, D)`` inputs, one row per ``(causal, L)``; the methods add one change each
(:mod:`attn_course.flash_tuned` explains them):

* ``readable``    — :func:`attn_course.flash_attention` with its default 64 × 64 tiles (the lesson's loop);
* ``big_tiles``   — the same loop with 256 × 512 tiles;
* ``tuned_exact`` — :func:`attn_course.flash_tuned.flash_attention_tuned` ``(lazy_rescale=False)``: 256 × 512,
  ``Kᵀ`` scaled once, no per-tile allocations, the FlashAttention-2 max-and-rescale on every tile;
* ``tuned``       — ``flash_attention_tuned`` (conditional rescaling: two passes per tile instead of four);
* ``sdpa``        — ``F.scaled_dot_product_attention`` (PyTorch's fused C++ flash kernel on CPU).

All methods of a row are timed in the same interleaved rounds (:mod:`attn_course.bench.runner`), so the
per-round ratios to SDPA are robust to the machine's load; the table prints each method's median ratio to
SDPA and the range of the per-round ratios. Each cell also records ``max_err`` against SDPA.
"""
from __future__ import annotations

from pathlib import Path

from .runner import Case, Suite, evaluate_targets

__all__ = ["SUITE", "STEPS", "RECORDED_FLASH_CPU", "TARGETS", "step", "ratio_to_sdpa", "format_flash", "check_flash"]

STEPS = ("readable", "big_tiles", "tuned_exact", "tuned", "sdpa")
RECORDED_FLASH_CPU = Path(__file__).resolve().parents[1] / "data" / "bench_flash_cpu_2core.json"

# (description, (causal, L), metric, low, high): time ratios within one run (issue 42's goal)
TARGETS = (
    ("forward, L=4096: tuned flash time <= 1.3x SDPA", (False, 4096), "tuned/sdpa", None, 1.3),
    ("causal forward, L=4096: tuned flash time <= 1.5x SDPA", (True, 4096), "tuned/sdpa", None, 1.5),
)


def step(name: str, is_causal: bool):
    """``fn(q, k, v)`` of one method of :data:`STEPS` (forward; call it under ``torch.no_grad()``)."""
    import torch.nn.functional as F

    from ..flash import flash_attention
    from ..flash_tuned import flash_attention_tuned
    fns = {"readable": lambda q, k, v: flash_attention(q, k, v, is_causal=is_causal),
           "big_tiles": lambda q, k, v: flash_attention(q, k, v, is_causal=is_causal, block_q=256, block_k=512),
           "tuned_exact": lambda q, k, v: flash_attention_tuned(q, k, v, is_causal=is_causal, lazy_rescale=False),
           "tuned": lambda q, k, v: flash_attention_tuned(q, k, v, is_causal=is_causal),
           "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)}
    if name not in fns:
        raise ValueError(f"unknown method {name!r}; choose from {STEPS}")
    return fns[name]


def _build(method: str, row: dict, args: dict, device) -> Case:
    import torch
    import torch.nn.functional as F
    fn = step(method, row["causal"])
    shape = (int(args.get("batch", 1)), int(args.get("heads", 8)), row["L"], int(args.get("dim", 64)))
    q, k, v = (torch.randn(shape, device=torch.device(device)) for _ in range(3))

    def run():
        with torch.no_grad():
            return fn(q, k, v)

    def error():
        with torch.no_grad():
            return float((run() - F.scaled_dot_product_attention(q, k, v, is_causal=row["causal"])).abs().max())
    return Case(run, {}, error)


def ratio_to_sdpa(row: dict, method: str) -> tuple[float, float, float] | None:
    """``(median ratio, lowest, highest per-round ratio)`` of ``method``'s time to SDPA's in one row."""
    a, b = row.get(method, {}), row.get("sdpa", {})
    if not a.get("times_s") or not b.get("times_s"):
        return None
    per_round = [x / y for x, y in zip(a["times_s"], b["times_s"])]
    return a["time_s"] / b["time_s"], min(per_round), max(per_round)


def format_flash(rows: list[dict]) -> str:
    """Markdown: per row, each method's median ms and its time ratio to SDPA (per-round range)."""
    methods = [m for m in STEPS if any(m in r for r in rows)]
    lines = ["| causal | L | " + " | ".join(f"{m} ms" for m in methods) + " | "
             + " | ".join(f"{m}/sdpa (rounds)" for m in methods if m != "sdpa") + " |",
             "|" + "---|" * (2 + 2 * len(methods) - ("sdpa" in methods))]
    for r in rows:
        ms = [f"{r[m]['time_s'] * 1e3:.0f}" if "time_s" in r.get(m, {}) else "—" for m in methods]
        rat = []
        for m in methods:
            if m != "sdpa":
                x = ratio_to_sdpa(r, m)
                rat.append("—" if x is None else f"{x[0]:.2f} ({x[1]:.2f}–{x[2]:.2f})")
        lines.append(f"| {'yes' if r['causal'] else 'no'} | {r['L']} | " + " | ".join(ms + rat) + " |")
    errors = [f"causal={r['causal']} L={r['L']} {m}: {r[m]['error']}" for r in rows for m in methods
              if "error" in r.get(m, {})]
    return "\n".join(lines + [f"\nnot measured: {e}" for e in errors])


def check_flash(rows: list[dict]) -> list[tuple[str, float | None, bool]]:
    """Evaluate :data:`TARGETS` on the median ratios: ``(description, measured ratio or None, passed)``."""
    flat = {(r["causal"], r["L"]): {"tuned/sdpa": (ratio_to_sdpa(r, "tuned") or (None,))[0]} for r in rows}
    return evaluate_targets(TARGETS, flat)


def _rows(args: dict) -> list[dict]:
    causal = {"no": (False,), "yes": (True,), "both": (False, True)}[args.get("causal", "both")]
    return [{"causal": c, "L": L} for c in causal for L in args["lengths"]]


def _header(args: dict) -> str:
    return f"B={args['batch']} H={args['heads']} D={args['dim']} float32 {args['device']}; forward"


SUITE = Suite(
    name="flash", methods=STEPS, rows=_rows, build=_build, check=check_flash, format=format_flash,
    quick=dict(lengths=[1024]), full=dict(lengths=[4096]), recorded=RECORDED_FLASH_CPU,
    row_label=lambda row: f"causal={row['causal']!s:5s} L={row['L']:5d}", header=_header,
)
