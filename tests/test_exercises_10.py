"""Exercise set 10: the reference solutions and an alternative style pass; each common mistake fails with its hint."""
import math

import pytest
import torch
import torch.nn.functional as F

import exercise_kit
from exercise_kit import assert_all_pass, assert_hint


# ---- 10_additive_score ----

def additive_scores(q, k, W_q, W_k, w_v, tanh="pair"):
    hq, hk = q @ W_q.T, k @ W_k.T
    if tanh == "pair":
        return torch.tanh(hq[:, None] + hk[None]) @ w_v
    if tanh == "none":
        return (hq[:, None] + hk[None]) @ w_v
    return (torch.tanh(hq)[:, None] + torch.tanh(hk)[None]) @ w_v


def additive_einsum(q, k, W_q, W_k, w_v):
    return torch.einsum("ijh,h->ij", torch.tanh(torch.einsum("hd,id->ih", W_q, q)[:, None]
                                                + torch.einsum("hd,jd->jh", W_k, k)[None]), w_v)


def test_additive_score():
    assert_all_pass("10_additive_score", additive_scores)
    assert_all_pass("10_additive_score", additive_einsum)
    assert_hint("10_additive_score", lambda *a: additive_scores(*a, tanh="none"), "the tanh is missing")
    assert_hint("10_additive_score", lambda *a: additive_scores(*a, tanh="each"), "not around each projection")


def test_additive_transposed_is_named_where_it_can_be():
    res = __import__("exercise_kit").results("10_additive_score", lambda *a: additive_scores(*a).T)
    assert not any(ok for ok, _ in res)
    assert any("rows are queries" in msg for _, msg in res)


# ---- 10_linear_by_hand ----

phi = lambda x: F.elu(x) + 1


def linear_attn(q, k, v, eps=1e-6):
    S = phi(k).transpose(-2, -1) @ v
    z = phi(k).sum(-2)
    return (phi(q) @ S) / (phi(q) @ z[..., None] + eps)


def linear_attn_einsum(q, k, v):
    S = torch.einsum("bhle,bhlf->bhef", phi(k), v)            # builds no (L, E, Ev) either
    den = torch.einsum("bhle,bhe->bhl", phi(q), phi(k).sum(-2))
    return torch.einsum("bhle,bhef->bhlf", phi(q), S) / (den[..., None] + 1e-6)


def linear_attn_outer(q, k, v):
    """Legitimate but wasteful: an (L, E, Ev) outer product, still no Lq × Lk matrix."""
    S = (phi(k)[..., :, None] * v[..., None, :]).sum(-3)
    return (phi(q) @ S) / (phi(q) @ phi(k).sum(-2)[..., None] + 1e-6)


def quadratic(q, k, v):
    K = phi(q) @ phi(k).transpose(-2, -1)
    return K @ v / (K.sum(-1, keepdim=True) + 1e-6)


def test_linear_by_hand():
    for fn in (linear_attn, linear_attn_einsum, linear_attn_outer):
        assert_all_pass("10_linear_by_hand", fn)
    assert_hint("10_linear_by_hand", quadratic, "formed an Lq × Lk tensor")

    def per_head_loop(q, k, v):                 # each (b, h) forms its own Lq × Lk kernel matrix: forbidden too
        out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
        for b in range(q.shape[0]):
            for h in range(q.shape[1]):
                out[b, h] = quadratic(q[b, h], k[b, h], v[b, h])
        return out
    res = exercise_kit.results("10_linear_by_hand", per_head_loop)
    assert not any(ok for ok, _ in res) and all("formed an Lq × Lk tensor" in msg for _, msg in res), res
    assert_hint("10_linear_by_hand", lambda q, k, v: phi(q) @ (phi(k).transpose(-2, -1) @ v), "normaliser is missing")
    no_plus = lambda q, k, v: (F.elu(q) @ (F.elu(k).transpose(-2, -1) @ v)) / (F.elu(q) @ F.elu(k).sum(-2)[..., None] + 1e-6)
    assert_hint("10_linear_by_hand", no_plus, "without the +1")


# ---- 10_recurrent_step ----

def rnn_step(S, z, q, k, v, read_first=False, normalise=True):
    S_new = S + phi(k)[:, :, None] * v[:, None, :]
    z_new = z + phi(k)
    S_r, z_r = (S, z) if read_first else (S_new, z_new)
    num = torch.einsum("be,bef->bf", phi(q), S_r)
    out = num / ((phi(q) * z_r).sum(-1, keepdim=True) + 1e-6) if normalise else num
    return out, S_new, z_new


