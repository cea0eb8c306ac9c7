"""Exercise set 15: the reference solutions and another style pass every case for several seeds; each common
mistake fails with the hint that names it; a state kept per position is refused on every case; the judges'
references agree with attn_course (deltanet, sinks, memory) — an independent second implementation."""
import pytest
import torch

from attn_course.deltanet import gated_delta_rule_recurrent
from attn_course.grading.exercises import get
from attn_course.memory import model_cache_bytes, open_models
from attn_course.sinks import sink_attention
from exercise_kit import assert_all_pass, assert_hint, results


def delta_rule(q, k, v, g, beta, *, keep_all=False):
    B, H, L, dk = k.shape
    S = q.new_zeros(B, H, dk, v.shape[-1])
    outs, states = [], []
    for t in range(L):
        S = S * g[:, :, t, None, None].exp()
        u = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, :, t]))
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, :, t], u)
        states.append(S)
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, :, t]))
    if keep_all:
        torch.stack(states, 2)                        # a state per position: what the limit refuses
    return torch.stack(outs, 2), S


def test_delta_rule_reference_and_package_pass():
    assert_all_pass("15_delta_rule", delta_rule)
    assert_all_pass("15_delta_rule", lambda q, k, v, g, b: gated_delta_rule_recurrent(q, k, v, g, b))


def test_delta_rule_state_per_position_is_refused_on_every_case():
    res = results("15_delta_rule", lambda *a: delta_rule(*a, keep_all=True))
    assert res and not any(ok for ok, _ in res)
    assert all("one state per position" in msg for _, msg in res), res


def test_delta_rule_hard_coded_answers_fail_on_held_out_cases():
    ex = get("15_delta_rule")
    shown = {c.name: ex.expected(c) for c in ex.cases(torch.Generator().manual_seed(0))}

    def memorised(q, k, v, g, beta):
        for want in shown.values():
            if want["o"].shape == (*v.shape[:3], v.shape[-1]):
                return want["o"], want["S"]
        return torch.zeros(*v.shape), torch.zeros(*k.shape[:2], k.shape[-1], v.shape[-1])
    assert all(ok for ok, _ in results("15_delta_rule", memorised, seed=0))
    assert not any(ok for ok, _ in results("15_delta_rule", memorised, seed=7))


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
    return model_cache_bytes(layers, seq_len)


def test_cache_reference_is_the_package_and_the_real_models_agree():
    assert_all_pass("15_cache_bytes", cache_bytes)
    ex = get("15_cache_bytes")
    for name, m in open_models().items():                 # the judge's closed form on the published configs
        from attn_course.grading.spec import Case
        groups = [g for g in m["layers"] if g["kind"] != "dsa"]
        case = Case(name, params={"layers": groups, "seq_len": 32768})
        assert ex.expected(case)["bytes"].item() == model_cache_bytes(groups, 32768)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_every_cache_case_set_covers_each_rule(seed):
    """Across the self-check and held-out draws, windows and delta layers appear (the hints need them)."""
    cases = get("15_cache_bytes").cases(torch.Generator().manual_seed(seed))
    kinds = {("window" in g) or g["kind"] for c in cases for g in c.params["layers"]}
    assert True in kinds and "delta" in kinds


def test_crossover_reference_passes_and_matches_the_table():
    from attn_course.grading.spec import Case
    fn = lambda layers: -(-sum(g["count"] * (g["num_heads"] * g["k_head_dim"] * g["head_dim"] + g["conv_channels"] * 3)
                               for g in layers if g["kind"] == "delta")
                          // sum(g["count"] * (2 * g["num_kv_heads"] * g["head_dim"] if g["kind"] == "gqa"
                                               else g["kv_lora_rank"] + g["qk_rope_head_dim"])
                                 for g in layers if g["kind"] != "delta"))
    assert_all_pass("15_crossover", fn)
    layers = open_models()["Qwen3-Next-80B-A3B"]["layers"]        # the crossover by the package's byte counts
    L = get("15_crossover").expected(Case("qwen", params={"layers": layers}))["L"].item()
    attn = [g for g in layers if g["kind"] == "gqa"]
    delta = [g for g in layers if g["kind"] == "delta"]
    assert model_cache_bytes(attn, int(L)) >= model_cache_bytes(delta, 1) > model_cache_bytes(attn, int(L) - 1)
