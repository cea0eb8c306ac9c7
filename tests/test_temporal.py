"""TemporalAttention against the paper's formula computed directly in fp64, and its properties."""
import math

import pytest
import torch

from attn_course import TemporalAttention
from attn_course.masks import padding_mask
from attn_course.mha import split_heads
from attn_course.temporal import time_matrix


def params64(m):
    return {n: t.detach().double() for n, t in m.named_parameters()}


def formula(m: TemporalAttention, x, time, keep=None):
    """Loop over samples and heads in fp64: softmax(Q_h (T_hᵀT_h/‖T_h‖_F) K_hᵀ/√d_h) V_h, concat, W_O."""
    p = params64(m)
    lin = lambda a, n: a.double() @ p[f"{n}.weight"].T + p[f"{n}.bias"]
    B, L, _ = x.shape
    d = m.head_dim
    outs, ws = [], []
    for b in range(B):
        Q, K, V = lin(x[b], "q_proj"), lin(x[b], "k_proj"), lin(x[b], "v_proj")
        T = lin(time[b], "t_proj").expand(L, m.d_model)              # (L, d_model): one row per token
        heads, wb = [], []
        for h in range(m.num_heads):
            sl = slice(h * d, (h + 1) * d)
            Th = T[:, sl]
            S = Q[:, sl] @ (Th.T @ Th / torch.linalg.norm(Th)) @ K[:, sl].T / math.sqrt(d)
            if keep is not None:
                S = S.masked_fill(~keep[b][None, :], float("-inf"))
            w = torch.softmax(S, dim=-1)
            wb.append(w)
            heads.append(w @ V[:, sl])
        ws.append(torch.stack(wb))
        outs.append(torch.cat(heads, -1) @ p["out_proj.weight"].T + p["out_proj.bias"])
    return torch.stack(outs), torch.stack(ws)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("B,L,d_model,H", [(2, 5, 16, 4), (3, 7, 12, 1), (1, 3, 8, 2)])
def test_matches_formula(need_weights, per_token, B, L, d_model, H):
    m = TemporalAttention(d_model, H, time_dim=6).eval()
    x = torch.randn(B, L, d_model)
    time = torch.randn(B, L if per_token else 1, 6)
    out, w = m(x, time, need_weights=need_weights)
    ref_out, ref_w = formula(m, x, time)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-4)
    if need_weights:
        torch.testing.assert_close(w.double(), ref_w, atol=1e-6, rtol=1e-4)
    else:
        assert w is None


def test_per_sequence_time_equals_the_same_time_on_every_token():
    m = TemporalAttention(16, 4, 5).eval()
    x, t = torch.randn(2, 6, 16), torch.randn(2, 1, 5)
    torch.testing.assert_close(m(x, t)[0], m(x, t.expand(2, 6, 5))[0])


def batchwide_scores(m, x, time):
    """The authors' normalisation: one norm over the whole (B, H, L, d_h) time tensor."""
    from attn_course.mha import split_heads
    q, k = split_heads(m.q_proj(x), m.num_heads), split_heads(m.k_proj(x), m.num_heads)
    T = split_heads(m.t_proj(time), m.num_heads).expand_as(q)
    return q @ T.transpose(-2, -1) @ (T / T.norm(2.0)) @ k.transpose(-2, -1) / math.sqrt(m.head_dim)


def test_sample_does_not_depend_on_its_batch():
    m = TemporalAttention(16, 4, 5).eval()
    x, t = torch.randn(4, 6, 16), torch.randn(4, 6, 5)
    t[2:] *= 10                                           # other samples with much larger time embeddings
    for need_weights in (False, True):
        full, _ = m(x, t, need_weights=need_weights)
        alone, _ = m(x[:1], t[:1], need_weights=need_weights)
        torch.testing.assert_close(full[:1], alone, atol=1e-6, rtol=1e-5)
    # the batch-wide norm of the authors' code does depend on the batch (the pitfall the lesson shows)
    with torch.no_grad():
        assert not torch.allclose(batchwide_scores(m, x, t)[:1], batchwide_scores(m, x[:1], t[:1]), rtol=1e-2)


