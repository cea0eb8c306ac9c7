'''Learner-style cells for lesson 12's exercises (format of ``tests/learner_cells.py``, merged into its ``CELLS``):
``CELLS[exercise_id] = (function name, correct cell in another style than the solution, [(wrong cell, hint
substring the judge must print), ...])``; ``"FORBIDDEN"`` means the cell must be rejected for a forbidden API.
Written for the suite, not copied from ``solutions/``: every misconception a hint promises, the shortcuts the
prompts forbid, and — for the absorbed decode step — the versions that materialise per-head keys or values.
'''

CELLS = {}


def _edit(cell: str, old: str, new: str) -> str:
    """``cell`` with ``old`` replaced by ``new`` (``old`` must occur: a wrong cell differs where it says)."""
    assert old in cell, old
    return cell.replace(old, new)


# ---- 12_cache_bytes -------------------------------------------------------------------------------------

_BYTES = '''
def mla_cache_bytes(seq_len, batch_size, num_layers, num_heads, kv_lora_rank, qk_rope_head_dim, bytes_per_element):
    """Per token and layer: the latent c_KV and ONE rope key for all heads (num_heads does not enter)."""
    elements = seq_len * batch_size * num_layers * (kv_lora_rank + qk_rope_head_dim)
    return elements * bytes_per_element
'''
_PER = "(kv_lora_rank + qk_rope_head_dim)"

CELLS["12_cache_bytes"] = ("mla_cache_bytes", _BYTES, [
    (_edit(_BYTES, _PER, "(kv_lora_rank + num_heads * qk_rope_head_dim)"), "shared by all heads"),
    (_edit(_BYTES, _PER, "kv_lora_rank"), "rotated rope key is cached too"),
    (_edit(_BYTES, _PER, "(2 * kv_lora_rank + qk_rope_head_dim)"), "not counted twice"),
    (_edit(_BYTES, _PER, "2 * (kv_lora_rank + qk_rope_head_dim)"), "do not double it"),
    (_edit(_BYTES, "return elements * bytes_per_element", "return elements"), "multiply by bytes_per_element"),
    (_edit(_BYTES, "seq_len * batch_size * num_layers", "seq_len * batch_size"), "multiply by num_layers"),
    (_edit(_BYTES, "seq_len * batch_size * num_layers", "seq_len * num_layers"), "multiply by batch_size"),
    ('''
from attn_course import kv_cache_bytes
def mla_cache_bytes(seq_len, batch_size, num_layers, num_heads, kv_lora_rank, qk_rope_head_dim, bytes_per_element):
    per = kv_cache_bytes("mla", seq_len=1, num_heads=num_heads, head_dim=1, kv_lora_rank=kv_lora_rank,
                         qk_rope_head_dim=qk_rope_head_dim, dtype=torch.float32) // 4
    return per * seq_len * batch_size * num_layers * bytes_per_element
''', "FORBIDDEN"),
])


# ---- 12_absorb_query ------------------------------------------------------------------------------------

_ABSORB = '''
def absorb_query(q_nope, kv_b_weight, qk_nope_head_dim):
    """Broadcast matmul: (B, H, L, d_nope) @ (H, d_nope, d_c); head h's W_UK = first d_nope rows of its block."""
    H = q_nope.shape[1]
    blocks = kv_b_weight.unflatten(0, (H, -1))                  # (H, d_nope + d_v, d_c)
    return q_nope @ blocks[:, :qk_nope_head_dim, :]
'''

