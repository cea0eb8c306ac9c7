"""MultiHeadLatentAttention against an independent fp64 reference written from DeepSeek-V2 Eqs. (9)-(19),
the absorbed path against the naive one, the latent cache, both RoPE conventions, and (when the
``transformers`` package is importable) Hugging Face's DeepseekV3Attention with the same weights."""
import math

import pytest
import torch
from torch.testing import assert_close

from attn_course import MultiHeadLatentAttention, kv_cache_bytes
from attn_course.bench import largest_tensor_created
from attn_course.mla import MLACache
from attn_course.rope import yarn_inv_freq

F64 = torch.float64
SHAPE = dict(kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5)


def make(d_model=16, H=3, q_lora_rank=None, interleaved=False, dtype=F64, seed=0, **kw):
    torch.manual_seed(seed)
    shape = {**SHAPE, **kw}
    m = MultiHeadLatentAttention(d_model, H, q_lora_rank=q_lora_rank, rope_interleaved=interleaved, **shape)
    with torch.no_grad():                       # non-trivial norm gains, so a skipped norm is caught
        for p in m.parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.5 * torch.randn_like(p))
    return m.to(dtype)


# ---- an independent reference: per token, per head, straight from the equations ---------------------

def rotate(x, pos, base, interleaved):
    """RoPE of one vector x (d,) at integer position pos, pair by pair with explicit 2x2 rotations."""
    d = x.shape[-1]
    out = x.clone()
    for i in range(d // 2):
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + d // 2)
        ang = pos * base ** (-2 * i / d)
        c, s = math.cos(ang), math.sin(ang)
        out[a], out[b] = c * x[a] - s * x[b], s * x[a] + c * x[b]
    return out


def rms(x, w, eps):
    return x / torch.sqrt((x * x).mean() + eps) * w


def reference(m, x, attn_mask=None, is_causal=False, start=0):
    """(out, weights) for x (B, L, d_model) at positions start.. from the paper's equations, in loops."""
    B, L, _ = x.shape
    H, dn, dr, dv, dc = m.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank
    base, il = m.rope_base, m.rope_interleaved
    W_kva = m.kv_a_proj_with_mqa.weight
    W_DKV, W_KR = W_kva[:dc], W_kva[dc:]                                  # rows: [latent | k_rope]
    W_b = m.kv_b_proj.weight.view(H, dn + dv, dc)
    W_UK, W_UV = W_b[:, :dn], W_b[:, dn:]
    out = torch.zeros(B, L, H * dv, dtype=x.dtype)
    weights = torch.zeros(B, H, L, L, dtype=x.dtype)
    for b in range(B):
        c = [rms(W_DKV @ x[b, j], m.kv_a_layernorm.weight, m.kv_a_layernorm.eps) for j in range(L)]   # Eq. (9)
        kR = [rotate(W_KR @ x[b, j], start + j, base, il) for j in range(L)]                           # Eq. (15)
        for t in range(L):
            if m.q_lora_rank is None:
                q = m.q_proj.weight @ x[b, t]
            else:
                cq = rms(m.q_a_proj.weight @ x[b, t], m.q_a_layernorm.weight, m.q_a_layernorm.eps)      # Eq. (12)
                q = m.q_b_proj.weight @ cq                                                                # Eqs. (13, 14)
            q = q.view(H, dn + dr)
            for i in range(H):
                q_ti = torch.cat((q[i, :dn], rotate(q[i, dn:], start + t, base, il)))                     # Eq. (16)
                s = torch.stack([q_ti @ torch.cat((W_UK[i] @ c[j], kR[j])) for j in range(L)])           # Eq. (17)
                s = s / math.sqrt(dn + dr)
                if is_causal:
                    s = s.masked_fill(torch.arange(L) > t, float("-inf"))
                if attn_mask is not None:
                    mk = attn_mask.expand(B, H, L, L)[b, i, t]
                    s = s.masked_fill(~mk, float("-inf")) if mk.dtype == torch.bool else s + mk
                p = s.softmax(-1)                                                                        # Eq. (18)
                weights[b, i, t] = p
                out[b, t, i * dv:(i + 1) * dv] = sum(p[j] * (W_UV[i] @ c[j]) for j in range(L))
    return m.o_proj(out), weights                                                                        # Eq. (19)


@pytest.mark.parametrize("q_lora_rank", [None, 7])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool", "float"])
def test_forward_matches_the_equations(q_lora_rank, interleaved, mask_kind):
    m = make(q_lora_rank=q_lora_rank, interleaved=interleaved)
    x = torch.randn(2, 5, 16, dtype=F64)
    mask = {"none": None, "causal": None, "bool": torch.rand(2, 1, 5, 5) > 0.4,
            "float": torch.randn(1, 3, 5, 5, dtype=F64)}[mask_kind]
    if mask_kind == "bool":
        mask[..., 0] = True                                              # every row keeps a key
    causal = mask_kind == "causal"
    with torch.no_grad():
        y_ref, w_ref = reference(m, x, mask, causal)
        for absorb in (False, True):
            y, w = m(x, attn_mask=mask, is_causal=causal, need_weights=True, absorb=absorb)
            assert_close(y, y_ref, atol=1e-12, rtol=1e-10)
            assert_close(w, w_ref, atol=1e-12, rtol=1e-10)
            y_fast, none = m(x, attn_mask=mask, is_causal=causal, absorb=absorb)   # SDPA path
            assert none is None
            assert_close(y_fast, y_ref, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("q_lora_rank", [None, 10])
def test_absorbed_equals_naive_tightly_with_and_without_cache(q_lora_rank):
    m = make(d_model=32, H=4, q_lora_rank=q_lora_rank, kv_lora_rank=16, qk_nope_head_dim=8,
             qk_rope_head_dim=8, v_head_dim=8)
    x = torch.randn(3, 9, 32, dtype=F64)
    with torch.no_grad():
        for kw in (dict(is_causal=True), dict(), dict(need_weights=True, is_causal=True)):
            y0, w0 = m(x, absorb=False, **kw)
            y1, w1 = m(x, absorb=True, **kw)
            assert_close(y1, y0, atol=1e-13, rtol=1e-11)
            if w0 is not None:
                assert_close(w1, w0, atol=1e-13, rtol=1e-11)
        c0, c1 = MLACache(), MLACache()
        for lo, hi in ((0, 4), (4, 5), (5, 9)):                          # prefill, then decode, then a chunk
            y0, _ = m(x[:, lo:hi], is_causal=True, cache=c0, absorb=False)
            y1, _ = m(x[:, lo:hi], is_causal=True, cache=c1, absorb=True)
            assert_close(y1, y0, atol=1e-13, rtol=1e-11)
        assert torch.equal(c0.c_kv, c1.c_kv) and torch.equal(c0.k_rope, c1.k_rope)


@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
def test_token_by_token_decoding_equals_full_causal_forward(absorb, interleaved):
    m = make(q_lora_rank=6, interleaved=interleaved)
    x = torch.randn(2, 7, 16, dtype=F64)
    with torch.no_grad():
        full, _ = m(x, is_causal=True)
        cache = MLACache()
        steps = [m(x[:, t:t + 1], is_causal=True, cache=cache, absorb=absorb)[0] for t in range(7)]
        assert_close(torch.cat(steps, dim=1), full, atol=1e-12, rtol=1e-10)
        # chunked prefill then decoding, with weights: the new queries see every cached key
        cache = MLACache()
        y_a, _ = m(x[:, :3], is_causal=True, cache=cache, absorb=absorb)
        y_b, w_b = m(x[:, 3:], is_causal=True, cache=cache, absorb=absorb, need_weights=True)
        assert_close(torch.cat((y_a, y_b), 1), full, atol=1e-12, rtol=1e-10)
        _, w_full = m(x, is_causal=True, need_weights=True)
        assert_close(w_b, w_full[:, :, 3:], atol=1e-12, rtol=1e-10)


def test_cache_holds_normalised_latent_and_rotated_shared_key():
    m = make()
    x = torch.randn(2, 6, 16, dtype=F64)
    cache = MLACache()
    with torch.no_grad():
        m(x[:, :2], is_causal=True, cache=cache)
        m(x[:, 2:], is_causal=True, cache=cache)
    assert cache.c_kv.shape == (2, 6, 12) and cache.k_rope.shape == (2, 6, 4) and len(cache) == 6
    W = m.kv_a_proj_with_mqa.weight.detach()
    for b in range(2):
        for j in range(6):
            c_raw, k_raw = W[:12] @ x[b, j], W[12:] @ x[b, j]
            assert_close(cache.c_kv[b, j], rms(c_raw, m.kv_a_layernorm.weight.detach(), 1e-6))
            assert_close(cache.k_rope[b, j], rotate(k_raw, j, 10000.0, False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cache_bytes_equal_kv_cache_bytes(dtype):
    m = make(dtype=dtype, H=8)           # the head count does not enter MLA's cache
    cache = MLACache()
    with torch.no_grad():
        for chunk in (5, 1, 1, 3):
            m(torch.randn(4, chunk, 16, dtype=dtype), is_causal=True, cache=cache, absorb=True)
    want = kv_cache_bytes("mla", seq_len=10, batch_size=4, num_heads=8, head_dim=6, kv_lora_rank=12,
                          qk_rope_head_dim=4, dtype=dtype)
    assert cache.nbytes() == want == 4 * 10 * (12 + 4) * torch.empty((), dtype=dtype).element_size()


def test_kv_cache_bytes_mla_deepseek_v2_is_gqa_with_2_25_groups():
    # DeepSeek-V2 (§2.1, §3.1.2): n_h = 128, d_h = 128, d_c = 4 d_h = 512, d^R_h = d_h / 2 = 64, 60 layers
    kw = dict(seq_len=1, num_heads=128, head_dim=128, num_layers=60)
    mla = kv_cache_bytes("mla", kv_lora_rank=512, qk_rope_head_dim=64, **kw)
    assert mla == 60 * (512 + 64) * 2                            # Table 1: (d_c + d^R_h) l = 9/2 d_h l
    assert mla * 2 == 9 * 128 * 60 * 2                           # ... = 4.5 d_h l elements
    # "equivalent to GQA with only 2.25 groups": 2 n_g d_h l with n_g = 2.25
    assert mla / kv_cache_bytes("gqa", num_kv_heads=1, **kw) == 2.25
    assert kv_cache_bytes("mha", **kw) / mla == pytest.approx(56.9, abs=0.05)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        kv_cache_bytes("mla", kv_lora_rank=512, **kw)
    with pytest.raises(ValueError, match="qk_rope_head_dim must be a positive integer, got 0"):
        kv_cache_bytes("mla", kv_lora_rank=512, qk_rope_head_dim=0, **kw)


def test_absorbed_path_never_forms_per_head_keys_or_values():
    """Decoding one token after 64 cached ones: absorbed, kv_b_proj's layer is never run and no tensor as
    large as the per-head keys is created; naive, the per-head keys are formed."""
    m = make(d_model=32, H=16, kv_lora_rank=8, qk_nope_head_dim=16, qk_rope_head_dim=4, v_head_dim=16,
             dtype=torch.float32)
    calls = []
    m.kv_b_proj.register_forward_hook(lambda *a: calls.append(1))
    x = torch.randn(1, 65, 32)
    per_head_k = 1 * 16 * 65 * (16 + 4) * 4                            # (B, H, S, d_nope + d_R) fp32
    largest = {}
    with torch.no_grad():
        for absorb in (False, True):
            cache = MLACache()
            m(x[:, :64], is_causal=True, cache=cache)
            calls.clear()
            largest[absorb] = largest_tensor_created(lambda: m(x[:, 64:], is_causal=True, cache=cache, absorb=absorb))
            assert bool(calls) != absorb
    assert largest[False] >= per_head_k > 2 * largest[True]


@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("need_weights", [False, True])
def test_fully_masked_rows_give_zeros_not_nan(absorb, need_weights):
    m = make(dtype=torch.float32)
    x = torch.randn(2, 4, 16, requires_grad=True)
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    mask[0, :, 2] = False                                              # query 2 of sample 0 sees nothing
    y, w = m(x, attn_mask=mask, need_weights=need_weights, absorb=absorb)
    assert torch.isfinite(y).all() and torch.equal(y[0, 2], torch.zeros(16))
    if need_weights:
        assert torch.equal(w[0, :, 2], torch.zeros(3, 4))
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("absorb", [False, True])
def test_half_precision_runs_and_stays_close(dtype, absorb):
    m = make(dtype=torch.float32, q_lora_rank=8)
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        want, _ = m(x, is_causal=True)
        got, w = m.to(dtype)(x.to(dtype), is_causal=True, need_weights=True, absorb=absorb)
    assert got.dtype == dtype and w.dtype == dtype
    assert_close(got.float(), want, atol=0.05, rtol=0.05)


def test_rope_conventions_differ_by_a_fixed_channel_permutation():
    """Interleaved RoPE with the rope channels of q and k_rope permuted by interleave_perm equals the
    half-split module: same outputs (so either checkpoint layout loads, once permuted)."""
    from attn_course.rope import interleave_perm

    half = make(interleaved=False, q_lora_rank=5)
    inter = make(interleaved=True, q_lora_rank=5)
    H, dn, dr, dc = 3, 6, 4, 12
    perm = interleave_perm(dr)
    with torch.no_grad():
        inter.load_state_dict(half.state_dict())
        Wq = inter.q_b_proj.weight.view(H, dn + dr, -1)
        Wq[:, dn:] = Wq[:, dn:][:, perm]
        inter.kv_a_proj_with_mqa.weight[dc:] = inter.kv_a_proj_with_mqa.weight[dc:][perm]
        x = torch.randn(2, 6, 16, dtype=F64)
        assert_close(inter(x, is_causal=True)[0], half(x, is_causal=True)[0])
        assert not torch.allclose(make(interleaved=True, q_lora_rank=5)(x, is_causal=True)[0],
                                  half(x, is_causal=True)[0])          # without the permutation they differ


def test_scores_depend_on_relative_position_only():
    m = make(interleaved=True)
    x = torch.randn(1, 5, 16, dtype=F64)
    with torch.no_grad():
        _, w0 = m(x, is_causal=True, need_weights=True)
        cache = MLACache()
        m(torch.randn(1, 40, 16, dtype=F64), cache=cache)              # 40 unrelated tokens first ...
        _, w1 = m(x, cache=cache, need_weights=True, attn_mask=torch.cat(
            (torch.zeros(5, 40, dtype=torch.bool), torch.ones(5, 5, dtype=torch.bool).tril()), dim=1))
    assert_close(w1[..., 40:], w0)                                     # ... masked out: same weights at +40


def test_state_dict_uses_the_deepseek_names():
    names = set(make().state_dict())
    assert names == {"q_proj.weight", "kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight",
                     "o_proj.weight"}
    m = make(q_lora_rank=7)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes == {"q_a_proj.weight": (7, 16), "q_a_layernorm.weight": (7,), "q_b_proj.weight": (3 * 10, 7),
                      "kv_a_proj_with_mqa.weight": (12 + 4, 16), "kv_a_layernorm.weight": (12,),
                      "kv_b_proj.weight": (3 * (6 + 5), 12), "o_proj.weight": (16, 3 * 5)}
    assert m.scale == 1 / math.sqrt(6 + 4)


@pytest.mark.parametrize("kwargs, match", [
    (dict(qk_rope_head_dim=3), "even qk_rope_head_dim, got qk_rope_head_dim=3"),
    (dict(kv_lora_rank=0), "kv_lora_rank must be a positive integer, got 0"),
    (dict(v_head_dim=-1), "v_head_dim must be a positive integer, got -1"),
    (dict(q_lora_rank=0), "q_lora_rank must be a positive integer, got 0"),
    (dict(qk_nope_head_dim=2.5), "qk_nope_head_dim must be a positive integer, got 2.5"),
])
def test_bad_configuration_raises_value_error(kwargs, match):
    kw = {**SHAPE, **kwargs}
    with pytest.raises(ValueError, match=match):
        MultiHeadLatentAttention(16, 2, **kw)


def test_bad_inputs_raise_value_error_naming_sizes():
    m = make()
    with pytest.raises(ValueError, match=r"last dimension 15.*d_model=16"):
        m(torch.randn(2, 3, 15, dtype=F64))
    with pytest.raises(ValueError, match="3 dimensions"):
        m(torch.randn(3, 16, dtype=F64))
    with pytest.raises(ValueError, match="not both"):
        m(torch.randn(2, 3, 16, dtype=F64), attn_mask=torch.ones(3, 3, dtype=torch.bool), is_causal=True)
    for absorb in (False, True):
        with pytest.raises(ValueError, match=r"attn_mask of shape \(4, 4\).*Lq=3, Lk=3"):
            m(torch.randn(2, 3, 16, dtype=F64), attn_mask=torch.ones(4, 4, dtype=torch.bool), absorb=absorb)
    cache = MLACache()
    m(torch.randn(2, 3, 16, dtype=F64), cache=cache)
    with pytest.raises(ValueError, match=r"cache holds c_kv of shape \(2, 3, 12\).*\(1, 1, 12\)"):
        m(torch.randn(1, 1, 16, dtype=F64), cache=cache)


# ---- Hugging Face parity ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rope_interleave", [True, False])
@pytest.mark.parametrize("q_lora_rank", [None, 24])
def test_matches_transformers_deepseek_v3_attention(rope_interleave, q_lora_rank):
    """Hugging Face's DeepseekV3Attention, built from a small random config (no download), with our
    state dict copied in, gives the same output (its ``rope_interleave`` is our ``rope_interleaved``)."""
    tr = pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf

    cfg = tr.DeepseekV3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=q_lora_rank,
                              kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
                              rope_interleave=rope_interleave, attention_bias=False, rms_norm_eps=1e-6,
                              rope_theta=10000.0, rope_scaling=None, num_hidden_layers=1, vocab_size=10)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = hf.DeepseekV3Attention(cfg, layer_idx=0).to(F64).eval()
    ours = MultiHeadLatentAttention(32, 4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
                                    q_lora_rank=q_lora_rank, rope_interleaved=rope_interleave).to(F64)
    _randomise(theirs)
    ours.load_state_dict(theirs.state_dict())                 # same names, same shapes: strict load
    x, want, w_want = _hf_forward(hf, theirs, cfg)
    with torch.no_grad():
        for absorb in (False, True):
            got, w_got = ours(x, is_causal=True, need_weights=True, absorb=absorb)
            # HF computes its rotary angles and its RMSNorms in fp32 even for fp64 inputs: fp32 tolerance
            assert_close(got, want, atol=1e-5, rtol=1e-4)
            assert_close(w_got, w_want, atol=1e-5, rtol=1e-4)
        # what the tolerance still catches: the other RoPE convention, or the scale over the nope dims only
        ours.rope_interleaved = not rope_interleave
        assert not torch.allclose(ours(x, is_causal=True)[0], want, atol=1e-3)
        ours.rope_interleaved, ours.scale = rope_interleave, 1 / math.sqrt(8)
        assert not torch.allclose(ours(x, is_causal=True)[0], want, atol=1e-3)



YARN_V2 = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "mscale": 0.707,
           "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}        # DeepSeek-V2's released config


def _yarn_config(tr, rope_interleave, rope_dim):
    cfg = tr.DeepseekV3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24,
                              kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=rope_dim, v_head_dim=6,
                              rope_interleave=rope_interleave, attention_bias=False, rms_norm_eps=1e-6,
                              rope_theta=10000.0, rope_scaling=dict(YARN_V2), max_position_embeddings=163840,
                              num_hidden_layers=1, vocab_size=10)
    cfg._attn_implementation = "eager"
    return cfg


def test_yarn_frequencies_match_transformers_far_beyond_the_original_context():
    """The rope channels at positions ~50,000 (12x V2's original 4096): HF's YaRN cos/sin (64 rope channels,
    its _compute_yarn_parameters) rotate exactly as our rope_scaling module does; plain RoPE does not."""
    tr = pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf

    cfg = _yarn_config(tr, False, 64)
    pos = torch.arange(50_000, 50_006)
    cos, sin = (t.to(F64)[0] for t in hf.DeepseekV3RotaryEmbedding(cfg)(torch.zeros(1, dtype=torch.float32), pos[None]))
    torch.manual_seed(0)
    x = torch.randn(3, 6, 64, dtype=F64)
    want = x * cos + torch.cat((-x[..., 32:], x[..., :32]), dim=-1) * sin                  # rotate_half form
    m = MultiHeadLatentAttention(32, 4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=64, v_head_dim=6,
                                 rope_scaling=YARN_V2)
    # HF's θ and angles are fp32: at p = 5e4 an angle is off by up to ~p·θ·2⁻²⁴ ≈ 3e-3 rad, hence the tolerance
    assert_close(m._rope(x, pos), want, atol=1e-2, rtol=0)
    plain = MultiHeadLatentAttention(32, 4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=64, v_head_dim=6)
    assert (plain._rope(x, pos) - want).abs().max() > 0.5
    # the frequencies themselves: V2's 32 pairs = 10 kept, a ramp, and the slowest divided by 40
    inv = yarn_inv_freq(64, 10000.0, 40, 4096)
    theta = 10000.0 ** (-torch.arange(0, 64, 2, dtype=F64) / 64)
    assert_close(inv, hf.ROPE_INIT_FUNCTIONS["yarn"](cfg)[0].to(F64), rtol=1e-6, atol=0)
    assert (inv[:10] == theta[:10]).all() and torch.allclose(inv[23:], theta[23:] / 40)


@pytest.mark.parametrize("rope_interleave", [True, False])
def test_yarn_module_matches_transformers_deepseek_v3_attention(rope_interleave):
    """The whole layer with V2's YaRN config: same output as HF's DeepseekV3Attention (its softmax scale is
    multiplied by mscale² ≈ 1.59, ours too); the module without rope_scaling differs."""
    tr = pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf

    cfg = _yarn_config(tr, rope_interleave, 4)
    torch.manual_seed(0)
    theirs = hf.DeepseekV3Attention(cfg, layer_idx=0).to(F64).eval()
    kw = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, q_lora_rank=24,
              rope_interleaved=rope_interleave)
    ours = MultiHeadLatentAttention(32, 4, rope_scaling=YARN_V2, **kw).to(F64)
    plain = MultiHeadLatentAttention(32, 4, **kw).to(F64)
    _randomise(theirs)
    ours.load_state_dict(theirs.state_dict())
    plain.load_state_dict(theirs.state_dict())
    assert math.isclose(ours.scale / plain.scale, (0.1 * 0.707 * math.log(40) + 1) ** 2, rel_tol=1e-12)
    assert math.isclose(ours.scale, theirs.scaling, rel_tol=1e-12)
    x, want, w_want = _hf_forward(hf, theirs, cfg)
    with torch.no_grad():
        for absorb in (False, True):
            got, w_got = ours(x, is_causal=True, need_weights=True, absorb=absorb)
            assert_close(got, want, atol=1e-5, rtol=1e-4)
            assert_close(w_got, w_want, atol=1e-5, rtol=1e-4)
        assert not torch.allclose(plain(x, is_causal=True)[0], want, atol=1e-3)


def test_rope_scaling_bad_input():
    kw = dict(kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4)
    with pytest.raises(ValueError, match="YaRN only, got type 'linear'"):
        MultiHeadLatentAttention(16, 2, rope_scaling={"type": "linear", "factor": 2}, **kw)
    with pytest.raises(ValueError, match="missing \\['original_max_position_embeddings'\\]"):
        MultiHeadLatentAttention(16, 2, rope_scaling={"type": "yarn", "factor": 2}, **kw)


def _randomise(theirs):
    """Random weights (norm gains near 1) for an HF attention module, in place."""
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 1.0) + (1.0 if p.dim() == 1 else 0.0))


