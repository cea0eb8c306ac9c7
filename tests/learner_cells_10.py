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

# ---- 10_chunked_scan: a state carried from chunk to chunk ---------------------------------------------------

_SCAN = '''
def chunked_linear_attention(phi_q, phi_k, v, chunk):
    B, H, L, E = phi_q.shape
    S = torch.zeros(B, H, E, v.shape[-1], dtype=v.dtype)
    z = torch.zeros(B, H, E, dtype=v.dtype)
    outs = []
    for c0 in range(0, L, chunk):
        Q, K, V = phi_q[..., c0:c0 + chunk, :], phi_k[..., c0:c0 + chunk, :], v[..., c0:c0 + chunk, :]
        {before}
        A = {intra}
        num = Q @ S + A @ V
        den = Q @ z.unsqueeze(-1) + A.sum(-1, keepdim=True){eps}
        outs.append({ratio})
        {after}
    return torch.cat(outs, dim=-2)
'''
_SOK = dict(before="", intra="torch.tril(Q @ K.transpose(-2, -1))", eps=" + 1e-6", ratio="num / den",
            after="S, z = S + K.transpose(-2, -1) @ V, z + K.sum(-2)")


def _scan(**change):
    return _SCAN.format(**{**_SOK, **change})


CELLS["10_chunked_scan"] = ("chunked_linear_attention", '''
import torch.nn.functional as F
from einops import rearrange

def chunked_linear_attention(phi_q, phi_k, v, chunk):
    """Every chunk at once: pad L up to n chunks (a zero phi(k) adds nothing), each chunk's (E, Ev) state,
    an EXCLUSIVE cumsum over the chunks (n states, not L), and the masked C x C block inside each chunk.
    F.scaled_dot_product_attention is not used."""
    L = phi_q.shape[-2]
    pad = (chunk - L % chunk) % chunk
    Q, K, V = (rearrange(F.pad(t, (0, 0, 0, pad)), "b h (n c) e -> b h n c e", c=chunk) for t in (phi_q, phi_k, v))
    per_chunk = torch.einsum("bhnce,bhncf->bhnef", K, V)
    S_before = per_chunk.cumsum(dim=2) - per_chunk
    z_before = K.sum(3).cumsum(dim=2) - K.sum(3)
    A = torch.einsum("bhnie,bhnje->bhnij", Q, K).tril()
    num = torch.einsum("bhnie,bhnef->bhnif", Q, S_before) + torch.einsum("bhnij,bhnjf->bhnif", A, V)
    den = torch.einsum("bhnie,bhne->bhni", Q, z_before) + A.sum(-1) + 1e-6
    return rearrange(num / den.unsqueeze(-1), "b h n c f -> b h (n c) f")[..., :L, :]
''', [
    (_scan(ratio="num"), "normaliser is missing"),
    (_scan(eps=""), "eps is missing"),
    (_scan(eps=" + 2e-6"), "eps is added twice"),
    (_scan(intra="Q @ K.transpose(-2, -1)"), "not causal inside the chunk"),
    (_scan(intra="torch.tril(Q @ K.transpose(-2, -1), diagonal=-1)"), "diagonal is excluded"),
    (_scan(before="S, z = S + K.transpose(-2, -1) @ V, z + K.sum(-2)", after=""), "updated BEFORE"),
    (_scan(after="S, z = K.transpose(-2, -1) @ V, K.sum(-2)"), "accumulate every earlier chunk"),
    # review 08-14 H-E1 (alt10.py): no carried state, O(L²) work, no tensor as large as L x L
    ('''
def chunked_linear_attention(phi_q, phi_k, v, chunk):
    L = phi_q.shape[-2]
    out = torch.empty_like(v)
    for c0 in range(0, L, chunk):                       # each query chunk against ALL earlier keys
        c1 = min(c0 + chunk, L)
        A = phi_q[..., c0:c1, :] @ phi_k[..., :c1, :].transpose(-2, -1)          # (B, H, C, c1)
        i = torch.arange(c0, c1)[:, None]; j = torch.arange(c1)[None, :]
        A = A * (j <= i)
        out[..., c0:c1, :] = (A @ v[..., :c1, :]) / (A.sum(-1, keepdim=True) + 1e-6)
    return out
''', "compare it with its own chunk only"),
    ('''
def chunked_linear_attention(phi_q, phi_k, v, chunk):
    L = phi_q.shape[-2]
    outs = []
    for i in range(L):                                  # one query at a time against its prefix
        a = (phi_q[..., i:i+1, :] @ phi_k[..., :i+1, :].transpose(-2, -1))     # (B, H, 1, i+1)
        outs.append((a @ v[..., :i+1, :]) / (a.sum(-1, keepdim=True) + 1e-6))
    return torch.cat(outs, -2)
''', "compare it with its own chunk only"),
    ('''
def chunked_linear_attention(phi_q, phi_k, v, chunk):
    L = phi_q.shape[-2]
    outs = []
    for i in range(L):                                  # the same, as broadcast-multiply-and-sum
        a = (phi_q[..., i:i+1, None, :] * phi_k[..., None, :i+1, :]).sum(-1)    # (B, H, 1, i+1)
        outs.append((a[..., None] * v[..., None, :i+1, :]).sum(-2) / (a.sum(-1, keepdim=True) + 1e-6))
    return torch.cat(outs, -2)
''', "compare it with its own chunk only"),
    ('''
def chunked_linear_attention(phi_q, phi_k, v, chunk):
    A = torch.tril(phi_q @ phi_k.transpose(-2, -1))               # the quadratic form: L x L
    return A @ v / (A.sum(-1, keepdim=True) + 1e-6)
''', "one head's L × L"),
    ('''
def chunked_linear_attention(phi_q, phi_k, v, chunk):
    S = torch.einsum("bhle,bhlf->bhlef", phi_k, v).cumsum(2)     # one state per position
    num = torch.einsum("bhle,bhlef->bhlf", phi_q, S)
    return num / ((phi_q * phi_k.cumsum(2)).sum(-1, keepdim=True) + 1e-6)
''', "a state per position"),
    ('''
def chunked_linear_attention(phi_q, phi_k, v, chunk):
    B, H, L, E = phi_q.shape
    n = L // chunk
    Q, K, V = (t.reshape(B, H, n, chunk, t.shape[-1]) for t in (phi_q, phi_k, v))   # L % chunk == 0 assumed
    kv = K.transpose(-2, -1) @ V
    S, z = kv.cumsum(2) - kv, K.sum(3).cumsum(2) - K.sum(3)
    A = torch.tril(Q @ K.transpose(-2, -1))
    out = (Q @ S + A @ V) / (Q @ z.unsqueeze(-1) + A.sum(-1, keepdim=True) + 1e-6)
    return out.reshape(B, H, L, -1)
''', "L need not be a multiple of the chunk size"),
    ('''
from attn_course.linear import linear_attention
def chunked_linear_attention(phi_q, phi_k, v, chunk):
    return linear_attention(phi_q, phi_k, v, is_causal=True, chunk_size=chunk, feature_map=lambda x: x)
''', "FORBIDDEN"),
])


ALSO_CORRECT = {"10_chunked_scan": [
    _scan(),                                            # the loop form, one running (S, z) carried across chunks
    _scan(intra="torch.tril(torch.einsum('bhie,bhje->bhij', Q, K))"),
]}