def rnn_step_bmm(S, z, q, k, v):
    S = S + torch.bmm(phi(k)[:, :, None], v[:, None, :])
    z = z + phi(k)
    out = torch.bmm(phi(q)[:, None, :], S)[:, 0] / (torch.bmm(phi(q)[:, None, :], z[:, :, None])[:, 0] + 1e-6)
    return out, S, z


def test_recurrent_step():
    assert_all_pass("10_recurrent_step", rnn_step)
    assert_all_pass("10_recurrent_step", rnn_step_bmm)
    assert_hint("10_recurrent_step", lambda *a: rnn_step(*a, read_first=True), "off by one")
    assert_hint("10_recurrent_step", lambda *a: rnn_step(*a, normalise=False), "normaliser is missing")

    def raw_k(S, z, q, k, v):                                  # state updated with k instead of φ(k)
        S_new, z_new = S + k[:, :, None] * v[:, None, :], z + k
        return (phi(q)[:, None] @ S_new)[:, 0] / ((phi(q) * z_new).sum(-1, keepdim=True) + 1e-6), S_new, z_new
    assert_hint("10_recurrent_step", raw_k, "not k_t itself")

    def replace(S, z, q, k, v):
        out, S_new, z_new = rnn_step(S, z, q, k, v)
        return out, S_new - S, z_new - z
    assert_hint("10_recurrent_step", replace, "ADD the new token")

    def in_place(S, z, q, k, v):                # right values, but the prompt forbids changing S and z in place
        S += phi(k)[:, :, None] * v[:, None, :]
        z += phi(k)
        return (phi(q)[:, None] @ S)[:, 0] / ((phi(q) * z).sum(-1, keepdim=True) + 1e-6), S, z
    res = exercise_kit.results("10_recurrent_step", in_place)
    assert not any(ok for ok, _ in res) and all("in place" in msg for _, msg in res), res


def test_recurrent_step_matches_the_package():
    """The judge's recurrence is the package's linear_attention_step."""
    from attn_course.grading.exercises import get
    from attn_course.linear import LinearAttentionState, linear_attention_step
    ex = get("10_recurrent_step")
    for case in ex.cases(torch.Generator().manual_seed(0)):
        i = case.inputs
        out, st = linear_attention_step(i["q"], i["k"], i["v"], LinearAttentionState(i["S"], i["z"]))
        want = ex.expected(case)
        torch.testing.assert_close(out, want["out"])
        torch.testing.assert_close(st.S, want["S"])


# ---- 10_crossover ----

def crossover(E, Ev):
    L = 1
    while 2 * L * E * Ev * 2 + L * E + 2 * L * E >= 2 * L * L * (E + Ev):
        L += 1
    return L


def crossover_closed_form(E, Ev):
    return math.floor((4 * E * Ev + 3 * E) / (2 * (E + Ev))) + 1       # first integer strictly above the root


def test_crossover():
    assert_all_pass("10_crossover", crossover)
    assert_all_pass("10_crossover", crossover_closed_form)
    assert_hint("10_crossover", lambda E, Ev: math.floor((4 * E * Ev + 3 * E) / (2 * E)) + 1, "TWO L×L matmuls")
    assert_hint("10_crossover", lambda E, Ev: math.ceil((4 * E * Ev + 3 * E) / (2 * (E + Ev))), "strictly FEWER",
                every=False)
    assert_hint("10_crossover", lambda E, Ev: crossover(E, Ev) - 1, "last L where softmax", every=False)


def test_crossover_is_about_d():
    """E = Ev = 64 (the lesson's head size): linear attention wins from L = 65 on — L ≈ d."""
    assert crossover(64, 64) == 65


# ---- 10_find_the_bug ----

def causal_linear_attention(q, k, v, plus_one=True, normaliser=True, off_by_one=False, eps=1e-6):
    phi_q, phi_k = (F.elu(q) + 1, F.elu(k) + 1) if plus_one else (F.elu(q), F.elu(k))
    kv = torch.einsum("...le,...lf->...lef", phi_k, v)
    S = kv.cumsum(-3) - (kv if off_by_one else 0)
    out = torch.einsum("...le,...lef->...lf", phi_q, S)
    if not normaliser:
        return out
    z = phi_k.cumsum(-2) - (phi_k if off_by_one else 0)
    return out / ((phi_q * z).sum(-1, keepdim=True) + eps)