def _hf_forward(hf, theirs, cfg):
    """x (2, 7, 32) in fp64 and HF's causal output and weights for it, with HF's rotary embedding."""
    x = torch.randn(2, 7, 32, dtype=F64)
    pos = torch.arange(7)[None].expand(2, -1)
    causal = torch.full((7, 7), float("-inf"), dtype=F64).triu(1)[None, None].expand(2, 1, 7, 7)
    cos, sin = (t.to(F64) for t in hf.DeepseekV3RotaryEmbedding(cfg)(x.float(), pos))
    with torch.no_grad():
        want, w_want = theirs(x, position_embeddings=(cos, sin), attention_mask=causal)
    return x, want, w_want


@pytest.mark.parametrize("absorb", [False, True])
def test_sdpa_gets_16_byte_aligned_inputs(monkeypatch, absorb):
    """On CUDA, SDPA's memory-efficient kernel (torch 2.11) picks a vectorised variant from the strides without
    checking the data pointers, and a view that starts mid-row crashes it with "misaligned address" (pytorch
    #183484; lesson 12 crashed so on an H200 when v was the split-off tail of the up-projection). So every
    q, k, v MLA hands to SDPA must start on a 16-byte boundary — checkable on a CPU."""
    import attn_course.mla as mla_mod
    seen = []
    real = mla_mod.F.scaled_dot_product_attention

    def spy(q, k, v, *a, **kw):
        seen.append({n: t.data_ptr() % 16 for n, t in (("q", q), ("k", k), ("v", v))})
        return real(q, k, v, *a, **kw)
    monkeypatch.setattr(mla_mod.F, "scaled_dot_product_attention", spy)
    torch.manual_seed(0)
    # lesson 12's hard task: 8 heads of width 4, d_R = 2, so d_nope = 2 and v starts 2 floats into each row
    m = MultiHeadLatentAttention(32, 8, kv_lora_rank=8, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=4)
    m(torch.randn(3, 5, 32), is_causal=True, absorb=absorb)
    assert seen and all(off == 0 for call in seen for off in call.values()), seen
