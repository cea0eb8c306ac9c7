'''Learner-style cells for lesson 10 (linear and additive attention), in the format of
``tests/learner_cells.py``: ``CELLS[exercise_id] = (function name, correct cell, [(wrong cell, hint), ...])``.

Written for the suite, not copied from the solutions: each correct cell solves its exercise in another style
than the solution notebook (a double loop, einsum, bmm, a closed form, a token loop, every chunk at once);
the wrong cells are the misconceptions each judge promises to name, the forbidden shortcuts ("FORBIDDEN") and,
for the tiling/state exercises, the versions that break the property (an Lq × Lk matrix, a state per position).
'''

CELLS = {}

CELLS["10_additive_score"] = ("additive_scores", '''
def additive_scores(q, k, W_q, W_k, w_v):
    """One (query, key) pair at a time, as Bahdanau et al. write it (attn_course.additive is not used)."""
    scores = torch.empty(q.shape[0], k.shape[0], dtype=q.dtype)
    for i in range(q.shape[0]):
        for j in range(k.shape[0]):
            scores[i, j] = torch.dot(w_v, torch.tanh(W_q @ q[i] + W_k @ k[j]))
    return scores
''', [('''
def additive_scores(q, k, W_q, W_k, w_v):
    return ((q @ W_q.T)[:, None, :] + (k @ W_k.T)[None, :, :]) @ w_v
''', "the tanh is missing"), ('''
def additive_scores(q, k, W_q, W_k, w_v):
    return (torch.tanh(q @ W_q.T)[:, None, :] + torch.tanh(k @ W_k.T)[None, :, :]) @ w_v
''', "not around each projection"), ('''
def additive_scores(q, k, W_q, W_k, w_v):
    return torch.tanh((k @ W_k.T)[:, None, :] + (q @ W_q.T)[None, :, :]) @ w_v
''', "rows are queries"), ('''
from attn_course.additive import AdditiveAttention          # imported "to compare": still attn_course
def additive_scores(q, k, W_q, W_k, w_v):
    return torch.tanh((q @ W_q.T)[:, None, :] + (k @ W_k.T)[None, :, :]) @ w_v
''', "FORBIDDEN")])

CELLS["10_linear_by_hand"] = ("linear_attn", '''
import torch.nn.functional as F          # F.scaled_dot_product_attention is NOT used; F.elu is

def linear_attn(q, k, v):
    """einsum with named axes; the (E, Ev) state first, never phi(Q) phi(K)^T."""
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    state = torch.einsum("bhje,bhjf->bhef", fk, v)
    norm = torch.einsum("bhie,bhe->bhi", fq, fk.sum(dim=2))
    return torch.einsum("bhie,bhef->bhif", fq, state) / (norm.unsqueeze(-1) + 1e-6)
''', [('''
import torch.nn.functional as F
def linear_attn(q, k, v):
    K = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-2, -1)       # the Lq x Lk kernel matrix
    return K @ v / (K.sum(-1, keepdim=True) + 1e-6)
''', "formed an Lq × Lk tensor"), ('''
import torch.nn.functional as F
def linear_attn(q, k, v):
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            K = (F.elu(q[b, h]) + 1) @ (F.elu(k[b, h]) + 1).T
            out[b, h] = K @ v[b, h] / (K.sum(-1, keepdim=True) + 1e-6)
    return out
''', "formed an Lq × Lk tensor"), ('''
import torch.nn.functional as F
def linear_attn(q, k, v):
    return (F.elu(q) + 1) @ ((F.elu(k) + 1).transpose(-2, -1) @ v)
''', "normaliser is missing"), ('''
import torch.nn.functional as F
def linear_attn(q, k, v):
    S = F.elu(k).transpose(-2, -1) @ v
    return F.elu(q) @ S / (F.elu(q) @ F.elu(k).sum(-2)[..., None] + 1e-6)
''', "without the +1"), ('''
def linear_attn(q, k, v):
    w = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, -1)
    return w @ v
''', "that is softmax attention"), ('''
import torch.nn.functional as F
def linear_attn(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)
''', "FORBIDDEN")])