CELLS["12_absorb_query"] = ("absorb_query", _ABSORB, [
    (_edit(_ABSORB, "blocks[:, :qk_nope_head_dim, :]", "blocks[:, -qk_nope_head_dim:, :]"), "rows of the wrong part"),
    (_edit(_ABSORB, "kv_b_weight.unflatten(0, (H, -1))", "kv_b_weight.unflatten(0, (-1, H)).transpose(0, 1)"),
     "head-major"),
    (_edit(_edit(_ABSORB, "kv_b_weight.unflatten(0, (H, -1))", "kv_b_weight.unflatten(0, (-1, H)).transpose(0, 1)"),
           "blocks[:, :qk_nope_head_dim, :]", "blocks[:, -qk_nope_head_dim:, :]"), "puts W_UK first"),
    (_edit(_ABSORB, "return q_nope @ blocks[:, :qk_nope_head_dim, :]",
           "return q_nope @ blocks[:, :qk_nope_head_dim, :] / qk_nope_head_dim ** 0.5"), "leave the softmax scale out"),
    ('''
from attn_course import MultiHeadLatentAttention
def absorb_query(q_nope, kv_b_weight, qk_nope_head_dim):
    H = q_nope.shape[1]
    d_c = kv_b_weight.shape[1]
    m = MultiHeadLatentAttention(8, H, kv_lora_rank=d_c, qk_nope_head_dim=qk_nope_head_dim, qk_rope_head_dim=2,
                                 v_head_dim=kv_b_weight.shape[0] // H - qk_nope_head_dim)
    m.kv_b_proj.weight.data.copy_(kv_b_weight)
    W_UK, _ = m.up_weights()
    return torch.einsum("bhld,hdc->bhlc", q_nope, W_UK.detach())
''', "FORBIDDEN"),
])


# ---- 12_shared_rope_key ---------------------------------------------------------------------------------

_SHARED = '''
def rope_key_costs(num_heads, head_dim, kv_lora_rank, qk_rope_head_dim):
    """Elements per token and layer; a GQA group caches a key and a value of head_dim each."""
    designs = [kv_lora_rank + qk_rope_head_dim,                 # one shared rope key
               kv_lora_rank + num_heads * qk_rope_head_dim]     # a rope key per head, still one latent
    per_group = 2 * head_dim
    return (*designs, *(n / per_group for n in designs))
'''

CELLS["12_shared_rope_key"] = ("rope_key_costs", _SHARED, [
    (_edit(_SHARED, "per_group = 2 * head_dim", "per_group = head_dim"), "divide by 2·head_dim"),
    (_edit(_SHARED, "kv_lora_rank + num_heads * qk_rope_head_dim]", "num_heads * (kv_lora_rank + qk_rope_head_dim)]"),
     "still one shared d_c-wide vector"),
    (_edit(_SHARED, "kv_lora_rank + num_heads * qk_rope_head_dim]", "num_heads * qk_rope_head_dim]"),
     "still caches the latent"),
    ('''
from attn_course import kv_cache_bytes
def rope_key_costs(num_heads, head_dim, kv_lora_rank, qk_rope_head_dim):
    shared = kv_cache_bytes("mla", seq_len=1, num_heads=num_heads, head_dim=head_dim, kv_lora_rank=kv_lora_rank,
                            qk_rope_head_dim=qk_rope_head_dim, dtype=torch.float32) // 4
    per_head = kv_lora_rank + num_heads * qk_rope_head_dim
    return shared, per_head, shared / (2 * head_dim), per_head / (2 * head_dim)
''', "FORBIDDEN"),
])


# ---- 12_fix_buggy_mla -----------------------------------------------------------------------------------

_FIX = '''
def mla_weights(c_kv, k_rope, q_nope, q_rope, W_UK):
    """Content scores via the absorbed query, rope scores against the ONE shared key; RoPE via the course."""
    from attn_course.rope import apply_rope

    S = c_kv.shape[1]
    d = q_nope.shape[-1] + q_rope.shape[-1]
    content = torch.einsum("bhid,hdc,bjc->bhij", q_nope, W_UK, c_kv)        # q·(W_UK c): no RoPE on the latent
    position = torch.einsum("bhir,bjr->bhij", apply_rope(q_rope), apply_rope(k_rope))
    scores = (content + position) / math.sqrt(d)
    visible = torch.arange(S)[None, :] <= torch.arange(S)[:, None]
    return torch.where(visible, scores, float("-inf")).softmax(dim=-1)
'''
_LATENT = ("    content = torch.einsum", "    c_kv = apply_rope(c_kv)\n    content = torch.einsum")
_SCALE = ("/ math.sqrt(d)", "/ math.sqrt(q_nope.shape[-1])")

