"""kv_cache_bytes: the per-token formulas of DESIGN §3 and published model sizes."""
import pytest
import torch

from attn_course import kv_cache_bytes

GiB = 2 ** 30


def test_llama2_7b_is_half_a_mebibyte_per_token():
    # 32 layers x 2 (K, V) x 32 heads x 128 dims x 2 bytes = 524288 B = 0.5 MiB per token
    per_token = kv_cache_bytes("mha", seq_len=1, num_heads=32, head_dim=128, num_layers=32)
    assert per_token == 512 * 1024
    assert kv_cache_bytes("mha", seq_len=4096, num_heads=32, head_dim=128, num_layers=32) == 2 * GiB


def test_llama2_70b_and_mistral_gqa():
    llama70 = kv_cache_bytes("gqa", seq_len=1, num_heads=64, head_dim=128, num_kv_heads=8, num_layers=80)
    assert llama70 == 80 * 2 * 8 * 128 * 2 == 327_680
    mha70 = kv_cache_bytes("mha", seq_len=1, num_heads=64, head_dim=128, num_layers=80)
    assert mha70 // llama70 == 8
    mistral = kv_cache_bytes("gqa", seq_len=32768, num_heads=32, head_dim=128, num_kv_heads=8, num_layers=32)
    assert mistral == 4 * GiB


@pytest.mark.parametrize("H", [1, 4, 32])
def test_gqa_extremes_are_mha_and_mqa(H):
    kw = dict(seq_len=7, num_heads=H, head_dim=16, batch_size=3, num_layers=2)
    assert kv_cache_bytes("gqa", num_kv_heads=H, **kw) == kv_cache_bytes("mha", **kw)
    assert kv_cache_bytes("gqa", num_kv_heads=1, **kw) == kv_cache_bytes("mqa", **kw)
    assert kv_cache_bytes("mha", num_kv_heads=H, **kw) == kv_cache_bytes("mha", **kw)
    assert kv_cache_bytes("mqa", num_kv_heads=1, **kw) == 2 * 16 * 7 * 3 * 2 * 2


def test_tpa_formula():
    # (R_k + R_v)(H + d) elements per token per layer: (2 + 2)(32 + 128) = 640 vs MHA's 8192
    tpa = kv_cache_bytes("tpa", seq_len=10, num_heads=32, head_dim=128, k_rank=2, v_rank=2, dtype=torch.float32)
    assert tpa == 640 * 10 * 4
    assert kv_cache_bytes("tpa", seq_len=1, num_heads=4, head_dim=8, k_rank=1, v_rank=3) == 4 * 12 * 2


@pytest.mark.parametrize("dtype,size", [(torch.float16, 2), (torch.bfloat16, 2), (torch.float32, 4),
                                        (torch.float64, 8), (torch.int8, 1)])
def test_dtype_scales_bytes(dtype, size):
    assert kv_cache_bytes("mha", seq_len=5, num_heads=2, head_dim=3, batch_size=2, num_layers=3,
                          dtype=dtype) == 2 * 2 * 3 * 5 * 2 * 3 * size


def test_errors():
    kw = dict(seq_len=4, num_heads=8, head_dim=16)
    with pytest.raises(ValueError, match="unknown mechanism 'latent'; expected one of mha, mqa, gqa, tpa, mla"):
        kv_cache_bytes("latent", **kw)
    with pytest.raises(ValueError, match="'gqa' needs num_kv_heads"):
        kv_cache_bytes("gqa", **kw)
    with pytest.raises(ValueError, match="num_heads=8 is not divisible by num_kv_heads=3"):
        kv_cache_bytes("gqa", num_kv_heads=3, **kw)
    with pytest.raises(ValueError, match="'tpa' needs k_rank and v_rank, got k_rank=2, v_rank=None"):
        kv_cache_bytes("tpa", k_rank=2, **kw)
    with pytest.raises(ValueError, match="v_rank must be a positive integer, got 0"):
        kv_cache_bytes("tpa", k_rank=2, v_rank=0, **kw)
    with pytest.raises(ValueError, match="mha has num_kv_heads == num_heads=8, got num_kv_heads=2"):
        kv_cache_bytes("mha", num_kv_heads=2, **kw)
    with pytest.raises(ValueError, match="mqa has a single kv head, got num_kv_heads=4"):
        kv_cache_bytes("mqa", num_kv_heads=4, **kw)
    with pytest.raises(ValueError, match="seq_len must be a positive integer, got 0"):
        kv_cache_bytes("mha", seq_len=0, num_heads=8, head_dim=16)
    with pytest.raises(ValueError, match="num_kv_heads must be a positive integer, got 0"):
        kv_cache_bytes("gqa", num_kv_heads=0, **kw)


# ---- lesson 15: windows, DeepSeek's indexer key, linear-attention states, the open-model table ----------------

