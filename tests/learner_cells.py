'''Learner-style exercise cells for the grading-validity regression suite (issue 18), written for the suite
and NOT copied from the solutions: for every exercise of lessons 01-08, correct work in another style
(docstrings and comments that name forbidden APIs, variables named like them, a cell-level comparison
against SDPA) and the misconceptions whose hints the judges promise.

``CELLS[exercise_id] = (function name, correct cell, [(wrong cell, expected hint substring), ...])``.
A hint of ``"FORBIDDEN"`` means the cell must be rejected for a forbidden API.

Lessons 09-13 keep their cells in ``learner_cells_NN.py`` beside this file (same format); they are merged
into ``CELLS`` at the end of this module.
'''

CELLS = {}

# ---- lesson 01 -------------------------------------------------------------------------------------------

CELLS["01_attention_by_hand"] = ("my_attention", '''
import torch.nn.functional as F          # only for the docstring's sake: F.scaled_dot_product_attention is NOT used

def my_attention(q, k, v, mask=None):
    """What F.scaled_dot_product_attention computes (nn.MultiheadAttention and attn_course are not used):
    softmax written by hand with exp, so a fully masked row gives zeros."""
    softmax = None                                     # a name of my own
    s = torch.einsum("bhqe,bhke->bhqk", q, k) * q.shape[-1] ** -0.5
    if mask is not None:
        s = torch.where(mask, s, torch.tensor(float("-inf")))
    m = s.amax(-1, keepdim=True).clamp_min(-1e30)
    e = torch.exp(s - m)
    w = e / e.sum(-1, keepdim=True).clamp_min(1e-30)
    return w @ v, w
''', [('''
def my_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    w = torch.softmax(s, -1).nan_to_num(0.0)
    return w @ v, w
''', "your mask is inverted"), ('''
import torch.nn.functional as F
def my_attention(q, k, v, mask=None):
    w = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
        ~mask if mask is not None else torch.zeros((), dtype=torch.bool), float("-inf")), -1).nan_to_num(0.0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).nan_to_num(0.0), w
''', "FORBIDDEN")])

CELLS["01_causal_padding_mask"] = ("make_mask", '''
def make_mask(lengths, L):
    """Causal AND padded keys; attn_course.masks is not used (the text may say so)."""
    pos = torch.arange(L)
    causal = pos[None, :] <= pos[:, None]               # (L, L)
    real_key = pos[None, :] < lengths[:, None]           # (B, L)
    return (causal.unsqueeze(0) & real_key.unsqueeze(1)).unsqueeze(1)
''', [('''
def make_mask(lengths, L):
    pos = torch.arange(L)
    return ((pos[None, :] <= pos[:, None]).unsqueeze(0) & (pos[None, :] <= lengths[:, None]).unsqueeze(1)).unsqueeze(1)
''', "off by one"), ('''
def make_mask(lengths, L):
    return torch.ones(L, L, dtype=torch.bool).tril().expand(len(lengths), 1, L, L)
''', "only the causal part")])

CELLS["01_predict_shapes"] = ("predict_shapes", '''
def predict_shapes(q_shape, k_shape, v_shape):
    return tuple(q_shape[:-1]) + (v_shape[-1],), tuple(q_shape[:-1]) + (k_shape[-2],)
''', [('''
def predict_shapes(q_shape, k_shape, v_shape):
    return tuple(q_shape), tuple(q_shape[:-1]) + (k_shape[-2],)
''', "comes from the values")])

CELLS["01_fix_the_bug"] = ("fixed_attention", '''
import torch.nn.functional as F

def fixed_attention(q, k, v, mask):
    w = (q @ k.mT * q.shape[-1] ** -0.5).masked_fill(mask.logical_not(), float("-inf")).softmax(-1)
    return w @ v

# compare with PyTorch's fused kernel, as the exercise suggests
_q = torch.randn(1, 1, 4, 8)
_m = torch.ones(4, 4, dtype=torch.bool).tril()
assert torch.allclose(fixed_attention(_q, _q, _q, _m), F.scaled_dot_product_attention(_q, _q, _q, attn_mask=_m), atol=1e-5)
''', [('''
def fixed_attention(q, k, v, mask):
    s = (q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v
''', "the 1/√d_k scale is missing"), ('''
import torch.nn.functional as F
def fixed_attention(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
''', "FORBIDDEN")])