CELLS["12_fix_buggy_mla"] = ("mla_weights", _FIX, [
    (_edit(_edit(_FIX, *_LATENT), *_SCALE), "both bugs are still there"),
    (_edit(_FIX, *_LATENT), "Rotate only q_rope and the shared k_rope."),
    (_edit(_FIX, *_SCALE), "RoPE is fixed; one bug left"),
    (_edit(_FIX, "torch.where(visible, scores, float(\"-inf\"))", "scores"), "causal mask is missing"),
    (_edit(_FIX, "apply_rope(q_rope), apply_rope(k_rope)", "q_rope, k_rope"), "must be rotated"),
    (_edit(_FIX, "apply_rope(q_rope), apply_rope(k_rope)",
           "apply_rope(q_rope, interleaved=True), apply_rope(k_rope, interleaved=True)"), "half-split RoPE of apply_rope"),
])


# ---- 12_absorbed_decode ---------------------------------------------------------------------------------

_GIVEN = '''
def rope_half(t, position):
    """The course's RoPE on t (..., d): half-split pairs (j, j + d/2), θ_j = 10000^(−2j/d), at an integer `position`
    (an int, or a tensor broadcastable to t.shape[:-1]). Given — this part is correct."""
    d = t.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)               # (d/2,)
    ang = torch.as_tensor(position, dtype=torch.float64)[..., None] * theta            # (..., d/2)
    ang = torch.cat((ang, ang), dim=-1)
    return t * ang.cos().to(t) + torch.cat((-t[..., d // 2:], t[..., : d // 2]), dim=-1) * ang.sin().to(t)
'''

# another style: the absorbed step as ONE-key multi-query attention, the heads folded into the query axis
_DECODE = _GIVEN + '''

def absorbed_decode(q_nope, q_rope, c_kv, k_rope, kv_b_weight):
    """MQA over the latent: query [W_UKᵀ q_nope ; RoPE(q_rope)], one shared key [c_kv ; k_rope], value c_kv
    (no F.scaled_dot_product_attention: fused kernels are refused while the grader runs the step)."""
    B, H, dn = q_nope.shape
    S, dr = k_rope.shape[-2:]
    per_head = kv_b_weight.unflatten(0, (H, -1))                      # (H, dn + dv, dc)
    w_uk, w_uv = per_head.split([dn, per_head.shape[1] - dn], dim=1)
    q = torch.cat([torch.einsum("bhn,hnc->bhc", q_nope, w_uk), rope_half(q_rope, S - 1)], dim=-1)
    key = torch.cat([c_kv, k_rope], dim=-1)                           # (B, S, dc + dr): shared by the heads
    w = torch.softmax(q @ key.transpose(1, 2) * (dn + dr) ** -0.5, dim=-1)   # (B, H, S): heads as query rows
    return torch.einsum("bhc,hvc->bhv", w @ c_kv, w_uv)
'''

# the plain, einsum form that the mistakes below edit
_ABS = _GIVEN + '''

def absorbed_decode(q_nope, q_rope, c_kv, k_rope, kv_b_weight):
    B, H, dn = q_nope.shape
    S, dr = k_rope.shape[1], k_rope.shape[2]
    dc = c_kv.shape[-1]
    W = kv_b_weight.reshape(H, -1, dc)
    W_UK, W_UV = W[:, :dn, :], W[:, dn:, :]
    q_lat = torch.einsum("bhd,hdc->bhc", q_nope, W_UK)
    q_pos = rope_half(q_rope, S - 1)
    s = torch.einsum("bhc,bsc->bhs", q_lat, c_kv) + torch.einsum("bhr,bsr->bhs", q_pos, k_rope)
    p = torch.softmax(s / math.sqrt(dn + dr), dim=-1)
    return torch.einsum("bhc,hvc->bhv", torch.einsum("bhs,bsc->bhc", p, c_kv), W_UV)
'''

