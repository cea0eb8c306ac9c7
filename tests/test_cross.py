"""CrossAttention against nn.MultiheadAttention(kdim=, vdim=), an fp64 per-head formula, and its properties."""
import math

import pytest
import torch
from torch import nn

from attn_course import CrossAttention
from attn_course.masks import padding_mask


def mha_copy(m: CrossAttention) -> nn.MultiheadAttention:
    """An nn.MultiheadAttention holding exactly m's parameters."""
    ref = nn.MultiheadAttention(m.d_model, m.num_heads, kdim=m.context_dim, vdim=m.context_dim,
                                batch_first=True, bias=m.q_proj.bias is not None)
    with torch.no_grad():
        if ref._qkv_same_embed_dim:
            ref.in_proj_weight.copy_(torch.cat([m.q_proj.weight, m.k_proj.weight, m.v_proj.weight]))
        else:
            ref.q_proj_weight.copy_(m.q_proj.weight)
            ref.k_proj_weight.copy_(m.k_proj.weight)
            ref.v_proj_weight.copy_(m.v_proj.weight)
        if m.q_proj.bias is not None:
            ref.in_proj_bias.copy_(torch.cat([m.q_proj.bias, m.k_proj.bias, m.v_proj.bias]))
            ref.out_proj.bias.copy_(m.out_proj.bias)
        ref.out_proj.weight.copy_(m.out_proj.weight)
    return ref.eval()


def formula(m: CrossAttention, x, c, keep=None):
    """Per-head loop in fp64: softmax((X W_i^Q)(C W_i^K)ᵀ/√d_h)(C W_i^V), concatenated, then W^O."""
    p = {n: t.detach().double() for n, t in m.named_parameters()}
    x, c = x.double(), c.double()
    Q = x @ p["q_proj.weight"].T + p["q_proj.bias"]
    K = c @ p["k_proj.weight"].T + p["k_proj.bias"]
    V = c @ p["v_proj.weight"].T + p["v_proj.bias"]
    d = m.head_dim
    heads, ws = [], []
    for i in range(m.num_heads):
        s = Q[..., i * d:(i + 1) * d] @ K[..., i * d:(i + 1) * d].transpose(-2, -1) / math.sqrt(d)
        if keep is not None:
            s = s.masked_fill(~keep[:, None, :], float("-inf"))
        w = torch.softmax(s, dim=-1)
        ws.append(w)
        heads.append(w @ V[..., i * d:(i + 1) * d])
    out = torch.cat(heads, dim=-1) @ p["out_proj.weight"].T + p["out_proj.bias"]
    return out, torch.stack(ws, dim=1)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("context_dim", [None, 12, 40])
@pytest.mark.parametrize("Lq,Lk", [(5, 9), (7, 3), (4, 4)])
def test_matches_nn_multihead_attention(need_weights, context_dim, Lq, Lk):
    m = CrossAttention(16, 4, context_dim=context_dim).eval()
    x = torch.randn(3, Lq, 16)
    c = torch.randn(3, Lk, m.context_dim)
    out, w = m(x, c, need_weights=need_weights)
    ref_out, ref_w = mha_copy(m)(x, c, c, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-4)
    if need_weights:
        torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=1e-5)
    else:
        assert w is None


@pytest.mark.parametrize("need_weights", [False, True])
def test_key_padding_matches_nn_mha_with_inverted_polarity(need_weights):
    m = CrossAttention(24, 3, context_dim=10).eval()
    lengths = torch.tensor([6, 2, 4])
    x, c = torch.randn(3, 5, 24), torch.randn(3, 6, 10)
    keep = padding_mask(lengths, 6)                                   # (B, 1, 1, Lk), True = real token
    out, w = m(x, c, attn_mask=keep, need_weights=need_weights)
    ref = mha_copy(m)
    # nn.MultiheadAttention's key_padding_mask is True = IGNORE: the opposite polarity.
    ref_out, ref_w = ref(x, c, c, key_padding_mask=~keep[:, 0, 0], average_attn_weights=False)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-4)
    if need_weights:
        torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=1e-5)
    # passing our mask without inverting it gives a different (wrong) answer
    wrong, _ = ref(x, c, c, key_padding_mask=keep[:, 0, 0])
    assert not torch.allclose(out[1], wrong[1], atol=1e-3)


def test_matches_fp64_formula_with_padding():
    m = CrossAttention(12, 2, context_dim=7).eval()
    x, c = torch.randn(2, 4, 12), torch.randn(2, 5, 7)
    keep = padding_mask([5, 3], 5)
    out, w = m(x, c, attn_mask=keep, need_weights=True)
    ref_out, ref_w = formula(m, x, c, keep[:, 0, 0])
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(w.double(), ref_w, atol=1e-6, rtol=1e-5)


