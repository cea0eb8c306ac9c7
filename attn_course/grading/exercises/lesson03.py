"""Exercise set 03 — grouped-query / multi-query attention and the KV cache
(solutions/03_grouped_and_multi_query_attention.ipynb).

References are computed here in float64 from the equations (Ainslie et al. 2023: query head i reads kv
head i // G), independently of the learner and of the package. Hints are detected by computing what the
common mistakes produce on the same inputs.
"""
from __future__ import annotations

import math

import torch
from einops import rearrange

from ..spec import Case, Exercise, FORBID_COURSE, FORBID_SDPA, Verdict, close, diagnose, randint, choice, draw, distinct

__all__ = ["EXERCISES"]

_F64 = torch.float64


_REPEAT_HINT = ("your query heads read the wrong kv heads: .repeat tiles the stack (0,1,0,1,…); query head i "
                "must read kv head i // G, which is repeat_interleave(G, dim=1) (0,0,…,1,1,…).")


def _expand(k: torch.Tensor, H: int, how: str = "interleave") -> torch.Tensor:
    G = H // k.shape[1]
    return k.repeat_interleave(G, dim=1) if how == "interleave" else k.repeat(1, G, 1, 1)


def _gqa(q, k, v, causal, *, how="interleave", scale=True):
    """(B, H, Lq, d) queries over (B, H_kv, Lk, d) keys/values, causal aligned bottom-right, in float64."""
    q, k, v = q.to(_F64), _expand(k.to(_F64), q.shape[1], how), _expand(v.to(_F64), q.shape[1], how)
    s = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
    if causal:
        Lq, Lk = s.shape[-2:]
        i = torch.arange(Lq)[:, None] + (Lk - Lq)
        s = s.masked_fill(torch.arange(Lk)[None, :] > i, float("-inf"))
    return torch.softmax(s, -1) @ v


# ---- 03_expand_kv -------------------------------------------------------------------------------------

def _expand_cases(gen):
    return [Case(f"k (B={B}, H_kv={Hkv}, L={L}, d={d}), num_heads={H}", {"k": torch.randn(B, Hkv, L, d, generator=gen)},
                 {"num_heads": H}) for B, Hkv, H, L, d in [(3, 2, 8, 4, 4), (1, 4, 8, 3, 2), (2, 3, 6, 5, 3), (2, 2, 6, 2, 2)]]
    # every case has H_kv >= 2 and G >= 2: there .repeat and .repeat_interleave always differ


def _expand_answer(fn, case):
    return {"k": fn(case.inputs["k"], case.params["num_heads"])}


def _expand_expected(case):
    return {"k": _expand(case.inputs["k"], case.params["num_heads"])}


def _expand_judge(got, want, case):
    if close(got["k"], want["k"]):
        return Verdict(True)
    return diagnose(got["k"], [(_REPEAT_HINT, _expand(case.inputs["k"], case.params["num_heads"], "repeat"))],
                  "expected (B, num_heads, L, d) where head i is kv head i // (num_heads // H_kv).")


# ---- 03_gqa_attention ---------------------------------------------------------------------------------

def _gqa_cases(gen):
    out = []
    # H_kv >= 2 and G >= 2 everywhere (repeat != repeat_interleave); a widely shared Chinese attention blog post's grouping raises for B=3, G=4
    # and B=3, G=2, mixes samples for B = G = 2, and equals .repeat for B = 1
    for B, H, Hkv, L, d, causal in [(3, 8, 2, 5, 4, False), (3, 4, 2, 6, 8, True), (1, 6, 3, 4, 4, True), (2, 4, 2, 5, 4, False)]:
        out.append(Case(f"B={B}, H={H}, H_kv={Hkv}, L={L}, d_h={d}, causal={causal}",
                        {"q": torch.randn(B, H, L, d, generator=gen), "k": torch.randn(B, Hkv, L, d, generator=gen),
                         "v": torch.randn(B, Hkv, L, d, generator=gen)}, {"causal": causal}))
    return out


