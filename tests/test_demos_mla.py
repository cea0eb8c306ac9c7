"""Lesson 12's demos: the trained comparison the lesson asserts (two seeds), the decode-step FLOP formulas
against FlopCounterMode, and the latent explorer's logic."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attn_course import MultiHeadLatentAttention
from attn_course.demos.mla import COMPARE, DECODE_SCHEMES, decode_step_flops, per_head_kv_decode, train_and_measure
from attn_course.gqa import KVCache
from attn_course.mla import MLACache


@pytest.mark.parametrize("seed", [0, 1])
def test_mla_beats_gqa_mqa_tpa_on_the_hard_task_at_a_gqa_sized_cache(seed):
    res = {k: train_and_measure(k, seed=seed, progress=False, **COMPARE)[1:]
           for k in ("MLA (d_c=16, d_R=2)", "GQA (H_kv=2)", "MQA (H_kv=1)", "TPA (R=6,2,2)")}
    acc = {k: a for k, (a, _) in res.items()}
    assert res["MLA (d_c=16, d_R=2)"][1] == 18 and res["GQA (H_kv=2)"][1] == 16
    assert acc["MLA (d_c=16, d_R=2)"] > 0.85
    assert all(acc["MLA (d_c=16, d_R=2)"] > acc[k] + 0.15 for k in ("GQA (H_kv=2)", "MQA (H_kv=1)", "TPA (R=6,2,2)"))


def test_train_and_measure_returns_the_training_losses_on_request():
    kw = dict(steps=5, n=4, d_model=16, num_heads=2, progress=False, seed=3)
    model, acc, per_token, losses = train_and_measure("MQA (H_kv=1)", return_losses=True, **kw)
    again = train_and_measure("MQA (H_kv=1)", **kw)
    assert len(losses) == 5 and all(l > 0 for l in losses) and (acc, per_token) == again[1:]


@pytest.mark.parametrize("scheme", DECODE_SCHEMES)
@pytest.mark.parametrize("new_tokens", [1, 3])
def test_decode_step_flops_match_flop_counter(scheme, new_tokens):
    torch.manual_seed(0)
    dims = dict(kv_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)
    m = MultiHeadLatentAttention(32, 4, q_lora_rank=10, **dims)
    cache, kv = MLACache(), KVCache()
    with torch.no_grad():
        x0, x1 = torch.randn(1, 20, 32), torch.randn(1, new_tokens, 32)
        m(x0, cache=cache)
        per_head_kv_decode(m, x0, kv)
        with FlopCounterMode(display=False) as fc:
            if scheme == "per_head_kv":
                per_head_kv_decode(m, x1, kv)
            else:
                m(x1, is_causal=True, cache=cache, need_weights=True, absorb=scheme == "absorbed")
    L = new_tokens
    own = 2 * L * (32 * 10 + 10 * 4 * 12 + 32 * (24 + 4) + 4 * 6 * 32)    # q_a, q_b, kv_a, o projections
    assert fc.get_total_flops() - own == decode_step_flops(context=20 + L, num_heads=4, scheme=scheme,
                                                           new_tokens=L, **dims)
    if scheme != "per_head_kv":                                          # the absorb= spelling agrees
        assert decode_step_flops(context=20 + L, num_heads=4, absorb=scheme == "absorbed", new_tokens=L,
                                 **dims) == decode_step_flops(context=20 + L, num_heads=4, scheme=scheme,
                                                              new_tokens=L, **dims)


def test_decode_step_flops_rejects_ambiguous_or_unknown_scheme():
    dims = dict(context=8, num_heads=2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2)
    for bad in (dict(), dict(absorb=True, scheme="absorbed"), dict(scheme="paged")):
        with pytest.raises(ValueError):
            decode_step_flops(**dims, **bad)


@pytest.mark.parametrize("rope", [dict(), dict(rope_interleaved=True, q_lora_rank=6),
                                  dict(rope_scaling={"type": "yarn", "factor": 4, "original_max_position_embeddings": 4,
                                                     "mscale": 0.707, "mscale_all_dim": 0.707})])
def test_per_head_kv_decode_equals_the_full_causal_forward(rope):
    # DeepSeek's attn_impl="naive" caches per-head K/V; decoding in uneven chunks must equal the full causal
    # forward (fp64), and the cache must hold H·(d_nope + d_R + d_v) numbers per token
    torch.manual_seed(0)
    m = MultiHeadLatentAttention(24, 3, kv_lora_rank=10, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=5,
                                 **rope).double()
    x = torch.randn(2, 9, 24, dtype=torch.float64)
    cache = KVCache()
    with torch.no_grad():
        full, _ = m(x, is_causal=True)
        steps = torch.cat([per_head_kv_decode(m, x[:, lo:hi], cache) for lo, hi in ((0, 4), (4, 5), (5, 9))], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-12, rtol=0)
    assert cache.nbytes() == 2 * 9 * 3 * (4 + 4 + 5) * 8


def test_latent_explorer_compute_and_figure():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from attn_course.widgets.mla import LatentExplorer

    known = {"MHA": (0.9, 64.0), "GQA (H_kv=2)": (0.6, 16.0), "MQA (H_kv=1)": (0.5, 8.0)}
    ex = LatentExplorer(steps=5, known=known)
    view = ex.update(kv_lora_rank=4, qk_rope_head_dim=8)           # trains only the MLA (5 steps)
    assert view.per_token == {"MLA (d_c=4, d_R=8)": 12.0, "MHA": 64.0, "GQA (H_kv=2)": 16.0, "MQA (H_kv=1)": 8.0}
    assert 0.0 <= view.accuracy["MLA (d_c=4, d_R=8)"] <= 1.0 and view.accuracy["MHA"] == 0.9
    assert view.deepseek_groups == (4 + 8) / 256
    plt.close(view.figure)
    box = ex.widget()
    assert set(box.controls) == {"kv_lora_rank", "qk_rope_head_dim"}