CELLS["01_score_std"] = ("score_std", '''
def score_std(d_k):
    return d_k ** 0.5, 1
''', [('''
def score_std(d_k):
    return float(d_k), 1.0
''', "variance")])

# ---- lesson 02 -------------------------------------------------------------------------------------------

CELLS["02_split_heads"] = ("split_heads", '''
def split_heads(x, num_heads):
    """Not attn_course.mha.split_heads: unflatten the features, then move the head axis."""
    return x.unflatten(-1, (num_heads, -1)).permute(0, 2, 1, 3)
''', [('''
def split_heads(x, num_heads):
    B, L, D = x.shape
    return x.view(B, num_heads, L, D // num_heads)
''', "cuts the flattened tokens")])

CELLS["02_merge_heads"] = ("merge_heads", '''
from einops import rearrange
def merge_heads(y):
    return rearrange(y, "b h l d -> b l (h d)")
''', [('''
def merge_heads(y):
    B, H, L, d = y.shape
    return y.reshape(B, L, H * d)
''', "without moving the head axis")])

CELLS["02_mha_forward"] = ("mha_forward", '''
import torch.nn.functional as F

def mha_forward(x, W_q, W_k, W_v, W_o, num_heads, causal):
    """By hand -- not F.scaled_dot_product_attention, not nn.MultiheadAttention."""
    B, L, D = x.shape
    heads = lambda t: t.unflatten(-1, (num_heads, -1)).transpose(1, 2)
    q, k, v = heads(F.linear(x, W_q)), heads(F.linear(x, W_k)), heads(F.linear(x, W_v))
    s = torch.einsum("bhid,bhjd->bhij", q, k) / (D // num_heads) ** 0.5
    if causal:
        s = s + torch.full((L, L), float("-inf")).triu(1)
    y = torch.einsum("bhij,bhjd->bihd", s.softmax(-1), v).flatten(2)
    return F.linear(y, W_o)
''', [('''
def mha_forward(x, W_q, W_k, W_v, W_o, num_heads, causal):
    B, L, D = x.shape
    q, k, v = ((x @ W.T).view(B, L, num_heads, -1).transpose(1, 2) for W in (W_q, W_k, W_v))
    s = q @ k.transpose(-2, -1) / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, L, D) @ W_o.T
''', "√d_model")])

CELLS["02_mha_flops"] = ("mha_flops", '''
def mha_flops(B, L, d_model, num_heads, head_dim):
    width = num_heads * head_dim
    return 8 * B * L * d_model * width + 4 * B * num_heads * L ** 2 * head_dim
''', [('''
def mha_flops(B, L, d_model, num_heads, head_dim):
    return 8 * B * L * d_model ** 2 + 4 * B * L ** 2 * d_model
''', "lesson's count"), ('''
def mha_flops(B, L, d_model, num_heads, head_dim):
    width = num_heads * head_dim
    return 6 * B * L * d_model * width + 4 * B * L ** 2 * width
''', "3 projections")])

# ---- lesson 03 -------------------------------------------------------------------------------------------

CELLS["03_expand_kv"] = ("expand_kv", '''
def expand_kv(k, num_heads):
    B, H_kv, L, d = k.shape
    G = num_heads // H_kv
    return k[:, :, None].expand(B, H_kv, G, L, d).reshape(B, num_heads, L, d)
''', [('''
def expand_kv(k, num_heads):
    return k.repeat(1, num_heads // k.shape[1], 1, 1)
''', ".repeat tiles the stack")])

CELLS["03_gqa_attention"] = ("gqa_attention", '''
def gqa_attention(q, k, v, causal):
    """Group the query heads next to their kv head: (B, H_kv, G, L, d); keys broadcast over G."""
    B, H, L, d = q.shape
    H_kv = k.shape[1]
    qg = q.view(B, H_kv, H // H_kv, L, d)
    s = qg @ k[:, :, None].transpose(-2, -1) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ v[:, :, None]).reshape(B, H, L, d)
''', [('''
def gqa_attention(q, k, v, causal):
    B, H, L, d = q.shape
    G = H // k.shape[1]
    s = q.view(B, G, k.shape[1], L, d) @ k.transpose(-2, -1) / math.sqrt(d)      # seed 000's grouping
    if causal:
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ v).view(B, H, L, d)
''', "blog post's grouping")])