def _gqa_answer(fn, case):
    i = case.inputs
    return {"out": fn(i["q"], i["k"], i["v"], case.params["causal"])}


def _gqa_expected(case):
    i = case.inputs
    return {"out": _gqa(i["q"], i["k"], i["v"], case.params["causal"]).to(i["q"].dtype)}


_BLOG_GROUPING = ("a widely shared Chinese attention blog post's grouping: q viewed as (B, G, H_kv, L, d) and multiplied with k (B, H_kv, L, d) — "
                  "matmul "
                  "broadcasts the leading axes from the right, so k's BATCH axis lines up with q's group axis "
                  "(it only runs when B is 1 or G, and then samples read each other's keys). Keep the batch "
                  "axis: expand k and v with repeat_interleave(G, dim=1), then attend per head.")


def _blog_grouping(q, k, v, causal):
    """The blog post's GroupedAttention applied to (q, k, v); None where its shapes do not broadcast."""
    B, H, L, d = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    q, k, v = q.to(_F64), k.to(_F64), v.to(_F64)
    try:
        s = q.reshape(B, G, Hkv, L, d) @ k.transpose(-2, -1) / math.sqrt(d)
        if causal:
            s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        return (torch.softmax(s, -1) @ v).reshape(B, H, L, d)
    except RuntimeError:
        return None


def _gqa_error_hint(case, error):
    B, H = case.inputs["q"].shape[:2]
    G = H // case.inputs["k"].shape[1]
    if "must match the size of tensor" in error and B not in (1, G):
        return _BLOG_GROUPING
    return None


def _gqa_judge(got, want, case):
    if close(got["out"], want["out"]):
        return Verdict(True)
    i, c = case.inputs, case.params["causal"]
    cands = [(_REPEAT_HINT + " (the blog post's grouping does the same when B = 1.)" if i["q"].shape[0] == 1
              else _REPEAT_HINT, _gqa(i["q"], i["k"], i["v"], c, how="repeat")),
             (_BLOG_GROUPING, _blog_grouping(i["q"], i["k"], i["v"], c)),
             ("the scores are not scaled: divide by √d_h.", _gqa(i["q"], i["k"], i["v"], c, scale=False))]
    if c:
        cands.append(("the causal mask is missing: query i may only attend keys j <= i.", _gqa(i["q"], i["k"], i["v"], False)))
    return diagnose(got["out"], cands, "wrong values: expand K and V to the query heads, then attend per head.")


# ---- 03_kv_cache_bytes --------------------------------------------------------------------------------

_MODELS = [  # (name, layers, H, H_kv, d_h): real configurations; the grader draws lengths, batch and dtype
    ("LLaMA-2-70B", 80, 64, 8, 128),
    ("Mistral-7B", 32, 32, 8, 128),
    ("LLaMA-3-8B", 32, 32, 8, 128),
    ("Qwen2-7B", 28, 28, 4, 128),
]


