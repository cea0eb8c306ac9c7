"""``attn-course bench`` (``--suite attention``): naive attention vs ``flash_attention`` vs SDPA, side by side.

"naive" is the three-line textbook computation ``softmax(Q Kᵀ · scale) V`` (with the causal mask filled
in place), which materialises the ``L × L`` scores and weights; "flash" is :func:`attn_course.flash_attention`
(tiles ``--block`` × ``--block``); "sdpa" is ``torch.nn.functional.scaled_dot_product_attention``, which on
CPU and CUDA dispatches to fused kernels that do not store the matrix either (``--sdpa-backend`` pins one of
them with ``torch.nn.attention.sdpa_kernel``: flash, efficient, cudnn or math). One row per
``(mode, causal, L)``; modes ``fwd`` (no grad) and ``fwd+bwd``. Device: CUDA when available (float16:
the FLASH backend has no fp32 kernel), else CPU (float32). Measured by :mod:`attn_course.bench.runner`.
"""
from __future__ import annotations

import math
from pathlib import Path

from .runner import Case, Suite, default_device, evaluate_targets, markdown_table, measure_row, method_columns

__all__ = ["SUITE", "METHODS", "TARGETS", "COLUMNS", "SDPA_BACKENDS", "RECORDED_CPU", "measure", "table_rows",
           "format_table", "check_targets"]

METHODS = ("naive", "flash", "sdpa")
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")     # torch.nn.attention.SDPBackend members, by short name
COLUMNS = ("mode", "causal", "L", "naive ms", "flash ms", "sdpa ms", "naive MiB", "flash MiB", "sdpa MiB",
           "flash/naive time", "flash/sdpa time", "flash/naive mem")
RECORDED_CPU = Path(__file__).resolve().parents[1] / "data" / "bench_cpu_2core.json"

# (description, (mode, causal, L), metric, low, high) — the CPU targets of the FlashAttention lesson
TARGETS = (
    ("forward, L=4096: flash memory <= 5% of naive", ("fwd", False, 4096), "flash/naive mem", None, 0.05),
    ("forward, L=4096: flash time <= 1.0x naive", ("fwd", False, 4096), "flash/naive time", None, 1.0),
    ("forward, L=4096: flash time <= 2x SDPA", ("fwd", False, 4096), "flash/sdpa time", None, 2.0),
    ("causal forward, L=4096: flash time <= 0.5x naive", ("fwd", True, 4096), "flash/naive time", None, 0.5),
    ("forward+backward, L=2048: flash memory <= 20% of naive", ("fwd+bwd", False, 2048), "flash/naive mem", None, 0.20),
)


def _naive(q, k, v, is_causal):
    import torch
    S = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))          # (B, H, L, L)
    if is_causal:
        L = q.shape[-2]
        S = S.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=q.device).tril(), -math.inf)
    return torch.softmax(S, dim=-1) @ v                                    # (B, H, L, D)


def _method(name: str, block: int, sdpa_backend: str | None = None):
    import torch.nn.functional as F

    from ..flash import flash_attention

    def sdpa(q, k, v, c):
        if sdpa_backend is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=c)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                   "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[sdpa_backend]
        with sdpa_kernel(backend):                   # RuntimeError if that kernel cannot run these inputs
            return F.scaled_dot_product_attention(q, k, v, is_causal=c)

    return {"naive": _naive,
            "flash": lambda q, k, v, c: flash_attention(q, k, v, is_causal=c, block_q=block, block_k=block),
            "sdpa": sdpa}[name]


def _dtype(args, device):
    import torch
    return args.get("dtype") or ("float16" if torch.device(device).type == "cuda" else "float32")


def _build(method: str, row: dict, args: dict, device) -> Case:
    import torch
    fn = _method(method, int(args.get("block", 128)), args.get("sdpa_backend"))
    dev, dt = torch.device(device), getattr(torch, _dtype(args, device))
    backward, causal = row["mode"] == "fwd+bwd", row["causal"]
    shape = (int(args.get("batch", 1)), int(args.get("heads", 8)), row["L"], int(args.get("dim", 64)))
    q, k, v = (torch.randn(shape, device=dev, dtype=dt, requires_grad=backward) for _ in range(3))
    grad = torch.randn(shape, device=dev, dtype=dt)

    def run():
        if backward:
            fn(q, k, v, causal).backward(grad)
            q.grad = k.grad = v.grad = None
        else:
            with torch.no_grad():
                fn(q, k, v, causal)
    return Case(run)