CELLS["03_kv_cache_bytes"] = ("cache_bytes", '''
def cache_bytes(num_layers, num_heads, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element):
    """Like attn_course.memory.kv_cache_bytes, by hand."""
    kv_cache_bytes = 2 * num_kv_heads * head_dim * bytes_per_element      # my own variable
    return kv_cache_bytes * num_layers * seq_len * batch_size
''', [('''
def cache_bytes(num_layers, num_heads, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element):
    return 2 * num_heads * head_dim * bytes_per_element * num_layers * seq_len * batch_size
''', "only the num_kv_heads"), ('''
from attn_course.memory import kv_cache_bytes
def cache_bytes(num_layers, num_heads, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element):
    return 2 * num_kv_heads * head_dim * bytes_per_element * num_layers * seq_len * batch_size
''', "FORBIDDEN")])

CELLS["03_decode_step"] = ("decode_step", '''
def decode_step(x_t, W_q, W_k, W_v, W_o, num_heads, num_kv_heads, k_cache, v_cache):
    B, _, D = x_t.shape
    d = D // num_heads
    G = num_heads // num_kv_heads
    q = (x_t @ W_q.T).view(B, num_kv_heads, G, d)                       # one token: (B, H_kv, G, d)
    k_cache = torch.cat([k_cache, (x_t @ W_k.T).view(B, num_kv_heads, 1, d)], dim=2)
    v_cache = torch.cat([v_cache, (x_t @ W_v.T).view(B, num_kv_heads, 1, d)], dim=2)
    w = torch.einsum("bngd,bnld->bngl", q, k_cache).div(math.sqrt(d)).softmax(-1)
    y = torch.einsum("bngl,bnld->bngd", w, v_cache).reshape(B, 1, D)
    return y @ W_o.T, k_cache, v_cache
''', [('''
def decode_step(x_t, W_q, W_k, W_v, W_o, num_heads, num_kv_heads, k_cache, v_cache):
    B, _, D = x_t.shape
    d = D // num_heads
    G = num_heads // num_kv_heads
    q = (x_t @ W_q.T).view(B, 1, num_heads, d).transpose(1, 2)
    k, v = k_cache.repeat_interleave(G, 1), v_cache.repeat_interleave(G, 1)
    y = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), -1) @ v
    k_new = (x_t @ W_k.T).view(B, 1, num_kv_heads, d).transpose(1, 2)
    v_new = (x_t @ W_v.T).view(B, 1, num_kv_heads, d).transpose(1, 2)
    return (y.transpose(1, 2).reshape(B, 1, D) @ W_o.T, torch.cat([k_cache, k_new], 2),
            torch.cat([v_cache, v_new], 2))
''', "attend to itself")])

# ---- lesson 04 -------------------------------------------------------------------------------------------

CELLS["04_cross_attend"] = ("cross_attend", '''
def cross_attend(x, context, w_q, w_k, w_v, num_heads, keep=None):
    """nn.MultiheadAttention would need key_padding_mask = ~keep; here everything is by hand."""
    B, Lq, D = x.shape
    d_h = D // num_heads
    q = torch.einsum("bld,de->ble", x, w_q).unflatten(-1, (num_heads, d_h))          # (B, Lq, H, d_h)
    k = torch.einsum("blc,ce->ble", context, w_k).unflatten(-1, (num_heads, d_h))
    v = torch.einsum("blc,ce->ble", context, w_v).unflatten(-1, (num_heads, d_h))
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / d_h ** 0.5
    if keep is not None:
        s = s.masked_fill(~keep[:, None, None, :], float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v).reshape(B, Lq, D)
''', [('''
def cross_attend(x, context, w_q, w_k, w_v, num_heads, keep=None):
    B, Lq, D = x.shape
    split = lambda t: t.view(B, t.shape[1], num_heads, -1).transpose(1, 2)
    q, k, v = split(x @ w_q), split(context @ w_k), split(context @ w_v)
    s = q @ k.transpose(-2, -1) / math.sqrt(D)
    if keep is not None:
        s = s.masked_fill(~keep[:, None, None, :], float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2).reshape(B, Lq, D)
''', "1/√d_model")])

CELLS["04_mha_key_padding"] = ("mha_key_padding", '''
def mha_key_padding(lengths, max_len):
    """True = ignore (nn.MultiheadAttention's polarity); not attn_course's masks.padding_mask."""
    return ~(torch.arange(max_len) < lengths.unsqueeze(1))
''', [('''
def mha_key_padding(lengths, max_len):
    return torch.arange(max_len) < lengths[:, None]
''', "inverted"), ('''
def mha_key_padding(lengths, max_len):
    return torch.arange(max_len) > lengths[:, None]
''', "off by one")])

