"""MultiHeadAttention: parity with nn.MultiheadAttention, fast == explicit path, masks, errors."""
import pytest
import torch
from torch import nn
from torch.testing import assert_close

from attn_course import MultiHeadAttention
from attn_course.masks import causal_mask, padding_mask
from attn_course.mha import merge_heads, split_heads


def _pair(d_model=16, num_heads=4, bias=True, dtype=torch.float64):
    """Our module and nn.MultiheadAttention holding the same parameters."""
    ref = nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=True, dtype=dtype)
    ours = MultiHeadAttention(d_model, num_heads, bias=bias).to(dtype)
    with torch.no_grad():
        for proj, w in zip((ours.q_proj, ours.k_proj, ours.v_proj), ref.in_proj_weight.chunk(3)):
            proj.weight.copy_(w)
        ours.out_proj.weight.copy_(ref.out_proj.weight)
        if bias:
            for proj, b in zip((ours.q_proj, ours.k_proj, ours.v_proj), ref.in_proj_bias.chunk(3)):
                proj.bias.copy_(b)
            ours.out_proj.bias.copy_(ref.out_proj.bias)
    return ours, ref


@pytest.mark.parametrize("case", ["self", "causal", "cross", "padding"])
@pytest.mark.parametrize("bias", [True, False])
def test_parity_with_nn_multiheadattention(case, bias):
    ours, ref = _pair(bias=bias)
    B, Lq, Lk, d = 3, 5, 5 if case != "cross" else 7, 16
    q = torch.randn(B, Lq, d, dtype=torch.float64, requires_grad=True)
    kv = q if case != "cross" else torch.randn(B, Lk, d, dtype=torch.float64, requires_grad=True)
    mask = {"self": None, "cross": None, "causal": causal_mask(Lq),
            "padding": padding_mask([5, 3, 1], Lk)}[case]
    ref_mask = None
    if case == "causal":
        ref_mask = ~mask                                  # nn.MHA: True = blocked
    out_r, w_r = ref(q, kv, kv, attn_mask=ref_mask, average_attn_weights=False,
                     key_padding_mask=None if case != "padding" else ~mask[:, 0, 0, :])
    out_o, w_o = ours(q, kv, kv, attn_mask=mask, need_weights=True)
    assert w_o.shape == (B, 4, Lq, Lk)
    assert_close(out_o, out_r)
    assert_close(w_o, w_r)
    g = torch.randn_like(out_r)
    grads_r = torch.autograd.grad(out_r, [q, ref.in_proj_weight, ref.out_proj.weight], g)
    grads_o = torch.autograd.grad(out_o, [q, ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight,
                                          ours.out_proj.weight], g)
    assert_close(grads_o[0], grads_r[0])
    assert_close(torch.cat(grads_o[1:4]), grads_r[1])
    assert_close(grads_o[4], grads_r[2])
    out_fast, none = ours(q, kv, kv, attn_mask=mask)      # fused path agrees too
    assert none is None
    assert_close(out_fast, out_r)