def _bytes_cases(gen):
    keys = ("num_layers", "num_heads", "num_kv_heads", "head_dim", "seq_len", "batch_size", "bytes_per_element")
    name, layers, H, H_kv, d_h = choice(gen, _MODELS)

    def toy(H_kv_of, bpe):
        def make(g):
            H = 2 * randint(g, 2, 8)
            return (randint(g, 3, 9), H, H_kv_of(H), 8 * randint(g, 1, 4), randint(g, 10, 500), randint(g, 3, 7), bpe)
        return make
    makers = [("", lambda g: (layers, H, H_kv, d_h, 1024 * randint(g, 1, 32), randint(g, 3, 8), choice(g, (2, 4)))),
              ("toy MQA: ", toy(lambda H: 1, 4)), ("toy GQA: ", toy(lambda H: H // 2, 2))]
    def ok(c, strict):          # no mistake gives the answer; on the MQA case each forgotten factor
        answer, wrong = _bytes_formula(dict(zip(keys, c))), [v for _, v in _bytes_mistakes(dict(zip(keys, c)))]
        return answer not in wrong and (not strict or distinct(answer, *wrong[1:3], *wrong[4:]))   # (×2, layers,
        # bytes, batch) gives its own number (with one kv head, "num_heads kv heads" = "width d_model")
    cases = []
    for prefix, make in makers:
        c = draw(gen, make, lambda c: ok(c, strict=prefix == "toy MQA: "))
        title = prefix or f"{name}: "
        cases.append(Case(f"{title}{c[0]} layers, H={c[1]}, H_kv={c[2]}, d_h={c[3]}, {c[5]} sequences of {c[4]}, "
                          f"{c[6]} bytes per element", params=dict(zip(keys, c))))
    return cases


def _bytes_answer(fn, case):
    return {"bytes": torch.tensor(int(fn(*case.params.values())), dtype=torch.int64)}


def _bytes_formula(p, *, kv=None, factor=2, layers=True, width=None):
    kv = p["num_kv_heads"] if kv is None else kv
    width = p["head_dim"] if width is None else width
    return (factor * kv * width * p["seq_len"] * p["batch_size"] * p["bytes_per_element"]
            * (p["num_layers"] if layers else 1))


def _bytes_expected(case):
    return {"bytes": torch.tensor(_bytes_formula(case.params), dtype=torch.int64)}


def _bytes_mistakes(p) -> list[tuple[str, int]]:
    return [
        ("you sized the cache with num_heads; only the num_kv_heads key/value heads are cached.", _bytes_formula(p, kv=p["num_heads"])),
        ("K and V are both cached: multiply by 2.", _bytes_formula(p, factor=1)),
        ("every layer has its own cache: multiply by num_layers.", _bytes_formula(p, layers=False)),
        ("each kv head has width head_dim, not d_model = num_heads·head_dim (a Chinese attention survey's mistake).",
         _bytes_formula(p, width=p["num_heads"] * p["head_dim"])),
        ("that is the number of elements; multiply by bytes_per_element.", _bytes_formula(p) // p["bytes_per_element"]),
        ("every sequence of the batch has its own cache: multiply by batch_size.",
         _bytes_formula(p) // p["batch_size"]),
    ]


def _bytes_judge(got, want, case):
    g, p = int(got["bytes"]), case.params
    if g == int(want["bytes"]):
        return Verdict(True)
    for hint, value in _bytes_mistakes(p):
        if g == value:
            return Verdict(False, hint)
    return Verdict(False, f"expected 2 · layers · H_kv · d_h · seq_len · batch · bytes, got {g:,}.")


# ---- 03_decode_step -----------------------------------------------------------------------------------

def _decode_cases(gen):
    out = []
    for B, D, H, Hkv, past in [(3, 16, 4, 2, 4), (2, 12, 6, 3, 1), (1, 8, 4, 2, 6)]:      # H_kv >= 2, G >= 2
        d = D // H
        W = {"W_q": torch.randn(D, D, generator=gen) / math.sqrt(D),
             "W_k": torch.randn(Hkv * d, D, generator=gen) / math.sqrt(D),
             "W_v": torch.randn(Hkv * d, D, generator=gen) / math.sqrt(D),
             "W_o": torch.randn(D, D, generator=gen) / math.sqrt(D)}
        out.append(Case(f"B={B}, d_model={D}, H={H}, H_kv={Hkv}, {past} cached token{'s' if past > 1 else ''}",
                        {"x_t": torch.randn(B, 1, D, generator=gen), **W,
                         "k_cache": torch.randn(B, Hkv, past, d, generator=gen),
                         "v_cache": torch.randn(B, Hkv, past, d, generator=gen)},
                        {"num_heads": H, "num_kv_heads": Hkv}))
    return out


def _decode_answer(fn, case):
    i, p = case.inputs, case.params
    y, k, v = fn(i["x_t"], i["W_q"], i["W_k"], i["W_v"], i["W_o"], p["num_heads"], p["num_kv_heads"],
                 i["k_cache"], i["v_cache"])
    return {"y": y, "k_cache": k, "v_cache": v}


def _decode_ref(case, *, append=True, how="interleave", scale=True):
    i, p = case.inputs, case.params
    x = i["x_t"].to(_F64)
    q = rearrange(x @ i["W_q"].to(_F64).T, "b l (h d) -> b h l d", h=p["num_heads"])
    k_new = rearrange(x @ i["W_k"].to(_F64).T, "b l (h d) -> b h l d", h=p["num_kv_heads"])
    v_new = rearrange(x @ i["W_v"].to(_F64).T, "b l (h d) -> b h l d", h=p["num_kv_heads"])
    k = torch.cat([i["k_cache"].to(_F64), k_new], dim=2)
    v = torch.cat([i["v_cache"].to(_F64), v_new], dim=2)
    k_att, v_att = (k, v) if append else (i["k_cache"].to(_F64), i["v_cache"].to(_F64))
    y = rearrange(_gqa(q, k_att, v_att, False, how=how, scale=scale), "b h l d -> b l (h d)") @ i["W_o"].to(_F64).T
    dt = i["x_t"].dtype
    return {"y": y.to(dt), "k_cache": k.to(dt), "v_cache": v.to(dt)}


def _decode_expected(case):
    return _decode_ref(case)


def _decode_judge(got, want, case):
    ok = {key: close(got[key], want[key]) for key in want}
    if all(ok.values()):
        return Verdict(True)
    if not (ok["k_cache"] and ok["v_cache"]):
        return Verdict(False, "the returned caches must be the old ones with the new token's k and v appended "
                              "along the length axis: torch.cat([k_cache, k_new], dim=2), shape (B, H_kv, L+1, d_h).")
    return diagnose(got["y"], [
        ("the new token must attend to itself too: append its k, v to the cache BEFORE attending.",
         _decode_ref(case, append=False)["y"]),
        (_REPEAT_HINT, _decode_ref(case, how="repeat")["y"]),
        ("the scores are not scaled: divide by √d_h.", _decode_ref(case, scale=False)["y"]),
    ], "the caches are right but y is not: q from x_t, attend over all cached + new keys, merge heads, W_o.")


EXERCISES = [
    Exercise("03_expand_kv", 2, "Expand kv heads to query heads", "a function expand_kv(k, num_heads) -> (B, H, L, d)",
             _expand_cases, _expand_answer, _expand_expected, _expand_judge, forbidden=FORBID_COURSE, kind="predict"),
    # one repeat_interleave (which kv head each query head reads), not a build; 03_gqa_attention and
    # 03_decode_step are the lesson's builds
    Exercise("03_gqa_attention", 3, "Grouped-query attention by hand",
             "a function gqa_attention(q, k, v, causal) -> (B, H, L, d)",
             _gqa_cases, _gqa_answer, _gqa_expected, _gqa_judge, forbidden=FORBID_SDPA + FORBID_COURSE,
             error_hint_fn=_gqa_error_hint, kind="build"),
    Exercise("03_kv_cache_bytes", 2, "KV-cache size arithmetic",
             "a function cache_bytes(num_layers, num_heads, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element) -> int",
             _bytes_cases, _bytes_answer, _bytes_expected, _bytes_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("03_decode_step", 3, "One decoding step with a KV cache",
             "a function decode_step(x_t, W_q, W_k, W_v, W_o, num_heads, num_kv_heads, k_cache, v_cache) -> (y_t, k_cache, v_cache)",
             _decode_cases, _decode_answer, _decode_expected, _decode_judge, forbidden=FORBID_SDPA + FORBID_COURSE, kind="build"),
]
