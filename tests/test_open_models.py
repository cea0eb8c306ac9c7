"""Lesson 15's modules against their Hugging Face peers (random weights, small configs, no download) and
against independent fp64 formulas: SinkAttention ↔ GptOssAttention, GatedAttention ↔ Qwen3NextAttention,
GatedDeltaNet ↔ Qwen3NextGatedDeltaNet, SparseIndexer ↔ DeepseekV32Indexer, DifferentialAttention ↔
DiffLlamaAttention.

Hugging Face computes parts of these layers in fp32 even for fp64 weights (softmax, RMSNorm, the delta rule,
λ), so the peer comparisons use fp32-level tolerances; the fp64 formulas pin our own arithmetic to 1e-12.
The RoPE tables given to the peers are built from our fp64 frequencies (checked against the peers' own
fp32 ``inv_freq`` separately), so a difference in the layer is not hidden by a difference in the table.
"""
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
import transformers  # noqa: F401  (a test dependency: the peers below)

from attn_course.deltanet import GatedDeltaNet, gated_delta_rule_chunked, gated_delta_rule_recurrent
from attn_course.diff import DifferentialAttention
from attn_course.dsa import SparseIndexer, topk_attention, topk_mask
from attn_course.functional import attention
from attn_course.gated import GatedAttention
from attn_course.sinks import SinkAttention, sink_attention

warnings.filterwarnings("ignore", module="transformers")
F64 = torch.float64


def _randomise(module, std=0.5, skip=()):
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if not any(s in name for s in skip):
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)
    return module


def _tables(ours_rope, L, B=2, half=False, offset=0):
    """cos, sin (B, L, rotary_dim) — or rotary_dim/2 for gpt-oss's half-width tables — from our fp64 frequencies,
    at positions offset..offset+L-1."""
    ang = torch.arange(offset, offset + L, dtype=F64)[:, None] * ours_rope.inv_freq
    emb = ang if half else torch.cat((ang, ang), -1)
    s = ours_rope.attention_scaling
    return (emb.cos() * s)[None].expand(B, -1, -1), (emb.sin() * s)[None].expand(B, -1, -1)


def _additive(allowed, B=2):
    return torch.zeros(allowed.shape, dtype=F64).masked_fill(~allowed, float("-inf"))[None, None].expand(B, 1, *allowed.shape)


# ---- sinks (gpt-oss) --------------------------------------------------------------------------------------------

def _gptoss_config(rope=True, **kw):
    from transformers import GptOssConfig
    args = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=3,
                num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    if not rope:
        args["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    cfg = GptOssConfig(**{**args, **kw})
    cfg._attn_implementation = "eager"
    return cfg


@pytest.mark.parametrize("yarn", [True, False])
@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("L", [1, 7])
def test_sink_attention_equals_gpt_oss(yarn, layer, L):
    from transformers.models.gpt_oss import modeling_gpt_oss as hf
    cfg = _gptoss_config(rope=yarn)
    theirs = _randomise(hf.GptOssAttention(cfg, layer).double())
    ours = SinkAttention.from_config(cfg, layer).double()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert ours.sliding_window == (3 if layer == 0 else None)
    rot = hf.GptOssRotaryEmbedding(cfg)
    torch.testing.assert_close(rot.inv_freq.double(), ours.rope.inv_freq, rtol=1e-6, atol=0)
    assert ours.rope.attention_scaling == pytest.approx(rot.attention_scaling, rel=1e-12)
    x = torch.randn(2, L, 32, dtype=F64)
    with torch.no_grad():
        want, w_want = theirs(x, position_embeddings=_tables(ours.rope, L, half=True),
                              attention_mask=_additive(ours.mask(L)))
        got, w = ours(x, need_weights=True)
        fused, none = ours(x)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    torch.testing.assert_close(fused, want, rtol=0, atol=1e-10)
    torch.testing.assert_close(w, w_want, rtol=0, atol=1e-12)
    assert none is None


def test_sink_formula_rows_sum_below_one_and_all_masked_rows_are_zero():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=F64) for _ in range(3))
    sinks = torch.tensor([-1.0, 0.0, 2.0], dtype=F64)
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()
    allowed[0] = False                                                  # a row with no key at all
    out, w = sink_attention(q, k, v, sinks, allowed)
    s = (q @ k.transpose(-2, -1) / 2.0).masked_fill(~allowed, float("-inf"))
    z = s.exp().sum(-1) + sinks.exp()[:, None]                          # Σ_j e^{s_ij} + e^{b_h}
    want_w = s.exp() / z[..., None]
    torch.testing.assert_close(w, want_w, rtol=0, atol=1e-14)
    torch.testing.assert_close(out, want_w @ v, rtol=0, atol=1e-14)
    torch.testing.assert_close(w.sum(-1), 1 - sinks.exp()[:, None] / z, rtol=0, atol=1e-14)   # the sink's share
    assert (w.sum(-1) < 1).all() and (out[:, :, 0] == 0).all()
    with pytest.raises(ValueError, match=r"sinks has shape \(2,\), expected \(num_heads,\) = \(3,\)"):
        sink_attention(q, k, v, sinks[:2])