def test_window_caps_the_cached_tokens():
    full = kv_cache_bytes("gqa", seq_len=100, num_heads=8, head_dim=16, num_kv_heads=2)
    assert kv_cache_bytes("gqa", seq_len=100, num_heads=8, head_dim=16, num_kv_heads=2, window=30) == full * 30 // 100
    assert kv_cache_bytes("gqa", seq_len=20, num_heads=8, head_dim=16, num_kv_heads=2, window=30) == full * 20 // 100
    with pytest.raises(ValueError, match="window must be a positive integer"):
        kv_cache_bytes("mha", seq_len=4, num_heads=2, head_dim=4, window=0)


def test_dsa_adds_the_indexer_key_to_mla():
    mla = kv_cache_bytes("mla", seq_len=10, num_heads=1, head_dim=1, kv_lora_rank=512, qk_rope_head_dim=64)
    dsa = kv_cache_bytes("dsa", seq_len=10, num_heads=1, head_dim=1, kv_lora_rank=512, qk_rope_head_dim=64,
                         index_head_dim=128)
    assert (mla, dsa) == (10 * 576 * 2, 10 * 704 * 2)
    with pytest.raises(ValueError, match="index_head_dim"):
        kv_cache_bytes("dsa", seq_len=10, num_heads=1, head_dim=1, kv_lora_rank=512, qk_rope_head_dim=64)


def test_delta_state_does_not_grow_with_length():
    a = kv_cache_bytes("delta", seq_len=10, num_heads=4, head_dim=6, k_head_dim=8, conv_channels=56, conv_kernel=4,
                       dtype=torch.float32)
    b = kv_cache_bytes("delta", seq_len=10_000, num_heads=4, head_dim=6, k_head_dim=8, conv_channels=56, conv_kernel=4,
                       dtype=torch.float32)
    from attn_course.deltanet import GatedDeltaNet
    assert a == b == GatedDeltaNet(32, 2, 4, 8, 6).state_bytes()       # the module's own count agrees
    mixed = kv_cache_bytes("delta", seq_len=10, num_heads=4, head_dim=6, k_head_dim=8, conv_channels=56, conv_kernel=4,
                           dtype=torch.bfloat16, state_dtype=torch.float32)
    assert mixed == 4 * 8 * 6 * 4 + 56 * 3 * 2                          # the state in fp32, the conv inputs in bf16
    assert mixed == GatedDeltaNet(32, 2, 4, 8, 6).to(torch.bfloat16).state_bytes()     # a bf16 module: the same
    assert mixed == GatedDeltaNet(32, 2, 4, 8, 6).state_bytes(conv_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="k_head_dim"):
        kv_cache_bytes("delta", seq_len=10, num_heads=4, head_dim=6)


def test_open_model_table_by_hand():
    from attn_course.memory import model_cache_bytes, open_models
    m = open_models()
    assert {"Llama 3 8B", "gpt-oss-20b", "gpt-oss-120b", "Qwen3-Next-80B-A3B", "Kimi Linear 48B-A3B",
            "DeepSeek-V3.2", "Gemma 3 27B"} <= set(m)
    L = 32768
    assert model_cache_bytes(m["Llama 3 8B"]["layers"], L) == 2 * 8 * 128 * 32 * L * 2        # bf16
    assert model_cache_bytes(m["gpt-oss-20b"]["layers"], L) == 2 * 8 * 64 * 12 * (128 + L) * 2
    qwen = 2 * 2 * 256 * 12 * L * 2 + 36 * (32 * 128 * 128 * 4 + 8192 * 3 * 2)       # fp32 state, bf16 conv inputs
    assert model_cache_bytes(m["Qwen3-Next-80B-A3B"]["layers"], L) == qwen
    assert all(g["state_dtype"] == "float32" for g in m["Qwen3-Next-80B-A3B"]["layers"] if g["kind"] == "delta")
    assert model_cache_bytes(m["Qwen3-Next-80B-A3B"]["layers"], L, state_dtype=torch.bfloat16) == \
        2 * 2 * 256 * 12 * L * 2 + 36 * (32 * 128 * 128 + 8192 * 3) * 2
    # the module's own count at Qwen3-Next's shapes (16 key heads, 32 value heads of 128 × 128; meta: no memory)
    from attn_course.deltanet import GatedDeltaNet
    with torch.device("meta"):
        layer = GatedDeltaNet(2048, 16, 32, 128, 128).to(torch.bfloat16)
    delta = next(g for g in m["Qwen3-Next-80B-A3B"]["layers"] if g["kind"] == "delta")
    assert layer.conv_dim == delta["conv_channels"]
    assert layer.state_bytes() == 32 * 128 * 128 * 4 + 8192 * 3 * 2 == 2_146_304 == \
        model_cache_bytes([dict(delta, count=1)], L)                          # one layer, the table's count
    assert layer.state_bytes(conv_dtype=torch.float32) == 2_195_456          # conv inputs in fp32: not the table
    assert model_cache_bytes(m["DeepSeek-V3.2"]["layers"], L) == 61 * (512 + 64 + 128) * L * 2
    assert sum(g["count"] for g in m["Gemma 3 27B"]["layers"]) == 62
