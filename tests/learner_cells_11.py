'''Learner-style cells for lesson 11's exercises (format of ``tests/learner_cells.py``, merged into its ``CELLS``):
``CELLS[exercise_id] = (function name, correct cell in another style than the solution, [(wrong cell, hint
substring the judge must print), ...])``; a hint of ``"FORBIDDEN"`` means the cell must be rejected for a
forbidden API. Written for the suite, not copied from ``solutions/``: every misconception a hint promises,
the grouped-KV mistakes of 11.3 (one of which crashes: the error must be named), and the shortcuts the
prompts forbid.
'''

CELLS = {}


def _edit(cell: str, old: str, new: str) -> str:
    """``cell`` with ``old`` replaced by ``new`` (``old`` must occur: a wrong cell differs where it says)."""
    assert old in cell, old
    return cell.replace(old, new)


# ---- 11_sinusoidal --------------------------------------------------------------------------------------

_SIN = '''
def sinusoidal(positions, dim):
    """Vaswani et al.'s table, one column pair at a time (attn_course.positions is not used)."""
    pe = torch.empty(len(positions), dim, dtype=torch.float64)
    p = positions.to(torch.float64)
    for i in range(dim // 2):
        w = 1.0 / 10000 ** (2 * i / dim)
        pe[:, 2 * i] = torch.sin(p * w)
        pe[:, 2 * i + 1] = torch.cos(p * w)
    return pe.float()
'''

CELLS["11_sinusoidal"] = ("sinusoidal", _SIN, [
    (_edit(_edit(_SIN, "pe[:, 2 * i] = torch.sin", "pe[:, 2 * i] = torch.cos"),
           "pe[:, 2 * i + 1] = torch.cos", "pe[:, 2 * i + 1] = torch.sin"), "sin goes in the even"),
    ('''
def sinusoidal(positions, dim):
    i = torch.arange(dim // 2, dtype=torch.float64)
    a = positions.double()[:, None] / 10000 ** (2 * i / dim)
    return torch.cat((a.cos(), a.sin()), dim=-1).float()        # the tutorial's cosines-first layout
''', "tutorial's layout"),
    (_edit(_SIN, "10000 ** (2 * i / dim)", "10000 ** (i / dim)"), "not i/d"),
    ('''
from attn_course.positions import sinusoidal_embedding
def sinusoidal(positions, dim):
    return sinusoidal_embedding(positions, dim).float()
''', "FORBIDDEN"),
])


# ---- 11_rope_interleaved --------------------------------------------------------------------------------

_ROPE = '''
def rope_interleaved(x, positions):
    """Complex form: pair (2i, 2i+1) is the complex number x_2i + i·x_2i+1, multiplied by e^{i p θ_i}."""
    d = x.shape[-1]
    theta = torch.pow(10000.0, -torch.arange(0, d, 2, dtype=torch.float64) / d)
    turn = torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64),
                       positions.double().unsqueeze(-1) * theta)                   # e^{i p θ}: (L, d/2)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * turn).reshape(x.shape).to(x.dtype)
'''

_ROPE_PAIRS = '''
def rope_interleaved(x, positions):
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2).float() / d)
    a = positions.float()[:, None] * theta
    c, s = a.cos(), a.sin()
    e, o = x[..., 0::2], x[..., 1::2]
    return torch.stack((e * c - o * s, e * s + o * c), dim=-1).flatten(-2)
'''

CELLS["11_rope_interleaved"] = ("rope_interleaved", _ROPE, [
    ('''
def rope_interleaved(x, positions):
    d = x.shape[-1]
    a = positions.float()[:, None] * 10000.0 ** (-torch.arange(0, d, 2).float() / d)
    c, s = torch.cat((a.cos(), a.cos()), -1), torch.cat((a.sin(), a.sin()), -1)
    return x * c + torch.cat((-x[..., d // 2:], x[..., : d // 2]), -1) * s     # rotate_half: pairs (i, i + d/2)
''', "half-split"),
    (_edit(_ROPE_PAIRS, "(e * c - o * s, e * s + o * c)", "(e * c + o * s, -e * s + o * c)"), "wrong way"),
    (_edit(_ROPE_PAIRS, "-torch.arange(0, d, 2).float() / d", "-torch.arange(d // 2).float() / d"), "10000^(−i/d)"),
    (_edit(_ROPE_PAIRS, "a = positions.float()[:, None] * theta",
           "a = torch.arange(x.shape[-2]).float()[:, None] * theta"), "ignored the given positions"),
    ('''
from attn_course.rope import apply_rope
def rope_interleaved(x, positions):
    return apply_rope(x, positions, interleaved=True)
''', "FORBIDDEN"),
])


