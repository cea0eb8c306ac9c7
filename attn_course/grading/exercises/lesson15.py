"""Exercise set 15 — the attention of today's open models (solutions/15_attention_in_open_models.ipynb).

References are computed here in float64 from the definitions — the delta rule as the matrix recurrence
S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ, the sink softmax with an explicit extra column, the cache
of a layer group in closed form (attention caches and a delta layer's convolution inputs in bf16, its state
matrices in fp32, as transformers keeps Qwen3-Next's cache and lesson 15's table counts it) — independently of ``attn_course.deltanet``, ``sinks``
and ``memory``. Hints are found by computing what each common mistake returns on the same inputs. In 15.1 the
grader drives the recurrence and the learner writes the step (a chunk of 1-4 tokens with the state before it):
the learner's code never holds more than one state.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..spec import FORBID_COURSE, FORBID_SDPA, Case, Exercise, Verdict, close, diagnose, draw, randint

__all__ = ["EXERCISES"]

_F64 = torch.float64


# ---- 15_delta_rule (build: the grader drives the recurrence, the learner writes the step) ---------------------

def _delta_cases(gen):
    out = []
    for n, (B, H, L, dk, dv) in enumerate([(1, 1, 5, 3, 2), (2, 3, 9, 4, 5), (1, 2, 16, 6, 3), (2, 1, 7, 2, 4)]):
        L += randint(gen, 0, 3)
        sizes = [1] * L if n == 0 else []              # case 0: one token per call; the others: chunks of 1-4 tokens
        while sum(sizes) < L:
            sizes.append(min(randint(gen, 1, 4), L - sum(sizes)))
        q = torch.randn(B, H, L, dk, generator=gen, dtype=_F64) / dk ** 0.5
        k = F.normalize(torch.randn(B, H, L, dk, generator=gen, dtype=_F64), dim=-1)
        out.append(Case(f"B={B}, H={H}, L={L}, d_k={dk}, d_v={dv}, chunks of {sizes}", {
            "q": q, "k": k, "v": torch.randn(B, H, L, dv, generator=gen, dtype=_F64),
            "g": -torch.rand(B, H, L, generator=gen, dtype=_F64) * 0.5,
            "beta": torch.rand(B, H, L, generator=gen, dtype=_F64) * 0.9 + 0.05}, {"chunks": sizes}))
    return out


def _delta_answer(fn, case):
    """Drives the recurrence: ``fn(S, q, k, v, g, beta) -> (S, o)`` on each chunk (tokens [a, b)) with the state
    it returned for the chunk before; keeps the state after every chunk (the learner's code holds only one)."""
    i = case.inputs
    B, H, L, dk = i["k"].shape
    S = torch.zeros(B, H, dk, i["v"].shape[-1], dtype=_F64)
    outs, states, a = [], [], 0
    for n in case.params["chunks"]:
        S, o = fn(S, *(i[x][:, :, a:a + n].clone() for x in ("q", "k", "v", "g", "beta")))
        if type(S) is not torch.Tensor or type(o) is not torch.Tensor:
            raise ValueError(f"your step returned ({type(S).__name__}, {type(o).__name__}): return (S, o), two tensors")
        outs.append(o)
        states.append(S)
        a += n
    return {"o": torch.cat(outs, 2), "S": torch.stack(states, 2)}


def _delta_formula(case, *, decay_after=False, no_beta=False, plain=False, read_before=False, raw_decay=False):
    """The recurrence in matrix form (the state after each of the case's chunks), or what a named mistake computes."""
    i = case.inputs
    q, k, v, g, beta = i["q"], i["k"], i["v"], i["g"], i["beta"]
    B, H, L, dk = k.shape
    S = torch.zeros(B, H, dk, v.shape[-1], dtype=_F64)
    eye = torch.eye(dk, dtype=_F64)
    ends = set(torch.tensor(case.params["chunks"]).cumsum(0).tolist())
    outs, states = [], []
    for t in range(L):
        kt, vt = k[:, :, t, :, None], v[:, :, t, None, :]                   # (B, H, dk, 1), (B, H, 1, dv)
        a = g[:, :, t, None, None] if raw_decay else g[:, :, t, None, None].exp()
        b = torch.ones_like(beta[:, :, t, None, None]) if no_beta else beta[:, :, t, None, None]
        prev = S
        if plain:
            S = a * S + b * kt @ vt                                         # linear attention: no correction
        elif decay_after:
            S = a * ((eye - b * kt @ kt.transpose(-2, -1)) @ S + b * kt @ vt)
        else:
            S = a * (eye - b * kt @ kt.transpose(-2, -1)) @ S + b * kt @ vt
        outs.append(((prev if read_before else S).transpose(-2, -1) @ q[:, :, t, :, None])[..., 0])
        if t + 1 in ends:
            states.append(S)
    return {"o": torch.stack(outs, 2), "S": torch.stack(states, 2)}


def _delta_expected(case):
    return _delta_formula(case)


def _delta_judge(got, want, case):
    if close(got["o"], want["o"], atol=1e-6) and close(got["S"], want["S"], atol=1e-6):
        return Verdict(True)
    if close(got["o"], want["o"], atol=1e-6):
        return Verdict(False, "the outputs are right but a returned state is not: return S after the chunk's "
                              "LAST token (the next call starts from it).")
    return diagnose(got, [
        ("decay the state FIRST: S ← α_t S_{t−1}, and compute the correction u_t = β_t (v_t − (α_t S_{t−1})ᵀ k_t) "
         "from the decayed state (you decayed after the update).", _delta_formula(case, decay_after=True)),
        ("the correction is scaled by β_t: u_t = β_t (v_t − Sᵀk_t) — β is the write strength.",
         _delta_formula(case, no_beta=True)),
        ("that is plain (decayed) linear attention, S ← α S + β k vᵀ: the delta rule writes only the correction "
         "v_t − Sᵀk_t, so what k_t held is replaced, not added to.", _delta_formula(case, plain=True)),
        ("read the state AFTER this token's update: o_t = S_tᵀ q_t (you used S_{t−1}).",
         _delta_formula(case, read_before=True)),
        ("g is a log-decay: the state is multiplied by α_t = exp(g_t), not by g_t.", _delta_formula(case, raw_decay=True)),
    ], "compare with S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ, o_t = S_tᵀ q_t, α_t = exp(g_t), starting "
       "from the S the grader passes (zeros for the first chunk).")


# ---- 15_sink_attention (build) --------------------------------------------------------------------------------

def _sink_cases(gen):
    out = []
    for B, H, Lq, Lk, E, causal in [(1, 2, 4, 4, 3, True), (2, 3, 5, 7, 4, False), (1, 4, 6, 6, 5, True),
                                    (2, 1, 3, 5, 2, False)]:
        mask = torch.ones(Lq, Lk, dtype=torch.bool).tril() if causal else torch.rand(Lq, Lk, generator=gen) > 0.3
        mask[0] = mask[0] if causal else False                               # a row with no key at all (non-causal)
        out.append(Case(f"B={B}, H={H}, Lq={Lq}, Lk={Lk}, E={E}, {'causal' if causal else 'random mask, row 0 empty'}", {
            "q": torch.randn(B, H, Lq, E, generator=gen, dtype=_F64), "k": torch.randn(B, H, Lk, E, generator=gen, dtype=_F64),
            "v": torch.randn(B, H, Lk, E + 1, generator=gen, dtype=_F64),
            "sinks": torch.randn(H, generator=gen, dtype=_F64) * 1.5, "mask": mask}))
    return out


def _sink_answer(fn, case):
    i = case.inputs
    out, w = fn(i["q"], i["k"], i["v"], i["sinks"], i["mask"])
    if isinstance(w, torch.Tensor) and w.dim() == 4 and w.shape[-1] == i["k"].shape[-2] + 1:
        raise ValueError(f"your weights have Lk + 1 = {w.shape[-1]} columns: drop the sink's column after the "
                         f"softmax — the weights are (B, H, Lq, Lk), the sink's share is attached to no value.")
    return {"out": out, "weights": w}


def _sink_formula(case, *, no_sink=False, shared=False, in_scores=False, no_mask=False):
    """The sink softmax with an explicit extra column (dropped after), or what a named mistake computes."""
    i = case.inputs
    s = i["q"] @ i["k"].transpose(-2, -1) / i["q"].shape[-1] ** 0.5            # (B, H, Lq, Lk)
    b = i["sinks"][:1].expand_as(i["sinks"]) if shared else i["sinks"]
    if in_scores:
        s = s + b[:, None, None]
    if not no_mask:
        s = s.masked_fill(~i["mask"], float("-inf"))
    if no_sink or in_scores:
        w = torch.softmax(s, -1).nan_to_num(0.0)                                 # an empty row: zeros
    else:
        col = b[:, None, None].expand(*s.shape[:-1], 1)
        w = torch.softmax(torch.cat((s, col), -1), -1)[..., :-1]
    return {"out": w @ i["v"], "weights": w}


def _sink_expected(case):
    return _sink_formula(case)


def _sink_judge(got, want, case):
    if close(got["out"], want["out"]) and close(got["weights"], want["weights"]):
        return Verdict(True)
    return diagnose(got, [
        ("the sink is missing: your rows sum to one. Put e^{sinks[h]} in every row's denominator, beside the "
         "scores, then drop it.", _sink_formula(case, no_sink=True)),
        ("each head has its own sink logit: use sinks[h] for head h (sinks has shape (H,)).",
         _sink_formula(case, shared=True)),
        ("the sink is one extra logit in the softmax, not a bias added to every score (adding a constant to a "
         "row's scores changes nothing).", _sink_formula(case, in_scores=True)),
        ("apply the mask (True = may attend) before the softmax; a row whose keys are all masked gives all its "
         "mass to the sink: zero output.", _sink_formula(case, no_mask=True)),
    ], "compare with p_ij = e^{s_ij} / (e^{b_h} + Σ_j' e^{s_ij'}) over the allowed keys, s = q·k/√E.")


# ---- 15_cache_bytes (compute) ---------------------------------------------------------------------------------

def _describe(groups):
    return " + ".join(f"{g['kind']}" + (f"(W={g['window']})" if "window" in g else "") + f" × {g['count']}" for g in groups)


# Every draw follows one plan, so that a mistake passes the same number of cases in check() and in the grader
# (held_out_cases keeps each case's index): a delta group in cases 0 and 1, a window shorter than the sequence
# (it caps the cache) in cases 0 and 2 and one longer than it (it does not) in case 3, an MLA group in cases 1
# and 3, a full GQA layer in case 2; the two groups of a case come in either order.
_CACHE_PLAN = (("gqa_window", "delta"), ("delta", "mla"), ("gqa_window", "gqa"), ("gqa_long_window", "mla"))


def _cache_cases(gen):
    out = []
    for kinds in _CACHE_PLAN:
        seq_len = ([1000, 4096, 32768, 131072][randint(gen, 0, 3)] if "gqa_long_window" not in kinds else 1000) \
            + randint(gen, 0, 999)
        groups = []
        for kind in (kinds if randint(gen, 0, 1) else kinds[::-1]):
            count = randint(gen, 2, 30)                         # > 1: forgetting the count is always seen
            if kind.startswith("gqa"):                          # num_heads > num_kv_heads always
                g = {"kind": "gqa", "count": count, "num_heads": 8 * randint(gen, 2, 8), "num_kv_heads": 2 ** randint(gen, 0, 3),
                     "head_dim": 64 * randint(gen, 1, 4)}
                if kind == "gqa_window":                        # window < seq_len
                    g["window"] = 128 * randint(gen, 1, min(16, (seq_len - 1) // 128))
                elif kind == "gqa_long_window":                 # window > seq_len (< 2,000 here)
                    g["window"] = 128 * randint(gen, seq_len // 128 + 1, 16)
            elif kind == "mla":
                g = {"kind": "mla", "count": count, "kv_lora_rank": 128 * randint(gen, 1, 4), "qk_rope_head_dim": 64}
            else:
                g = {"kind": "delta", "count": count, "num_heads": 8 * randint(gen, 1, 4), "k_head_dim": 128,
                     "head_dim": 128, "conv_channels": 1024 * randint(gen, 2, 12), "conv_kernel": 4}
            groups.append(g)
        out.append(Case(f"{_describe(groups)}, "
                        f"seq_len={seq_len}", params={"layers": groups, "seq_len": seq_len}))
    return out


def _cache_answer(fn, case):
    return {"bytes": torch.tensor(float(fn([dict(g) for g in case.params["layers"]], case.params["seq_len"])), dtype=_F64)}


def _cache_formula(case, *, ignore_window=False, mha=False, delta_grows=False, one_layer=False, fp32=False,
                   state_bf16=False, conv_fp32=False):
    """Bytes: attention caches and a delta layer's convolution inputs in bf16 (2 bytes), its state matrices in
    fp32 (4 bytes) -- as transformers keeps Qwen3-Next's (conv_state in the weights' dtype)."""
    total = 0
    L = case.params["seq_len"]
    for g in case.params["layers"]:
        n = 1 if one_layer else g["count"]
        if g["kind"] == "gqa":
            tokens = L if ignore_window or "window" not in g else min(L, g["window"])
            heads = g["num_heads"] if mha else g["num_kv_heads"]
            total += 2 * heads * g["head_dim"] * tokens * n * (4 if fp32 else 2)
        elif g["kind"] == "mla":
            total += (g["kv_lora_rank"] + g["qk_rope_head_dim"]) * L * n * (4 if fp32 else 2)
        else:
            state = g["num_heads"] * g["k_head_dim"] * g["head_dim"] * (2 if state_bf16 else 4)
            conv = g["conv_channels"] * (g["conv_kernel"] - 1) * (4 if conv_fp32 else 2)
            total += (state + conv) * (L if delta_grows else 1) * n
    return {"bytes": torch.tensor(float(total), dtype=_F64)}


def _cache_expected(case):
    return _cache_formula(case)


def _cache_judge(got, want, case):
    if close(got["bytes"], want["bytes"], atol=0.5, rtol=0):
        return Verdict(True)
    return diagnose(got, [
        ("a windowed layer keeps only the last min(seq_len, window) tokens.", _cache_formula(case, ignore_window=True)),
        ("a GQA layer caches num_kv_heads heads of keys and values, not num_heads.", _cache_formula(case, mha=True)),
        ("a delta layer's state does not grow with the sequence: count it once per layer.",
         _cache_formula(case, delta_grows=True)),
        ("multiply by the number of layers in each group (count).", _cache_formula(case, one_layer=True)),
        ("the attention caches are bf16: 2 bytes per number (only the delta state is fp32).",
         _cache_formula(case, fp32=True)),
        ("a delta layer's state matrices are kept in fp32 (4 bytes per number: a sum over every token needs the "
         "precision), not bf16.", _cache_formula(case, state_bf16=True)),
        ("a delta layer's convolution inputs are bf16 like the attention caches (2 bytes); only its state matrices "
         "are fp32.", _cache_formula(case, conv_fp32=True)),
    ], "per group: gqa 2·H_kv·d_h·tokens, mla (d_c + d_R)·tokens (× 2 bytes), delta 4·H·d_k·d_v + 2·conv·(K−1) "
       "bytes; × count.",
        same=lambda a, b: b is not None and close(a["bytes"], b["bytes"], atol=0.5, rtol=0))


# ---- 15_crossover (compute) ----------------------------------------------------------------------------------

def _cross_group(gen, n):
    attn = ({"kind": "gqa", "count": randint(gen, 1, 16), "num_heads": 16, "num_kv_heads": 2 ** randint(gen, 0, 3),
             "head_dim": 64 * randint(gen, 1, 4)} if n % 2 == 0 else
            {"kind": "mla", "count": randint(gen, 1, 16), "kv_lora_rank": 128 * randint(gen, 1, 4), "qk_rope_head_dim": 64})
    delta = {"kind": "delta", "count": randint(gen, 2, 40), "num_heads": 8 * randint(gen, 1, 4),
             "k_head_dim": 64 * randint(gen, 1, 2), "head_dim": 128, "conv_channels": 1024 * randint(gen, 2, 12),
             "conv_kernel": 4}
    return [attn, delta] if randint(gen, 0, 1) else [delta, attn]


def _cross_sizes(layers, *, no_conv=False, per_layer=False, kv_heads=False, state_bytes=4, conv_bytes=2):
    """(bytes of the delta groups' state (matrices fp32, convolution inputs bf16), bytes per token of the
    attention groups' cache (bf16))."""
    state = per_token = 0
    for g in layers:
        n = 1 if per_layer else g["count"]
        if g["kind"] == "delta":
            state += (state_bytes * g["num_heads"] * g["k_head_dim"] * g["head_dim"]
                      + (0 if no_conv else conv_bytes * g["conv_channels"] * (g["conv_kernel"] - 1))) * n
        elif g["kind"] == "gqa":
            per_token += 2 * 2 * (g["num_heads"] if kv_heads else g["num_kv_heads"]) * g["head_dim"] * n
        else:
            per_token += 2 * (g["kv_lora_rank"] + g["qk_rope_head_dim"]) * n
    return state, per_token


def _cross_cases(gen):
    """Cases 0 and 1 have a state that is an exact multiple of the per-token cache (where ceil and floor + 1
    differ), cases 2 and 3 one that is not (where ceil and floor differ): every draw tells the roundings apart."""
    def exact(layers):
        state, per_token = _cross_sizes(layers)
        return state % per_token == 0
    return [Case(_describe(ls), params={"layers": ls})
            for ls in (draw(gen, lambda g, n=n: _cross_group(g, n), lambda x, n=n: exact(x) == (n < 2))
                       for n in range(4))]


def _cross_answer(fn, case):
    return {"L": torch.tensor(float(fn([dict(g) for g in case.params["layers"]])), dtype=_F64)}


def _cross_formula(case, *, rounding="ceil", same_bytes=False, **kw):
    if same_bytes:
        kw["state_bytes"] = 2                             # the state matrices counted in bf16 like the cache
    state, per_token = _cross_sizes(case.params["layers"], **kw)
    L = {"ceil": -(-state // per_token), "floor": state // per_token, "floor+1": state // per_token + 1}[rounding]
    return {"L": torch.tensor(float(L), dtype=_F64)}


def _cross_judge(got, want, case):
    if close(got["L"], want["L"], atol=0.5, rtol=0):
        return Verdict(True)
    return diagnose(got, [
        ("round UP: the smallest L whose cache is at least the state (ceil, not floor).", _cross_formula(case, rounding="floor")),
        ("when the state is an exact multiple of the cache per token, L = state / per_token already reaches it: "
         "ceil, not floor + 1.", _cross_formula(case, rounding="floor+1")),
        ("the delta state matrices are fp32 (4 bytes per number), the attention cache bf16 (2): compare bytes, "
         "not numbers.", _cross_formula(case, same_bytes=True)),
        ("the delta layers' convolution inputs are bf16 (2 bytes), like the cache; only the state matrices are fp32.",
         _cross_formula(case, conv_bytes=4)),
        ("the delta layers' state includes the convolution's last conv_kernel − 1 inputs.", _cross_formula(case, no_conv=True)),
        ("compare the whole groups: multiply each side by its layer count.", _cross_formula(case, per_layer=True)),
        ("a GQA layer caches num_kv_heads heads, not num_heads.", _cross_formula(case, kv_heads=True)),
    ], "the smallest L with L × (bf16 bytes per token of the attention groups) ≥ (bytes of the delta groups' state: "
       "matrices fp32, convolution inputs bf16).",
        same=lambda a, b: b is not None and close(a["L"], b["L"], atol=0.5, rtol=0))


EXERCISES = [
    Exercise("15_delta_rule", 4, "The gated delta rule: the step the grader loops over",
             "a function delta_step(S, q, k, v, g, beta) -> (S (B, H, d_k, d_v), o (B, H, C, d_v)) for a chunk "
             "of C tokens",
             _delta_cases, _delta_answer, _delta_expected, _delta_judge,
             forbidden=FORBID_COURSE, kind="build"),
    Exercise("15_sink_attention", 3, "Attention with a sink logit per head",
             "a function sink_attn(q, k, v, sinks, mask) -> (out (B, H, Lq, Ev), weights (B, H, Lq, Lk))",
             _sink_cases, _sink_answer, _sink_expected, _sink_judge, forbidden=FORBID_SDPA + FORBID_COURSE, kind="build"),
    Exercise("15_cache_bytes", 2, "What a hybrid model keeps per sequence",
             "a function cache_bytes(layers, seq_len) -> int (bytes: attention caches bf16, delta states fp32, their "
             "convolution inputs bf16)",
             _cache_cases, _cache_answer, _cache_expected, _cache_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("15_crossover", 2, "When does attention's cache outgrow the linear layers' state?",
             "a function crossover(layers) -> int (tokens)",
             _cross_cases, _cross_answer, _cross_formula, _cross_judge, forbidden=FORBID_COURSE,
             kind="compute"),
]
