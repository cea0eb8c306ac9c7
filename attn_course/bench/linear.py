"""``attn-course bench --suite linear``: linear attention vs SDPA vs textbook softmax attention, side by side.

Methods, all forward only (``torch.no_grad``), inputs ``(B, H, L, E)``, one row per ``(causal, L)``:

* ``linear`` — :func:`attn_course.linear_attention` (φ = elu + 1; causal: the chunked scan);
* ``sdpa`` — ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels, no L × L matrix);
* ``naive`` — softmax attention that materialises **one** ``(B, H, L, L)`` score matrix and does the
  mask, the softmax and the scaling in place on it — the leanest textbook version, so the memory
  comparison with ``linear`` is not flattered by avoidable copies;
* ``linear_half`` — ``linear`` on the first L/2 positions, timed in the same interleaved rounds, so the
  growth column (time at L over time at L/2) compares two measurements taken at the same moments. (Rows
  run at different times, and on a busy machine a later row can come out faster than an earlier one.)

Measured by :mod:`attn_course.bench.runner`. Lesson 10 prints the recorded run.
"""
from __future__ import annotations

import math
from pathlib import Path

from .runner import Case, Suite, evaluate_targets, markdown_table, measure_row, method_columns
from .runner import load_recorded as _load_recorded

__all__ = ["SUITE", "METHODS", "TARGETS", "COLUMNS", "RECORDED_CPU", "measure", "table_rows", "format_table",
           "check_targets", "load_recorded"]

METHODS = ("linear", "sdpa", "naive", "linear_half")
COLUMNS = ("causal", "L", "linear ms", "sdpa ms", "naive ms", "linear MiB", "sdpa MiB", "naive MiB",
           "linear/sdpa time", "linear/naive mem", "linear time ×(L/2→L)")
RECORDED_CPU = Path(__file__).resolve().parents[1] / "data" / "bench_linear_cpu_2core.json"

# (description, (causal, L), metric, low, high) — the CPU targets of lesson 10. The growth target is
# two-sided: linear attention's time should about double when L doubles (a time that does not grow is noise,
# not a better growth law); it is measured within one row (linear at L and at L/2, interleaved).
TARGETS = (
    ("non-causal, L=8192: linear time <= 0.2x SDPA", (False, 8192), "linear/sdpa time", None, 0.2),
    ("non-causal: linear time grows 1.5x-2.5x from L=4096 to L=8192 (linear in L)", (False, 8192),
     "linear time ×(L/2→L)", 1.5, 2.5),
    ("causal, L=8192: linear peak extra memory <= 10% of naive", (True, 8192), "linear/naive mem", None, 0.10),
)


def _naive(q, k, v, is_causal):
    import torch
    L = q.shape[-2]
    S = q @ k.transpose(-2, -1)                                            # (B, H, L, L): the one big matrix
    S.mul_(1.0 / math.sqrt(q.shape[-1]))
    if is_causal:
        S.masked_fill_(~torch.ones(L, L, dtype=torch.bool, device=q.device).tril(), -math.inf)
    S.sub_(S.amax(-1, keepdim=True)).exp_()                                # softmax, in place
    S.div_(S.sum(-1, keepdim=True))
    return S @ v


