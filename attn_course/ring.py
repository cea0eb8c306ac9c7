"""Ring attention and DeepSpeed-Ulysses on ``torch.distributed``: each of P ranks holds L/P positions of q, k, v.

**Ring** (Liu, Zaharia & Abbeel 2023): at step t rank r holds the K/V shard of rank ``(r − t) mod P``, attends
to it with lesson 08's tiled kernel (which returns the log-sum-exp) and passes it on to r + 1 while receiving
the next (overlapped); partials merge by their log-sum-exps. Causal: future key blocks are skipped; the *zigzag*
layout (chunks r and 2P−1−r of 2P) balances the work. The backward ring recomputes blocks; dK, dV travel with
K, V. **Ulysses** (Jacobs et al. 2023): all-to-all from sequence to head shards (H divisible by P), local
attention, all-to-all back. Call every function on every rank of ``group`` (gloo on CPU, NCCL on CUDA).
Layouts, traffic: :mod:`.ring_layout`; launcher, verifier, CLI (``-m attn_course.ring``): :mod:`.ring_launch`."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .flash import flash_attention_backward, flash_attention_forward
from .ring_layout import (LAYOUTS, _chunks, _pairs, ring_comm_bytes, ring_plan, ring_schedule, shard,
                          shard_positions, ulysses_comm_bytes, work_per_rank)

_LAUNCH = ("launch", "verify", "choose_backend", "rank_device", "reference_rows", "main")
__all__ = ["ring_attention", "ulysses_attention", "shard_positions", "shard", "merge_partials", "ring_schedule",
           "comm_stats", "reset_comm_stats", "ring_comm_bytes", "ulysses_comm_bytes", "ring_plan", "work_per_rank",
           "LAYOUTS", *_LAUNCH]


def __getattr__(name):                         # the launcher imports this module: re-exported lazily
    if name not in _LAUNCH:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import ring_launch
    return getattr(ring_launch, name)


def merge_partials(out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor, lse2: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attentions of the same queries over disjoint key sets.

    ``out_i``: ``(…, Lq, Ev)`` each normalised over its own keys; ``lse_i``: ``(…, Lq)`` their log-sum-exps
    (−∞ for a row that saw no key). Returns the attention over the union and its log-sum-exp. Rows with no
    key on either side stay zero (never NaN).
    """
    lse = torch.logaddexp(lse1, lse2)                                          # (…, Lq)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)           # both empty: avoid −∞ − −∞
    w1 = torch.exp(lse1 - safe).unsqueeze(-1)                                  # e^{lse_1 − lse}
    w2 = torch.exp(lse2 - safe).unsqueeze(-1)
    return w1 * out1 + w2 * out2, lse


_STATS = {"bytes_sent": 0, "score_entries": 0}   # bytes this rank sent; q·k scores it computed (forward)


def comm_stats() -> dict:
    """What this process did since :func:`reset_comm_stats`: ``bytes_sent`` (point-to-point and all-to-all
    payload this rank sent) and ``score_entries`` (q·k scores it computed in the forward pass, over all batches and heads: its work)."""
    return dict(_STATS)


def reset_comm_stats() -> None:
    _STATS.update(bytes_sent=0, score_entries=0)


def _group_info(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call dist.init_process_group first "
                           "(or run through attn_course.ring.launch / torchrun)")
    return dist.get_rank(group), dist.get_world_size(group)


def _start_shift(buf: torch.Tensor, rank: int, world: int, group):
    """Send ``buf`` to rank+1 and receive the same-shaped tensor from rank−1 (non-blocking)."""
    recv = torch.empty_like(buf)
    to, frm = (rank + 1) % world, (rank - 1) % world
    g = group if group is not None else dist.group.WORLD
    ops = [dist.P2POp(dist.isend, buf, dist.get_global_rank(g, to), group),
           dist.P2POp(dist.irecv, recv, dist.get_global_rank(g, frm), group)]
    reqs = dist.batch_isend_irecv(ops)
    _STATS["bytes_sent"] += buf.numel() * buf.element_size()
    return recv, reqs


