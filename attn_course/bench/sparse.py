"""``attn-course bench --suite sparse``: causal sliding-window attention five ways, side by side.

The measured comparison of lesson 09 (it corrects a popular tutorial's table of sparse-attention costs).
For each sequence length L, causal sliding-window attention with window W (forward, no grad) computed by:

* ``naive``        — ``softmax(QKᵀ·scale masked) V`` with a dense ``L × L`` bool mask: materialises the scores;
* ``sdpa_mask``    — ``F.scaled_dot_product_attention`` with the same dense bool mask;
* ``sdpa_causal``  — SDPA ``is_causal=True`` (plain causal, *no* window: the dense-causal baseline);
* ``flex``         — ``torch.compile(flex_attention)`` with the sliding-window ``BlockMask`` (empty tiles skipped);
* ``flash_window`` — :func:`attn_course.flash_attention` ``(window=W, is_causal=True)`` (band tiles only);
* ``flash_causal`` — :func:`attn_course.flash_attention` ``(is_causal=True)``: the same loop without the window.

Measured by :mod:`attn_course.bench.runner` (one fresh process per L, methods timed in interleaved rounds);
each cell also records ``first_call_s`` (for ``flex``: the compile), ``mask_bytes`` (the dense mask, L² bool,
or the BlockMask) and ``max_err`` (largest difference from SDPA with the dense window mask — or with
``is_causal`` for the two ``*_causal`` methods).
"""
from __future__ import annotations

import math
from pathlib import Path

from .runner import Case, Suite, evaluate_targets, load_recorded, measure_row

__all__ = ["SUITE", "SPARSE_METHODS", "SPARSE_TARGETS", "RECORDED_SPARSE_CPU", "measure_sparse", "format_sparse",
           "check_sparse", "load_recorded_sparse"]

SPARSE_METHODS = ("naive", "sdpa_mask", "sdpa_causal", "flex", "flash_window", "flash_causal")
RECORDED_SPARSE_CPU = Path(__file__).resolve().parents[1] / "data" / "bench_sparse_cpu_2core.json"

# (description, (L,), metric, low, high): time ratios within one run
SPARSE_TARGETS = (
    ("L=4096: flash_attention(window=W) <= 0.35x flash_attention(is_causal)", (4096,), "flash_window/flash_causal",
     None, 0.35),
    ("L=4096: compiled FlexAttention + BlockMask <= 0.3x SDPA + dense mask", (4096,), "flex/sdpa_mask", None, 0.3),
)


def _window_mask(L, W, device):
    from ..masks import sliding_window_mask
    return sliding_window_mask(L, W, causal=True, device=device)                # (L, L) bool, L² bytes


def _setup(method, L, W, block, device):
    """Return ``fn(q, k, v)`` for one method, plus the extra bytes it keeps (its mask)."""
    import torch
    import torch.nn.functional as F
    if method == "naive":
        mask = _window_mask(L, W, device)

        def fn(q, k, v):
            S = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))           # (B, H, L, L)
            return torch.softmax(S.masked_fill_(~mask, -math.inf), dim=-1) @ v
        return fn, mask.numel()
    if method == "sdpa_mask":
        mask = _window_mask(L, W, device)
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)), mask.numel()
    if method == "sdpa_causal":
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), 0
    if method == "flex":
        from .. import sparse
        bm = sparse.block_mask(sparse.sliding_window(W), L, block=block, device=device)
        return (lambda q, k, v: sparse.flex(q, k, v, block_mask=bm)), sparse.block_mask_bytes(bm)
    from ..flash import flash_attention
    if method == "flash_window":
        return (lambda q, k, v: flash_attention(q, k, v, is_causal=True, window=W, block_q=block, block_k=block)), 0
    if method == "flash_causal":
        return (lambda q, k, v: flash_attention(q, k, v, is_causal=True, block_q=block, block_k=block)), 0
    raise ValueError(f"unknown method {method!r}; choose from {SPARSE_METHODS}")


def _build(method: str, row: dict, args: dict, device) -> Case:
    import torch
    import torch.nn.functional as F
    L, W = row["L"], int(args.get("window", 256))
    dev = torch.device(device)
    shape = (int(args.get("batch", 1)), int(args.get("heads", 8)), L, int(args.get("dim", 64)))
    q, k, v = (torch.randn(shape, device=dev) for _ in range(3))
    fn, mask_bytes = _setup(method, L, W, int(args.get("block", 128)), dev)

    def run():
        with torch.no_grad():
            return fn(q, k, v)

    def error():
        with torch.no_grad():                                            # the two *_causal methods: no window
            ref = (F.scaled_dot_product_attention(q, k, v, is_causal=True) if method.endswith("_causal") else
                   F.scaled_dot_product_attention(q, k, v, attn_mask=_window_mask(L, W, dev)))
            return float((run() - ref).abs().max())
    return Case(run, {"mask_bytes": int(mask_bytes)}, error)