CELLS["10_recurrent_step"] = ("rnn_step", '''
import torch.nn.functional as F

def rnn_step(S, z, q, k, v):
    """bmm for the rank-one update and the read-out; S and z are not modified in place."""
    fk, fq = F.elu(k) + 1, F.elu(q) + 1
    S_next = S + torch.bmm(fk.unsqueeze(2), v.unsqueeze(1))
    z_next = z + fk
    num = torch.bmm(fq.unsqueeze(1), S_next).squeeze(1)
    den = torch.bmm(fq.unsqueeze(1), z_next.unsqueeze(2)).squeeze(1)
    return num / (den + 1e-6), S_next, z_next
''', [('''
import torch.nn.functional as F
def rnn_step(S, z, q, k, v):
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    out = (fq[:, :, None] * S).sum(1) / ((fq * z).sum(-1, keepdim=True) + 1e-6)     # reads before adding t
    return out, S + fk[:, :, None] * v[:, None, :], z + fk
''', "off by one"), ('''
import torch.nn.functional as F
def rnn_step(S, z, q, k, v):
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    S, z = S + fk[:, :, None] * v[:, None, :], z + fk
    return (fq[:, :, None] * S).sum(1), S, z
''', "normaliser is missing"), ('''
import torch.nn.functional as F
def rnn_step(S, z, q, k, v):
    fq = F.elu(q) + 1
    S, z = S + k[:, :, None] * v[:, None, :], z + k
    return (fq[:, :, None] * S).sum(1) / ((fq * z).sum(-1, keepdim=True) + 1e-6), S, z
''', "not k_t itself"), ('''
import torch.nn.functional as F
def rnn_step(S, z, q, k, v):
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    S_t, z_t = fk[:, :, None] * v[:, None, :], fk                # replaces the state
    return (fq[:, :, None] * (S + S_t)).sum(1) / ((fq * (z + z_t)).sum(-1, keepdim=True) + 1e-6), S_t, z_t
''', "ADD the new token"), ('''
import torch.nn.functional as F
def rnn_step(S, z, q, k, v):
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    S += fk[:, :, None] * v[:, None, :]
    z += fk
    return (fq[:, :, None] * S).sum(1) / ((fq * z).sum(-1, keepdim=True) + 1e-6), S, z
''', "in place"), ('''
import torch.nn.functional as F
def rnn_step(S, z, q, k, v):
    fk = F.elu(k) + 1
    S, z = S + fk[:, :, None] * v[:, None, :], z + fk
    return (q[:, :, None] * S).sum(1) / ((q * z).sum(-1, keepdim=True) + 1e-6), S, z
''', "query needs the feature map too"), ('''
from attn_course.linear import LinearAttentionState, linear_attention_step
def rnn_step(S, z, q, k, v):
    out, st = linear_attention_step(q, k, v, LinearAttentionState(S, z))
    return out, st.S, st.z
''', "FORBIDDEN")])

CELLS["10_crossover"] = ("crossover", '''
def crossover(E, Ev):
    """Closed form: linear < softmax  <=>  4·E·Ev + 3·E < 2·L·(E + Ev); the first integer strictly above."""
    return (4 * E * Ev + 3 * E) // (2 * (E + Ev)) + 1
''', [('''
def crossover(E, Ev):
    L = 1
    while 4 * L * E * Ev + 3 * L * E >= 2 * L * L * E:           # QK^T only
        L += 1
    return L
''', "TWO L×L matmuls"), ('''
def crossover(E, Ev):
    L = 1
    while 4 * L * E * Ev + 3 * L * E > 2 * L * L * (E + Ev):     # stops where the counts tie
        L += 1
    return L
''', "strictly FEWER"), ('''
def crossover(E, Ev):
    L = 1
    while 4 * L * E * Ev + 3 * L * E >= 2 * L * L * (E + Ev):
        L += 1
    return L - 1
''', "last L where softmax"), ('''
from attn_course.bench import linear as bench_linear
def crossover(E, Ev):
    L = 1
    while 4 * L * E * Ev + 3 * L * E >= 2 * L * L * (E + Ev):
        L += 1
    return L
''', "FORBIDDEN")])

CELLS["10_find_the_bug"] = ("causal_linear_attention", '''
import torch.nn.functional as F

def causal_linear_attention(q, k, v):
    """The RNN form, token by token (a state of E x Ev), instead of a prefix sum of states."""
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    S = torch.zeros(*q.shape[:-2], q.shape[-1], v.shape[-1], dtype=q.dtype)
    z = torch.zeros(*q.shape[:-2], q.shape[-1], dtype=q.dtype)
    outs = []
    for t in range(q.shape[-2]):
        S = S + fk[..., t, :, None] * v[..., t, None, :]
        z = z + fk[..., t, :]
        outs.append((fq[..., t, :, None] * S).sum(-2) / ((fq[..., t, :] * z).sum(-1, keepdim=True) + 1e-6))
    return torch.stack(outs, dim=-2)
''', [('''
import torch.nn.functional as F
def causal_linear_attention(q, k, v):
    fq, fk = F.elu(q), F.elu(k)                                   # the +1 is still missing
    kv = torch.einsum("...le,...lf->...lef", fk, v)
    num = torch.einsum("...le,...lef->...lf", fq, kv.cumsum(-3))
    return num / ((fq * fk.cumsum(-2)).sum(-1, keepdim=True) + 1e-6)
''', "+ 1"), ('''
import torch.nn.functional as F
def causal_linear_attention(q, k, v):
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    kv = torch.einsum("...le,...lf->...lef", fk, v)
    return torch.einsum("...le,...lef->...lf", fq, kv.cumsum(-3))
''', "normaliser is missing"), ('''
import torch.nn.functional as F
def causal_linear_attention(q, k, v):
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    kv = torch.einsum("...le,...lf->...lef", fk, v)
    num = torch.einsum("...le,...lef->...lf", fq, kv.cumsum(-3) - kv)
    return num / ((fq * (fk.cumsum(-2) - fk)).sum(-1, keepdim=True) + 1e-6)
''', "off by one"), ('''
from attn_course import linear_attention
def causal_linear_attention(q, k, v):
    return linear_attention(q, k, v, is_causal=True)
''', "FORBIDDEN")])