CELLS["04_predict_shapes"] = ("cross_shapes", '''
def cross_shapes(B, Lq, Lk, d_model, context_dim, num_heads):
    out_shape = (B, Lq, d_model)
    return out_shape, (B, num_heads, Lq, Lk)
''', [('''
def cross_shapes(B, Lq, Lk, d_model, context_dim, num_heads):
    return (B, Lq, context_dim), (B, num_heads, Lq, Lk)
''', "the output width is d_model")])

CELLS["04_split_cross_attention"] = ("split_cross_attention", '''
def split_cross_attention(q, k, v, num_image_tokens):
    """Two softmaxes (seed 002 without its 257)."""
    out = 0
    for part in (slice(0, num_image_tokens), slice(num_image_tokens, None)):
        w = (q @ k[..., part, :].transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1)
        out = out + w @ v[..., part, :]
    return out
''', [('''
def split_cross_attention(q, k, v, num_image_tokens):
    att = lambda kk, vv: (q @ kk.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1) @ vv
    return att(k[..., :257, :], v[..., :257, :]) + att(k[..., 257:, :], v[..., 257:, :])
''', "257")])

# ---- lesson 05 -------------------------------------------------------------------------------------------

CELLS["05_time_matrix"] = ("time_matrix", '''
def time_matrix(T, keep=None):
    if keep is not None:
        T = torch.where(keep[:, None, :, None], T, torch.zeros(()))
    norm = torch.linalg.matrix_norm(T)[..., None, None]          # Frobenius, per (sample, head)
    return torch.einsum("bhld,bhle->bhde", T, T) / norm
''', [('''
def time_matrix(T, keep=None):
    if keep is not None:
        T = T * keep[:, None, :, None]
    return T.transpose(-2, -1) @ T / T.norm()
''', "whole batch")])

CELLS["05_temporal_weights"] = ("temporal_weights", '''
def temporal_weights(q, k, T):
    """No F.scaled_dot_product_attention: softmax(Q M Kᵀ / √d) by hand."""
    M = T.mT @ T / torch.linalg.matrix_norm(T)[..., None, None]
    return torch.softmax(q @ M @ k.mT / math.sqrt(q.shape[-1]), dim=-1)
''', [('''
def temporal_weights(q, k, T):
    n = T.pow(2).sum((-2, -1), keepdim=True).sqrt()
    return torch.softmax((q @ k.mT + T @ T.mT / n) / math.sqrt(q.shape[-1]), dim=-1)
''', "you added the time")])

CELLS["05_rank_one_scale"] = ("period_scales", '''
def period_scales(L1, n1, L2, n2, d_h):
    """TᵀT = L1 t̄1 t̄1ᵀ + L2 t̄2 t̄2ᵀ; ‖T‖_F² adds the squared norms of all rows."""
    fro = (L1 * n1 ** 2 + L2 * n2 ** 2) ** 0.5
    return L1 / fro / d_h ** 0.5, L2 / fro / d_h ** 0.5
''', [('''
def period_scales(L1, n1, L2, n2, d_h):
    return math.sqrt(L1) / (n1 * math.sqrt(d_h)), math.sqrt(L2) / (n2 * math.sqrt(d_h))
''', "one-period factor")])

CELLS["05_video_frames"] = ("frames_to_sequences", '''
from einops import rearrange
def frames_to_sequences(x):
    return rearrange(x, "b f n c -> (b n) f c")
''', [('''
def frames_to_sequences(x):
    B, F, N, C = x.shape
    return x.reshape(B * N, F, C)
''', "without moving the frame axis"), ('''
def frames_to_sequences(x):
    B, F, N, C = x.shape
    return x.permute(2, 0, 1, 3).reshape(N * B, F, C)
''', "(n b)")])

# ---- lesson 06 -------------------------------------------------------------------------------------------

CELLS["06_spatial_pool"] = ("spatial_pool", '''
def spatial_pool(x):
    return torch.stack([x.mean(1), x.max(1).values], dim=1)
''', [('''
def spatial_pool(x):
    return torch.stack([x.amax(1), x.mean(1)], dim=1)
''', "max comes before mean")])