def test_sink_attention_bad_configuration():
    with pytest.raises(ValueError, match="num_heads=3 must be a positive multiple of num_kv_heads=2"):
        SinkAttention(16, 3, 2, 4)
    with pytest.raises(ValueError, match="sliding_window must be positive"):
        SinkAttention(16, 2, 2, 4, sliding_window=0)
    with pytest.raises(ValueError, match="hidden_size=16"):
        SinkAttention(16, 2, 2, 4)(torch.randn(1, 3, 8))


# ---- gated attention (Qwen3-Next) -----------------------------------------------------------------------------

def _qwen3next_config(**kw):
    from transformers import Qwen3NextConfig
    cfg = Qwen3NextConfig(**{**dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=4,
                                    linear_key_head_dim=8, linear_value_head_dim=6), **kw})
    cfg._attn_implementation = "eager"
    return cfg


@pytest.mark.parametrize("heads", [(4, 2), (4, 4), (2, 1)])
@pytest.mark.parametrize("L", [1, 9])
def test_gated_attention_equals_qwen3_next(heads, L):
    from transformers.models.qwen3_next import modeling_qwen3_next as hf
    cfg = _qwen3next_config(num_attention_heads=heads[0], num_key_value_heads=heads[1])
    theirs = _randomise(hf.Qwen3NextAttention(cfg, 3).double())
    ours = GatedAttention.from_config(cfg).double()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert ours.rope.rotary_dim == 4                                    # partial RoPE: a quarter of 16 channels
    rot = hf.Qwen3NextRotaryEmbedding(cfg)
    torch.testing.assert_close(rot.inv_freq.double(), ours.rope.inv_freq, rtol=1e-6, atol=0)
    x = torch.randn(2, L, 32, dtype=F64)
    with torch.no_grad():
        want, w_want = theirs(x, position_embeddings=_tables(ours.rope, L),
                              attention_mask=_additive(torch.ones(L, L, dtype=torch.bool).tril()))
        got, w = ours(x, need_weights=True)
        fused, _ = ours(x)
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6 * scale)   # HF's QK-norm runs in fp32
    torch.testing.assert_close(fused, got, rtol=0, atol=1e-12)
    torch.testing.assert_close(w, w_want, rtol=0, atol=1e-5)