def causal_loop(q, k, v):
    outs = []
    S = torch.zeros(*q.shape[:-2], q.shape[-1], v.shape[-1], dtype=q.dtype)
    z = torch.zeros(*q.shape[:-2], q.shape[-1], dtype=q.dtype)
    for t in range(q.shape[-2]):
        S = S + phi(k[..., t, :])[..., :, None] * v[..., t, None, :]
        z = z + phi(k[..., t, :])
        outs.append((phi(q[..., t, None, :]) @ S)[..., 0, :] / ((phi(q[..., t, :]) * z).sum(-1, keepdim=True) + 1e-6))
    return torch.stack(outs, -2)


@pytest.mark.parametrize("kw,fragments", [
    (dict(plus_one=False, normaliser=False, off_by_one=True), ["+ 1", "normaliser is missing", "off by one"]),
    (dict(plus_one=False), ["+ 1"]),
    (dict(normaliser=False), ["normaliser is missing"]),
    (dict(off_by_one=True), ["off by one"]),
    (dict(plus_one=False, off_by_one=True), ["+ 1", "off by one"]),
])
def test_find_the_bug(kw, fragments):
    fn = lambda q, k, v: causal_linear_attention(q, k, v, **kw)
    res = __import__("exercise_kit").results("10_find_the_bug", fn)
    assert not any(ok for ok, _ in res), res
    for _, msg in res:
        assert msg.startswith("still there:"), msg
        for f in ("+ 1", "normaliser is missing", "off by one"):
            assert (f in msg) == (f in fragments), (f, msg)


def test_find_the_bug_fixed():
    assert_all_pass("10_find_the_bug", causal_linear_attention)
    assert_all_pass("10_find_the_bug", causal_loop)
    from attn_course import linear_attention
    assert_all_pass("10_find_the_bug", lambda q, k, v: linear_attention(q, k, v, is_causal=True, chunk_size=3))


# ---- 10_chunked_scan (build: a state carried chunk to chunk) ----

def make_scan(intra="tril", state="after", accumulate=True, normalise=True, eps=1e-6):
    def chunked_linear_attention(phi_q, phi_k, v, chunk):
        B, H, L, E = phi_q.shape
        S, z = phi_q.new_zeros(B, H, E, v.shape[-1]), phi_q.new_zeros(B, H, E)
        outs = []
        for c0 in range(0, L, chunk):
            Q, K, V = phi_q[..., c0:c0 + chunk, :], phi_k[..., c0:c0 + chunk, :], v[..., c0:c0 + chunk, :]
            A = Q @ K.transpose(-2, -1)
            A = {"tril": A.tril(), "strict": A.tril(-1), "full": A}[intra]
            if state == "before":
                S, z = S + K.transpose(-2, -1) @ V, z + K.sum(-2)
            num = Q @ S + A @ V
            den = Q @ z[..., None] + A.sum(-1, keepdim=True) + eps
            outs.append(num / den if normalise else num)
            if state == "after":
                S = (S if accumulate else 0) + K.transpose(-2, -1) @ V
                z = (z if accumulate else 0) + K.sum(-2)
        return torch.cat(outs, -2)
    return chunked_linear_attention


def scan_all_chunks(phi_q, phi_k, v, chunk):
    """Another style: every chunk at once (padded), the earlier chunks' states by an exclusive cumsum over chunks."""
    from einops import rearrange
    L = phi_q.shape[-2]
    pad = -L % chunk
    Q, K, V = (rearrange(F.pad(t, (0, 0, 0, pad)), "b h (n c) e -> b h n c e", c=chunk) for t in (phi_q, phi_k, v))
    kv = torch.einsum("bhnce,bhncf->bhnef", K, V)
    S = kv.cumsum(2) - kv                                       # (B, H, n, E, Ev): chunks before n
    z = K.sum(3).cumsum(2) - K.sum(3)
    A = torch.einsum("bhnie,bhnje->bhnij", Q, K).tril()
    num = torch.einsum("bhnie,bhnef->bhnif", Q, S) + A @ V
    den = torch.einsum("bhnie,bhne->bhni", Q, z) + A.sum(-1) + 1e-6
    return rearrange(num / den[..., None], "b h n c f -> b h (n c) f")[..., :L, :]


def scan_cumsum(phi_q, phi_k, v, chunk):
    """Right values, but a state per position (B, H, L, E, Ev): the cumsum shortcut."""
    S = torch.einsum("bhle,bhlf->bhlef", phi_k, v).cumsum(2)
    num = torch.einsum("bhle,bhlef->bhlf", phi_q, S)
    return num / ((phi_q * phi_k.cumsum(2)).sum(-1, keepdim=True) + 1e-6)


