"""FlashAttention-2-style forward and backward kernels in Triton (the ``triton`` extra), for CUDA GPUs.

``flash_attention_triton`` is a separate function — :func:`attn_course.flash_attention` stays the
pure-PyTorch teaching version on every device. The kernel runs one program per (query block, batch·head):
it loads its block of queries once, streams the key/value tiles through the online-softmax recurrence
of lesson 08 (fp32 accumulators, ``exp2`` with ``log2 e`` folded into the scale, tiles above the
diagonal skipped for causal), then writes ``O`` and the logsumexp once (Dao 2023, Algorithm 1).
The backward pass recomputes the tiles from the saved ``O`` and logsumexp (Dao 2023, Algorithm 2) in two
Triton kernels — one program per key block accumulates dK, dV; one per query block accumulates dQ — so
nothing of size L×L is stored and no atomic adds are needed.

On a CPU the kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``, set before importing
triton); that is how the tests check it without a GPU. The interpreter handles plain pointer
arithmetic, ``tl.dot`` and masks — the kernel uses no block pointers and no autotuning lists.

Launch parameters (block sizes, warps, pipeline stages) come from one place, :func:`kernel_config`;
:mod:`attn_course.triton_aot` compiles the kernels with them for A100 / L4 / H100 (sm_80/89/90) without a GPU
and reports registers, spills and shared memory against each GPU's limit.

GPU measurement: ``python -m attn_course.flash_triton --bench`` prints TFLOP/s of this kernel and of
SDPA pinned to its FLASH backend (``sdpa_kernel``) at L = 4096, d = 64/128, fp16/bf16, forward and
forward+backward, in the launch configuration (64 × 64 blocks, compiled without spills for sm_80/89/90).

Without Triton (CPU-only torch, macOS, Windows) this module still imports: :func:`kernel_config`,
:data:`KERNELS` and :func:`interpreted` work, and launching a kernel raises ModuleNotFoundError saying so.
"""
from __future__ import annotations

import math
import os

import torch

try:                         # Triton comes with torch's Linux CUDA build; CPU-only torch, macOS, Windows lack it
    import triton
    import triton.language as tl
except ModuleNotFoundError:  # kernel_config, KERNELS and interpreted() still work; launching says what is missing
    triton = tl = None


def _jit(fn):
    """``triton.jit`` when Triton is installed; otherwise the plain function (never launched: see _need_triton)."""
    return triton.jit(fn) if triton is not None else fn


def _need_triton() -> None:
    if triton is None:
        raise ModuleNotFoundError("attn_course.flash_triton's kernels need Triton (it comes with torch's Linux CUDA "
                                  "build; `pip install triton` on Linux); attn_course.flash_attention computes the "
                                  "same attention in PyTorch on any device", name="triton")

from .flash import LOG2E, _check

__all__ = ["flash_attention_triton", "flash_attention_triton_forward", "interpreted", "kernel_config"]


def interpreted() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


KERNELS = ("forward", "backward_dkdv", "backward_dq")


def kernel_config(kernel: str, head_dim: int, dtype: torch.dtype, *, block_q: int = 64, block_k: int = 64,
                  capability: int | None = None) -> dict:
    """The compile-time parameters one of the three kernels is launched with — the launchers below and the
    ahead-of-time report (:mod:`attn_course.triton_aot`) both read them here, so they cannot drift apart.

    ``kernel`` in :data:`KERNELS`; ``capability`` = 10·major + minor of the CUDA device (80 = A100, 89 = L4,
    90 = H100), ``None`` under the interpreter. Returns the constexprs ``BLOCK_M``, ``BLOCK_N``, ``BLOCK_D``,
    ``PRECISION`` and the launch options ``num_warps``, ``num_stages`` (Triton's defaults are 4 and 3).
    The backward kernels depart from the defaults; each choice was found by compiling for sm_80/89/90
    without a GPU (``python -m attn_course.triton_aot``, recorded in ``attn_course/data/triton_aot.json``):
    the dK/dV kernel keeps two fp32 accumulators of ``BLOCK_N × BLOCK_D`` per program and spills registers
    with 4 warps, so it runs 8; before Hopper (capability < 90) at head dim 128, three pipeline stages of the
    dQ kernel need 104 KiB of shared memory (more than the 99 KiB per block of an L4 / sm_89), and with 2 or 3
    stages both backward kernels spill registers on sm_80 or sm_89 — so there they run 8 warps, 1 stage.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    BLOCK_D = max(16, 1 << (head_dim - 1).bit_length())     # triton.next_power_of_2
    num_warps, num_stages = 4, 3
    if kernel == "backward_dkdv":
        num_warps = 8
    if kernel != "forward" and capability is not None and capability < 90 and BLOCK_D >= 128:
        num_warps, num_stages = 8, 1
    return dict(BLOCK_M=block_q, BLOCK_N=block_k, BLOCK_D=BLOCK_D,
                PRECISION="ieee" if dtype in (torch.float32, torch.float64) else None,
                num_warps=num_warps, num_stages=num_stages)


def _capability(t: torch.Tensor) -> int | None:
    """10·major + minor of t's CUDA device; None on a CPU (the interpreter ignores num_warps/num_stages)."""
    if t.device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(t.device)
    return 10 * major + minor