def test_gated_attention_formula_in_fp64():
    """y = W_o (o ⊙ σ(g)) with o from per-head softmax over QK-normed, partially rotated q and k."""
    torch.manual_seed(0)
    m = _randomise(GatedAttention(12, 2, 1, 8).double(), std=0.3)
    x = torch.randn(1, 5, 12, dtype=F64)
    y, _ = m(x)
    qg = m.q_proj(x).view(1, 5, 2, 16)
    q, g = qg[..., :8], qg[..., 8:]
    k, v = m.k_proj(x).view(1, 5, 1, 8), m.v_proj(x).view(1, 5, 1, 8)

    def norm(t, w):
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w)

    def rope2(t):          # rotary_dim = 2: one pair (channels 0, 1), angle p·1
        p = torch.arange(5, dtype=F64)[:, None]
        c, s = torch.cos(p), torch.sin(p)
        return torch.cat((t[..., :1] * c - t[..., 1:2] * s, t[..., 1:2] * c + t[..., :1] * s, t[..., 2:]), -1)
    outs = []
    for h in range(2):
        qh, kh = rope2(norm(q[0, :, h], m.q_norm.weight)), rope2(norm(k[0, :, 0], m.k_norm.weight))
        s = (qh @ kh.T / math.sqrt(8)).masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
        outs.append(torch.softmax(s, -1) @ v[0, :, 0] * torch.sigmoid(g[0, :, h]))
    torch.testing.assert_close(y[0], m.o_proj(torch.cat(outs, -1)), rtol=0, atol=1e-12)
    y_off, _ = m(x, gate=False)
    assert (y_off - y).abs().max() > 1e-3                               # the gate does something


# ---- Gated DeltaNet (Qwen3-Next) ------------------------------------------------------------------------------

@pytest.mark.parametrize("L", [1, 7, 70, 130])
@pytest.mark.parametrize("mode", ["chunked", "recurrent"])
def test_gated_deltanet_equals_qwen3_next(L, mode):
    from transformers.models.qwen3_next import modeling_qwen3_next as hf
    cfg = _qwen3next_config()
    theirs = _randomise(hf.Qwen3NextGatedDeltaNet(cfg, 0).double())
    ours = GatedDeltaNet.from_config(cfg).double()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(2, L, 32, dtype=F64)
    with torch.no_grad():
        want = theirs(x)                                                # HF's torch path (fp32 inside)
        got = ours(x, mode=mode)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("act", ["gelu", "relu", "gelu_pytorch_tanh"])
def test_gated_deltanet_follows_hidden_act(act):
    """The convolution's non-linearity is the config's ``hidden_act`` (the peer's ``self.activation``)."""
    from transformers.models.qwen3_next import modeling_qwen3_next as hf
    cfg = _qwen3next_config(hidden_act=act)
    theirs = _randomise(hf.Qwen3NextGatedDeltaNet(cfg, 0).double())
    ours = GatedDeltaNet.from_config(cfg).double()
    assert ours.activation == act
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(2, 9, 32, dtype=F64)
    with torch.no_grad():
        want, got = theirs(x), ours(x)
        silu = GatedDeltaNet.from_config(_qwen3next_config()).double()
        silu.load_state_dict(theirs.state_dict(), strict=True)
        assert (silu(x) - want).abs().max() > 1e-3                       # the activation matters here
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * want.abs().max().item())
    with pytest.raises(ValueError, match="activation must be one of"):
        GatedDeltaNet(32, 2, 4, 8, 6, activation="tanhh")


def _delta_inputs(B=2, H=3, L=37, dk=5, dv=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, dk, generator=g, dtype=F64)
    k = F.normalize(torch.randn(B, H, L, dk, generator=g, dtype=F64), dim=-1)
    v = torch.randn(B, H, L, dv, generator=g, dtype=F64)
    decay = -torch.rand(B, H, L, generator=g, dtype=F64)
    beta = torch.rand(B, H, L, generator=g, dtype=F64)
    S0 = torch.randn(B, H, dk, dv, generator=g, dtype=F64)
    return q, k, v, decay, beta, S0


def test_delta_rule_recurrent_equals_the_matrix_recurrence():
    """S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ, o_t = S_tᵀ q_t, written as matrices in fp64."""
    q, k, v, g, beta, S0 = _delta_inputs()
    o, S_end = gated_delta_rule_recurrent(q, k, v, g, beta, S0)
    S, want = S0.clone(), []
    eye = torch.eye(5, dtype=F64)
    for t in range(q.shape[2]):
        kt, b, a = k[:, :, t, :, None], beta[:, :, t, None, None], g[:, :, t, None, None].exp()
        S = a * (eye - b * kt @ kt.transpose(-2, -1)) @ S + b * kt @ v[:, :, t, None, :]
        want.append((S.transpose(-2, -1) @ q[:, :, t, :, None])[..., 0])
    torch.testing.assert_close(o, torch.stack(want, 2), rtol=0, atol=1e-12)
    torch.testing.assert_close(S_end, S, rtol=0, atol=1e-12)