def _method(name: str):
    import torch.nn.functional as F

    from ..linear import linear_attention
    return {"linear": lambda q, k, v, c: linear_attention(q, k, v, is_causal=c),
            "sdpa": lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c),
            "naive": _naive,
            "linear_half": lambda q, k, v, c: linear_attention(q[..., : q.shape[-2] // 2, :], k[..., : k.shape[-2] // 2, :],
                                                               v[..., : v.shape[-2] // 2, :], is_causal=c)}[name]


def _build(method: str, row: dict, args: dict, device) -> Case:
    import torch
    fn = _method(method)
    dev, dt = torch.device(device), getattr(torch, args.get("dtype") or "float32")
    shape = (int(args.get("batch", 1)), int(args.get("heads", 8)), row["L"], int(args.get("dim", 64)))
    q, k, v = (torch.randn(shape, device=dev, dtype=dt) for _ in range(3))

    def run():
        with torch.no_grad():
            fn(q, k, v, row["causal"])
    return Case(run)


def _rows(args: dict) -> list[dict]:
    causal = {"no": (False,), "yes": (True,), "both": (False, True)}[args.get("causal", "both")]
    return [{"causal": c, "L": L} for c in causal for L in args["lengths"]]


def measure(method: str, *, L: int, causal: bool = False, batch: int = 1, heads: int = 8, dim: int = 64,
            dtype: str = "float32", device: str = "cpu", repeats: int = 7, warmup: int = 1, threads: int = 1,
            seed: int = 0) -> dict:
    """Measure one method in the *current* process (the runner's protocol): ``{"times_s", "time_s" (median),
    "min_s", "max_s", "mem_bytes", "first_call_s"}``. Call it in a fresh process for a meaningful memory figure."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    args = dict(batch=batch, heads=heads, dim=dim, dtype=dtype, device=device, repeats=repeats, warmup=warmup,
                threads=threads, seed=seed)
    cell = measure_row(SUITE, {"causal": causal, "L": L}, [method], args)[method]
    if "error" in cell:
        raise RuntimeError(f"{method} at L={L} (causal={causal}) failed: {cell['error']}")
    return {"method": method, "L": L, "causal": causal, **cell}


def _get(row, m, key):
    return row.get(m, {}).get(key)


def table_rows(rows: list[dict]) -> list[dict]:
    """Flatten measurements into the table's columns (ms, MiB, ratios; None where not measured)."""
    out, prev = [], {}
    for r in rows:
        t = {"causal": r["causal"], "L": r["L"], **method_columns(r, METHODS)}
        lin, sd, nv = _get(r, "linear", "time_s"), _get(r, "sdpa", "time_s"), _get(r, "naive", "mem_bytes")
        t["linear/sdpa time"] = lin / sd if lin is not None and sd else None
        lm = _get(r, "linear", "mem_bytes")
        t["linear/naive mem"] = lm / nv if lm is not None and nv else None
        half = _get(r, "linear_half", "time_s")
        p = prev.get(r["causal"])                                          # previous row with the same causal
        if "linear_half" in r:                                             # measured in the same rounds
            t["linear time ×(L/2→L)"] = lin / half if lin is not None and half else None
        else:                                                              # rows without it: the previous row
            t["linear time ×(L/2→L)"] = (lin / p[1] if lin is not None and p and p[1] and r["L"] == 2 * p[0] else None)
        prev[r["causal"]] = (r["L"], lin)
        out.append(t)
    return out


def format_table(rows: list[dict]) -> str:
    """A Markdown table of the rows."""
    return markdown_table(COLUMNS, table_rows(rows), rows, METHODS, lambda r: f"causal={r['causal']} L={r['L']}",
                          ratio_digits=3)


def check_targets(rows: list[dict]) -> list[tuple[str, float | None, bool]]:
    """Evaluate :data:`TARGETS`: ``(description, measured value or None, passed)``."""
    return evaluate_targets(TARGETS, {(t["causal"], t["L"]): t for t in table_rows(rows)})


def load_recorded(path: str | Path = RECORDED_CPU) -> tuple[dict, list[dict]]:
    """``(args, rows)`` of a recorded run (``attn-course bench --suite linear --json PATH``); the package ships
    the course's 2-core CPU run (lesson 10 prints it)."""
    return _load_recorded(path)


def _header(args: dict) -> str:
    return f"B={args['batch']} H={args['heads']} E={args['dim']} {args['dtype']} {args['device']}; forward"


SUITE = Suite(
    name="linear", methods=METHODS, rows=_rows, build=_build, check=check_targets, format=format_table,
    quick=dict(lengths=[1024, 2048], causal="both"), full=dict(lengths=[1024, 2048, 4096, 8192], causal="both"),
    recorded=RECORDED_CPU, row_label=lambda row: f"causal={row['causal']!s:5s} L={row['L']:5d}", header=_header,
)