def _skip(method: str, row: dict, args: dict) -> str | None:
    """``naive`` only up to ``naive_max`` (its L² scores, masked copy and weights: 6 GiB at L=8192, H=8)."""
    limit = int(args.get("naive_max", 4096))
    return f"skipped above L={limit} (memory)" if method == "naive" and row["L"] > limit else None


def measure_sparse(method: str, *, L: int, window: int = 256, batch: int = 1, heads: int = 8, dim: int = 64,
                   block: int = 128, device: str = "cpu", repeats: int = 7, warmup: int = 1, threads: int = 1,
                   seed: int = 0) -> dict:
    """One cell in the current process (the runner's protocol): ``{"time_s", "times_s", "min_s", "max_s",
    "mem_bytes", "first_call_s", "mask_bytes", "max_err"}``."""
    if method not in SPARSE_METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {SPARSE_METHODS}")
    args = dict(window=window, batch=batch, heads=heads, dim=dim, block=block, device=device, repeats=repeats,
                warmup=warmup, threads=threads, seed=seed)
    cell = measure_row(SUITE, {"L": L}, [method], args)[method]
    if "error" in cell:
        raise RuntimeError(f"{method} at L={L} failed: {cell['error']}")
    return {"method": method, "L": L, **cell}


def load_recorded_sparse(path: str | Path = RECORDED_SPARSE_CPU) -> tuple[dict, list[dict]]:
    """``(args, rows)`` of a recorded run; the package ships the course's 2-core CPU run (lesson 09 prints it)."""
    return load_recorded(path)


def _ratio(r, a, b):
    x, y = r.get(a, {}).get("time_s"), r.get(b, {}).get("time_s")
    return None if x is None or not y else x / y


def format_sparse(rows: list[dict]) -> str:
    """Markdown tables: time (ms), peak memory (MiB), mask bytes, ratios; flex compile time."""
    methods = [m for m in SPARSE_METHODS if any(m in r for r in rows)]

    def cell(r, m, key, scale, fmt):
        x = r.get(m, {}).get(key)
        return "—" if x is None else fmt.format(x * scale)

    def ratio(r, a, b):
        x = _ratio(r, a, b)
        return "—" if x is None else f"{x:.2f}"

    head = "| L | " + " | ".join(f"{m} ms" for m in methods) + " | flash_window/flash_causal | flex/sdpa_mask |"
    lines = [head, "|" + "---|" * (len(methods) + 3)]
    for r in rows:
        lines.append(f"| {r['L']} | " + " | ".join(cell(r, m, "time_s", 1e3, "{:.1f}") for m in methods)
                     + f" | {ratio(r, 'flash_window', 'flash_causal')} | {ratio(r, 'flex', 'sdpa_mask')} |")
    lines += ["", "| L | " + " | ".join(f"{m} MiB" for m in methods) + " | dense mask KiB | BlockMask KiB | flex first call s |",
              "|" + "---|" * (len(methods) + 4)]
    for r in rows:
        dense = r.get("sdpa_mask", {}).get("mask_bytes")
        blk = r.get("flex", {}).get("mask_bytes")
        lines.append(f"| {r['L']} | " + " | ".join(cell(r, m, "mem_bytes", 2**-20, "{:.0f}") for m in methods)
                     + f" | {'—' if dense is None else f'{dense / 1024:.0f}'} | {'—' if blk is None else f'{blk / 1024:.1f}'}"
                     + f" | {cell(r, 'flex', 'first_call_s', 1, '{:.1f}')} |")
    errors = [f"L={r['L']} {m}: {r[m]['error']}" for r in rows for m in methods if "error" in r.get(m, {})]
    return "\n".join(lines + [f"\nnot measured: {e}" for e in errors])


def check_sparse(rows: list[dict]) -> list[tuple[str, float | None, bool]]:
    """Evaluate :data:`SPARSE_TARGETS`: ``(description, measured ratio or None, passed)``."""
    flat = {(r["L"],): {"flash_window/flash_causal": _ratio(r, "flash_window", "flash_causal"),
                        "flex/sdpa_mask": _ratio(r, "flex", "sdpa_mask")} for r in rows}
    return evaluate_targets(SPARSE_TARGETS, flat)


def _header(args: dict) -> str:
    return (f"causal sliding window W={args['window']}, B={args['batch']} H={args['heads']} D={args['dim']} float32 "
            f"{args['device']} block={args['block']}; forward")


SUITE = Suite(
    name="sparse", methods=SPARSE_METHODS, rows=lambda args: [{"L": L} for L in args["lengths"]], build=_build,
    check=check_sparse, format=format_sparse, skip=_skip,
    quick=dict(lengths=[1024, 2048]), full=dict(lengths=[1024, 2048, 4096, 8192]),
    recorded=RECORDED_SPARSE_CPU, row_label=lambda row: f"L={row['L']:5d}", header=_header,
)