@pytest.mark.parametrize("C", [1, 4, 16, 64])
def test_delta_rule_chunked_equals_recurrent(C):
    q, k, v, g, beta, S0 = _delta_inputs()
    o1, s1 = gated_delta_rule_recurrent(q, k, v, g, beta, S0)
    o2, s2 = gated_delta_rule_chunked(q, k, v, g, beta, C, S0)
    torch.testing.assert_close(o2, o1, rtol=0, atol=1e-12)
    torch.testing.assert_close(s2, s1, rtol=0, atol=1e-12)


def test_delta_rule_state_carries_across_calls_and_overwrites():
    q, k, v, g, beta, _ = _delta_inputs(L=20)
    o, S = gated_delta_rule_recurrent(q, k, v, g, beta)
    o1, S1 = gated_delta_rule_chunked(q[:, :, :11], k[:, :, :11], v[:, :, :11], g[:, :, :11], beta[:, :, :11], 4)
    o2, S2 = gated_delta_rule_chunked(q[:, :, 11:], k[:, :, 11:], v[:, :, 11:], g[:, :, 11:], beta[:, :, 11:], 4, S1)
    torch.testing.assert_close(torch.cat((o1, o2), 2), o, rtol=0, atol=1e-12)
    torch.testing.assert_close(S2, S, rtol=0, atol=1e-12)
    # with β = 1 and no decay, writing v at a unit key k and reading with k returns v exactly (overwrite)
    k1 = F.normalize(torch.randn(1, 1, 1, 4, dtype=F64), dim=-1)
    S0 = torch.randn(1, 1, 4, 3, dtype=F64)
    v1 = torch.randn(1, 1, 1, 3, dtype=F64)
    o, _ = gated_delta_rule_recurrent(k1, k1, v1, torch.zeros(1, 1, 1, dtype=F64), torch.ones(1, 1, 1, dtype=F64), S0)
    torch.testing.assert_close(o, v1, rtol=0, atol=1e-12)


def test_delta_rule_bad_shapes():
    q, k, v, g, beta, S0 = _delta_inputs()
    with pytest.raises(ValueError, match=r"g has shape \(2, 3, 36\), expected \(B, H, L\) = \(2, 3, 37\)"):
        gated_delta_rule_recurrent(q, k, v, g[..., 1:], beta)
    with pytest.raises(ValueError, match="initial_state has shape"):
        gated_delta_rule_chunked(q, k, v, g, beta, 8, S0[..., :2])
    with pytest.raises(ValueError, match="num_v_heads=3 must be a multiple of num_k_heads=2"):
        GatedDeltaNet(16, 2, 3, 4, 4)


def test_gated_deltanet_state_is_constant_in_length():
    m = GatedDeltaNet(32, 2, 4, 8, 6)
    assert m.state_bytes() == (4 * 8 * 6 + (2 * 16 + 24) * 3) * 4


# ---- DeepSeek Sparse Attention's indexer ----------------------------------------------------------------------

def _dsv32_config(**kw):
    from transformers.models.deepseek_v32 import DeepseekV32Config
    return DeepseekV32Config(**{**dict(hidden_size=32, q_lora_rank=16, index_n_heads=4, index_head_dim=16,
                                       qk_rope_head_dim=8, index_topk=5, num_hidden_layers=2, num_attention_heads=4,
                                       kv_lora_rank=16, qk_nope_head_dim=8, v_head_dim=8), **kw})


