"""Exercise set 15: the reference solutions and another style pass every case for several seeds; each common
mistake fails with the hint that names it; a state kept per position is refused on every case; the judges'
references agree with attn_course (deltanet, sinks, memory) — an independent second implementation."""
import pytest
import torch

from attn_course.deltanet import gated_delta_rule_recurrent
from attn_course.grading.exercises import get
from attn_course.memory import model_cache_bytes, open_models
from attn_course.sinks import sink_attention
from attn_course.grading.selfcheck import judge_case
from exercise_kit import assert_all_pass, assert_hint, results


def delta_step(S, q, k, v, g, beta):
    outs = []
    for t in range(k.shape[2]):
        S = S * g[:, :, t, None, None].exp()
        u = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, :, t]))
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, :, t], u)
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, :, t]))
    return S, torch.stack(outs, 2)


def test_delta_rule_reference_and_package_pass():
    assert_all_pass("15_delta_rule", delta_step)
    assert_all_pass("15_delta_rule", lambda S, q, k, v, g, b: gated_delta_rule_recurrent(q, k, v, g, b, initial_state=S)[::-1])


def test_delta_rule_grader_drives_chunks_and_checks_every_state():
    """Case 0 steps one token per call, the others chunks of 1-4 tokens; a step that returns the state after the
    chunk's first token (right for one-token chunks only) fails where chunks are longer."""
    ex = get("15_delta_rule")
    for seed in range(4):
        cases = ex.cases(torch.Generator().manual_seed(seed))
        assert set(cases[0].params["chunks"]) == {1} and all(max(c.params["chunks"]) <= 4 for c in cases)
        assert all(sum(c.params["chunks"]) == c.inputs["k"].shape[2] for c in cases)
        assert any(max(c.params["chunks"]) > 1 for c in cases[1:])
    calls = []

    def spy(S, q, k, v, g, beta):
        calls.append(k.shape[2])
        return delta_step(S, q, k, v, g, beta)
    case = ex.cases(torch.Generator().manual_seed(0))[1]
    got = ex.answer(spy, case)
    assert calls == case.params["chunks"] and got["S"].shape[2] == len(calls)

    def first_state(S, q, k, v, g, beta):
        S1, _ = delta_step(S, q[:, :, :1], k[:, :, :1], v[:, :, :1], g[:, :, :1], beta[:, :, :1])
        return S1, delta_step(S, q, k, v, g, beta)[1]
    res = results("15_delta_rule", first_state)
    assert res[0][0] and not all(ok for ok, _ in res), res


def sink_attn(q, k, v, sinks, mask, *, drop=True):
    s = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
    s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(torch.cat([s, sinks[:, None, None].expand(*s.shape[:-1], 1)], -1), -1)
    return (w[..., :-1] @ v, w[..., :-1]) if drop else (w[..., :-1] @ v, w)


def test_sink_reference_and_package_pass():
    assert_all_pass("15_sink_attention", sink_attn)
    assert_all_pass("15_sink_attention", lambda q, k, v, b, m: sink_attention(q, k, v, b, m))


def test_sink_column_kept_is_named():
    assert_hint("15_sink_attention", lambda *a: sink_attn(*a, drop=False), "drop the sink's column")


def cache_bytes(layers, seq_len):
    """The package's counts, as lesson 15's table: attention caches and convolution inputs in bf16, the delta
    layers' state matrices in fp32 (as transformers keeps Qwen3-Next's cache)."""
    return model_cache_bytes(layers, seq_len, dtype=torch.bfloat16, state_dtype=torch.float32)


def test_cache_reference_is_the_package_and_the_real_models_agree():
    assert_all_pass("15_cache_bytes", cache_bytes)
    ex = get("15_cache_bytes")
    for name, m in open_models().items():                 # the judge's closed form on the published configs
        from attn_course.grading.spec import Case
        groups = [g for g in m["layers"] if g["kind"] != "dsa"]
        case = Case(name, params={"layers": groups, "seq_len": 32768})
        assert ex.expected(case)["bytes"].item() == cache_bytes(groups, 32768)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_every_cache_case_set_covers_each_rule(seed):
    """Across the self-check and held-out draws, windows and delta layers appear (the hints need them)."""
    cases = get("15_cache_bytes").cases(torch.Generator().manual_seed(seed))
    kinds = {("window" in g) or g["kind"] for c in cases for g in c.params["layers"]}
    assert True in kinds and "delta" in kinds