# ---- 11_convert_checkpoint ------------------------------------------------------------------------------

_CONV = '''
def convert(w_q, w_k, num_heads, num_kv_heads):
    """Row indices written out: head by head, new row 2j <- old row j, new row 2j+1 <- old row j + d_h/2."""
    d_h = w_q.shape[0] // num_heads
    order = [j + half for j in range(d_h // 2) for half in (0, d_h // 2)]

    def rows(heads):
        return torch.tensor([h * d_h + r for h in range(heads) for r in order])

    return w_q[rows(num_heads)], w_k[rows(num_kv_heads)]
'''

CELLS["11_convert_checkpoint"] = ("convert", _CONV, [
    ('''
def convert(w_q, w_k, num_heads, num_kv_heads):
    d_h = w_q.shape[0] // num_heads
    perm = torch.stack((torch.arange(d_h // 2), torch.arange(d_h // 2, d_h)), -1).flatten()
    inv = torch.argsort(perm)                                       # the inverse: new row j + d_h/2 <- old 2j + 1
    return (w_q.view(num_heads, d_h, -1)[:, inv].reshape(w_q.shape),
            w_k.view(num_kv_heads, d_h, -1)[:, inv].reshape(w_k.shape))
''', "inverse permutation"),
    ('''
def convert(w_q, w_k, num_heads, num_kv_heads):
    def whole(w):                                                   # one permutation over all rows at once
        n = w.shape[0]
        return w[torch.stack((torch.arange(n // 2), torch.arange(n // 2, n)), -1).flatten()]
    return whole(w_q), whole(w_k)
''', "within each head"),
    # the grouped-KV mistakes (issue 24: one of them showed a raw exception): w_k split into num_heads heads
    (_edit(_CONV, "w_k[rows(num_kv_heads)]", "w_k[rows(num_heads)]"), "num_kv_heads heads"),      # IndexError
    ('''
def convert(w_q, w_k, num_heads, num_kv_heads):
    def per_head(w):                                                # head_dim from each matrix, num_heads for both
        d_h = w.shape[0] // num_heads
        perm = torch.stack((torch.arange(d_h // 2), torch.arange(d_h // 2, d_h)), -1).flatten()
        return w.view(num_heads, d_h, -1)[:, perm].reshape(w.shape)
    return per_head(w_q), per_head(w_k)
''', "num_kv_heads heads"),                                         # wrong rows, and a stack error (d_h odd)
    ('''
def convert(w_q, w_k, num_heads, num_kv_heads):
    d_h = w_q.shape[0] // num_heads
    perm = torch.stack((torch.arange(d_h // 2), torch.arange(d_h // 2, d_h)), -1).flatten()
    return (w_q.view(num_heads, d_h, -1)[:, perm].reshape(w_q.shape),
            w_k.view(num_heads, d_h, -1)[:, perm].reshape(w_k.shape))       # the queries' view on the keys
''', "num_kv_heads heads"),
    (_edit(_CONV, "w_k[rows(num_kv_heads)]", "w_k"), "keys need the same"),
    (_edit(_CONV, "return w_q[rows(num_heads)]", "return w_q"), "queries need the same"),
    ('''
from attn_course.rope import interleave_perm
def convert(w_q, w_k, num_heads, num_kv_heads):
    d_h = w_q.shape[0] // num_heads
    p = interleave_perm(d_h)
    return (w_q.view(num_heads, d_h, -1)[:, p].reshape(w_q.shape),
            w_k.view(num_kv_heads, d_h, -1)[:, p].reshape(w_k.shape))
''', "FORBIDDEN"),
])


# ---- 11_rmsnorm -----------------------------------------------------------------------------------------

_RMS = '''
def rms_norm(x, weight, eps):
    """Through the vector norm: mean(x²) = |x|² / d (no centring; attn_course.norm is not used)."""
    d = x.shape[-1]
    ms = torch.linalg.vector_norm(x, dim=-1, keepdim=True) ** 2 / d
    return weight * (x / (ms + eps).sqrt())
'''