def test_padded_context_gets_exactly_zero_weight_and_no_influence():
    m = CrossAttention(16, 4, context_dim=8).eval()
    x, c = torch.randn(2, 3, 16), torch.randn(2, 6, 8)
    keep = padding_mask([4, 1], 6)
    out, w = m(x, c, attn_mask=keep, need_weights=True)
    assert torch.all(w[0, ..., 4:] == 0) and torch.all(w[1, ..., 1:] == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 3))
    c2 = c.clone()
    c2[0, 4:] = 100 * torch.randn(2, 8)                               # garbage in the padding
    c2[1, 1:] = 100 * torch.randn(5, 8)
    for need_weights in (False, True):
        out2, _ = m(x, c2, attn_mask=keep, need_weights=need_weights)
        torch.testing.assert_close(out2, out, atol=1e-5, rtol=1e-5)


def test_gradients_flow_to_both_sequences_but_not_to_padding():
    m = CrossAttention(8, 2, context_dim=6).double()
    x = torch.randn(2, 3, 8, dtype=torch.double, requires_grad=True)
    c = torch.randn(2, 5, 6, dtype=torch.double, requires_grad=True)
    keep = padding_mask([5, 2], 5)
    for need_weights in (False, True):
        assert torch.autograd.gradcheck(lambda a, b: m(a, b, attn_mask=keep, need_weights=need_weights)[0], (x, c))
    out, _ = m(x, c, attn_mask=keep)
    out.square().sum().backward()
    assert torch.all(c.grad[1, 2:] == 0) and c.grad[1, :2].abs().sum() > 0 and x.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())


def test_fully_masked_query_row_gives_zero_not_nan():
    m = CrossAttention(8, 2, bias=False).eval()
    x = torch.randn(1, 2, 8, requires_grad=True)
    c = torch.randn(1, 3, 8)
    mask = torch.tensor([[True, False, True], [False, False, False]])   # query 1 sees nothing
    for need_weights in (False, True):
        out, w = m(x, c, attn_mask=mask, need_weights=need_weights)
        assert torch.all(out[0, 1] == 0)            # no bias: zero head output -> zero output
        if need_weights:
            assert torch.all(w[0, :, 1] == 0)
        out.sum().backward()
        assert torch.isfinite(x.grad).all()
        x.grad = None


