"""Exercise set 14 — attention when serving (solutions/14_serving_attention.ipynb).

References are computed here (float64 softmax attention written out, integer formulas), independently of the
learner and of ``attn_course.paged``. Hints are *detected*: each judge computes what the common mistakes
(forgetting K or V, layers or bytes; rounding the pool up; no copy-on-write; sharing the partly filled block;
no length mask on the last block; the wrong GQA grouping; blocks read in pool order; no scale) would return on
the same inputs and names the match. The paged decode step never gets the pool: it reads it through a
:class:`BlockReader` (the sequence's blocks only, each at most twice), and may not gather what it read into one
tensor (none of ``seq_len · d`` elements or more, ``spec.limit_numel``). Split-KV's merge is graded on partials
the grader makes (log-sum-exps far apart, an empty split with lse = −∞): no query or key ever reaches it.
"""
from __future__ import annotations

import math

import torch

from ..spec import Case, Exercise, FORBID_COURSE, FORBID_SDPA, Verdict, close, diagnose, distinct, draw, limit_numel, randint

__all__ = ["EXERCISES"]

_F64 = torch.float64


def _max_diff(got: torch.Tensor, want: torch.Tensor) -> str:
    d = (got.double() - want.double()).abs()
    return "NaN" if torch.isnan(d).any() else f"{float(d.max()):.3g}"


# ---- 14_pool_blocks -------------------------------------------------------------------------------------

_POOL_KEYS = ("memory_bytes", "num_layers", "num_kv_heads", "head_dim", "bytes_per_element", "block_size")