def scan_quadratic(phi_q, phi_k, v, chunk):
    K = (phi_q @ phi_k.transpose(-2, -1)).tril()
    return K @ v / (K.sum(-1, keepdim=True) + 1e-6)


def test_chunked_scan():
    assert_all_pass("10_chunked_scan", make_scan())
    assert_all_pass("10_chunked_scan", scan_all_chunks)
    assert_hint("10_chunked_scan", make_scan(normalise=False), "normaliser is missing")
    assert_hint("10_chunked_scan", make_scan(eps=0.0), "eps is missing")
    assert_hint("10_chunked_scan", make_scan(eps=2e-6), "eps is added twice", every=False)   # the tiny case
    assert_hint("10_chunked_scan", make_scan(intra="full"), "not causal inside the chunk")
    assert_hint("10_chunked_scan", make_scan(intra="strict"), "diagonal is excluded")
    assert_hint("10_chunked_scan", make_scan(state="before"), "updated BEFORE")
    assert_hint("10_chunked_scan", make_scan(accumulate=False), "accumulate every earlier chunk")


def test_chunked_scan_property_every_case():
    """Right values through an L × L tensor or a state per position: 0 points, on every case."""
    for fn, fragment in [(scan_quadratic, "one head's L × L"), (scan_cumsum, "a state per position")]:
        for seed in (0, 1, 2):
            res = exercise_kit.results("10_chunked_scan", fn, seed)
            assert not any(ok for ok, _ in res) and all(fragment in msg for _, msg in res), res

    def per_head(phi_q, phi_k, v, chunk):                     # one head at a time: still an L × L matrix
        out = torch.empty(*phi_q.shape[:-1], v.shape[-1], dtype=v.dtype)
        for b in range(phi_q.shape[0]):
            for h in range(phi_q.shape[1]):
                out[b, h] = scan_quadratic(phi_q[b, h], phi_k[b, h], v[b, h], chunk)
        return out
    res = exercise_kit.results("10_chunked_scan", per_head)
    assert not any(ok for ok, _ in res) and all("one head's L × L" in msg for _, msg in res), res


def test_chunked_scan_cases_separate_the_two_limits():
    """Some case's state stack is smaller than L·L (only the second limit catches the cumsum), and L is not
    always a multiple of the chunk."""
    from attn_course.grading.exercises.lesson10 import _scan_limits
    cases = exercise_kit.get("10_chunked_scan").cases(torch.Generator().manual_seed(0))
    assert any(_scan_limits(c)[1] < _scan_limits(c)[0] for c in cases)
    assert sum(c.inputs["phi_q"].shape[-2] % c.params["chunk"] != 0 for c in cases) == 3


def test_chunked_scan_is_the_package_and_the_tail_is_named():
    from attn_course.linear import linear_attention
    assert_all_pass("10_chunked_scan", lambda q, k, v, C: linear_attention(q, k, v, is_causal=True, chunk_size=C,
                                                                           feature_map=lambda x: x))

    def reshape_only(phi_q, phi_k, v, chunk):              # assumes L is a multiple of the chunk
        B, H, L, E = phi_q.shape
        Q = phi_q.reshape(B, H, L // chunk, chunk, E)
        return scan_all_chunks(phi_q, phi_k, v, chunk) + 0 * Q.sum()
    res = exercise_kit.results("10_chunked_scan", reshape_only)
    assert any("L need not be a multiple of the chunk size" in msg for _, msg in res), res


def test_crossover_tie_names_both_mistakes():
    """Where the two counts tie at some L, '<=' and 'one too few' answer the same L: the hint names both."""
    res = exercise_kit.results("10_crossover", lambda E, Ev: crossover(E, Ev) - 1)
    tied = [msg for ok, msg in res if not ok and "strictly FEWER" in msg]
    assert tied and all("last L where softmax" in msg for msg in tied), res


def test_recurrent_step_query_without_feature_map_is_named():
    """The state is right (φ(k) was used) but the read-out uses q itself: the hint names the query's φ."""
    def raw_q(S, z, q, k, v):
        S_new, z_new = S + phi(k)[:, :, None] * v[:, None, :], z + phi(k)
        return (q[:, None] @ S_new)[:, 0] / ((q * z_new).sum(-1, keepdim=True) + 1e-6), S_new, z_new
    assert_hint("10_recurrent_step", raw_q, "query needs the feature map too")
