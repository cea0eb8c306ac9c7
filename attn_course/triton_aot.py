"""Lesson 08's Triton kernels compiled ahead of time for GPUs this machine does not have.

Triton lowers a ``@triton.jit`` kernel to PTX and lets NVIDIA's ``ptxas`` (shipped inside the triton wheel)
assemble it into a cubin for a chosen architecture; neither step needs a GPU. For each kernel of
:mod:`attn_course.flash_triton` (the forward and both backward kernels) this module builds the same
signature, specialisation and compile options a launch on that GPU would (through Triton's own binder, with
the block sizes, ``num_warps`` and ``num_stages`` of :func:`attn_course.flash_triton.kernel_config`),
compiles it with ``triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))``, and reports what
ptxas allocated: registers per thread, spill stores/loads, and the shared memory Triton asks the driver for
— checked against the device's per-block maximum. It says whether the kernel *fits* the GPU, not how fast
it runs (performance: ``python -m attn_course.flash_triton --bench`` on a GPU).

Compiles run in fresh subprocesses, without any ``TRITON_*`` environment variable and with an empty cache:
the tests (and lesson 08) run Triton under its CPU interpreter (``TRITON_INTERPRET=1``), where ``@triton.jit``
yields an interpreted function with nothing to compile.

``python -m attn_course.triton_aot [--out PATH] [--jobs 2]`` compiles the whole matrix (3 kernels ×
3 archs × 2 dtypes × 2 head dims × causal/non-causal) and records it in :data:`RECORDED`.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["GPUS", "Config", "matrix", "compile_configs", "compile_config", "load_recorded", "table_rows",
           "RECORDED", "triton_version", "recorded_row"]

RECORDED = Path(__file__).resolve().parent / "data" / "triton_aot.json"

# Maximum shared memory per thread block (opt-in, bytes): CUDA C++ Programming Guide, "Technical
# Specifications per Compute Capability" — 163 KB for 8.0, 99 KB for 8.6/8.9, 227 KB for 9.0 (the SM holds
# 164 / 100 / 228 KB; CUDA reserves 1 KB of it per block). The same numbers are Triton's "Hardware limit"
# in its OutOfResources errors on those GPUs.
GPUS = {80: ("A100", 163 * 1024), 89: ("L4", 99 * 1024), 90: ("H100", 227 * 1024)}
DTYPES = ("float16", "bfloat16")
HEAD_DIMS = (64, 128)
LENGTH = 4096          # the sequence length of the modelled launch: only its divisibility by 16 reaches the code


@dataclass(frozen=True)
class Config:
    """One compilation: a kernel of :data:`attn_course.flash_triton.KERNELS` for sm_<arch>, at the launch
    parameters of :func:`attn_course.flash_triton.kernel_config` unless ``num_warps`` / ``num_stages`` are given
    (to see what another choice would have cost)."""
    kernel: str
    arch: int
    dtype: str
    head_dim: int
    causal: bool
    num_warps: int | None = None
    num_stages: int | None = None


def matrix(kernels=None, archs=tuple(GPUS), dtypes=DTYPES, head_dims=HEAD_DIMS, causal=(False, True)) -> list[Config]:
    """Every combination, in a fixed order."""
    if kernels is None:
        kernels = ("forward", "backward_dkdv", "backward_dq")
    return [Config(*c) for c in itertools.product(kernels, archs, dtypes, head_dims, causal)]


# --- runs inside the worker process (TRITON_INTERPRET unset) ---------------------------------------------

def _launch_args(cfg: Config):
    """(kernel, positional args, constexprs + options) of a launch on (1, LENGTH, head_dim) tensors, built the
    way ``flash_triton._launch`` / ``_launch_backward`` build them. CPU tensors stand in for the CUDA ones:
    Triton's binder only reads their dtype, the alignment of their data pointer and the integers' divisibility."""
    import torch
    from . import flash_triton as ft
    dtype = getattr(torch, cfg.dtype)
    E, L = cfg.head_dim, LENGTH
    Q, K, V, O, dO, dQ, dK, dV = (torch.empty(1, L, E, dtype=dtype) for _ in range(8))
    LSE, Dd = torch.empty(1, L), torch.empty(1, L)
    scale = 1.0 / E ** 0.5
    meta = dict(IS_CAUSAL=cfg.causal, **ft.kernel_config(cfg.kernel, E, dtype, capability=cfg.arch))
    meta.update({k: v for k, v in (("num_warps", cfg.num_warps), ("num_stages", cfg.num_stages)) if v is not None})
    if cfg.kernel == "forward":
        args = (Q, K, V, O, LSE, L, L, E, scale * ft.LOG2E, Q.stride(0), Q.stride(1), K.stride(0), K.stride(1),
                V.stride(0), V.stride(1), O.stride(0), O.stride(1))
        return ft._flash_fwd_kernel, args, meta
    common = (L, L, E, scale * ft.LOG2E, scale, Q.stride(0), Q.stride(1), K.stride(0), K.stride(1),
              V.stride(0), V.stride(1), dO.stride(0), dO.stride(1))
    if cfg.kernel == "backward_dkdv":
        return ft._flash_bwd_dkdv_kernel, (Q, K, V, dO, LSE, Dd, dK, dV, *common), meta
    return ft._flash_bwd_dq_kernel, (Q, K, V, dO, LSE, Dd, dQ, *common), meta


def _compile_here(cfg: Config, cubin_dir: str | None = None) -> dict:
    """Compile one configuration in this process and return its record."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    fn, args, meta = _launch_args(cfg)
    if not isinstance(fn, triton.runtime.jit.JITFunction):
        raise RuntimeError("the kernels are interpreted (TRITON_INTERPRET=1): compile in a fresh process")
    target = GPUTarget("cuda", cfg.arch, 32)
    backend = make_backend(target)
    # the JIT's own path from a call to a compile: binder -> specialisation -> (signature, constexprs, attrs)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **meta)
    options, signature, constexprs, attrs = fn._pack_args(backend, options, bound, specialization, options)
    knobs.nvidia.dump_ptxas_log = True          # Triton runs `ptxas -v`; keep its report instead of deleting it
    log = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(log):
        k = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
    seconds = time.perf_counter() - t0
    ptxas = log.getvalue()
    regs = re.search(r"Used (\d+) registers", ptxas)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", ptxas)
    if regs is None or spills is None:
        raise RuntimeError(f"unexpected ptxas report for {cfg}:\n{ptxas}")
    cubin = k.asm["cubin"]
    gpu, limit = GPUS.get(cfg.arch, (f"sm_{cfg.arch}", None))
    rec = dict(asdict(cfg), gpu=gpu, name=k.metadata.name, overridden=cfg.num_warps is not None or cfg.num_stages is not None,
               block_m=meta["BLOCK_M"], block_n=meta["BLOCK_N"], block_d=meta["BLOCK_D"],
               num_warps=k.metadata.num_warps, num_stages=k.metadata.num_stages,
               registers=int(regs.group(1)), spill_stores=int(spills.group(1)), spill_loads=int(spills.group(2)),
               shared_bytes=int(k.metadata.shared), smem_limit=limit,
               fits=None if limit is None else int(k.metadata.shared) <= limit,
               cubin_bytes=len(cubin), ptx_bytes=len(k.asm["ptx"]), compile_s=round(seconds, 2),
               ptxas=get_ptxas(cfg.arch).version)
    if cubin_dir is not None:
        path = Path(cubin_dir) / f"{cfg.kernel}_sm{cfg.arch}_{cfg.dtype}_d{cfg.head_dim}_{'causal' if cfg.causal else 'full'}.cubin"
        path.write_bytes(cubin)
        rec["cubin_path"] = str(path)
    return rec