CELLS["11_rmsnorm"] = ("rms_norm", _RMS, [
    (_edit(_RMS, "    d = x.shape[-1]\n", "    d = x.shape[-1]\n    x = x - x.mean(-1, keepdim=True)\n"),
     "that is LayerNorm"),
    ('''
def rms_norm(x, weight, eps):
    return x / torch.sqrt(x.var(dim=-1, keepdim=True) + eps) * weight
''', "divided by the variance"),
    (_edit(_RMS, "(ms + eps).sqrt()", "(ms.sqrt() + eps)"), "inside the square root"),
    ('''
def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.square().mean(dim=-2, keepdim=True) + eps) * weight
''', "over the last axis"),
    (_edit(_RMS, "return weight * (x / (ms + eps).sqrt())", "return x / (ms + eps).sqrt()"), "multiply by the gain"),
    ('''
from attn_course.norm import RMSNorm
def rms_norm(x, weight, eps):
    norm = RMSNorm(x.shape[-1], eps).to(x.dtype)
    norm.weight.data.copy_(weight)
    return norm(x).detach()
''', "FORBIDDEN"),
])


# ---- 11_block_params ------------------------------------------------------------------------------------

_PARAMS = '''
def block_params(d_model, num_heads, num_kv_heads, ffn_dim):
    """Shape by shape, as in the block's state_dict (attn_course is not used)."""
    d_h = d_model // num_heads
    shapes = {"q_proj": (num_heads * d_h, d_model), "k_proj": (num_kv_heads * d_h, d_model),
              "v_proj": (num_kv_heads * d_h, d_model), "out_proj": (d_model, num_heads * d_h),
              "w1": (ffn_dim, d_model), "w3": (ffn_dim, d_model), "w2": (d_model, ffn_dim),
              "norm1": (d_model, 1), "norm2": (d_model, 1), "q_norm": (d_h, 1), "k_norm": (d_h, 1)}
    return sum(a * b for a, b in shapes.values())
'''

CELLS["11_block_params"] = ("block_params", _PARAMS, [
    (_edit(_edit(_PARAMS, '"k_proj": (num_kv_heads * d_h, d_model)', '"k_proj": (d_model, d_model)'),
           '"v_proj": (num_kv_heads * d_h, d_model)', '"v_proj": (d_model, d_model)'), "num_kv_heads·head_dim"),
    (_edit(_PARAMS, '"w3": (ffn_dim, d_model), ', ""), "three matrices"),
    (_edit(_edit(_PARAMS, '"q_norm": (d_h, 1)', '"q_norm": (d_model, 1)'), '"k_norm": (d_h, 1)', '"k_norm": (d_model, 1)'),
     "not d_model"),
    (_edit(_PARAMS, ', "q_norm": (d_h, 1), "k_norm": (d_h, 1)}', "}"), "left out the QK-norm"),
    (_edit(_PARAMS, '"norm1": (d_model, 1), "norm2": (d_model, 1), ', ""), "norm1, norm2"),
    ('''
from attn_course import TransformerBlock
def block_params(d_model, num_heads, num_kv_heads, ffn_dim):
    block = TransformerBlock(d_model, num_heads, num_kv_heads, ffn_dim, qk_norm=True)
    return sum(p.numel() for p in block.parameters())
''', "FORBIDDEN"),
])


# ---- 11_fix_block_attention -----------------------------------------------------------------------------

_FIX = '''
import torch.nn.functional as F

def rope_half(t):
    """Half-split RoPE on t (..., L, d) at positions 0..L-1 (this part is correct)."""
    L, d = t.shape[-2:]
    ang = torch.arange(L)[:, None] * 10000.0 ** (-torch.arange(0, d, 2) / d)
    cos, sin = torch.cat((ang.cos(), ang.cos()), -1), torch.cat((ang.sin(), ang.sin()), -1)
    return t * cos + torch.cat((-t[..., d // 2:], t[..., : d // 2]), -1) * sin


def attend(x, W_q, W_k, W_v, g_q, g_k, num_heads):
    """Per head: QK-norm over d_h (F.rms_norm), RoPE on q and k, causal softmax (not F.scaled_dot_product_attention)."""
    B, L, D = x.shape
    d_h = D // num_heads
    q, k, v = ((x @ W.T).view(B, L, num_heads, d_h).transpose(1, 2) for W in (W_q, W_k, W_v))
    q = F.rms_norm(q, (d_h,), g_q, 1e-6)
    k = F.rms_norm(k, (d_h,), g_k, 1e-6)
    s = torch.einsum("bhid,bhjd->bhij", rope_half(q), rope_half(k)) / d_h ** 0.5
    s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, D)
'''