def _wait(reqs):
    for r in reqs:
        r.wait()


def _check_qkv(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() < 2 or not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor (…, L/P, E), got "
                             f"{getattr(t, 'shape', type(t).__name__)}")
    if q.shape[:-1] != k.shape[:-1] or k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"ring attention needs q, k, v shards of one length: q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)} (and q, k of one embedding size)")


def _ring_forward(q, k, v, is_causal, layout, group):
    rank, world = _group_info(group)
    Lloc = q.shape[-2]
    L = Lloc * world
    q_chunks = _chunks(rank, world, L, layout)
    acc = torch.promote_types(q.dtype, torch.float32)
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=acc, device=q.device)
    lse = torch.full(q.shape[:-1], -math.inf, dtype=acc, device=q.device)
    E = k.shape[-1]
    kv = torch.cat([k, v], dim=-1).contiguous()                                 # one message per hop
    for t in range(world):
        if t < world - 1:
            nxt, reqs = _start_shift(kv, rank, world, group)                    # overlap: send while computing
        src = (rank - t) % world
        k_t, v_t = kv[..., :E], kv[..., E:]
        for qs, ks, diag in _pairs(q_chunks, _chunks(src, world, L, layout), is_causal):
            o, l = flash_attention_forward(q[..., qs, :], k_t[..., ks, :], v_t[..., ks, :], is_causal=diag)
            out[..., qs, :], lse[..., qs] = merge_partials(out[..., qs, :], lse[..., qs], o.to(acc), l.to(acc))
            c = qs.stop - qs.start                                              # per (batch, head):
            n = c * (c + 1) // 2 if diag else c * (ks.stop - ks.start)          # the diagonal block: c(c+1)/2
            _STATS["score_entries"] += n * math.prod(q.shape[:-2])
        if t < world - 1:
            _wait(reqs)
            kv = nxt
    return out.to(q.dtype), lse