def _worker(payload: str) -> int:
    import warnings
    warnings.filterwarnings("ignore")         # Triton 3.9 warns once that its FP-fusion default will change
    job = json.loads(payload)
    records = [_compile_here(Config(**c), job.get("cubin_dir")) for c in job["configs"]]
    print(json.dumps(records))
    return 0


# --- the caller's side -------------------------------------------------------------------------------------

def _run_worker(configs: list[Config], cubin_dir: str | None, timeout: float) -> list[dict]:
    # no TRITON_* settings reach the compile (TRITON_INTERPRET, TRITON_PTXAS_PATH, ...): Triton's defaults and
    # the ptxas bundled in the wheel, so that a record is reproducible
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_")}
    with tempfile.TemporaryDirectory(prefix="attn-course-triton-cache-") as cache:
        env["TRITON_CACHE_DIR"] = cache       # an empty cache: every compile is real, nothing written to ~
        payload = json.dumps({"configs": [asdict(c) for c in configs], "cubin_dir": cubin_dir})
        res = subprocess.run([sys.executable, "-m", "attn_course.triton_aot", "--worker", payload],
                             capture_output=True, text=True, env=env, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"AOT compile failed (exit {res.returncode}):\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def compile_configs(configs: list[Config], *, jobs: int = 2, cubin_dir: str | None = None,
                    timeout: float = 600) -> list[dict]:
    """Compile ``configs`` in ``jobs`` fresh processes (each given ``timeout`` seconds), in their order.

    Each record: the configuration, ``gpu``, ``block_m/n/d``, ``num_warps``, ``num_stages``, ``registers``
    (per thread), ``spill_stores`` / ``spill_loads`` (bytes), ``shared_bytes`` (dynamic shared memory per
    block), ``smem_limit`` and ``fits``, ``cubin_bytes``, ``ptx_bytes``, ``compile_s``; with ``cubin_dir``,
    also ``cubin_path`` where the cubin was written."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    chunks = [list(range(len(configs)))[i::jobs] for i in range(jobs) if configs[i::jobs]]
    with ThreadPoolExecutor(len(chunks)) as pool:        # each worker answers its configs in their order
        results = list(pool.map(lambda idx: _run_worker([configs[i] for i in idx], cubin_dir, timeout), chunks))
    out = [None] * len(configs)
    for idx, recs in zip(chunks, results):
        for i, r in zip(idx, recs):
            out[i] = r
    return out


def compile_config(cfg: Config, *, cubin_dir: str | None = None, timeout: float = 120) -> dict:
    """Compile one configuration in a fresh process and return its record (see :func:`compile_configs`)."""
    return compile_configs([cfg], jobs=1, cubin_dir=cubin_dir, timeout=timeout)[0]


def triton_version() -> str | None:
    """The installed Triton's version, or None when it cannot be imported (a CPU-only torch, macOS, Windows, an
    install without the ``triton`` extra). Asked in a fresh process, without ``TRITON_*`` settings, as the
    compiles are; nothing here needs Triton itself."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_")}
    res = subprocess.run([sys.executable, "-c", "import triton; print(triton.__version__)"],
                         capture_output=True, text=True, env=env, timeout=120)
    return res.stdout.strip().splitlines()[-1] if res.returncode == 0 and res.stdout.strip() else None