_NAIVE = _GIVEN + '''

def absorbed_decode(q_nope, q_rope, c_kv, k_rope, kv_b_weight):
    """The naive step: up-project every cached latent into per-head keys and values."""
    B, H, dn = q_nope.shape
    S, dr = k_rope.shape[1:]
    kv = (c_kv @ kv_b_weight.T).view(B, S, H, -1).transpose(1, 2)       # (B, H, S, dn + dv)
    k_nope, v = kv[..., :dn], kv[..., dn:]
    s = torch.einsum("bhd,bhsd->bhs", q_nope, k_nope) + torch.einsum("bhr,bsr->bhs", rope_half(q_rope, S - 1), k_rope)
    p = torch.softmax(s / math.sqrt(dn + dr), dim=-1)
    return torch.einsum("bhs,bhsv->bhv", p, v)
'''

# review 08-13 H12-1: the naive re-projection written one head at a time (no tensor of B·H·S·d elements)
_NAIVE_PER_HEAD = _GIVEN + '''

def absorbed_decode(q_nope, q_rope, c_kv, k_rope, kv_b_weight):
    B, H, dn = q_nope.shape
    S, dr = k_rope.shape[1:]
    W = kv_b_weight.view(H, -1, kv_b_weight.shape[-1])
    q_r = rope_half(q_rope, S - 1)
    outs = []
    for h in range(H):
        k = c_kv @ W[h, :dn].T                                           # (B, S, dn): this head's keys
        v = c_kv @ W[h, dn:].T                                           # (B, S, dv): this head's values
        s = torch.einsum("bd,bsd->bs", q_nope[:, h], k) + torch.einsum("br,bsr->bs", q_r[:, h], k_rope)
        outs.append(torch.einsum("bs,bsv->bv", torch.softmax(s / math.sqrt(dn + dr), -1), v))
    return torch.stack(outs, 1)
'''

_VALUES_FIRST = _edit(_ABS, '''    return torch.einsum("bhc,hvc->bhv", torch.einsum("bhs,bsc->bhc", p, c_kv), W_UV)''',
                      '''    values = torch.einsum("bsc,hvc->bhsv", c_kv, W_UV)                   # W_UV on the whole cache
    return torch.einsum("bhs,bhsv->bhv", p, values)''')

_EXPANDED = _edit(_ABS, '''    s = torch.einsum("bhc,bsc->bhs", q_lat, c_kv)''',
                  '''    c_heads = c_kv[:, None].expand(B, H, S, dc)                         # a per-head view of the latent
    s = torch.einsum("bhc,bhsc->bhs", q_lat, c_heads)''')

# a per-head COPY of the latent: the absorbed algorithm (the same FLOPs), only wasteful in memory — 12.5 grades the
# work, so it gets full marks like the expand view
_REPEATED = _edit(_ABS, '''    s = torch.einsum("bhc,bsc->bhs", q_lat, c_kv)''',
                  '''    c_heads = c_kv[:, None].repeat(1, H, 1, 1)                           # a per-head copy of the latent
    s = torch.einsum("bhc,bhsc->bhs", q_lat, c_heads)''')