CELLS["06_channel_gate"] = ("channel_gate", '''
import torch.nn.functional as F
def channel_gate(x, W0, b0, W1, b1):
    mlp = lambda f: F.linear(F.relu(F.linear(f, W0, b0)), W1, b1)
    return torch.sigmoid(mlp(x.mean((2, 3))) + mlp(x.flatten(2).max(-1).values)).view(*x.shape[:2], 1, 1)
''', [('''
def channel_gate(x, W0, b0, W1, b1):
    mlp = lambda f: torch.relu(f @ W0.T + b0) @ W1.T + b1
    return torch.softmax(mlp(x.mean((2, 3))) + mlp(x.amax((2, 3))), dim=1)[:, :, None, None]
''', "softmax over the channels")])

CELLS["06_apply_gate"] = ("apply_gate", '''
def apply_gate(x, s):
    return torch.einsum("bchw,bc->bchw", x, s)
''', [('''
def apply_gate(x, s):
    return x * s[:, None, None, :]
''', "width axis")])

CELLS["06_cbam_params"] = ("cbam_params", '''
def cbam_params(channels, reduction, kernel_size):
    hidden = max(1, channels // reduction)
    return 2 * channels * hidden + hidden + channels + 2 * kernel_size ** 2
''', [('''
def cbam_params(channels, reduction, kernel_size):
    hidden = max(1, channels // reduction)
    return 2 * channels * hidden + 2 * kernel_size ** 2
''', "biases")])

# ---- lesson 07 -------------------------------------------------------------------------------------------

CELLS["07_tpa_combine"] = ("combine", '''
def combine(a, b, num_heads, rank):
    A = a.unflatten(-1, (num_heads, rank))                         # head-major
    Bf = b.unflatten(-1, (rank, -1))
    return (A[..., None] * Bf[:, :, None]).mean(dim=3)            # (1/R) sum over r
''', [('''
def combine(a, b, num_heads, rank):
    A = a.unflatten(-1, (num_heads, rank))
    Bf = b.unflatten(-1, (rank, -1))
    return (A[..., None] * Bf[:, :, None]).sum(dim=3)
''', "without dividing by R")])

CELLS["07_rope"] = ("rope", '''
def rope(x, positions):
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = (positions.double()[:, None] * theta).to(x.dtype)
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
''', [('''
def rope(x, positions):
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2).float() / d)
    ang = positions.float()[:, None] * theta
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()], -1).flatten(-2)
''', "paired neighbours")])

CELLS["07_which_factors_rope"] = ("rotated_qkv", '''
def rotated_qkv(A_q, B_q, A_k, B_k, A_v, B_v, start):
    L, d = B_q.shape[1], B_q.shape[-1]
    pos = torch.arange(start, start + L, dtype=torch.float32)
    ang = torch.outer(pos, 10000.0 ** (-torch.arange(0, d, 2).float() / d))[:, None, :]   # (L, 1, d/2)
    ang = torch.cat([ang, ang], -1)
    def rot(Bf):                                                   # (B, L, R, d): L is axis 1
        x1, x2 = Bf.chunk(2, -1)
        return Bf * ang.cos() + torch.cat([-x2, x1], -1) * ang.sin()
    comb = lambda A, Bf: torch.einsum("blhr,blrd->blhd", A, Bf) / A.shape[-1]
    return comb(A_q, rot(B_q)), comb(A_k, rot(B_k)), comb(A_v, B_v)
''', [('''
from attn_course.rope import apply_rope
def rotated_qkv(A_q, B_q, A_k, B_k, A_v, B_v, start):
    pos = torch.arange(start, start + B_q.shape[1])
    rot = lambda Bf: apply_rope(Bf.transpose(1, 2), pos).transpose(1, 2)
    comb = lambda A, Bf: torch.einsum("blhr,blrd->blhd", A, Bf) / A.shape[-1]
    return comb(A_q, rot(B_q)), comb(A_k, rot(B_k)), comb(A_v, rot(B_v))
''', "values get no RoPE")])

CELLS["07_cache_elements"] = ("tpa_cache_elements", '''
def tpa_cache_elements(seq_lens, num_heads, head_dim, k_rank, v_rank, constant_heads):
    tokens = sum(seq_lens)                              # each sequence caches its own tokens
    A = 0 if constant_heads else num_heads              # constant head factors are weights, not cache
    return tokens * (k_rank * (A + head_dim) + v_rank * (A + head_dim))
''', [('''
def tpa_cache_elements(seq_lens, num_heads, head_dim, k_rank, v_rank, constant_heads):
    return sum(seq_lens) * (k_rank + v_rank) * (num_heads + head_dim)
''', "constant head factors are weights"), ('''
def tpa_cache_elements(seq_lens, num_heads, head_dim, k_rank, v_rank, constant_heads):
    return len(seq_lens) * max(seq_lens) * (k_rank + v_rank) * ((0 if constant_heads else num_heads) + head_dim)
''', "add the lengths"), ('''
def tpa_cache_elements(seq_lens, num_heads, head_dim, k_rank, v_rank, constant_heads):
    return 2 * sum(seq_lens) * (k_rank + v_rank) * (num_heads + head_dim)
''', "counted keys and values twice")])