_AXIS = ('''    q = F.rms_norm(q, (d_h,), g_q, 1e-6)
    k = F.rms_norm(k, (d_h,), g_k, 1e-6)
''', '''    q = q * torch.rsqrt(q.pow(2).mean(-2, keepdim=True) + 1e-6) * g_q
    k = k * torch.rsqrt(k.pow(2).mean(-2, keepdim=True) + 1e-6) * g_k
''')
_ROPE_V = ("    s = torch.einsum", "    v = rope_half(v)\n    s = torch.einsum")
_ROPE_S = ('torch.einsum("bhid,bhjd->bhij", rope_half(q), rope_half(k))', 'rope_half(q @ k.transpose(-2, -1))')

CELLS["11_fix_block_attention"] = ("attend", _FIX, [
    (_edit(_FIX, *_ROPE_V), "applied to v"),
    (_edit(_FIX, *_ROPE_S), "after the dot product"),
    (_edit(_FIX, *_AXIS), "sequence axis"),
    (_edit(_edit(_FIX, *_AXIS), *_ROPE_V), "sequence axis"),
    (_edit(_FIX, '''    q, k, v = ((x @ W.T).view(B, L, num_heads, d_h).transpose(1, 2) for W in (W_q, W_k, W_v))
    q = F.rms_norm(q, (d_h,), g_q, 1e-6)
    k = F.rms_norm(k, (d_h,), g_k, 1e-6)
''', '''    q = F.rms_norm(x @ W_q.T, (D,), g_q.repeat(num_heads), 1e-6)     # one norm over the whole width
    k = F.rms_norm(x @ W_k.T, (D,), g_k.repeat(num_heads), 1e-6)
    q, k, v = ((t).view(B, L, num_heads, d_h).transpose(1, 2) for t in (q, k, x @ W_v.T))
'''), "whole width"),
    (_edit(_FIX, '''    s = torch.einsum("bhid,bhjd->bhij", rope_half(q), rope_half(k)) / d_h ** 0.5
    s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, D)''',
           '''    y = F.scaled_dot_product_attention(rope_half(q), rope_half(k), v, is_causal=True)
    return y.transpose(1, 2).reshape(B, L, D)'''), "FORBIDDEN"),
])


# ---- 11_block_forward -----------------------------------------------------------------------------------

_BLOCK = '''
def block_forward(x, weights, num_heads, num_kv_heads, eps):
    """The pre-norm block written out (attention by hand, kv heads repeated per group; attn_course not used)."""
    B, L, D = x.shape
    hd = D // num_heads
    group = num_heads // num_kv_heads
    W = lambda name: weights[name].T                                   # nn.Linear layout: x @ W.T

    def norm(t, g):
        return F.rms_norm(t, (D,), g, eps)

    def heads(t, n):                                                   # (B, L, n·hd) -> (B, n, L, hd)
        return t.reshape(B, L, n, hd).permute(0, 2, 1, 3)

    def rotate(t):                                                     # half-split RoPE at positions 0..L-1
        freq = 1.0 / 10000 ** (torch.arange(hd // 2) * 2 / hd)
        ang = torch.outer(torch.arange(L).float(), freq).repeat(1, 2)  # (L, hd)
        t1, t2 = t.split(hd // 2, dim=-1)
        return t * ang.cos() + torch.cat((-t2, t1), dim=-1) * ang.sin()

    u = norm(x, weights["norm1.weight"])
    q = rotate(heads(u @ W("attn.q_proj.weight"), num_heads))
    k = rotate(heads(u @ W("attn.k_proj.weight"), num_kv_heads)).repeat_interleave(group, dim=1)
    v = heads(u @ W("attn.v_proj.weight"), num_kv_heads).repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    future = torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)
    att = torch.softmax(scores.masked_fill(future, -math.inf), dim=-1)
    h = x + (att @ v).permute(0, 2, 1, 3).reshape(B, L, D) @ W("attn.out_proj.weight")
    u = norm(h, weights["norm2.weight"])
    gate, up = u @ W("ffn.w1.weight"), u @ W("ffn.w3.weight")
    return h + (F.silu(gate) * up) @ W("ffn.w2.weight")
'''
_BLOCK = "\nimport torch.nn.functional as F\n" + _BLOCK

