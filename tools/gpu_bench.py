"""The course's GPU measurements, in one run on one CUDA device (writes JSON records).

    python tools/gpu_bench.py --out DIR [--sections env,flash_check,flash_perf,flash_sweep,sparse,ring]

* ``flash_check``  lesson 08's Triton kernels (forward and backward) against SDPA's FLASH backend and an
  fp64 reference: fp16/bf16, d = 64/128, causal or not, ragged lengths.
* ``flash_perf``   TFLOP/s of the Triton kernels and of SDPA FLASH, forward and backward, L = 1k…16k
  (16k tokens per batch, d_model 2048, as in the FlashAttention-2 paper), CUDA events via
  ``triton.testing.do_bench`` (median and 10th/90th percentiles of ≥ 20 timed runs after warm-up).
  A run given ``--deadline-s`` stops starting new measurements past it (the rows so far are kept).
* ``flash_sweep``  block sizes / warps / stages of the three kernels at L = 4096, d = 128, fp16.
* ``sparse``       lesson 09's comparison: compiled FlexAttention + BlockMask, SDPA with a dense bool mask,
  SDPA ``is_causal`` (no window), the course's ``flash_attention(window=W)``: time and peak memory.
* ``ring``         lesson 13's ring and Ulysses attention in an NCCL group of world size 1.

Each section writes ``DIR/<section>.json`` as soon as it finishes, so a cut-off run keeps what it measured.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

SECTIONS = ("env", "flash_check", "flash_perf", "flash_sweep", "sparse", "ring")


DEADLINE = math.inf           # time.perf_counter() after which no new measurement starts (--deadline-s)


def _past_deadline() -> bool:
    return time.perf_counter() > DEADLINE


def _write(out: Path, name: str, obj) -> None:
    (out / f"{name}.json").write_text(json.dumps(obj, indent=1, default=str))
    print(f"[{time.strftime('%H:%M:%S')}] wrote {name}.json", flush=True)


def env() -> dict:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    import triton
    p = torch.cuda.get_device_properties(0)
    return {"device": torch.cuda.get_device_name(0), "nvidia_smi": smi,
            "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
            "multiprocessors": p.multi_processor_count, "memory_GiB": round(p.total_memory / 2**30, 1),
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "torch": torch.__version__,
            "triton": triton.__version__, "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d")}


# ---- lesson 08: Triton kernels -------------------------------------------------------------------------

def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def flash_check() -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from attn_course.flash_triton import flash_attention_triton
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        for D in (64, 128):
            for causal in (False, True):
                for (B, H, Lq, Lk) in ((2, 4, 1000, 1000), (1, 3, 777, 777), (2, 2, 333, 1111), (1, 2, 4096, 4096)):
                    if causal and Lq != Lk:
                        continue                                 # FLASH's causal is top-left like ours; keep square
                    q = torch.randn(B, H, Lq, D, device="cuda", dtype=dtype, generator=g)
                    k = torch.randn(B, H, Lk, D, device="cuda", dtype=dtype, generator=g)
                    v = torch.randn(B, H, Lk, D, device="cuda", dtype=dtype, generator=g)
                    do = torch.randn(B, H, Lq, D, device="cuda", dtype=dtype, generator=g)
                    ref_in = [t.double().requires_grad_() for t in (q, k, v)]
                    ref = F.scaled_dot_product_attention(*ref_in, is_causal=causal)
                    ref.backward(do.double())
                    res = {}
                    for name in ("triton", "sdpa_flash"):
                        x = [t.clone().requires_grad_() for t in (q, k, v)]
                        if name == "triton":
                            o = flash_attention_triton(*x, is_causal=causal)
                        else:
                            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                                o = F.scaled_dot_product_attention(*x, is_causal=causal)
                        o.backward(do)
                        torch.cuda.synchronize()
                        res[name] = {"out": _rel(o, ref), "dq": _rel(x[0].grad, ref_in[0].grad),
                                     "dk": _rel(x[1].grad, ref_in[1].grad), "dv": _rel(x[2].grad, ref_in[2].grad),
                                     "finite": bool(all(torch.isfinite(t).all() for t in (o, *[y.grad for y in x])))}
                    worst = max(res["triton"][c] / max(res["sdpa_flash"][c], 1e-6) for c in ("out", "dq", "dk", "dv"))
                    rows.append({"dtype": str(dtype)[6:], "d": D, "causal": causal, "B": B, "H": H, "Lq": Lq, "Lk": Lk,
                                 "triton": res["triton"], "sdpa_flash": res["sdpa_flash"],
                                 "worst_err_ratio_vs_flash": worst,
                                 "ok": res["triton"]["finite"] and worst < 3.0 and
                                 max(res["triton"][c] for c in ("out", "dq", "dk", "dv")) < 2e-2})
                    print(f"check {rows[-1]['dtype']} d={D} causal={causal} {Lq}x{Lk}: "
                          f"triton out {res['triton']['out']:.1e} dq {res['triton']['dq']:.1e} | flash out "
                          f"{res['sdpa_flash']['out']:.1e} dq {res['sdpa_flash']['dq']:.1e} ok={rows[-1]['ok']}", flush=True)
    return rows


def _bench(fn, rep_ms=300, min_runs=20):
    """Median and 10th/90th percentiles (CUDA events, L2 flushed between runs) of at least ``min_runs`` timed
    runs: do_bench's ``rep`` is a time budget, so it is stretched to min_runs × one run's estimated time."""
    import triton
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    torch.cuda.synchronize()
    est = start.elapsed_time(end) / 3
    q10, q50, q90 = triton.testing.do_bench(fn, warmup=max(25, 3 * est), rep=max(rep_ms, 1.2 * min_runs * est),
                                            quantiles=[0.1, 0.5, 0.9])
    return {"ms": q50, "p10_ms": q10, "p90_ms": q90}


def _fwd_bwd_timings(attn, q, k, v, do):
    """(forward timing, backward timing) of attn(q, k, v) with grads for q, k, v."""
    fwd = _bench(lambda: attn(q, k, v))
    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
    o = attn(qq, kk, vv)
    bwd = _bench(lambda: o.backward(do, retain_graph=True))
    return fwd, bwd


def flash_perf(lengths=(1024, 2048, 4096, 8192, 16384), block_q=64, block_k=64) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from attn_course.flash_triton import flash_attention_triton

    def sdpa_flash(q, k, v, causal):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for D in (64, 128):
            H = 2048 // D
            for causal in (False, True):
                for L in lengths:
                    if _past_deadline():
                        return rows
                    B = max(1, 16384 // L)
                    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=dtype) for _ in range(4))
                    flops = 4 * B * H * L * L * D * (0.5 if causal else 1.0)
                    row = {"dtype": str(dtype)[6:], "d": D, "causal": causal, "L": L, "B": B, "H": H,
                           "block_q": block_q, "block_k": block_k}
                    for name, fn in (("triton", lambda a, b, c: flash_attention_triton(
                                         a, b, c, is_causal=causal, block_q=block_q, block_k=block_k)),
                                     ("sdpa_flash", lambda a, b, c: sdpa_flash(a, b, c, causal))):
                        f, b = _fwd_bwd_timings(fn, q, k, v, do)
                        row[name] = {"fwd": f, "bwd": b, "fwd_tflops": flops / f["ms"] / 1e9,
                                     "bwd_tflops": 2.5 * flops / b["ms"] / 1e9}
                    row["fwd_ratio"] = row["triton"]["fwd_tflops"] / row["sdpa_flash"]["fwd_tflops"]
                    row["bwd_ratio"] = row["triton"]["bwd_tflops"] / row["sdpa_flash"]["bwd_tflops"]
                    rows.append(row)
                    print(f"perf {row['dtype']} d={D} causal={causal} L={L}: fwd {row['triton']['fwd_tflops']:.0f} vs "
                          f"{row['sdpa_flash']['fwd_tflops']:.0f} ({row['fwd_ratio']:.2f}x) | bwd "
                          f"{row['triton']['bwd_tflops']:.0f} vs {row['sdpa_flash']['bwd_tflops']:.0f} "
                          f"({row['bwd_ratio']:.2f}x)", flush=True)
                    del q, k, v, do
    return rows


def flash_sweep(L=4096, D=128, dtype=torch.float16, causal_modes=(False,),
                kernels=("backward_dq", "backward_dkdv", "forward")) -> list[dict]:
    """Each kernel launched directly with other block sizes / warps / stages (correctness checked too).
    The backward kernels come first: the forward is within 5 % of its best launch (the H200 run of 2026-11-30)."""
    import triton
    from attn_course import flash_triton as ft
    from attn_course.flash import LOG2E
    B, H = 16384 // L, 2048 // D
    Z = B * H
    q, k, v, do = (torch.randn(Z, L, D, device="cuda", dtype=dtype) for _ in range(4))
    scale = 1 / math.sqrt(D)
    rows = []
    for causal in causal_modes:
        flops = 4 * Z * L * L * D * (0.5 if causal else 1.0)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        O_ref, LSE_ref = ft.flash_attention_triton_forward(q, k, v, is_causal=causal)
        Dd = (do.float() * O_ref.float()).sum(-1)
        strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                   q.stride(0), q.stride(1))
        for kernel in kernels:
            for bm, bn in ((64, 64), (128, 64), (64, 128), (128, 128)):
                for warps in (4, 8):
                    for stages in (1, 2, 3):
                        if _past_deadline():
                            break
                        meta = dict(IS_CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=D, PRECISION=None,
                                    num_warps=warps, num_stages=stages)
                        try:
                            if kernel == "forward":
                                O = torch.empty_like(q)
                                LSE = torch.empty(Z, L, device="cuda", dtype=torch.float32)
                                fn = lambda: ft._flash_fwd_kernel[(triton.cdiv(L, bm), Z)](
                                    q, k, v, O, LSE, L, L, D, scale * LOG2E, *strides, **meta)
                                fn()
                                err = _rel(O, ref)
                            elif kernel == "backward_dkdv":
                                dK, dV = torch.empty_like(k), torch.empty_like(v)
                                fn = lambda: ft._flash_bwd_dkdv_kernel[(triton.cdiv(L, bn), Z)](
                                    q, k, v, do, LSE_ref, Dd, dK, dV, L, L, D, scale * LOG2E, scale, *strides, **meta)
                                fn()
                                err = None
                            else:
                                dQ = torch.empty_like(q)
                                fn = lambda: ft._flash_bwd_dq_kernel[(triton.cdiv(L, bm), Z)](
                                    q, k, v, do, LSE_ref, Dd, dQ, L, L, D, scale * LOG2E, scale, *strides, **meta)
                                fn()
                                err = None
                            torch.cuda.synchronize()
                            t = _bench(fn, rep_ms=60)
                            # share of the pass's FLOPs: fwd 2 matmuls; dkdv 4 of bwd's 5 (incl. recompute); dq 3
                            share = {"forward": 1.0, "backward_dkdv": 2.0, "backward_dq": 1.5}[kernel]
                            rows.append({"kernel": kernel, "causal": causal, "block_m": bm, "block_n": bn,
                                         "warps": warps, "stages": stages, "ms": t["ms"],
                                         "tflops": share * flops / t["ms"] / 1e9, "rel_err": err})
                        except Exception as e:                   # out of shared memory / registers
                            rows.append({"kernel": kernel, "causal": causal, "block_m": bm, "block_n": bn,
                                         "warps": warps, "stages": stages, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            best = max((r for r in rows if r["kernel"] == kernel and r["causal"] == causal and "ms" in r),
                       key=lambda r: r["tflops"], default=None)
            print(f"sweep {kernel} causal={causal}: best {best}", flush=True)
    return rows


# ---- lesson 09: sliding windows ------------------------------------------------------------------------

def sparse(lengths=(4096, 16384, 32768), W=256, H=8, D=64, dtype=torch.float16) -> list[dict]:
    from attn_course import sparse as sp
    from attn_course.flash import flash_attention
    from attn_course.masks import sliding_window_mask
    rows = []
    for L in lengths:
        if _past_deadline():
            break
        q, k, v = (torch.randn(1, H, L, D, device="cuda", dtype=dtype) for _ in range(3))
        mask = sliding_window_mask(L, W, causal=True, device="cuda")
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        t0 = time.perf_counter()
        bm = sp.block_mask(sp.sliding_window(W), L, block=128, device="cuda")
        torch.cuda.synchronize()
        bm_s = time.perf_counter() - t0
        methods = {
            "flex": (lambda: sp.flex(q, k, v, block_mask=bm), sp.block_mask_bytes(bm)),
            "sdpa_mask": (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), mask.numel()),
            "sdpa_causal": (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 0),
            "flash_window": (lambda: flash_attention(q, k, v, is_causal=True, window=W, block_q=128, block_k=128), 0),
        }
        for name, (fn, mask_bytes) in methods.items():
            try:
                t0 = time.perf_counter()
                out = fn()
                torch.cuda.synchronize()
                first = time.perf_counter() - t0
                err = float((out.float() - ref.float()).abs().max()) if name != "sdpa_causal" else None
                del out
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                fn()
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() - base
                t = _bench(fn, rep_ms=200)
                rows.append({"L": L, "W": W, "H": H, "d": D, "dtype": str(dtype)[6:], "method": name, **t,
                             "peak_extra_bytes": peak, "mask_bytes": mask_bytes, "first_call_s": first,
                             "max_abs_err_vs_sdpa_mask": err, "block_mask_build_s": bm_s if name == "flex" else None})
                print(f"sparse L={L} {name}: {t['ms']:.3f} ms, peak +{peak / 2**20:.1f} MiB, err {err}", flush=True)
            except Exception as e:
                rows.append({"L": L, "method": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
                print(f"sparse L={L} {name}: {rows[-1]['error']}", flush=True)
        del q, k, v, mask, ref, bm
        torch.cuda.empty_cache()
    return rows


# ---- lesson 13: NCCL ----------------------------------------------------------------------------------

def _ring_worker():
    import torch.distributed as dist
    from attn_course.ring import ring_attention, ulysses_attention
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    out = {"backend": dist.get_backend(), "world_size": dist.get_world_size(), "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
    for name, fn in (("ring", ring_attention), ("ulysses", ulysses_attention)):
        for causal in (False, True):
            for dtype in (torch.float32, torch.bfloat16):
                q, k, v = (torch.randn(1, 4, 1024, 64, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
                o = fn(q, k, v, is_causal=causal)
                o.sum().backward()
                ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
                ref = F.scaled_dot_product_attention(*ref_in, is_causal=causal)
                ref.sum().backward()
                out[f"{name}_{'causal' if causal else 'full'}_{str(dtype)[6:]}"] = {
                    "out_rel_err": _rel(o, ref), "dq_rel_err": _rel(q.grad, ref_in[0].grad),
                    "device": str(o.device)}
    dist.destroy_process_group()
    print(json.dumps(out))


def ring() -> dict:
    r = subprocess.run([sys.executable, __file__, "--ring-worker"], capture_output=True, text=True, timeout=180)
    if r.returncode:
        return {"error": r.stderr[-3000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="gpu_out")
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--ring-worker", action="store_true")
    p.add_argument("--sweep", default="", help="D:causal for flash_sweep (default 128:0)")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="start no new measurement after this many seconds (the rows so far are written)")
    a = p.parse_args(argv)
    global DEADLINE
    if a.deadline_s is not None:
        DEADLINE = time.perf_counter() + a.deadline_s
    if a.ring_worker:
        _ring_worker()
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    for name in a.sections.split(","):
        t0 = time.perf_counter()
        try:
            kw = {}
            if name == "flash_sweep" and a.sweep:                # e.g. --sweep 64:1 = head dim 64, causal
                d, c = a.sweep.split(":")
                kw = dict(D=int(d), causal_modes=(bool(int(c)),))
            result = globals()[name](**kw)
        except Exception:
            result = {"error": traceback.format_exc()[-3000:]}
            print(result["error"], flush=True)
        _write(out, name, {"section": name, "seconds": round(time.perf_counter() - t0, 1), "result": result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