def _rows(args: dict) -> list[dict]:
    causal = {"no": (False,), "yes": (True,), "both": (False, True)}[args.get("causal", "both")]
    return [{"mode": mode, "causal": c, "L": L} for mode in args["modes"] for c in causal for L in args["lengths"]]


def measure(method: str, *, L: int, mode: str = "fwd", causal: bool = False, batch: int = 1, heads: int = 8,
            dim: int = 64, block: int = 128, dtype: str | None = None, device: str | None = None,
            repeats: int = 7, warmup: int = 1, threads: int = 1, seed: int = 0,
            sdpa_backend: str | None = None) -> dict:
    """Measure one method in the *current* process (the runner's protocol, :func:`.runner.measure_row`).

    Returns ``{"method", "L", "mode", "causal", "device", "dtype", "times_s": [...], "time_s": median,
    "min_s", "max_s", "mem_bytes": peak extra, "first_call_s"}``. ``device`` defaults to CUDA when
    available; ``dtype`` to ``"float16"`` on CUDA and ``"float32"`` on CPU; ``threads`` (default 1; 0
    leaves torch's count) is fixed during the measurement and restored after. Call it in a fresh process
    for a meaningful CPU memory figure (``attn-course bench`` does).
    """
    import torch
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if sdpa_backend is not None and sdpa_backend not in SDPA_BACKENDS:
        raise ValueError(f"sdpa_backend must be one of {SDPA_BACKENDS} or None, got {sdpa_backend!r}")
    if repeats <= 0 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    device = default_device() if device is None else str(device)
    dtype = dtype or ("float16" if torch.device(device).type == "cuda" else "float32")
    args = dict(batch=batch, heads=heads, dim=dim, block=block, dtype=dtype, device=device, repeats=repeats,
                warmup=warmup, threads=threads, seed=seed, sdpa_backend=sdpa_backend)
    cell = measure_row(SUITE, {"mode": mode, "causal": causal, "L": L}, [method], args)[method]
    if "error" in cell:
        raise RuntimeError(f"{method} at L={L} ({mode}, causal={causal}) failed: {cell['error']}")
    return {"method": method, "L": L, "mode": mode, "causal": causal, "device": device, "dtype": dtype, **cell}


def _ratio(row, a, b, key):
    x, y = row.get(a, {}).get(key), row.get(b, {}).get(key)
    return None if x is None or not y else x / y


def table_rows(rows: list[dict]) -> list[dict]:
    """Flatten measurements into the table's columns (ms, MiB, ratios; None where not measured)."""
    out = []
    for r in rows:
        t = {"mode": r["mode"], "causal": r["causal"], "L": r["L"], **method_columns(r, METHODS)}
        t["flash/naive time"] = _ratio(r, "flash", "naive", "time_s")
        t["flash/sdpa time"] = _ratio(r, "flash", "sdpa", "time_s")
        t["flash/naive mem"] = _ratio(r, "flash", "naive", "mem_bytes")
        out.append(t)
    return out


def format_table(rows: list[dict]) -> str:
    """A Markdown table of the rows (ms and MiB per method, ratios); cells not measured are listed below."""
    return markdown_table(COLUMNS, table_rows(rows), rows, METHODS,
                          lambda r: f"{r['mode']} causal={r['causal']} L={r['L']}")


def check_targets(rows: list[dict]) -> list[tuple[str, float | None, bool]]:
    """Evaluate :data:`TARGETS` on the measured rows: ``(description, measured ratio or None, passed)``."""
    return evaluate_targets(TARGETS, {(t["mode"], t["causal"], t["L"]): t for t in table_rows(rows)})


def _describe(args: dict) -> str:
    sdpa = f" sdpa backend={args['sdpa_backend']}" if args.get("sdpa_backend") else ""
    return f"B={args['batch']} H={args['heads']} D={args['dim']} {args['dtype']} {args['device']} block={args['block']}{sdpa}"


SUITE = Suite(
    name="attention", methods=METHODS, rows=_rows, build=_build, check=check_targets, format=format_table,
    quick=dict(lengths=[512, 1024], modes=["fwd", "fwd+bwd"], causal="both"),
    full=dict(lengths=[512, 1024, 2048, 4096], modes=["fwd", "fwd+bwd"], causal="both"),
    recorded=RECORDED_CPU,
    row_label=lambda row: f"{row['mode']:7s} causal={row['causal']!s:5s} L={row['L']:5d}", header=_describe,
)