@pytest.mark.parametrize("L,topk", [(12, 5), (4, 5), (9, 1)])
def test_sparse_indexer_picks_what_deepseek_v32_picks(L, topk):
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hf
    cfg = _dsv32_config(index_topk=topk)
    theirs = _randomise(hf.DeepseekV32Indexer(cfg, 0).double())
    ours = SparseIndexer.from_config(cfg).double()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x, c = torch.randn(2, L, 32, dtype=F64), torch.randn(2, L, 16, dtype=F64)
    causal = torch.ones(L, L, dtype=torch.bool).tril()[None].expand(2, L, L)
    with torch.no_grad():
        want = theirs(x, c, _tables(ours.rope, L), causal, None)
        got = ours(x, c)
    assert got.shape == want.shape == (2, L, min(topk, L))
    for b in range(2):
        for t in range(L):
            n = min(t + 1, topk)                                         # the first n picks are real keys
            assert sorted(got[b, t, :n].tolist()) == sorted(want[b, t, :n].tolist())


def test_sparse_indexer_per_sequence_positions_match_deepseek_v32():
    """(B, L) positions — transformers' position_ids, with gaps that differ per sequence (a common offset would
    not change RoPE's scores at all) — rotate each sequence by its own positions, also when B equals the number
    of index heads (where a wrong broadcast would pair them)."""
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hf
    cfg = _dsv32_config(index_topk=12)
    theirs = _randomise(hf.DeepseekV32Indexer(cfg, 0).double())
    ours = SparseIndexer.from_config(cfg).double()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    B, L = cfg.index_n_heads, 7                                          # B == H_I on purpose
    x, c = torch.randn(B, L, 32, dtype=F64), torch.randn(B, L, 16, dtype=F64)
    g = torch.Generator().manual_seed(3)
    pos = torch.stack([torch.randperm(60, generator=g)[:L].sort().values for _ in range(B)])   # (B, L), gaps
    ang = pos.to(F64)[..., None] * ours.rope.inv_freq                                    # (B, L, r/2)
    emb, scaling = torch.cat((ang, ang), -1), ours.rope.attention_scaling
    cos, sin = [emb.cos() * scaling], [emb.sin() * scaling]
    causal = torch.ones(L, L, dtype=torch.bool).tril()[None].expand(B, L, L)
    with torch.no_grad():
        got = ours.index_scores(x, c, pos)
        want = theirs(x, c, (torch.cat(cos), torch.cat(sin)), causal, None)   # top-12 of 7 keys: the full order
        for b in range(B):                                                  # each sequence alone, (L,) positions
            torch.testing.assert_close(got[b], ours.index_scores(x[b:b + 1], c[b:b + 1], pos[b])[0], rtol=0, atol=1e-12)
        assert (got - ours.index_scores(x, c)).nan_to_num(0.0).abs().max() > 1e-3     # the positions matter here
    for b in range(B):
        for t in range(L):
            mine = got[b, t, : t + 1].sort(descending=True).values                 # ties (ReLU zeros) in any order
            torch.testing.assert_close(got[b, t, want[b, t, : t + 1].long()], mine, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"positions must have shape \(L,\) = \(7,\) or \(B, L\) = \(4, 7\)"):
        ours.index_scores(x, c, pos[:, :3])


def test_index_scores_formula_and_topk_attention_equals_masked_dense():
    torch.manual_seed(0)
    m = _randomise(SparseIndexer(16, 8, 3, 8, 4, topk=4).double(), std=0.4)
    L = 10
    x, c = torch.randn(1, L, 16, dtype=F64), torch.randn(1, L, 8, dtype=F64)
    sc = m.index_scores(x, c)
    q = m.rope(m.wq_b(c).view(1, L, 3, 8).transpose(1, 2)[..., :4]), m.wq_b(c).view(1, L, 3, 8).transpose(1, 2)[..., 4:]
    q = torch.cat(q, -1)
    kk = m.k_norm(m.wk(x))
    kk = torch.cat((m.rope(kk[..., :4]), kk[..., 4:]), -1)
    w = m.weights_proj(x) / math.sqrt(3)
    for t in range(L):
        for s in range(L):
            want = sum(w[0, t, h] * torch.relu(q[0, h, t] @ kk[0, s] / math.sqrt(8)) for h in range(3))
            assert (sc[0, t, s] == float("-inf")) if s > t else abs(sc[0, t, s] - want) < 1e-12
    idx = m(x, c)
    allowed = torch.isfinite(sc.gather(-1, idx))
    qa, ka, va = (torch.randn(1, 2, L, 6, dtype=F64) for _ in range(3))
    out = topk_attention(qa, ka, va, idx, allowed=allowed)
    dense, _ = attention(qa, ka, va, attn_mask=(topk_mask(idx, L) & torch.ones(L, L, dtype=torch.bool).tril())[:, None])
    torch.testing.assert_close(out, dense, rtol=0, atol=1e-12)
    assert (topk_mask(idx, L).sum(-1) == idx.shape[-1]).all()