CELLS["12_absorbed_decode"] = ("absorbed_decode", _DECODE, [
    (_NAIVE, "rule: trace budget — counted FLOPs"),
    (_NAIVE_PER_HEAD, "the cache was up-projected into per-head keys or values"),
    (_VALUES_FIRST, "rule: trace budget — counted FLOPs"),
    (_edit(_ABS, "math.sqrt(dn + dr)", "math.sqrt(dn)"), "not 1/sqrt(d_nope)"),
    (_edit(_ABS, "math.sqrt(dn + dr)", "math.sqrt(q_lat.shape[-1] + q_pos.shape[-1])"), "does not change the scale"),
    (_edit(_ABS, "math.sqrt(dn + dr)", "1.0"), "the scores are not scaled"),
    (_edit(_ABS, "    q_lat = torch.einsum", "    c_kv = rope_half(c_kv, torch.arange(S))\n    q_lat = torch.einsum"),
     "RoPE must not touch the latent"),
    (_edit(_ABS, "q_pos = rope_half(q_rope, S - 1)", "q_pos = q_rope"), "you left it unrotated"),
    (_edit(_ABS, "q_pos = rope_half(q_rope, S - 1)", "q_pos = rope_half(q_rope, S)"), "(not S)"),
    (_edit(_ABS, 'torch.einsum("bhr,bsr->bhs", q_pos, k_rope)', 'torch.einsum("bhr,bsr->bhs", q_pos, rope_half(k_rope, torch.arange(S)))'),
     "already rotated at its own position"),
    (_edit(_ABS, ' + torch.einsum("bhr,bsr->bhs", q_pos, k_rope)', ""), "the rope part is missing"),
    (_edit(_ABS, "W_UK, W_UV = W[:, :dn, :], W[:, dn:, :]", "W_UV, W_UK = W[:, :-dn, :], W[:, -dn:, :]"),
     "you took [v | k_nope]"),
    (_edit(_ABS, "W = kv_b_weight.reshape(H, -1, dc)", "W = kv_b_weight.reshape(-1, H, dc).transpose(0, 1)"),
     "(d_nope + d_v, H)"),
    (_edit(_ABS, "W = kv_b_weight.reshape(H, -1, dc)", "W = kv_b_weight.reshape(H, dc, -1).transpose(1, 2)"),
     "where a transpose was needed"),
    # (the course's own RoPE for the given rope part is allowed in the sandbox — attn_course.rope is lesson 12's
    # SANDBOX_ALLOW — so that variant is no misconception; the course's MLA module stays out of reach:)
    (_edit(_ABS, "q_pos = rope_half(q_rope, S - 1)",
           "q_pos = __import__('attn_course.mla').mla and rope_half(q_rope, S - 1)"),
     "FORBIDDEN"),
])


ALSO_CORRECT = {"12_absorbed_decode": [
    _EXPANDED,                                          # a per-head expand VIEW of the latent (no copy)
    _REPEATED,                                          # a per-head copy of the latent: the same FLOPs
    # review 08-14 L12-1 (alt12.py): MQA-style, [c_kv ; k_rope] expanded (a view) to the H heads, softmax by hand
    _GIVEN + '''

def absorbed_decode(q_nope, q_rope, c_kv, k_rope, kv_b_weight):
    B, H, d_nope = q_nope.shape
    S, d_R = k_rope.shape[1:]
    W = kv_b_weight.view(H, -1, kv_b_weight.shape[-1])
    W_UK, W_UV = W[:, :d_nope], W[:, d_nope:]
    q = torch.cat([torch.einsum("bhd,hdc->bhc", q_nope, W_UK), rope_half(q_rope, S - 1)], -1)[:, :, None]   # (B,H,1,D)
    kk = torch.cat([c_kv, k_rope], -1)[:, None].expand(B, H, S, c_kv.shape[-1] + d_R)                      # (B,H,S,D)
    s = (q @ kk.transpose(-1, -2)) / math.sqrt(d_nope + d_R)
    e = torch.exp(s - s.amax(-1, keepdim=True))
    o = ((e / e.sum(-1, keepdim=True)) @ c_kv[:, None].expand(B, H, S, c_kv.shape[-1]))[:, :, 0]           # (B,H,d_c)
    return torch.einsum("bhc,hvc->bhv", o, W_UV)
''',
    # review 08-14 (alt12.py): absorbed, with plain broadcasting matmuls (no einsum)
    _GIVEN + '''

def absorbed_decode(q_nope, q_rope, c_kv, k_rope, kv_b_weight):
    B, H, d_nope = q_nope.shape
    S, d_R = k_rope.shape[1:]
    W = kv_b_weight.view(H, -1, kv_b_weight.shape[-1])
    W_UK, W_UV = W[:, :d_nope], W[:, d_nope:]
    q_lat = (q_nope.unsqueeze(-2) @ W_UK).squeeze(-2)                       # (B, H, d_c)
    q_r = rope_half(q_rope, S - 1)
    s = q_lat @ c_kv.transpose(-1, -2) + q_r @ k_rope.transpose(-1, -2)     # (B, H, S)
    p = torch.softmax(s / math.sqrt(d_nope + d_R), -1)
    mixed = p @ c_kv                                                          # (B, H, d_c)
    return (mixed.unsqueeze(-2) @ W_UV.transpose(-1, -2)).squeeze(-2)
''',
]}