@pytest.mark.parametrize("mask_kind", [None, "bool", "float", "is_causal"])
@pytest.mark.parametrize("shape", [(2, 6, 6), (1, 3, 9), (4, 8, 2)])
def test_fast_equals_explicit_fp32(mask_kind, shape):
    B, Lq, Lk = shape
    m = MultiHeadAttention(24, 3).eval()
    q, kv = torch.randn(B, Lq, 24), torch.randn(B, Lk, 24)
    kw = {}
    if mask_kind == "bool":
        kw["attn_mask"] = torch.rand(B, 1, Lq, Lk) > 0.3
    elif mask_kind == "float":
        kw["attn_mask"] = torch.randn(Lq, Lk)
    elif mask_kind == "is_causal":
        kw["is_causal"] = True
    fast, _ = m(q, kv, **kw)
    slow, w = m(q, kv, need_weights=True, **kw)
    assert_close(fast, slow, atol=1e-5, rtol=1e-4)
    rows = w.sum(-1)
    assert_close(rows[rows > 0], torch.ones_like(rows[rows > 0]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_runs_and_agrees(dtype):
    m = MultiHeadAttention(16, 2)
    x = torch.randn(2, 5, 16)
    want, _ = m(x, is_causal=True)
    m = m.to(dtype)
    fast, _ = m(x.to(dtype), is_causal=True)
    slow, w = m(x.to(dtype), is_causal=True, need_weights=True)
    assert fast.dtype == slow.dtype == w.dtype == dtype
    assert_close(fast.float(), want, atol=3e-2, rtol=3e-2)
    assert_close(slow.float(), want, atol=3e-2, rtol=3e-2)


def test_heads_are_independent_subspaces():
    """Output of head h (before W^O) depends only on rows h·d_h…(h+1)·d_h−1 of the projections."""
    m = MultiHeadAttention(8, 2, bias=False)
    x = torch.randn(1, 4, 8)
    heads = lambda: m.out_proj.register_forward_hook(lambda mod, inp, out: setattr(m, "_y", inp[0].clone()))
    h = heads()
    m(x)
    before = m._y
    with torch.no_grad():
        m.q_proj.weight[4:] += 1.0            # perturb head 1's queries only
    m(x)
    h.remove()
    assert_close(m._y[..., :4], before[..., :4])
    assert not torch.allclose(m._y[..., 4:], before[..., 4:])


def test_split_merge_roundtrip_and_view_bug_when_L_equals_dh():
    B, L, H, dh = 2, 4, 3, 4                   # L == d_h: the buggy view has the right shape
    x = torch.randn(B, L, H * dh)
    s = split_heads(x, H)
    assert_close(s, x.view(B, L, H, dh).transpose(1, 2))
    assert_close(merge_heads(s), x)
    buggy = x.view(B, H, L, dh)
    assert buggy.shape == s.shape and not torch.allclose(buggy, s)


def test_fully_masked_row_gives_zero_output_and_no_nan_grad():
    m = MultiHeadAttention(8, 2, bias=False)
    x = torch.randn(1, 3, 8, requires_grad=True)
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False
    for need in (False, True):
        out, _ = m(x, attn_mask=mask, need_weights=need)
        assert_close(out[0, 1], torch.zeros(8))
        (g,) = torch.autograd.grad(out.sum(), x)
        assert torch.isfinite(g).all()


def test_causal_output_ignores_future_tokens():
    m = MultiHeadAttention(16, 4)
    x = torch.randn(2, 6, 16)
    y = x.clone()
    y[:, 4:] = torch.randn(2, 2, 16)
    assert_close(m(x, is_causal=True)[0][:, :4], m(y, is_causal=True)[0][:, :4])


def test_dropout_only_in_training():
    m = MultiHeadAttention(8, 2, dropout=0.5)
    x = torch.randn(2, 5, 8)
    m.eval()
    assert_close(m(x)[0], m(x)[0])
    m.train()
    assert not torch.allclose(m(x)[0], m(x)[0])


def test_errors_name_sizes():
    with pytest.raises(ValueError, match="d_model=10 is not divisible by num_heads=3"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="num_heads must be a positive integer, got 0"):
        MultiHeadAttention(8, 0)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1.5"):
        MultiHeadAttention(8, 2, dropout=1.5)
    m = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="query has last dimension 6.*d_model=8"):
        m(torch.randn(1, 3, 6))
    with pytest.raises(ValueError, match="query must have 3 dimensions, got shape \\(3, 8\\)"):
        m(torch.randn(3, 8))
    with pytest.raises(ValueError, match=r"must share B"):
        m(torch.randn(2, 3, 8), torch.randn(1, 3, 8))
    with pytest.raises(ValueError, match=r"must share B"):
        m(torch.randn(1, 3, 8), torch.randn(1, 4, 8), torch.randn(1, 5, 8))
    for need in (False, True):
        with pytest.raises(ValueError, match=r"attn_mask of shape \(3, 4\) does not broadcast.*Lq=3, Lk=3"):
            m(torch.randn(1, 3, 8), attn_mask=torch.ones(3, 4, dtype=torch.bool), need_weights=need)
        with pytest.raises(ValueError, match="either attn_mask or is_causal"):
            m(torch.randn(1, 3, 8), attn_mask=torch.ones(3, 3, dtype=torch.bool), is_causal=True,
              need_weights=need)


# --- lesson 02's tiny task and the per-head explorer --------------------------------------------------

def test_neighbour_task_targets_are_prev_minus_next_cyclic():
    from attn_course.demos.heads import NeighbourTask
    task = NeighbourTask(vocab_size=10, seq_len=5)
    x = torch.tensor([[3, 1, 4, 1, 5]])
    assert task.targets(x).tolist() == [[(5 - 1) % 10, (3 - 4) % 10, (1 - 1) % 10, (4 - 5) % 10, (1 - 3) % 10]]
    xs, ys = task.sample(torch.Generator().manual_seed(0), 4)
    assert xs.shape == ys.shape == (4, 5) and torch.equal(ys, task.targets(xs))


def test_tiny_model_weights_and_training_step():
    from attn_course.demos.heads import NeighbourTask, evaluate, make_model, train
    task = NeighbourTask(vocab_size=6, seq_len=8)
    model = make_model(task, d_model=16, num_heads=2)
    logits, w = model(torch.zeros(3, 8, dtype=torch.long), need_weights=True)
    assert logits.shape == (3, 8, 6) and w.shape == (3, 2, 8, 8)
    losses = train(model, task, steps=20, batch_size=32, progress=False)
    assert losses[-1] < losses[0]
    assert 0.0 <= evaluate(model, task, batches=2) <= 1.0


def test_head_explorer_logic_and_widget():
    from attn_course.widgets.heads import HeadExplorer
    w = torch.zeros(2, 3, 3)
    w[0, :, 0] = 1.0                   # head 0: everyone looks at key 0
    w[1] = torch.eye(3)                # head 1: everyone looks at itself
    e = HeadExplorer(w[None], ["a", "b", "c"])
    v = e.compute(head=1, query=2)
    assert (v.top_key, v.top_weight) == (2, 1.0) and torch.equal(v.all_heads, w[:, 2])
    assert e.describe(head=0, query=2) == "head 0, query 2 ('c') puts 100% of its weight on key 0 ('a')"
    assert e.update(head=0, query=1).figure is not None
    box = e.widget()
    box.controls["head"].value = 1
    box.controls["query"].value = 2
    assert (e.view.head, e.view.query, e.view.top_key) == (1, 2, 2)
    with pytest.raises(ValueError, match=r"head must be an int in \[0, H=2\), got 2"):
        e.compute(head=2)
    with pytest.raises(ValueError, match=r"got 2 query and 2 key labels for weights of shape \(H=2, Lq=3, Lk=3\)"):
        HeadExplorer(w, ["a", "b"])


@pytest.mark.parametrize("Lq, Lk, is_causal", [(0, 0, False), (0, 3, False), (3, 0, False), (0, 0, True)])
def test_empty_sequences_need_weights_path_equals_fused_and_nn_mha(Lq, Lk, is_causal):
    """L = 0 (or a key/value of length 0): the explicit path returns what the fused (SDPA) path returns,
    weights of shape (B, H, Lq, Lk), and nn.MultiheadAttention agrees (it used to raise IndexError).
    Causal self-attention has one length, so only (0, 0) is causal."""
    ours, ref = _pair()
    x, kv = torch.randn(2, Lq, 16, dtype=torch.float64), torch.randn(2, Lk, 16, dtype=torch.float64)
    out, w = ours(x, kv, kv, is_causal=is_causal, need_weights=True)
    fast, none = ours(x, kv, kv, is_causal=is_causal)
    assert none is None and out.shape == (2, Lq, 16) and w.shape == (2, 4, Lq, Lk)
    assert_close(out, fast)
    if Lq:                                   # nn.MHA's own fast path refuses empty batches of queries
        assert_close(out, ref(x, kv, kv, need_weights=False)[0])