_POST = _edit(_edit(_edit(_BLOCK, '''    u = norm(x, weights["norm1.weight"])
''', '''    u = x
'''), '''    h = x + (att @ v).permute(0, 2, 1, 3).reshape(B, L, D) @ W("attn.out_proj.weight")
    u = norm(h, weights["norm2.weight"])
''', '''    h = norm(x + (att @ v).permute(0, 2, 1, 3).reshape(B, L, D) @ W("attn.out_proj.weight"), weights["norm1.weight"])
    u = h
'''), '''    return h + (F.silu(gate) * up) @ W("ffn.w2.weight")''',
    '''    return norm(h + (F.silu(gate) * up) @ W("ffn.w2.weight"), weights["norm2.weight"])''')

_NORM_BY_HAND = ('''        return F.rms_norm(t, (D,), g, eps)''',
                 '''        return t / (t.pow(2).mean(-1, keepdim=True).sqrt() + eps) * g''')

CELLS["11_block_forward"] = ("block_forward", _BLOCK, [
    (_POST, "POST-norm"),
    (_edit(_edit(_BLOCK, "    h = x + (att @ v)", "    h = (att @ v)"), "    return h + (F.silu", "    return (F.silu"),
     "residual connections are missing"),
    (_edit(_BLOCK, "    h = x + (att @ v)", "    h = (att @ v)"), "the attention's residual is missing"),
    (_edit(_BLOCK, *_NORM_BY_HAND), "eps goes inside the square root"),
    (_edit(_BLOCK, _NORM_BY_HAND[0], '''        return t * torch.rsqrt(t.pow(2).mean(1, keepdim=True) + eps) * g'''),
     "not over the sequence"),
    (_edit(_BLOCK, '''        t1, t2 = t.split(hd // 2, dim=-1)
        return t * ang.cos() + torch.cat((-t2, t1), dim=-1) * ang.sin()''',
           '''        ang = ang[:, : hd // 2]
        t1, t2 = t[..., 0::2], t[..., 1::2]                             # neighbours (2i, 2i+1)
        return torch.stack((t1 * ang.cos() - t2 * ang.sin(), t1 * ang.sin() + t2 * ang.cos()), -1).flatten(-2)'''),
     "interleaved RoPE convention"),
    (_edit(_BLOCK, 'v = heads(u @ W("attn.v_proj.weight"), num_kv_heads)', 'v = rotate(heads(u @ W("attn.v_proj.weight"), num_kv_heads))'),
     "do not rotate v"),
    (_edit(_BLOCK, "(F.silu(gate) * up)", "(F.silu(up) * gate)"), "gate and up are swapped"),
    (_edit(_BLOCK, "scores.masked_fill(future, -math.inf)", "scores"), "causal mask is missing"),
    (_edit(_BLOCK, " / math.sqrt(hd)", ""), "not scaled"),
    (_edit(_edit(_BLOCK, "k = rotate(heads(u @ W(\"attn.k_proj.weight\"), num_kv_heads)).repeat_interleave(group, dim=1)",
                 "k = rotate(heads(u @ W(\"attn.k_proj.weight\"), num_kv_heads)).repeat(1, group, 1, 1)"),
           "v = heads(u @ W(\"attn.v_proj.weight\"), num_kv_heads).repeat_interleave(group, dim=1)",
           "v = heads(u @ W(\"attn.v_proj.weight\"), num_kv_heads).repeat(1, group, 1, 1)"), "repeat_interleave"),
    # kv heads never repeated: a broadcast error, named (every case is grouped)
    (_edit(_edit(_BLOCK, ".repeat_interleave(group, dim=1)\n    v =", "\n    v ="), ".repeat_interleave(group, dim=1)\n    scores",
           "\n    scores"), "k and v have num_kv_heads heads"),
    ('''
from attn_course import TransformerBlock
def block_forward(x, weights, num_heads, num_kv_heads, eps):
    block = TransformerBlock(x.shape[-1], num_heads, num_kv_heads, weights["ffn.w1.weight"].shape[0])
    block.norm1.eps = block.norm2.eps = eps
    block.load_state_dict(weights)
    with torch.no_grad():
        return block(x)
''', "FORBIDDEN"),
])