@_jit
def _flash_fwd_kernel(Q, K, V, O, LSE, Lq, Lk, D, qk_scale,
                      s_qz, s_qm, s_kz, s_kn, s_vz, s_vn, s_oz, s_om,
                      IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    start_m = tl.program_id(0)                       # which query block Q_i
    z = tl.program_id(1)                             # which (batch, head)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q = tl.load(Q + z * s_qz + offs_m[:, None] * s_qm + offs_d[None, :],
                mask=(offs_m[:, None] < Lq) & d_ok[None, :], other=0.0)              # (BLOCK_M, BLOCK_D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)                             # running max (base 2)
    l_i = tl.zeros([BLOCK_M], tl.float32)                                           # running denominator
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)                                  # unnormalised output
    hi = tl.minimum(Lk, (start_m + 1) * BLOCK_M) if IS_CAUSAL else Lk              # causal: skip tiles above the diagonal
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kT = tl.load(K + z * s_kz + cols[None, :] * s_kn + offs_d[:, None],
                     mask=(cols[None, :] < Lk) & d_ok[:, None], other=0.0)          # (BLOCK_D, BLOCK_N)
        v = tl.load(V + z * s_vz + cols[:, None] * s_vn + offs_d[None, :],
                    mask=(cols[:, None] < Lk) & d_ok[None, :], other=0.0)           # (BLOCK_N, BLOCK_D)
        s = tl.dot(q, kT, input_precision=PRECISION) * qk_scale                    # S_ij · log2 e
        valid = cols[None, :] < Lk
        if IS_CAUSAL:
            valid = valid & (cols[None, :] <= offs_m[:, None])
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)                       # fully masked row: no NaN
        p = tl.math.exp2(s - m_safe[:, None])                                       # P̃_ij
        alpha = tl.math.exp2(m_i - m_safe)                                          # rescale of earlier tiles
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    tl.store(O + z * s_oz + offs_m[:, None] * s_om + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=(offs_m[:, None] < Lq) & d_ok[None, :])
    tl.store(LSE + z * Lq + offs_m, lse, mask=offs_m < Lq)