def test_one_time_per_sequence_gives_rank_one_scores_that_factorise():
    m = TemporalAttention(16, 2, 3).eval()
    B, L, d = 2, 6, m.head_dim
    x, time = torch.randn(B, L, 16, dtype=torch.double), torch.randn(B, 1, 3, dtype=torch.double)
    m = m.double()
    _, w = m(x, time, need_weights=True)
    p = params64(m)
    for b in range(B):
        Q = x[b] @ p["q_proj.weight"].T + p["q_proj.bias"]
        K = x[b] @ p["k_proj.weight"].T + p["k_proj.bias"]
        t = time[b, 0] @ p["t_proj.weight"].T + p["t_proj.bias"]
        for h in range(2):
            sl = slice(h * d, (h + 1) * d)
            a, c = Q[:, sl] @ t[sl], K[:, sl] @ t[sl]               # Q t̄ and K t̄, (L,)
            S = math.sqrt(L) / (t[sl].norm() * math.sqrt(d)) * torch.outer(a, c)
            torch.testing.assert_close(w[b, h], torch.softmax(S, -1), atol=1e-10, rtol=1e-8)
            assert torch.linalg.matrix_rank(S).item() == 1
    # per-token times break the factorisation (rank up to min(L, d_h, time_dim + 1) = 4 here)
    t_tok = torch.randn(B, L, 3, dtype=torch.double)
    T = m.t_proj(t_tok)[0, :, :d]
    Q, K = m.q_proj(x)[0, :, :d], m.k_proj(x)[0, :, :d]
    S_tok = Q @ (T.T @ T) @ K.T
    assert torch.linalg.matrix_rank(S_tok).item() == 4


def test_changing_the_time_changes_the_output():
    m = TemporalAttention(16, 4, 5).eval()
    x, t = torch.randn(2, 6, 16), torch.randn(2, 1, 5)
    out, w = m(x, t, need_weights=True)
    out2, w2 = m(x, t + torch.randn(2, 1, 5), need_weights=True)
    assert (out - out2).abs().amax() > 1e-3 and (w - w2).abs().amax() > 1e-3


def test_time_matrix_is_symmetric_and_per_index():
    T = torch.randn(3, 2, 5, 4, dtype=torch.double)
    M = time_matrix(T)
    torch.testing.assert_close(M, M.transpose(-2, -1))
    torch.testing.assert_close(M[1, 0], T[1, 0].T @ T[1, 0] / torch.sqrt((T[1, 0] ** 2).sum()))
    assert torch.all(time_matrix(torch.zeros(2, 3, 4)) == 0)


def test_time_mask_makes_padding_invisible():
    m = TemporalAttention(16, 4, 5).eval()
    L, n = 7, 4
    x, t = torch.randn(1, n, 16), torch.randn(1, n, 5)
    alone, _ = m(x, t)
    xp = torch.cat([x, torch.randn(1, L - n, 16)], 1)
    tp = torch.cat([t, torch.randn(1, L - n, 5)], 1)                   # padding has (garbage) times too
    keep = padding_mask([n], L)
    for need_weights in (False, True):
        padded, _ = m(xp, tp, attn_mask=keep, time_mask=keep[:, 0, 0], need_weights=need_weights)
        torch.testing.assert_close(padded[:, :n], alone, atol=1e-5, rtol=1e-5)
    # one time per sequence: without time_mask, ‖T‖ counts L rows instead of n, the scores change
    ts = torch.randn(1, 1, 5)
    ok, _ = m(xp, ts, attn_mask=keep, time_mask=keep[:, 0, 0])
    torch.testing.assert_close(ok[:, :n], m(x, ts)[0], atol=1e-5, rtol=1e-5)
    leaky, _ = m(xp, ts, attn_mask=keep)
    assert not torch.allclose(leaky[:, :n], ok[:, :n], atol=1e-4)
    # ... because the padded copies of t̄ multiply M (hence the scores) by exactly √(L/n)
    T = split_heads(m.t_proj(ts), m.num_heads).expand(1, m.num_heads, L, m.head_dim).detach()
    ratio = time_matrix(T) / time_matrix(T, keep[:, 0])
    torch.testing.assert_close(ratio, torch.full_like(ratio, math.sqrt(L / n)))