def test_float_mask_is_added():
    m = CrossAttention(8, 2).eval()
    x, c = torch.randn(2, 3, 8), torch.randn(2, 4, 8)
    bias = torch.randn(2, 2, 3, 4)
    _, w = m(x, c, attn_mask=bias, need_weights=True)
    _, w0 = m(x, c, need_weights=True)
    expected = torch.softmax(torch.log(w0) + bias, dim=-1)
    torch.testing.assert_close(w, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(m(x, c, attn_mask=bias)[0], m(x, c, attn_mask=bias, need_weights=True)[0])


def test_queries_come_from_x():
    """Swapping the roles changes the output length: the output has one row per query token."""
    m = CrossAttention(8, 2).eval()
    x, c = torch.randn(1, 3, 8), torch.randn(1, 7, 8)
    assert m(x, c)[0].shape == (1, 3, 8) and m(c, x)[0].shape == (1, 7, 8)
    x2 = x.clone()
    x2[0, 0] += 1                                       # changing query 0 changes only output row 0
    d = (m(x2, c)[0] - m(x, c)[0]).abs().amax(-1)[0]
    assert d[0] > 0 and torch.all(d[1:] == 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_close_to_fp32(dtype):
    m = CrossAttention(16, 2, context_dim=8).eval()
    x, c = torch.randn(2, 5, 16), torch.randn(2, 6, 8)
    keep = padding_mask([6, 3], 6)
    want, _ = m(x, c, attn_mask=keep)
    mh = m.to(dtype)
    for need_weights in (False, True):
        got, w = mh(x.to(dtype), c.to(dtype), attn_mask=keep, need_weights=need_weights)
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)


def test_dropout_only_while_training():
    m = CrossAttention(8, 2, dropout=0.5)
    x, c = torch.randn(2, 4, 8), torch.randn(2, 5, 8)
    m.eval()
    torch.testing.assert_close(m(x, c)[0], m(x, c, need_weights=True)[0])
    m.train()
    torch.manual_seed(1)
    a = m(x, c, need_weights=True)[0]
    torch.manual_seed(2)
    b = m(x, c, need_weights=True)[0]
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("kwargs,match", [
    (dict(d_model=10, num_heads=3), "d_model=10 is not divisible by num_heads=3"),
    (dict(d_model=8, num_heads=2, context_dim=0), "context_dim must be a positive integer"),
    (dict(d_model=8, num_heads=0), "num_heads must be a positive integer"),
    (dict(d_model=8, num_heads=2, dropout=1.0), "dropout must be in"),
])
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CrossAttention(**kwargs)


def test_bad_inputs():
    m = CrossAttention(8, 2, context_dim=6)
    with pytest.raises(ValueError, match="context has last dimension 8.*context_dim=6"):
        m(torch.randn(1, 3, 8), torch.randn(1, 4, 8))
    with pytest.raises(ValueError, match="x has last dimension 6.*d_model=8"):
        m(torch.randn(1, 3, 6), torch.randn(1, 4, 6))
    with pytest.raises(ValueError, match="same batch size, got B=2 and B=3"):
        m(torch.randn(2, 3, 8), torch.randn(3, 4, 6))
    with pytest.raises(ValueError, match=r"x must have 3 dimensions, got shape \(3, 8\)"):
        m(torch.randn(3, 8), torch.randn(1, 4, 6))
    for need_weights in (False, True):
        with pytest.raises(ValueError, match=r"does not broadcast.*Lq=3, Lk=4"):
            m(torch.randn(1, 3, 8), torch.randn(1, 4, 6), attn_mask=torch.ones(3, 3, dtype=torch.bool),
              need_weights=need_weights)


# ---- lesson 04 demo (toy translation) and explorer ----------------------------------------------

from attn_course.demos import cross as demo  # noqa: E402
from attn_course.widgets.cross import TranslationExplorer, parse_digits  # noqa: E402


def test_toy_translation_data():
    src, tgt_in, tgt_out, lengths = demo.sample_batch(torch.Generator().manual_seed(0), 50)
    for b in range(50):
        n = int(lengths[b])
        digits = src[b, :n]
        assert len(set(digits.tolist())) == n and torch.all(src[b, n:] == demo.PAD)
        assert tgt_out[b, :n].tolist() == sorted(digits.tolist()) and torch.all(tgt_out[b, n:] == -100)
        assert tgt_in[b, 0] == demo.BOS and tgt_in[b, 1:n].tolist() == tgt_out[b, :n - 1].tolist()


def test_toy_translator_learns_the_alignment_and_ignores_padding():
    """The lesson's claims: >95% of sentences exactly right, each word looks most at its own digit."""
    model, losses = demo.train_translator(progress=False)
    assert losses[-1] < 0.05 and demo.exact_match(model, n=500) > 0.95
    src, _, tgt, _ = demo.sample_batch(torch.Generator().manual_seed(1), 200)
    _, w = demo.translate(model, src)
    assert torch.all(w.masked_select((src == demo.PAD)[:, None, None, :].expand_as(w)) == 0)
    real = tgt != -100
    source_pos = (src[:, None, :] == tgt[:, :, None]).float().argmax(-1)        # where each target digit sits
    assert (w[:, 0].argmax(-1) == source_pos)[real].float().mean() > 0.95


def test_translation_explorer_logic():
    torch.manual_seed(0)
    ex = TranslationExplorer(demo.ToyTranslator())               # untrained: the logic does not care
    v = ex.update("7 1 8 3")
    assert v.tokens == ["7", "1", "8", "3", "<pad>", "<pad>"] and len(v.words) == 4
    assert v.weights.shape == (1, 4, 6) and v.pad_weight == 0.0
    torch.testing.assert_close(v.weights.sum(-1), torch.ones(1, 4))
    assert v.alignment == v.weights[0].argmax(-1).tolist() and v.figure is not None
    assert parse_digits("3,1,4") == [3, 1, 4]
    for bad, match in (("12", "3 to 6 distinct digits, got 2"), ("1123", "distinct"), ("1a2b3", "digits only")):
        with pytest.raises(ValueError, match=match):
            parse_digits(bad)
    box = ex.widget()
    box.controls["text"].value = "9 0 5"                         # redraws without raising
    box.controls["text"].value = "9"                             # a bad input is shown, not raised


@pytest.mark.parametrize("Lq,Lk", [(0, 5), (4, 0), (0, 0)])
def test_empty_query_or_context_behaves_like_sdpa(Lq, Lk):
    """No queries: an empty output. No context tokens: each query's attention output is 0 (SDPA's answer),
    so the layer returns out_proj's bias; the explicit path equals the fused one, weights (B, H, Lq, 0)."""
    torch.manual_seed(0)
    m = CrossAttention(16, 4, context_dim=12).double().eval()
    x, c = torch.randn(2, Lq, 16, dtype=torch.float64), torch.randn(2, Lk, 12, dtype=torch.float64)
    out, w = m(x, c, need_weights=True)
    fast, _ = m(x, c)
    assert out.shape == (2, Lq, 16) and w.shape == (2, 4, Lq, Lk)
    torch.testing.assert_close(out, fast)
    if Lq and not Lk:
        torch.testing.assert_close(out, m.out_proj.bias.expand_as(out))