def recorded_row(records: list[dict], cfg: Config) -> dict | None:
    """The recorded compile of ``cfg`` (same kernel, arch, dtype, head dim, causal, warps and stages), if any."""
    for r in records:
        if (r["kernel"], r["arch"], r["dtype"], r["head_dim"], r["causal"]) == (
                cfg.kernel, cfg.arch, cfg.dtype, cfg.head_dim, cfg.causal) and \
                (cfg.num_warps is None or r["num_warps"] == cfg.num_warps) and \
                (cfg.num_stages is None or r["num_stages"] == cfg.num_stages):
            return r
    return None


def load_recorded(path: str | Path = RECORDED) -> tuple[dict, list[dict]]:
    """``(info, records)`` of the matrix recorded with ``python -m attn_course.triton_aot``: ``info`` holds
    the triton version, the date and the total compile time; the package ships the course's run."""
    data = json.loads(Path(path).read_text())
    return data["info"], data["records"]


def table_rows(records: list[dict]) -> list[dict]:
    """One row per (kernel, GPU, head dim): the worst of its fp16/bf16 × causal/non-causal compiles (most
    registers, most spilled bytes, most shared memory; ``fits`` only if all four fit)."""
    rows = {}
    for r in records:
        key = (r["kernel"], r["arch"], r["head_dim"])
        row = rows.setdefault(key, dict(kernel=r["kernel"], gpu=f"{r['gpu']} (sm_{r['arch']})",
                                         d=r["head_dim"], warps=r["num_warps"], stages=r["num_stages"],
                                         regs=0, spills=0, smem_KiB=0.0, limit_KiB=r["smem_limit"] / 1024,
                                         fits=True))
        row["regs"] = max(row["regs"], r["registers"])
        row["spills"] = max(row["spills"], r["spill_stores"] + r["spill_loads"])
        row["smem_KiB"] = max(row["smem_KiB"], r["shared_bytes"] / 1024)
        row["fits"] = row["fits"] and bool(r["fits"])
    return list(rows.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attn_course.triton_aot",
                                description="compile lesson 08's Triton kernels for sm_80/89/90 without a GPU")
    p.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(RECORDED), help="where to write the records (default: the package's copy)")
    p.add_argument("--jobs", type=int, default=2, help="compile processes (default 2)")
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args.worker)
    import triton
    configs = matrix()
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    records = compile_configs(configs, jobs=args.jobs)
    wall = time.perf_counter() - t0
    info = dict(triton=triton.__version__, date=datetime.date.today().isoformat(), length=LENGTH,
                configs=len(records), jobs=args.jobs, cpus=os.cpu_count(), load_avg_1min=round(load, 1),
                wall_s=round(wall, 1),
                compile_s_total=round(sum(r["compile_s"] for r in records), 1))
    Path(args.out).write_text(json.dumps(dict(info=info, records=records), indent=1) + "\n")
    for row in table_rows(records):
        print(row)
    bad = [r for r in records if not r["fits"] or r["spill_stores"] or r["spill_loads"]]
    print(f"{len(records)} compiles in {wall:.0f} s ({args.jobs} processes); "
          f"{len(bad)} do not fit or spill" + "".join(f"\n  {r}" for r in bad))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