def test_gradients():
    m = TemporalAttention(8, 2, 3).double()
    x = torch.randn(2, 4, 8, dtype=torch.double, requires_grad=True)
    t = torch.randn(2, 1, 3, dtype=torch.double, requires_grad=True)
    for need_weights in (False, True):
        assert torch.autograd.gradcheck(lambda a, b: m(a, b, need_weights=need_weights)[0], (x, t))
    m(x, t)[0].square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_close_to_fp32(dtype):
    m = TemporalAttention(16, 2, 4).eval()
    x, t = torch.randn(2, 5, 16), torch.randn(2, 5, 4)
    want, _ = m(x, t)
    mh = m.to(dtype)
    for need_weights in (False, True):
        got, _ = mh(x.to(dtype), t.to(dtype), need_weights=need_weights)
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("kwargs,match", [
    (dict(d_model=10, num_heads=3, time_dim=4), "d_model=10 is not divisible by num_heads=3"),
    (dict(d_model=8, num_heads=2, time_dim=0), "time_dim must be a positive integer"),
    (dict(d_model=8, num_heads=2, time_dim=4, dropout=-0.1), "dropout must be in"),
])
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TemporalAttention(**kwargs)


def test_bad_inputs():
    m = TemporalAttention(8, 2, 4)
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"time must have shape \(B=2, L=5 or 1, time_dim=4\), got \(2, 3, 4\)"):
        m(x, torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match=r"got \(1, 1, 4\)"):
        m(x, torch.randn(1, 1, 4))
    with pytest.raises(ValueError, match="time has last dimension 3.*time_dim=4"):
        m(x, torch.randn(2, 1, 3))
    with pytest.raises(ValueError, match="x has last dimension 6.*d_model=8"):
        m(torch.randn(2, 5, 6), torch.randn(2, 1, 4))
    with pytest.raises(ValueError, match=r"time must have 3 dimensions, got shape \(2, 4\)"):
        m(x, torch.randn(2, 4))
    with pytest.raises(ValueError, match=r"time_mask must be a bool tensor of shape \(B=2, L=5\)"):
        m(x, torch.randn(2, 1, 4), time_mask=torch.ones(2, 1, 1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"does not broadcast.*Lq=5, Lk=5"):
        m(x, torch.randn(2, 1, 4), attn_mask=torch.ones(4, 4, dtype=torch.bool))


# ---- lesson 05 demo (period task), the authors' batch-wide norm, and the explorer -------------------

from attn_course.demos import temporal as demo  # noqa: E402
from attn_course.widgets.temporal import PeriodExplorer  # noqa: E402


def test_period_task_data():
    tokens, period, label = demo.sample_batch(torch.Generator().manual_seed(0), 100)
    G = len(demo.GADGETS[0])
    for b in range(100):
        gadgets = [t for t in tokens[b].tolist() if t < 12]
        assert sorted(g // G for g in gadgets) == [0, 1, 2]          # one gadget from each period
        assert label[b] in gadgets and label[b] // G == period[b]


def test_period_model_needs_and_uses_the_time():
    """The lesson's claims: >95% with the time, ~1/3 (chance) without; the map moves with the time."""
    model, _ = demo.train_period_model(300, seed=2, progress=False)
    blind, _ = demo.train_period_model(300, use_time=False, progress=False)
    assert demo.accuracy(model, 1000) > 0.95 and abs(demo.accuracy(blind, 1000, use_time=False) - 1 / 3) < 0.05
    tokens = demo.encode("we used the pager and our ipod with the smartphone")
    with torch.no_grad():
        w = [model(tokens, torch.tensor([p]), need_weights=True)[1] for p in range(3)]
    assert [int(wp[0, 0].sum(0).argmax()) for wp in w] == [3, 6, 9]     # pager, ipod, smartphone columns
    # rank one predicts that column: the largest b_j = k_j·t̄ where every a_i = q_i·t̄ > 0, the smallest where < 0
    with torch.no_grad():
        x = model.emb(tokens)
        q, k = model.attn.q_proj(x)[0], model.attn.k_proj(x)[0]                 # (L, d), one head
        for p, col in enumerate([3, 6, 9]):
            tbar = model.attn.t_proj(model.time_emb(torch.tensor([p])))[0]
            a, b = q @ tbar, k @ tbar
            assert (a > 0).all() or (a < 0).all()
            assert int(b.argmax() if (a > 0).all() else b.argmin()) == col
    # the authors' batch-wide norm: evaluated in a big batch (the lesson's 512), the same model loses its answers
    tokens, period, label = demo.sample_batch(torch.Generator().manual_seed(3), 512)
    with torch.no_grad():
        x, t = model.emb(tokens), model.time_emb(period)[:, None, :]
        wb = demo.batchwide_norm_weights(model.attn, x, t)
        y = (wb @ split_heads(model.attn.v_proj(x), 1))[:, 0]
        acc_batchwide = (model.head(model.attn.out_proj(y)).mean(1).argmax(-1) == label).float().mean()
    assert acc_batchwide < demo.accuracy(model, 1000) - 0.2          # the lesson's claim: 20 points lower


def test_batchwide_norm_reproduction():
    attn = TemporalAttention(8, 1, 3).eval()
    x, t = torch.randn(5, 6, 8), torch.randn(5, 1, 3)
    with torch.no_grad():
        alone = demo.batchwide_norm_weights(attn, x[:1], t[:1])
        # one sample, one head: the authors' norm is the per-sample-and-head norm
        torch.testing.assert_close(alone, attn(x[:1], t[:1], need_weights=True)[1], atol=1e-6, rtol=1e-5)
        batched = demo.batchwide_norm_weights(attn, x, t)[:1]
    assert (batched - alone).abs().amax() > 1e-3                      # ... but in a batch it changes


def test_period_explorer_logic():
    torch.manual_seed(0)
    ex = PeriodExplorer(demo.PeriodModel(num_heads=2))
    v = ex.update("we used the pager and our ipod with the smartphone", 1)
    assert v.weights.shape == (2, 10, 10) and v.tokens[3] == "pager" and v.answer in demo.VOCAB[:12]
    torch.testing.assert_close(v.weights.sum(-1), torch.ones(2, 10))
    assert v.top_key == int(v.weights.sum((0, 1)).argmax()) and 0 <= v.agree <= 1 and v.figure is not None
    with pytest.raises(ValueError, match=r"period must be an int in \[0, 3\), got 3"):
        ex.compute("we used the pager", 3)
    with pytest.raises(ValueError, match=r"unknown words \['laptop'\]"):
        ex.compute("we used the laptop", 0)
    box = ex.widget()
    box.controls["period"].value = 2
    box.controls["sentence"].value = "we used the laptop"               # shown, not raised


def test_period_model_with_batchwide_norm_reproduces_the_authors_norm():
    """``PeriodModel(batchwide_norm=True)``: the weights equal a direct fp64 computation with ONE Frobenius
    norm over the whole (B, H, L, d_h) time tensor, a sample's output depends on its batch mates, and
    gradients reach every parameter (the lesson trains through it)."""
    torch.manual_seed(0)
    model = demo.PeriodModel(num_heads=2, batchwide_norm=True)
    tokens, period, _ = demo.sample_batch(torch.Generator().manual_seed(0), 5)
    logits, w = model(tokens, period, need_weights=True)
    p = {n: t.detach().double() for n, t in model.named_parameters()}
    x = p["emb.weight"][tokens]                                               # (B, L, d)
    t = p["time_emb.weight"][period]                                          # (B, time_dim)
    lin = lambda a, n: a @ p[f"attn.{n}.weight"].T + p[f"attn.{n}.bias"]
    B, L, d = x.shape
    q, k = (lin(x, n).view(B, L, 2, d // 2).transpose(1, 2) for n in ("q_proj", "k_proj"))
    T = lin(t, "t_proj").view(B, 2, 1, d // 2).expand(B, 2, L, d // 2)
    norm = torch.sqrt((T ** 2).sum())                                         # one norm for the batch
    S = q @ (T.transpose(-2, -1) @ T / norm) @ k.transpose(-2, -1) / math.sqrt(d // 2)
    torch.testing.assert_close(w.double(), torch.softmax(S, -1), atol=1e-5, rtol=1e-4)
    alone, _ = model(tokens[:1], period[:1])
    assert (alone[0] - logits[0]).abs().max() > 1e-4
    logits.sum().backward()
    assert all(prm.grad is not None and prm.grad.abs().sum() > 0 for prm in model.parameters())