def _pool(p, *, kv=2, layers=True, nbytes=True, per_token=False, ceil=False):
    block = (kv * (p["num_layers"] if layers else 1) * p["num_kv_heads"] * p["head_dim"]
             * (p["bytes_per_element"] if nbytes else 1) * (1 if per_token else p["block_size"]))
    return -(-p["memory_bytes"] // block) if ceil else p["memory_bytes"] // block


def _pool_cases(gen):
    # bytes_per_element is never 2 (forgetting it would equal forgetting K or V) nor 1 (no effect)
    makers = [lambda g: (randint(g, 20, 60) * 2**30 + randint(g, 1, 2**29), 32, 8, 128, 4, 16),   # Llama-3-8B, fp32
              lambda g: (randint(g, 10**7, 10**9), randint(g, 3, 40), randint(g, 1, 8), 64 * randint(g, 1, 2),
                         4, 2 ** randint(g, 3, 5)),
              lambda g: (randint(g, 10**6, 10**8), randint(g, 2, 12), randint(g, 3, 6), randint(g, 5, 40),
                         4, randint(g, 3, 24))]

    def ok(s):
        p = dict(zip(_POOL_KEYS, s))
        vals = [_pool(p), _pool(p, kv=1), _pool(p, layers=False), _pool(p, nbytes=False), _pool(p, per_token=True),
                _pool(p, ceil=True)]
        return vals[0] >= 1 and distinct(*vals)
    return [Case(", ".join(f"{k}={v}" for k, v in zip(_POOL_KEYS, s)), params=dict(zip(_POOL_KEYS, s)))
            for s in (draw(gen, make, ok) for make in makers)]


def _pool_answer(fn, case):
    return {"blocks": torch.tensor(int(fn(*case.params.values())), dtype=torch.int64)}


def _pool_expected(case):
    return {"blocks": torch.tensor(_pool(case.params), dtype=torch.int64)}


def _pool_judge(got, want, case):
    g, w, p = int(got["blocks"]), int(want["blocks"]), case.params
    if g == w:
        return Verdict(True)
    for value, hint in [
        (_pool(p, kv=1), "a block holds keys AND values: 2 · layers · KV heads · head_dim · block_size · bytes."),
        (_pool(p, layers=False), "every layer caches its own keys and values for the block's tokens: multiply "
                                 "by num_layers."),
        (_pool(p, nbytes=False), "memory_bytes is in bytes: multiply the numbers per block by bytes_per_element."),
        (_pool(p, per_token=True), "that counts token slots; one block holds block_size tokens."),
        (_pool(p, ceil=True), "round down: a block that does not fit entirely cannot be allocated."),
    ]:
        if g == value:
            return Verdict(False, hint)
    return Verdict(False, f"got {g:,}, expected {w:,} blocks: memory_bytes // (bytes of one block).")


# ---- 14_shared_prefix_blocks ----------------------------------------------------------------------------

def _shared(prefix_len, suffixes, B, *, cow=True, parent=True, share=True):
    if not share:
        return sum(-(-(prefix_len + u) // B) for u in suffixes) + (-(-prefix_len // B) if parent else 0)
    first_own = prefix_len // B if cow else -(-prefix_len // B)     # the partly filled block is copied (COW)
    own = sum(-(-(prefix_len + u) // B) - first_own for u in suffixes)
    return own + (-(-prefix_len // B) if parent else 0)


def _shared_cases(gen):
    def make(lo_p, hi_p, n, hi_u, Bs):
        def m(g):
            B = Bs[randint(g, 0, len(Bs) - 1)]
            P = randint(g, lo_p, hi_p)
            return P, [randint(g, 1, hi_u) for _ in range(randint(g, 2, n))], B
        return m

    def ok(c):
        P, us, B = c
        return P % B != 0 and distinct(_shared(P, us, B), _shared(P, us, B, cow=False),
                                       _shared(P, us, B, parent=False), _shared(P, us, B, share=False),
                                       _shared(P, us, B, share=False, parent=False))
    cases = [draw(gen, make(20, 200, 6, 60, (8, 16)), ok), draw(gen, make(300, 2000, 12, 500, (16, 32)), ok),
             draw(gen, make(5, 40, 4, 10, (4, 6)), ok)]
    return [Case(f"prefix_len={P}, suffix_lengths={us}, block_size={B}",
                 params=dict(prefix_len=P, suffix_lengths=us, block_size=B)) for P, us, B in cases]


def _shared_answer(fn, case):
    p = case.params
    return {"blocks": torch.tensor(int(fn(p["prefix_len"], list(p["suffix_lengths"]), p["block_size"])),
                                   dtype=torch.int64)}


def _shared_expected(case):
    p = case.params
    return {"blocks": torch.tensor(_shared(p["prefix_len"], p["suffix_lengths"], p["block_size"]), dtype=torch.int64)}


def _shared_judge(got, want, case):
    g, w = int(got["blocks"]), int(want["blocks"])
    if g == w:
        return Verdict(True)
    P, us, B = case.params["prefix_len"], case.params["suffix_lengths"], case.params["block_size"]
    for value, hint in [
        (_shared(P, us, B, cow=False), "the prefix's last block is only partly filled: the first write of each "
                                       "request copies it (copy-on-write), so every request owns its own copy."),
        (_shared(P, us, B, parent=False), "the prefix's own sequence stays in the cache (new requests fork it): "
                                          "count its ceil(prefix_len / block_size) blocks once."),
        (_shared(P, us, B, share=False), "with forks the requests share the prefix's full blocks: count them once, "
                                         "not once per request."),
        (_shared(P, us, B, share=False, parent=False), "that is the cache without sharing: the forked requests "
                                                       "share the prefix's full blocks."),
    ]:
        if g == value:
            return Verdict(False, hint)
    return Verdict(False, f"got {g:,}, expected {w:,} blocks.")


# ---- 14_paged_decode (build: the learner reads the pool only through a block reader) ------------------------

_READ = """
def read(b):
    b = int(b)
    if b not in mine:
        refused.append(b)
        raise ValueError(f"block {b} is not one of this sequence's blocks {sorted(mine)}: read only the blocks "
                         f"of block_table")
    reads[b] = reads.get(b, 0) + 1
    return k_pool[b].clone(), v_pool[b].clone()
"""


class BlockReader:
    """What the learner's decode step may see of the pool: the sequence's ``block_table`` (a small int64 tensor),
    ``seq_len`` and ``block_size``, and ``read(b) -> (K, V)``, pool block ``b``'s keys and values, each
    ``(H_kv, block_size, d)`` (a copy; slots past ``seq_len`` hold stale data). Blocks outside the table are
    refused; every read is counted in ``reads``. ``read`` is compiled under a file name of its own: it is a tool
    handed to the learner's code (like ``ring_sim``), which the runtime guard would otherwise count as a call
    into the grader."""

    def __init__(self, k_pool, v_pool, block_table, seq_len):
        self.block_table, self.seq_len, self.block_size = block_table.clone(), int(seq_len), k_pool.shape[2]
        self.reads, self.refused = {}, []
        scope = {"mine": set(block_table.tolist()), "refused": self.refused, "reads": self.reads,
                 "k_pool": k_pool, "v_pool": v_pool}
        exec(compile(_READ, "<paged block reader>", "exec"), scope)
        self.read = scope["read"]


def _dec_cases(gen):
    cases = []
    for nb, Hkv, g, B, d in ((12, 2, 2, 4, 8), (16, 1, 4, 8, 16), (20, 2, 3, 5, 8)):
        # a partial last block; seq_len > H·block_size: one block (repeated for all H query heads) stays under
        # the size limit (seq_len·d); d > H: the scores of every token (H × seq_len) too
        L = draw(gen, lambda gg: randint(gg, Hkv * g * B + 1, nb // 2 * B), lambda n: n % B != 0)
        k_pool = torch.randn(nb, Hkv, B, d, generator=gen, dtype=_F64) * 2      # unused slots hold stale data
        v_pool = torch.randn(nb, Hkv, B, d, generator=gen, dtype=_F64)
        n = -(-L // B)
        table = torch.randperm(nb, generator=gen)[:n]
        if bool((table[:-1] < table[1:]).all()):                                  # never already in pool order
            table = table.flip(0)
        q = torch.randn(Hkv * g, d, generator=gen, dtype=_F64)
        cases.append(Case(f"q {tuple(q.shape)}, pool of {nb} blocks (H_kv={Hkv}, block_size={B}, d={d}), "
                          f"block_table of {n} blocks, seq_len={L}",
                          {"q": q, "k_pool": k_pool, "v_pool": v_pool, "block_table": table}, {"seq_len": L}))
    return cases


def _dec_answer(fn, case):
    i = case.inputs
    reader = BlockReader(i["k_pool"], i["v_pool"], i["block_table"], case.params["seq_len"])
    out = fn(i["q"].clone(), reader)
    if reader.refused:
        raise ValueError(f"your code asked for pool block {reader.refused[0]}, which is not one of the sequence's: "
                         f"a decode step reads only the blocks of its block_table")
    over = {b: n for b, n in reader.reads.items() if n > 2}
    if over:
        b, n = next(iter(over.items()))
        raise ValueError(f"your code read block {b} {n} times: read each block of the table at most twice (once "
                         f"per pass)")
    return {"out": out}


def _dec_limit(case):
    return case.params["seq_len"] * case.inputs["k_pool"].shape[-1]


def _dec_materialised(case, shape, limit):
    return (f"your code formed a {shape} tensor (≥ {limit} elements = seq_len·d): that is the sequence's keys or "
            f"values (of one KV head or more) gathered into one tensor — fold the blocks in one at a time.")


def _decode(case, *, mask=True, grouping="div", order="table", scale=True):
    i = case.inputs
    q, K, V, table, L = i["q"].to(_F64), i["k_pool"], i["v_pool"], i["block_table"], case.params["seq_len"]
    Hq, (_, Hkv, B, d) = q.shape[0], K.shape
    if order == "sorted":
        table = table.sort().values
    keys = K[table].transpose(0, 1).reshape(Hkv, -1, d)                   # (H_kv, n·B, d)
    vals = V[table].transpose(0, 1).reshape(Hkv, -1, d)
    if mask:
        keys, vals = keys[:, :L], vals[:, :L]
    g = Hq // Hkv
    heads = torch.arange(Hq) // g if grouping == "div" else torch.arange(Hq) % Hkv
    s = torch.einsum("hd,hld->hl", q, keys[heads]) / (math.sqrt(d) if scale else 1.0)
    return {"out": torch.einsum("hl,hld->hd", s.softmax(-1), vals[heads]).to(i["q"].dtype)}


def _dec_expected(case):
    return _decode(case)


def _dec_judge(got, want, case):
    if close(got["out"], want["out"], atol=1e-6, rtol=1e-6):
        return Verdict(True)
    return diagnose(got, [
        ("the last block is only partly filled: its slots at positions ≥ seq_len hold stale keys from an earlier "
         "sequence — mask them.", _decode(case, mask=False)),
        ("query head h reads KV head h // (H / H_kv) (consecutive query heads share a KV head), not h % H_kv.",
         _decode(case, grouping="mod")),
        ("read the blocks in the block table's order: token t is in block_table[t // block_size], whatever the "
         "block's number in the pool.", _decode(case, order="sorted")),
        ("scale the scores by 1/sqrt(head_dim).", _decode(case, scale=False)),
    ], f"wrong values (largest difference {_max_diff(got['out'], want['out'])}): out[h] = softmax(q[h]·K/√d) V over "
       f"the seq_len tokens of the sequence, K and V read from the blocks of block_table in order.")


# ---- 14_split_kv (build: the merge, graded on partials the grader makes) -------------------------------------

def _split_cases(gen):
    """Partials of splits of very different log-sum-exps (spread over ±spread, beyond exp's float64 range in
    case 2), and one empty split (lse = −∞, output zeros) in every case but the first."""
    cases = []
    for n, (S, H, Dv, spread) in enumerate(((3, 2, 6, 5.0), (5, 4, 8, 60.0), (4, 3, 5, 900.0))):
        lse = torch.rand(S, H, generator=gen, dtype=_F64) * 2 - 1
        out = torch.randn(S, H, Dv, generator=gen, dtype=_F64)
        if n:
            empty = randint(gen, 0, S - 1)
            lse[empty], out[empty] = -math.inf, 0.0
        seen = torch.isfinite(lse)
        lse[seen] = lse[seen] / lse[seen].abs().max() * spread  # the farthest split at ±spread exactly
        cases.append(Case(f"{S} splits, H={H}, Dv={Dv}, lse_s in ±{spread:g}" + (", one empty split" if n else ""),
                          {"split_out": out, "split_lse": lse}))
    return cases


def _split_answer(fn, case):
    i = case.inputs
    out, lse = fn(i["split_out"].clone(), i["split_lse"].clone())
    return {"out": out, "lse": lse}


def _split_merge(case, *, how="lse"):
    """The merge (natural log-sum-exps, weights e^{lse_s − lse}), or what a named mistake returns."""
    o, l = case.inputs["split_out"], case.inputs["split_lse"]
    lse = torch.logsumexp(l, 0)
    if how == "mean":
        return {"out": o.mean(0)}
    out = (torch.exp(l - lse)[..., None] * o).sum(0)
    return {"out": out, "lse": {"lse": lse, "max": l.amax(0), "log2": lse / math.log(2)}[how]}


def _split_expected(case):
    return _split_merge(case)


def _split_judge(got, want, case):
    if close(got["out"], want["out"], atol=1e-6, rtol=1e-6) and close(got["lse"], want["lse"], atol=1e-6, rtol=1e-9):
        return Verdict(True)
    if bool(torch.isnan(got["out"]).any()) or bool(torch.isinf(got["out"]).any()):
        return Verdict(False, "your output has NaN or ∞: subtract the largest lse_s before exponentiating (a split's "
                              "lse can be far beyond exp's range), and let an empty split (lse = −∞) weigh e^{−∞} = 0.")
    return diagnose(got, [
        ("merging by the average of the splits is right only when every split has the same log-sum-exp: weight "
         "split s by exp(lse_s − lse), lse = log Σ_s exp(lse_s).", _split_merge(case, how="mean")),
        ("the merged lse is log Σ_s exp(lse_s), not the largest lse_s.", {"lse": _split_merge(case, how="max")["lse"]}),
        ("return the merged lse as a NATURAL log (a base-2 computation inside is fine: convert back).",
         {"lse": _split_merge(case, how="log2")["lse"]}),
    ], f"wrong values (largest differences: out {_max_diff(got['out'], want['out'])}, lse "
       f"{_max_diff(got['lse'], want['lse'])}): out = Σ_s exp(lse_s − lse) O_s with lse = log Σ_s exp(lse_s).")


EXERCISES = [
    Exercise("14_pool_blocks", 1, "How many blocks fit in the GPU's memory",
             "a function pool_blocks(memory_bytes, num_layers, num_kv_heads, head_dim, bytes_per_element, "
             "block_size) -> int",
             _pool_cases, _pool_answer, _pool_expected, _pool_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("14_shared_prefix_blocks", 2, "Blocks in use with a shared system prompt",
             "a function shared_prefix_blocks(prefix_len, suffix_lengths, block_size) -> int",
             _shared_cases, _shared_answer, _shared_expected, _shared_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("14_paged_decode", 4, "The paged decode step, block by block",
             "a function paged_decode(q, reader) -> (H, d), reading the pool one block at a time through "
             "reader.read(b)",
             _dec_cases, limit_numel(_dec_answer, _dec_limit, _dec_materialised), _dec_expected, _dec_judge,
             forbidden=FORBID_COURSE + FORBID_SDPA, kind="build"),
    Exercise("14_split_kv", 3, "Flash-decoding: merge the splits by log-sum-exp",
             "a function merge_splits(split_out (S, H, Dv), split_lse (S, H)) -> (out (H, Dv), lse (H,))",
             _split_cases, _split_answer, _split_expected, _split_judge, forbidden=FORBID_COURSE + FORBID_SDPA,
             kind="build"),
]