# ---- 10_chunked_scan: the chunk step, with the state the grader carries ------------------------------------

_SCAN = '''
def chunk_step(S, z, phi_q, phi_k, v):
    Q, K, V = phi_q, phi_k, v
    {before}
    A = {intra}
    num = Q @ S + A @ V
    den = Q @ z.unsqueeze(-1) + A.sum(-1, keepdim=True){eps}
    {after}
    return {ratio}, S, z
'''
_SOK = dict(before="", intra="torch.tril(Q @ K.transpose(-2, -1))", eps=" + 1e-6", ratio="num / den",
            after="S, z = S + K.transpose(-2, -1) @ V, z + K.sum(-2)")


def _scan(**change):
    return _SCAN.format(**{**_SOK, **change})


CELLS["10_chunked_scan"] = ("chunk_step", '''
def chunk_step(S, z, phi_q, phi_k, v):
    \"\"\"einsum throughout; the normaliser as one more value column of ones (F.scaled_dot_product_attention is
    not used).\"\"\"
    V1 = torch.cat([v, torch.ones_like(v[..., :1])], -1)                     # [V | 1]
    Sz = torch.cat([S, z.unsqueeze(-1)], -1)                                  # [S | z]
    A = torch.einsum("bhie,bhje->bhij", phi_q, phi_k).tril()
    nd = torch.einsum("bhie,bhef->bhif", phi_q, Sz) + torch.einsum("bhij,bhjf->bhif", A, V1)
    new = Sz + torch.einsum("bhje,bhjf->bhef", phi_k, V1)
    return nd[..., :-1] / (nd[..., -1:] + 1e-6), new[..., :-1], new[..., -1]
''', [
    (_scan(ratio="num"), "normaliser is missing"),
    (_scan(eps=""), "eps is missing"),
    (_scan(eps=" + 2e-6"), "eps is added twice"),
    (_scan(intra="Q @ K.transpose(-2, -1)"), "not causal inside the chunk"),
    (_scan(intra="torch.tril(Q @ K.transpose(-2, -1), diagonal=-1)"), "diagonal is excluded"),
    (_scan(before="S, z = S + K.transpose(-2, -1) @ V, z + K.sum(-2)", after=""), "updated BEFORE"),
    (_scan(after="S, z = K.transpose(-2, -1) @ V, K.sum(-2)"), "must accumulate"),
    # the review's M10-1 shortcut as a step: no carried state — every earlier chunk stashed, each query compared
    # with its whole prefix through a masked_fill (the products the old work counter lost)
    ('''
SEEN = []
def chunk_step(S, z, phi_q, phi_k, v):
    \"\"\"Stateless O(L^2): keep every chunk seen so far and compare each query with its whole prefix.\"\"\"
    if not SEEN or SEEN[-1][2].shape != S.shape or not torch.equal(SEEN[-1][2], S):
        SEEN.clear()                                        # not the state I returned last: a new sequence
    SEEN.append((phi_k, v, None))
    K = torch.cat([k for k, _, _ in SEEN], -2); V = torch.cat([x for _, x, _ in SEEN], -2)
    n, C = K.shape[-2], phi_q.shape[-2]
    i = torch.arange(n - C, n)[:, None]; j = torch.arange(n)[None, :]
    prod = (phi_q[..., :, None, :] * K[..., None, :, :]).masked_fill(~(j <= i)[..., None], 0.0)
    a = prod.sum(-1)
    out = (a[..., None] * V[..., None, :, :]).sum(-2) / (a.sum(-1, keepdim=True) + 1e-6)
    S_new = S + phi_k.transpose(-2, -1) @ v
    SEEN[-1] = (phi_k, v, S_new)
    return out, S_new, z + phi_k.sum(-2)
''', "read the earlier tokens from the S, z it is given"),
    ('''
from attn_course.linear import linear_attention
def chunk_step(S, z, phi_q, phi_k, v):
    out = linear_attention(phi_q, phi_k, v, is_causal=True, feature_map=lambda x: x)
    return out, S + phi_k.transpose(-2, -1) @ v, z + phi_k.sum(-2)
''', "FORBIDDEN"),
])


ALSO_CORRECT = {"10_chunked_scan": [
    _scan(),                                            # the plain chunk form
    _scan(intra="torch.tril(torch.einsum('bhie,bhje->bhij', Q, K))"),
    # the token-by-token recurrence inside the step (review M10-2): the same sums, allowed and said so in the prompt
    '''
def chunk_step(S, z, phi_q, phi_k, v):
    outs = []
    for t in range(phi_q.shape[-2]):                    # exercise 10.3's step, C times
        S = S + phi_k[..., t, :, None] * v[..., t, None, :]
        z = z + phi_k[..., t, :]
        q = phi_q[..., t, :]
        outs.append((q[..., :, None] * S).sum(-2) / ((q * z).sum(-1, keepdim=True) + 1e-6))
    return torch.stack(outs, -2), S, z
''',
]}