def _ring_backward(q, k, v, out, lse, dout, is_causal, layout, group):
    rank, world = _group_info(group)
    Lloc = q.shape[-2]
    L = Lloc * world
    q_chunks = _chunks(rank, world, L, layout)
    acc = torch.promote_types(q.dtype, torch.float32)
    E = k.shape[-1]
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    # two travelling messages for the shard that started on rank (rank − t) mod P:
    #   kv   = [k | v] in the INPUT dtype: P − 1 hops, sent while this step computes (as in the forward);
    #   dkdv = [dk | dv] in the accumulation dtype (fp32 for bf16/fp16): P hops, sent only AFTER this
    #          step has added its contribution, so this teaching version does not overlap it with compute.
    kv = torch.cat([k, v], dim=-1).contiguous()
    dkdv = torch.zeros(*k.shape[:-1], E + v.shape[-1], dtype=acc, device=k.device)
    for t in range(world):
        if t < world - 1:
            nxt, reqs_kv = _start_shift(kv, rank, world, group)                 # overlapped: K/V for step t+1
        k_t, v_t = kv[..., :E].to(acc), kv[..., E:].to(acc)
        for qs, ks, diag in _pairs(q_chunks, _chunks((rank - t) % world, world, L, layout), is_causal):
            gq, gk, gv = flash_attention_backward(q[..., qs, :].to(acc), k_t[..., ks, :], v_t[..., ks, :],
                                                  out[..., qs, :].to(acc), lse[..., qs], dout[..., qs, :].to(acc),
                                                  is_causal=diag)
            dq[..., qs, :] += gq
            dkdv[..., ks, :E] += gk
            dkdv[..., ks, E:] += gv
        if world > 1:                          # P hops bring every dk, dv home (not overlapped: see above)
            dkdv, reqs = _start_shift(dkdv, rank, world, group)
            _wait(reqs)
        if t < world - 1:
            _wait(reqs_kv)
            kv = nxt
    return dq.to(q.dtype), dkdv[..., :E].to(k.dtype), dkdv[..., E:].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, layout, group):
        out, lse = _ring_forward(q, k, v, is_causal, layout, group)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cfg = (is_causal, layout, group)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(q, k, v, out, lse, dout.contiguous(), *ctx.cfg)
        return dq, dk, dv, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                   layout: str = "contiguous", group=None) -> torch.Tensor:
    """Exact softmax attention over a sequence sharded across the ranks of ``group``.

    Args:
        q, k, v: this rank's shards ``(…, L/P, E)`` (usually ``(B, H, L/P, E)``), positions as given by
            :func:`shard_positions` for ``layout``. Every rank calls this with same-shaped shards.
        is_causal: causal over *global* positions; key shards wholly in a query shard's future are skipped.
        layout: ``"contiguous"`` (rank r holds ``[r·L/P, (r+1)·L/P)``) or ``"zigzag"`` (chunks r and
            2P−1−r of 2P, concatenated — balanced causal work).
        group: the process group (default: the default group).

    Returns:
        This rank's shard of the output, ``(…, L/P, Ev)``, in the input dtype, equal to its rows of
        ``F.scaled_dot_product_attention`` on the full sequence. Differentiable: the backward is a second
        ring that recomputes blocks from the saved output and log-sum-exp.
    """
    _check_qkv(q, k, v)
    _, world = _group_info(group)
    _chunks(0, world, q.shape[-2] * world, layout)                  # validates layout and divisibility
    if layout == "zigzag" and q.shape[-2] % 2:
        raise ValueError(f"the zigzag layout needs an even shard length, got L/P={q.shape[-2]}")
    return _RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), bool(is_causal), layout, group)


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    """Split ``x`` into P pieces along ``scatter_dim``, send piece j to rank j, concatenate what arrives
    along ``gather_dim`` (in rank order)."""
    _, world = _group_info(group)
    ins = torch.stack(x.chunk(world, dim=scatter_dim))              # (P, piece): piece j goes to rank j
    outs = torch.empty_like(ins)
    dist.all_to_all_single(outs, ins, group=group)                 # torch 2.11's gloo has only this form
    _STATS["bytes_sent"] += ins[0].numel() * ins.element_size() * (world - 1)
    return torch.cat(outs.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """Differentiable all-to-all: its adjoint is the all-to-all with the two dims swapped."""
    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.cfg = (scatter_dim, gather_dim, group)
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, g):
        scatter_dim, gather_dim, group = ctx.cfg
        return _all_to_all(g, gather_dim, scatter_dim, group), None, None, None


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                      group=None) -> torch.Tensor:
    """DeepSpeed-Ulysses: sequence shards ``(B, H, L/P, E)`` (contiguous layout) -> head shards
    ``(B, H/P, L, E)`` by all-to-all, full attention locally (SDPA), all-to-all back to ``(B, H, L/P, Ev)``.

    Requires the number of heads H to be divisible by P. Differentiable.
    """
    _check_qkv(q, k, v)
    if q.dim() != 4:
        raise ValueError(f"ulysses_attention needs (B, H, L/P, E) shards, got q {tuple(q.shape)}")
    _, world = _group_info(group)
    H = q.shape[1]
    if H % world:
        raise ValueError(f"Ulysses splits heads across ranks: num_heads H={H} is not divisible by "
                         f"the world size P={world}")
    qh, kh, vh = (_AllToAll.apply(t, 1, 2, group) for t in (q, k, v))           # (B, H/P, L, E)
    oh = F.scaled_dot_product_attention(qh, kh, vh, is_causal=is_causal)         # (B, H/P, L, Ev)
    return _AllToAll.apply(oh, 2, 1, group)                                      # (B, H, L/P, Ev)


if __name__ == "__main__":                     # python -m attn_course.ring / torchrun -m attn_course.ring
    raise SystemExit(__getattr__("main")())