# ---- differential attention (DiffLlama) -----------------------------------------------------------------------

@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (4, 2)])
@pytest.mark.parametrize("layer", [0, 2])
def test_differential_attention_equals_diffllama(heads, layer):
    from transformers import DiffLlamaConfig
    from transformers.models.diffllama import modeling_diffllama as hf
    cfg = DiffLlamaConfig(hidden_size=32, num_attention_heads=heads[0], num_key_value_heads=heads[1], head_dim=8,
                          num_hidden_layers=4)
    cfg._attn_implementation = "eager"
    theirs = _randomise(hf.DiffLlamaAttention(cfg, layer).double())
    ours = DifferentialAttention.from_config(cfg, layer).double()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert ours.lambda_init == pytest.approx(theirs.lambda_init, abs=1e-15)
    L = 7
    x = torch.randn(2, L, 32, dtype=F64)
    with torch.no_grad():
        want, _ = theirs(x, position_embeddings=_tables(ours.rope, L),
                         attention_mask=_additive(torch.ones(L, L, dtype=torch.bool).tril()))
        got, maps = ours(x, need_weights=True)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * want.abs().max().item())   # HF: fp32 softmax and λ
    torch.testing.assert_close(maps.sum(-1), (1 - ours.lam()).expand_as(maps.sum(-1)), rtol=0, atol=1e-12)


def test_differential_attention_formula_in_fp64():
    """Eq. 1–3 of the paper, head pair by head pair, in DiffLlama's layout (pair i = heads i and i + H/2)."""
    torch.manual_seed(0)
    m = _randomise(DifferentialAttention(16, 4, 2, 4, layer_idx=1).double(), std=0.3)
    L = 6
    x = torch.randn(1, L, 16, dtype=F64)
    y, _ = m(x)
    q = m.rope(m.q_proj(x).view(1, L, 4, 4).transpose(1, 2))[0]
    k = m.rope(m.k_proj(x).view(1, L, 2, 4).transpose(1, 2))[0]
    v = m.v_proj(x).view(1, L, 2, 4).transpose(1, 2)[0]
    V = torch.cat((v[0], v[1]), -1)                                      # [v1 ; v2]: 2·head_dim
    lam = math.exp(m.lambda_q1.detach() @ m.lambda_k1.detach()) - math.exp(m.lambda_q2.detach() @ m.lambda_k2.detach()) + (0.8 - 0.6 * math.exp(-0.3))
    causal = torch.ones(L, L, dtype=torch.bool).triu(1)

    def sm(qh, kh):
        return torch.softmax((qh @ kh.T / 2.0).masked_fill(causal, float("-inf")), -1)
    heads = []
    for i in range(2):                                                   # kv head of query head j: j // 2
        a = (sm(q[i], k[i // 2]) - lam * sm(q[i + 2], k[(i + 2) // 2])) @ V
        heads.append((1 - m.lambda_init) * a / torch.sqrt(a.pow(2).mean(-1, keepdim=True) + m.eps))
    torch.testing.assert_close(y[0], m.o_proj(torch.cat(heads, -1)), rtol=0, atol=1e-12)


def test_differential_attention_bad_configuration():
    with pytest.raises(ValueError, match="must be even"):
        DifferentialAttention(16, 3, 3, 4)
    with pytest.raises(ValueError, match="must be even"):
        DifferentialAttention(16, 4, 1, 4)