CELLS["07_fix_seed_attention"] = ("fixed_attention", '''
def fixed_attention(Q, K, V):
    """The seed used F.softmax over heads; here the scores are (B, H, L, L). No F.scaled_dot_product_attention."""
    q, k, v = (t.permute(0, 2, 1, 3) for t in (Q, K, V))
    L = q.shape[-2]
    s = q @ k.mT / math.sqrt(q.shape[-1]) + torch.full((L, L), float("-inf")).triu(1)
    return (s.softmax(-1) @ v).permute(0, 2, 1, 3)
''', [('''
def fixed_attention(Q, K, V):
    B, L, H, d = Q.shape
    q, k, v = (t.reshape(B, H, L, d) for t in (Q, K, V))
    s = (q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ v).reshape(B, L, H, d)
''', "reshape is not transpose"), ('''
def fixed_attention(Q, K, V):
    H = Q.shape[2]
    s = Q @ K.transpose(2, 3) / math.sqrt(Q.shape[-1])
    s = s.masked_fill(torch.ones(H, H, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ V
''', "a causal mask on the blog post's scores")])

# ---- lesson 08 -------------------------------------------------------------------------------------------

CELLS["08_online_step"] = ("online_step", '''
def online_step(m, l, acc, s, v):
    """No torch.softmax / torch.logsumexp: the recurrence by hand."""
    m_new = torch.max(m, s.max(dim=-1, keepdim=True).values)
    safe = m_new.nan_to_num(neginf=0.0)                         # a row that saw only -inf: subtract 0
    p = (s - safe).exp()
    alpha = (m - safe).exp()
    return m_new, alpha * l + p.sum(-1, keepdim=True), alpha * acc + p @ v
''', [('''
def online_step(m, l, acc, s, v):
    m_new = torch.maximum(m, s.amax(-1, keepdim=True))
    m_sub = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
    p = torch.exp(s - m_sub)
    alpha = torch.exp(m - m_sub)
    return m_new, alpha * l + p.sum(-1, keepdim=True), acc + p @ v
''', "not rescaled")])

CELLS["08_causal_tiles"] = ("causal_tiles", '''
def causal_tiles(L, block_q, block_k):
    count = 0
    for q0 in range(0, L, block_q):
        last_query = min(L, q0 + block_q) - 1
        for k0 in range(0, L, block_k):
            count += k0 <= last_query
    return count
''', [('''
def causal_tiles(L, block_q, block_k):
    T = -(-L // block_q)
    return T * (T + 1) // 2
''', "T(T+1)/2")])

CELLS["08_hbm_traffic"] = ("tiled_traffic", '''
def tiled_traffic(N, d, block_q, block_k):
    passes = -(-N // block_q)
    return N * d + passes * 2 * N * d + N * d + N
''', [('''
def tiled_traffic(N, d, block_q, block_k):
    return N * d + math.ceil(N / block_k) * 2 * N * d + N * d + N
''', "QUERY blocks")])


# ---- lessons 09-13: one module per lesson -----------------------------------------------------------------

import importlib as _importlib  # noqa: E402
import pkgutil as _pkgutil  # noqa: E402
from pathlib import Path as _Path  # noqa: E402

ALSO_CORRECT = {}
"""More correct cells for some exercises — the alternatives a review tried (unaligned tiles, padding, an
``expand`` view, overlap-style ring code): ``{exercise_id: [cell, ...]}``, each must get full marks."""

for _info in sorted(_pkgutil.iter_modules([str(_Path(__file__).parent)]), key=lambda m: m.name):
    if _info.name.startswith("learner_cells_"):
        _module = _importlib.import_module(_info.name)
        CELLS.update(_module.CELLS)
        for _id, _cells in getattr(_module, "ALSO_CORRECT", {}).items():
            ALSO_CORRECT.setdefault(_id, []).extend(_cells)