@_jit
def _flash_bwd_dkdv_kernel(Q, K, V, dO, LSE, Dd, dK, dV, Lq, Lk, D, qk_scale, sm_scale,
                           s_qz, s_qm, s_kz, s_kn, s_vz, s_vn, s_oz, s_om,
                           IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    """One program per (key block K_j, batch·head): dK_j, dV_j accumulate locally over the query blocks."""
    start_n = tl.program_id(0)
    z = tl.program_id(1)
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    kv_mask = (offs_n[:, None] < Lk) & d_ok[None, :]
    k = tl.load(K + z * s_kz + offs_n[:, None] * s_kn + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + z * s_vz + offs_n[:, None] * s_vn + offs_d[None, :], mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M if IS_CAUSAL else 0                 # causal: skip blocks above
    for start_m in range(lo, Lq, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_mask = (offs_m[:, None] < Lq) & d_ok[None, :]
        q = tl.load(Q + z * s_qz + offs_m[:, None] * s_qm + offs_d[None, :], mask=q_mask, other=0.0)
        do = tl.load(dO + z * s_oz + offs_m[:, None] * s_om + offs_d[None, :], mask=q_mask, other=0.0)
        lse = tl.load(LSE + z * Lq + offs_m, mask=offs_m < Lq, other=0.0) * 1.4426950408889634
        Di = tl.load(Dd + z * Lq + offs_m, mask=offs_m < Lq, other=0.0)
        sT = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale             # (BLOCK_N, BLOCK_M) S_ijᵀ
        valid = (offs_n[:, None] < Lk) & (offs_m[None, :] < Lq)
        if IS_CAUSAL:
            valid = valid & (offs_n[:, None] <= offs_m[None, :])
        pT = tl.where(valid, tl.math.exp2(sT - lse[None, :]), 0.0)                     # P_ijᵀ = exp(S − L)ᵀ
        dv += tl.dot(pT.to(do.dtype), do, input_precision=PRECISION)                  # dV_j += P_ijᵀ dO_i
        dpT = tl.dot(v, tl.trans(do), input_precision=PRECISION)                      # dP_ijᵀ = V_j dO_iᵀ
        dsT = pT * (dpT - Di[None, :])                                                # dS_ijᵀ
        dk += tl.dot(dsT.to(q.dtype), q, input_precision=PRECISION)                   # dK_j += dS_ijᵀ Q_i
    tl.store(dK + z * s_kz + offs_n[:, None] * s_kn + offs_d[None, :], (dk * sm_scale).to(dK.dtype.element_ty),
             mask=kv_mask)
    tl.store(dV + z * s_vz + offs_n[:, None] * s_vn + offs_d[None, :], dv.to(dV.dtype.element_ty), mask=kv_mask)


@_jit
def _flash_bwd_dq_kernel(Q, K, V, dO, LSE, Dd, dQ, Lq, Lk, D, qk_scale, sm_scale,
                         s_qz, s_qm, s_kz, s_kn, s_vz, s_vn, s_oz, s_om,
                         IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    """One program per (query block Q_i, batch·head): dQ_i accumulates locally over the key blocks."""
    start_m = tl.program_id(0)
    z = tl.program_id(1)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q_mask = (offs_m[:, None] < Lq) & d_ok[None, :]
    q = tl.load(Q + z * s_qz + offs_m[:, None] * s_qm + offs_d[None, :], mask=q_mask, other=0.0)
    do = tl.load(dO + z * s_oz + offs_m[:, None] * s_om + offs_d[None, :], mask=q_mask, other=0.0)
    lse = tl.load(LSE + z * Lq + offs_m, mask=offs_m < Lq, other=0.0) * 1.4426950408889634
    Di = tl.load(Dd + z * Lq + offs_m, mask=offs_m < Lq, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    hi = tl.minimum(Lk, (start_m + 1) * BLOCK_M) if IS_CAUSAL else Lk
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        kv_mask = (offs_n[:, None] < Lk) & d_ok[None, :]
        k = tl.load(K + z * s_kz + offs_n[:, None] * s_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + z * s_vz + offs_n[:, None] * s_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale              # (BLOCK_M, BLOCK_N)
        valid = (offs_m[:, None] < Lq) & (offs_n[None, :] < Lk)
        if IS_CAUSAL:
            valid = valid & (offs_n[None, :] <= offs_m[:, None])
        p = tl.where(valid, tl.math.exp2(s - lse[:, None]), 0.0)                       # P_ij = exp(S − L)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)                        # dP_ij = dO_i V_jᵀ
        ds = p * (dp - Di[:, None])                                                    # dS_ij = P ∘ (dP − D)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)                     # dQ_i += dS_ij K_j
    tl.store(dQ + z * s_qz + offs_m[:, None] * s_qm + offs_d[None, :], (dq * sm_scale).to(dQ.dtype.element_ty),
             mask=q_mask)


def _launch(q, k, v, is_causal, scale, block_q, block_k):
    """(…, L, E) tensors -> (O in q's dtype, logsumexp fp32), both flattened to (Z, L, ·)."""
    _need_triton()
    if q.device.type != "cuda" and not interpreted():
        raise ValueError(f"flash_attention_triton needs CUDA tensors (got q on {q.device}); on a CPU set "
                         f"TRITON_INTERPRET=1 before importing triton, or use attn_course.flash_attention")
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if b < 16 or b & (b - 1):
            raise ValueError(f"{name} must be a power of two >= 16 for tl.dot, got {b}")
    if q.shape[-1] != v.shape[-1]:
        raise ValueError(f"the Triton kernel needs v's width equal to q's: E={q.shape[-1]}, Ev={v.shape[-1]}")
    Z, Lq, E = math.prod(q.shape[:-2]), q.shape[-2], q.shape[-1]
    Lk = k.shape[-2]
    Q, K, V = (t.reshape(Z, t.shape[-2], E).contiguous() for t in (q, k, v))
    O = torch.empty_like(Q)
    LSE = torch.empty(Z, Lq, device=q.device, dtype=torch.float32)
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
    grid = (triton.cdiv(Lq, block_q), Z)
    _flash_fwd_kernel[grid](Q, K, V, O, LSE, Lq, Lk, E, scale * LOG2E,
                            Q.stride(0), Q.stride(1), K.stride(0), K.stride(1), V.stride(0), V.stride(1),
                            O.stride(0), O.stride(1), IS_CAUSAL=bool(is_causal),
                            **kernel_config("forward", E, q.dtype, block_q=block_q, block_k=block_k,
                                            capability=_capability(q)))
    return O, LSE, scale


def _launch_backward(q, k, v, O, LSE, grad_out, is_causal, scale, block_q, block_k):
    """dQ, dK, dV (each in its input's shape and dtype) from the saved O and logsumexp: Dao 2023, Algorithm 2,
    split into two kernels (dK/dV per key block, dQ per query block) so that no atomics are needed."""
    Z, E = O.shape[0], O.shape[-1]
    Q, K, V = (t.reshape(Z, t.shape[-2], E).contiguous() for t in (q, k, v))
    dO = grad_out.reshape(O.shape).to(O.dtype).contiguous()
    Dd = (dO.float() * O.float()).sum(-1)                                             # (Z, Lq) D_i = rowsum(dO ∘ O)
    dQ, dK, dV = torch.empty_like(Q), torch.empty_like(K), torch.empty_like(V)
    Lq, Lk = Q.shape[1], K.shape[1]
    meta = {name: dict(IS_CAUSAL=bool(is_causal), **kernel_config(name, E, q.dtype, block_q=block_q, block_k=block_k,
                                                                    capability=_capability(q)))
            for name in ("backward_dkdv", "backward_dq")}
    args = (Lq, Lk, E, scale * LOG2E, scale, Q.stride(0), Q.stride(1), K.stride(0), K.stride(1),
            V.stride(0), V.stride(1), dO.stride(0), dO.stride(1))
    _flash_bwd_dkdv_kernel[(triton.cdiv(Lk, block_k), Z)](Q, K, V, dO, LSE, Dd, dK, dV, *args, **meta["backward_dkdv"])
    _flash_bwd_dq_kernel[(triton.cdiv(Lq, block_q), Z)](Q, K, V, dO, LSE, Dd, dQ, *args, **meta["backward_dq"])
    return dQ.reshape(q.shape), dK.reshape(k.shape), dV.reshape(v.shape)


class _TritonFlash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, block_q, block_k):
        O, LSE, s = _launch(q, k, v, is_causal, scale, block_q, block_k)
        ctx.save_for_backward(q, k, v, O, LSE)
        ctx.cfg = (s, is_causal, block_q, block_k)
        return O.reshape(q.shape)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, O, LSE = ctx.saved_tensors
        s, is_causal, block_q, block_k = ctx.cfg
        dq, dk, dv = _launch_backward(q, k, v, O, LSE, grad_out, is_causal, s, block_q, block_k)
        return dq, dk, dv, None, None, None, None


def flash_attention_triton_forward(q, k, v, *, is_causal=False, scale=None, block_q=64, block_k=64):
    """The Triton forward alone: ``(out (…, Lq, E) in q's dtype, logsumexp (…, Lq) fp32)``."""
    _check(q, k, v, scale, block_q, block_k)
    with torch.no_grad():
        O, LSE, _ = _launch(q, k, v, is_causal, scale, block_q, block_k)
    return O.reshape(q.shape), LSE.reshape(q.shape[:-1])


def flash_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                           scale: float | None = None, block_q: int = 64, block_k: int = 64) -> torch.Tensor:
    """Same semantics as :func:`attn_course.flash_attention` (and SDPA), computed by the Triton kernel.

    q ``(…, Lq, E)``, k ``(…, Lk, E)``, v ``(…, Lk, E)`` on CUDA (or on CPU under ``TRITON_INTERPRET=1``);
    fp32/fp16/bf16 (fp32 accumulation; fp32 matmuls in IEEE precision, not TF32). ``block_q``/``block_k``
    must be powers of two ≥ 16 (``tl.dot``'s minimum). Differentiable: Triton backward kernels recompute the tiles.
    """
    _check(q, k, v, scale, block_q, block_k)
    return _TritonFlash.apply(q, k, v, bool(is_causal), scale, block_q, block_k)


BENCH_REPS = 20     # at least this many timed repetitions per measurement (do_bench's rep is a time budget in ms)


def _bench(argv=None) -> int:
    """TFLOP/s of this kernel vs SDPA's FLASH backend (CUDA only): L=4096, d=64/128, fp16/bf16, forward and
    forward+backward.

    The default configuration is the launch configuration — 64 × 64 blocks and :func:`kernel_config`'s warps
    and stages — the one :mod:`attn_course.triton_aot` compiled for sm_80/89/90 without a register spill
    (``attn_course/data/triton_aot.json``); 128 × 64 query × key blocks spill at d = 128 on sm_80 and sm_89.
    Each time is the median of ``triton.testing.do_bench`` (CUDA events, warm-up first, ≥ 20 repetitions).
    FLOPs: 4·B·H·L²·d for the forward (two matmuls), 2.5× that for the backward (five matmuls), halved when causal.
    """
    import argparse
    p = argparse.ArgumentParser(prog="python -m attn_course.flash_triton --bench")
    p.add_argument("--bench", action="store_true")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--block-q", type=int, default=64,
                   help="query block (default 64: the launch configuration, compiled without spills for sm_80/89/90)")
    p.add_argument("--block-k", type=int, default=64, help="key block (default 64)")
    p.add_argument("--pass", dest="passes", choices=("fwd", "fwd+bwd", "both"), default="both",
                   help="time the forward, forward+backward, or both (default)")
    args = p.parse_args(argv)
    if triton is None:
        print("Triton is not installed: the benchmark times the Triton kernels on a CUDA GPU "
              "(torch's Linux CUDA build brings Triton)")
        return 1
    if not torch.cuda.is_available():
        print("no CUDA device: the TFLOP/s comparison needs a CUDA GPU (on a CPU, lesson 08 runs the PyTorch "
              "flash_attention and its recorded tables)")
        return 1
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    def median_ms(fn):
        est = do_bench(fn, warmup=5, rep=5, return_mode="median")
        return do_bench(fn, warmup=25, rep=max(100.0, 1.5 * BENCH_REPS * est), return_mode="median")

    B, H, L = args.batch, args.heads, args.length
    passes = ("fwd", "fwd+bwd") if args.passes == "both" else (args.passes,)
    print(f"{torch.cuda.get_device_name()}  B={B} H={H} L={L}, blocks {args.block_q}x{args.block_k}, "
          f"median of triton.testing.do_bench (CUDA events, >= {BENCH_REPS} reps)\n")
    print("| pass | dtype | d | causal | triton TFLOP/s | SDPA flash TFLOP/s | triton / SDPA |")
    print("|---|---|---|---|---|---|---|")
    for which in passes:
        for dtype in (torch.float16, torch.bfloat16):
            for D in (64, 128):
                for causal in (False, True):
                    grad = which == "fwd+bwd"
                    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=dtype, requires_grad=grad)
                               for _ in range(3))
                    flops = 4 * B * H * L * L * D * (0.5 if causal else 1.0) * (3.5 if grad else 1.0)
                    if grad:
                        dout = torch.randn_like(q)
                        tri = lambda: flash_attention_triton(q, k, v, is_causal=causal, block_q=args.block_q,
                                                             block_k=args.block_k).backward(dout)
                        ref = lambda: torch.nn.functional.scaled_dot_product_attention(
                            q, k, v, is_causal=causal).backward(dout)
                    else:
                        tri = lambda: flash_attention_triton_forward(q, k, v, is_causal=causal,
                                                                     block_q=args.block_q, block_k=args.block_k)
                        ref = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    t_tri = median_ms(tri)
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        t_sdpa = median_ms(ref)
                    a, b = flops / t_tri / 1e9, flops / t_sdpa / 1e9      # do_bench returns milliseconds
                    print(f"| {which} | {str(dtype)[6:]} | {D} | {'yes' if causal else 'no'} | {a:.0f} | {b:.0f} | "
                          f"{a / b:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_bench())