def _window_as_is(layers, seq_len):
    """Caches `window` tokens even when the sequence is shorter (min(seq_len, window) forgotten the other way)."""
    return sum(2 * 2 * g["num_kv_heads"] * g["head_dim"] * g.get("window", seq_len) * g["count"] if g["kind"] == "gqa"
               else 2 * (g["kv_lora_rank"] + g["qk_rope_head_dim"]) * seq_len * g["count"] if g["kind"] == "mla"
               else (4 * g["num_heads"] * g["k_head_dim"] * g["head_dim"] + 2 * g["conv_channels"] * 3) * g["count"]
               for g in layers)


def test_every_cache_mistake_passes_the_same_cases_on_every_draw():
    """15.3's cases follow one plan (a delta group in cases 0 and 1, a window that caps the cache in 0 and 2, one
    longer than the sequence in 3), so each mistake -- the learner cells' and a window used without min() -- passes
    the same cases, hence scores the same, in check() and in the grader (held-out draws keep each case's index)."""
    from learner_cells import CELLS
    from attn_course.grading.selfcheck import held_out_cases, self_check_cases
    ex = get("15_cache_bytes")
    mistakes = []
    for source, hint in CELLS["15_cache_bytes"][2]:
        ns = {}
        exec(source, ns)
        mistakes.append((hint, ns["cache_bytes"]))
    mistakes.append(("window used as is", _window_as_is))
    draws = [self_check_cases(ex), held_out_cases(ex, 1), held_out_cases(ex, 2)]
    draws += [ex.cases(torch.Generator().manual_seed(seed)) for seed in range(6)]
    for hint, fn in mistakes:
        passed = {tuple(judge_case(ex, ex.answer(fn, c), ex.expected(c), c).ok for c in cases) for cases in draws}
        assert len(passed) == 1 and not all(next(iter(passed))), (hint, passed)


def test_crossover_reference_passes_and_matches_the_table():
    from attn_course.grading.spec import Case
    assert_all_pass("15_crossover", lambda layers: next(L for L in range(1, 10**7)
                                                        if cache_bytes([g for g in layers if g["kind"] != "delta"], L)
                                                        >= cache_bytes([g for g in layers if g["kind"] == "delta"], 1)))
    layers = open_models()["Qwen3-Next-80B-A3B"]["layers"]        # the crossover by the package's byte counts
    L = int(get("15_crossover").expected(Case("qwen", params={"layers": layers}))["L"].item())
    attn = [g for g in layers if g["kind"] == "gqa"]
    delta = [g for g in layers if g["kind"] == "delta"]
    assert cache_bytes(attn, L) >= cache_bytes(delta, 1) > cache_bytes(attn, L - 1)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_crossover_floor_plus_one_scores_the_same_on_every_draw(seed):
    """Review 14-16 (15.4): floor + 1 differs from ceil only when the state is an exact multiple of the cache per
    token. Every draw has two such cases and two others, so floor + 1 and floor each pass exactly half: the same
    points in check() and in the grader, whatever the seed."""
    def rounding(how):
        def crossover(layers):
            state = sum(d["count"] * (4 * d["num_heads"] * d["k_head_dim"] * d["head_dim"] + 2 * d["conv_channels"] * 3)
                        for d in layers if d["kind"] == "delta")
            grow = sum(2 * d["count"] * (2 * d["num_kv_heads"] * d["head_dim"] if d["kind"] == "gqa"
                                         else d["kv_lora_rank"] + d["qk_rope_head_dim"]) for d in layers if d["kind"] != "delta")
            return state // grow + 1 if how == "floor+1" else state // grow
        return crossover
    for how, hint in (("floor+1", "ceil, not floor + 1"), ("floor", "round UP")):
        res = results("15_crossover", rounding(how), seed)
        assert sum(ok for ok, _ in res) == 2 and all(hint in msg for ok, msg in res if not ok), res
    assert get("15_crossover").score(2, 4) == 1.0
