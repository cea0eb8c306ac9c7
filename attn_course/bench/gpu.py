"""The course's measurements on a GPU, recorded: one run of ``tools/gpu_bench.py`` on one CUDA device.

The package ships the run on an NVIDIA H200 (:data:`RECORDED_GPU`), so lesson 08 can print measured GPU numbers
on any machine. Sections (each as ``tools/gpu_bench.py`` wrote it): ``env`` (device, driver, torch, triton),
``flash_check`` (lesson 08's Triton kernels and SDPA's FLASH backend against an fp64 reference),
``flash_perf`` (TFLOP/s forward and backward), ``flash_sweep`` (block sizes, warps, stages), ``sparse``
(lesson 09's sliding window) and ``ring`` (lesson 13 over NCCL).
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["RECORDED_GPU", "load_gpu_record", "combine", "flash_table", "flash_summary"]

RECORDED_GPU = Path(__file__).resolve().parents[1] / "data" / "gpu_h200.json"


def combine(run_dir: str | Path) -> dict:
    """``{section: result}`` (plus each section's seconds) from the ``<section>.json`` files of one run."""
    out = {}
    for p in sorted(Path(run_dir).glob("*.json")):
        data = json.loads(p.read_text())
        out[data["section"]] = {"seconds": data["seconds"], "result": data["result"]}
    return out


def load_gpu_record(path: str | Path = RECORDED_GPU) -> dict:
    """The recorded run: ``{section: {"seconds": s, "result": ...}}``."""
    return json.loads(Path(path).read_text())


def flash_table(rows: list[dict], L: int) -> str:
    """Markdown: Triton against SDPA's FLASH backend at length ``L``, forward and backward TFLOP/s (medians)."""
    lines = ["| dtype | d | causal | forward: Triton | FLASH | ratio | backward: Triton | FLASH | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["L"] == L:
            t, f = r["triton"], r["sdpa_flash"]
            lines.append(f"| {r['dtype']} | {r['d']} | {'yes' if r['causal'] else 'no'} | {t['fwd_tflops']:.0f} | "
                         f"{f['fwd_tflops']:.0f} | {r['fwd_ratio']:.2f}× | {t['bwd_tflops']:.0f} | "
                         f"{f['bwd_tflops']:.0f} | {r['bwd_ratio']:.2f}× |")
    return "\n".join(lines)


def flash_summary(rows: list[dict]) -> dict:
    """Lowest and highest Triton/FLASH TFLOP/s ratio over every row, forward and backward, and the lengths;
    ``spread``: the widest 10th–90th percentile range of any timing, relative to its median; ``fwd_ties``: the
    rows whose two forward timings' 10th–90th percentile ranges overlap (neither is faster beyond the noise)."""
    def overlap(a, b):
        return a["p10_ms"] <= b["p90_ms"] and b["p10_ms"] <= a["p90_ms"]
    timings = [r[impl][ph] for r in rows for impl in ("triton", "sdpa_flash") for ph in ("fwd", "bwd")]
    return {"lengths": sorted({r["L"] for r in rows}),
            "fwd": (min(r["fwd_ratio"] for r in rows), max(r["fwd_ratio"] for r in rows)),
            "bwd": (min(r["bwd_ratio"] for r in rows), max(r["bwd_ratio"] for r in rows)),
            "rows": len(rows),
            "spread": max((t["p90_ms"] - t["p10_ms"]) / t["ms"] for t in timings),
            "fwd_ties": [r for r in rows if overlap(r["triton"]["fwd"], r["sdpa_flash"]["fwd"])]}
