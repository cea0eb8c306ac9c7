'''Learner-style cells for lesson 09 (sparse and sliding-window attention), in the format of
``tests/learner_cells.py``: ``CELLS[exercise_id] = (function name, correct cell, [(wrong cell, hint), ...])``.

Written for the suite, not copied from the solutions: each correct cell solves its exercise in another style
than the solution notebook (loops for broadcasting, a strip of keys for aligned tiles, an oldest-first buffer
for slot ``t mod W``); the wrong cells are the misconceptions each judge promises to name, the forbidden
shortcuts ("FORBIDDEN") and, for the two build exercises, the versions that break the property the exercise is
about (tiles outside the band, an L × L tensor, a cache that grows, state kept outside the cache).
'''

CELLS = {}

CELLS["09_dilated_mask"] = ("dilated_mask", '''
def dilated_mask(L, window, dilation):
    """Loops, not broadcasting (attn_course.masks.dilated_mask is the reference -- not used)."""
    mask = torch.zeros(L, L, dtype=torch.bool)
    for i in range(L):
        for n in range(window):                       # the n-th kept key back from i, the query itself first
            if i - n * dilation >= 0:
                mask[i, i - n * dilation] = True
    return mask
''', [('''
def dilated_mask(L, window, dilation):
    d = torch.arange(L)[:, None] - torch.arange(L)[None, :]
    return ~((d >= 0) & (d % dilation == 0) & (d < window * dilation))
''', "polarity"), ('''
def dilated_mask(L, window, dilation):
    d = torch.arange(L)[:, None] - torch.arange(L)[None, :]
    return (d >= 0) & (d % dilation == 0) & (d <= window * dilation)
''', "off by one"), ('''
def dilated_mask(L, window, dilation):
    d = torch.arange(L)[:, None] - torch.arange(L)[None, :]
    return (d >= 0) & (d % dilation == 0) & (d < window)
''', "reach must be window·dilation"), ('''
def dilated_mask(L, window, dilation):
    d = torch.arange(L)[:, None] - torch.arange(L)[None, :]
    return (d % dilation == 0) & (d.abs() < window * dilation)
''', "must be causal"), ('''
from attn_course.masks import dilated_mask as _course_mask
def dilated_mask(L, window, dilation):
    return _course_mask(L, window, dilation)
''', "FORBIDDEN")])

CELLS["09_window_density"] = ("window_density", '''
def window_density(L, window):
    """Row by row: row i sees min(i + 1, window) keys (no L x L mask is built)."""
    visible = 0
    for i in range(L):
        visible += min(i + 1, window)
    return visible / L ** 2
''', [('''
def window_density(L, window):
    return L * window / (L * L)
''', "first W − 1 rows"), ('''
def window_density(L, window):
    return sum(min(i, window - 1) + 1 + min(L - 1 - i, window - 1) for i in range(L)) / L ** 2
''', "only the past"), ('''
def window_density(L, window):
    W = min(L, window)
    return W * (W + 1) // 2 + (L - W) * W
''', "fraction of all L² pairs"), ('''
import attn_course.masks as masks
def window_density(L, window):
    return masks.sliding_window_mask(L, window).float().mean().item()
''', "FORBIDDEN")])

CELLS["09_mask_mod"] = ("make_mask_mod", '''
def make_mask_mod(window, n_sink):
    """torch.logical_* spelled out; a closure over window and n_sink."""
    def mask_mod(b, h, q_idx, kv_idx):
        past = torch.logical_not(kv_idx > q_idx)
        near = torch.lt(q_idx - kv_idx, window)
        sink = torch.lt(kv_idx, n_sink)
        return torch.logical_and(past, torch.logical_or(near, sink))
    return mask_mod
''', [('''
def make_mask_mod(window, n_sink):
    def mask_mod(b, h, q_idx, kv_idx):
        return ((kv_idx <= q_idx) & (q_idx - kv_idx < window)) | (kv_idx < n_sink)
    return mask_mod
''', "sink tokens must stay causal"), ('''
def make_mask_mod(window, n_sink):
    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & ((q_idx - kv_idx <= window) | (kv_idx < n_sink))
    return mask_mod
''', "off by one"), ('''
def make_mask_mod(window, n_sink):
    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < window)
    return mask_mod
''', "sinks are missing"), ('''
def make_mask_mod(window, n_sink):
    def mask_mod(b, h, q_idx, kv_idx):
        m = (q_idx >= kv_idx) & (q_idx - kv_idx < window)
        m[..., :n_sink] = q_idx >= kv_idx[..., :n_sink]          # slicing: FlexAttention calls it on scalars
        return m
    return mask_mod
''', "FlexAttention cannot use this mask_mod"), ('''
from attn_course import sparse
def make_mask_mod(window, n_sink):
    win = sparse.sliding_window(window)
    def mask_mod(b, h, q_idx, kv_idx):
        return win(b, h, q_idx, kv_idx) | ((kv_idx < n_sink) & (kv_idx <= q_idx))
    return mask_mod
''', "FORBIDDEN")])

CELLS["09_receptive_field"] = ("receptive_field", '''
def receptive_field(num_layers, window, seq_len):
    """Walk back from the last position, one layer at a time."""
    first = seq_len - 1
    for _ in range(num_layers):
        first = max(0, first - window + 1)
    return seq_len - first
''', [('''
def receptive_field(num_layers, window, seq_len):
    return min(seq_len, num_layers * window)
''', "off by one"), ('''
def receptive_field(num_layers, window, seq_len):
    return num_layers * (window - 1) + 1
''', "cap the receptive field"), ('''
def receptive_field(num_layers, window, seq_len):
    return min(window, seq_len)
''', "stacking composes"), ('''
from attn_course.masks import sliding_window_mask
def receptive_field(num_layers, window, seq_len):
    L = min(seq_len, num_layers * window + 1)
    m = sliding_window_mask(L, window).double()
    reach = torch.linalg.matrix_power(m, num_layers)
    return int((reach[-1] > 0).sum()) if L == seq_len else num_layers * (window - 1) + 1
''', "FORBIDDEN")])

CELLS["09_rolling_cache_bytes"] = ("rolling_cache_bytes", '''
def rolling_cache_bytes(layers, kv_heads, head_dim, window, tokens, batch, nbytes):
    """Per layer: a K buffer and a V buffer of (batch, kv_heads, positions held, head_dim)."""
    held = window if tokens > window else tokens
    per_layer = 2 * batch * kv_heads * held * head_dim * nbytes
    return layers * per_layer
''', [('''
def rolling_cache_bytes(num_layers, num_kv_heads, head_dim, window, tokens, batch_size, bytes_per_element):
    return 2 * num_layers * batch_size * num_kv_heads * tokens * head_dim * bytes_per_element
''', "never holds more than W"), ('''
def rolling_cache_bytes(num_layers, num_kv_heads, head_dim, window, tokens, batch_size, bytes_per_element):
    return 2 * num_layers * batch_size * num_kv_heads * window * head_dim * bytes_per_element
''', "not full"), ('''
def rolling_cache_bytes(num_layers, num_kv_heads, head_dim, window, tokens, batch_size, bytes_per_element):
    return num_layers * batch_size * num_kv_heads * min(tokens, window) * head_dim * bytes_per_element
''', "multiply by 2"), ('''
from attn_course.gqa import RollingKVCache
def rolling_cache_bytes(num_layers, num_kv_heads, head_dim, window, tokens, batch_size, bytes_per_element):
    cache = RollingKVCache(window)
    cache.update(torch.zeros(batch_size, num_kv_heads, 1, head_dim), torch.zeros(batch_size, num_kv_heads, 1, head_dim))
    return num_layers * cache.nbytes() // 4 * bytes_per_element * min(tokens, window) // window
''', "FORBIDDEN")])

CELLS["09_fix_sparse_attention"] = ("sparse_attention", '''
import torch.nn.functional as F          # F.scaled_dot_product_attention would do it; this cell does it by hand

def sparse_attention(q, k, v, mask):
    """An additive bias: 0 where the mask allows, -inf where it hides (nn.MultiheadAttention is not used)."""
    bias = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(mask.logical_not(), float("-inf"))
    scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1]) + bias
    return F.softmax(scores, dim=-1) @ v
''', [('''
def sparse_attention(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores * mask, dim=-1) @ v
''', "⊙M bug"), ('''
def sparse_attention(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores + mask, dim=-1) @ v
''', "adding the 0/1 mask"), ('''
def sparse_attention(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
''', "polarity"), ('''
def sparse_attention(q, k, v, mask):
    scores = (q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
''', "1/√d"), ('''
import torch.nn.functional as F
def sparse_attention(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
''', "FORBIDDEN")])

# ---- 09_window_tiles: the band's tiles only ---------------------------------------------------------------

_TILES = '''
def window_attention(q, k, v, window, block):
    L, d = q.shape[-2:]
    out = torch.empty_like(q)
    for q0 in range(0, L, block):
        q1 = min(q0 + block, L)
        qi = q[..., q0:q1, :] / {scale}
        m = torch.full((*qi.shape[:-1], 1), -math.inf, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros_like(qi)
        for k0 in range({first}, {last}, block):
            k1 = min(k0 + block, L)
            s = qi @ k[..., k0:k1, :].transpose(-2, -1)
            i, j = torch.arange(q0, q1)[:, None], torch.arange(k0, k1)[None, :]
            s = s.masked_fill({hide}, -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            m_sub = {m_sub}
            p = torch.exp(s - m_sub)
            alpha = torch.exp(m - m_sub)
            l = alpha * l + p.sum(-1, keepdim=True)
            acc = {rescaled} + p @ v[..., k0:k1, :]
            m = m_new
        out[..., q0:q1, :] = acc / l
    return out
'''
_OK = dict(scale="math.sqrt(d)", first="max(0, q0 - window + 1) // block * block", last="q1",
           hide="(j > i) | (i - j >= window)", m_sub="torch.where(m_new == -math.inf, 0.0, m_new)",
           rescaled="alpha * acc")


def _tiles(**change):
    return _TILES.format(**{**_OK, **change})


CELLS["09_window_tiles"] = ("window_attention", '''
def window_attention(q, k, v, window, block):
    """Key tiles of `block` keys starting at q0 - W + 1 -- not aligned to the grid -- with the online softmax;
    einsum for the products. No torch.softmax / logsumexp: exp and sums by hand. (F.scaled_dot_product_attention
    and flex_attention are not used.)"""
    L, d = q.shape[-2:]
    out = torch.zeros_like(q)
    for q0 in range(0, L, block):
        q1 = min(L, q0 + block)
        run_max = torch.full((*q.shape[:-2], q1 - q0, 1), -math.inf, dtype=q.dtype)
        denom = torch.zeros_like(run_max)
        total = torch.zeros(*q.shape[:-2], q1 - q0, v.shape[-1], dtype=q.dtype)
        for lo in range(max(0, q0 - window + 1), q1, block):
            hi = min(lo + block, q1)
            scores = torch.einsum("bhid,bhjd->bhij", q[..., q0:q1, :], k[..., lo:hi, :]) * d ** -0.5
            gap = torch.arange(q0, q1)[:, None] - torch.arange(lo, hi)[None, :]        # i - j
            scores = torch.where((gap >= 0) & (gap < window), scores, torch.tensor(-math.inf, dtype=q.dtype))
            new_max = torch.maximum(run_max, scores.amax(-1, keepdim=True))
            shift = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
            weights, keep = (scores - shift).exp(), (run_max - shift).exp()
            denom = keep * denom + weights.sum(-1, keepdim=True)
            total = keep * total + torch.einsum("bhij,bhjd->bhid", weights, v[..., lo:hi, :])
            run_max = new_max
        out[..., q0:q1, :] = total / denom
    return out
''', [
    (_tiles(hide="(j > i) | (i - j > window)", first="max(0, q0 - window) // block * block"), "W + 1 keys"),
    (_tiles(hide="(i - j >= window) | ((j > i) & (k0 < q0))"), "diagonal tiles need the causal mask"),
    (_tiles(hide="j > i"), "window mask is missing"),
    (_tiles(rescaled="acc"), "accumulator is not rescaled"),
    (_tiles(scale="1.0"), "not scaled"),
    (_tiles(m_sub="m_new"), "NaN"),
    (_tiles(first="0", last="L"), "you visited about"),               # every tile, masked: right values
    (_tiles(first="0"), "the band has"),                              # every tile up to the diagonal
    # review 08-14 M9-1 (alt09.py): every causal tile, the products written as broadcast-multiply-and-sum
    (_tiles(first="0").replace("s = qi @ k[..., k0:k1, :].transpose(-2, -1)",
                               "s = (qi[..., :, None, :] * k[..., None, k0:k1, :]).sum(-1)")
                      .replace("p @ v[..., k0:k1, :]", "(p[..., :, :, None] * v[..., None, k0:k1, :]).sum(-2)"),
     "you visited about"),
    # review 08-14 M9-1 (alt09.py): no online softmax -- one exact softmax per query block over its key range
    ('''
def window_attention(q, k, v, window, block):
    L, d = q.shape[-2:]
    out = torch.empty_like(q)
    for q0 in range(0, L, block):
        q1 = min(q0 + block, L); k0 = max(0, q0 - window + 1)
        s = q[..., q0:q1, :] @ k[..., k0:q1, :].transpose(-2, -1) / math.sqrt(d)
        i = torch.arange(q0, q1)[:, None]; j = torch.arange(k0, q1)[None, :]
        s = s.masked_fill((j > i) | (i - j >= window), -math.inf)
        e = torch.exp(s - s.amax(-1, keepdim=True))
        out[..., q0:q1, :] = (e / e.sum(-1, keepdim=True)) @ v[..., k0:q1, :]
    return out
''', "not the online softmax"),
    ('''
def window_attention(q, k, v, window, block):
    L = q.shape[-2]
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])            # the whole L x L matrix: not tiled
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    s = s.masked_fill((j > i) | (i - j >= window), -math.inf)
    w = torch.exp(s - s.amax(-1, keepdim=True))
    return w @ v / w.sum(-1, keepdim=True)
''', "as large as the whole score matrix"),
    (_tiles().replace("p = torch.exp(s - m_sub)", "p = torch.softmax(s, -1) * torch.exp(s - m_sub).sum(-1, keepdim=True)"),
     "FORBIDDEN"),
    ('''
from torch.nn.attention.flex_attention import flex_attention
def window_attention(q, k, v, window, block):
    """FlexAttention's band, with a hand-written fallback where it cannot run."""
    try:
        return flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: torch.where((j <= i) & (i - j < window), s, -math.inf))
    except Exception:
        L = q.shape[-2]
        i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
        s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill((j > i) | (i - j >= window), -math.inf)
        w = torch.exp(s - s.amax(-1, keepdim=True))
        return w @ v / w.sum(-1, keepdim=True)
''', "FORBIDDEN"),
])

# ---- 09_rolling_decode: a cache bounded by W --------------------------------------------------------------

_DECODE = '''
def decode_step(k_cache, v_cache, q, k, v, t):
    W = k_cache.shape[-2]
    k_cache[:, :, {slot}] = k
    v_cache[:, :, {slot}] = v
    valid = {valid}
    s = torch.einsum("bhwd,bhd->bhw", k_cache, q) / {scale}
    w = torch.softmax(s.masked_fill(~valid, -math.inf), dim=-1)
    return torch.einsum("bhw,bhwd->bhd", w, v_cache), k_cache, v_cache
'''
_DOK = dict(slot="t % W", valid="torch.arange(W) <= t", scale="math.sqrt(q.shape[-1])")


def _decode(**change):
    return _DECODE.format(**{**_DOK, **change})


CELLS["09_rolling_decode"] = ("decode_step", '''
def decode_step(k_cache, v_cache, q, k, v, t):
    """Oldest first: drop slot 0, append the new token at the end (torch.cat, then the last W).
    Valid slots are the last min(t + 1, W); F.scaled_dot_product_attention is not used."""
    W = k_cache.shape[-2]
    k_cache = torch.cat([k_cache, k.unsqueeze(2)], dim=2)[:, :, -W:]
    v_cache = torch.cat([v_cache, v.unsqueeze(2)], dim=2)[:, :, -W:]
    valid = torch.arange(W) >= W - 1 - t
    scores = (k_cache * q.unsqueeze(2)).sum(-1) / math.sqrt(q.shape[-1])
    scores = torch.where(valid, scores, torch.tensor(-math.inf, dtype=scores.dtype))
    w = torch.exp(scores - scores.amax(-1, keepdim=True))
    out = (w.unsqueeze(-1) * v_cache).sum(2) / w.sum(-1, keepdim=True)
    return out, k_cache, v_cache
''', [
    ('''
def decode_step(k_cache, v_cache, q, k, v, t):
    W = k_cache.shape[-2]
    keys = torch.cat([k_cache, k[:, :, None]], 2)                # the whole buffer AND the new token
    vals = torch.cat([v_cache, v[:, :, None]], 2)
    valid = torch.cat([torch.arange(W) < t, torch.ones(1, dtype=torch.bool)])
    s = (keys @ q[..., None]).squeeze(-1) / math.sqrt(q.shape[-1])
    out = (torch.softmax(s.masked_fill(~valid, -math.inf), -1)[..., None, :] @ vals).squeeze(-2)
    k_cache[:, :, t % W], v_cache[:, :, t % W] = k, v
    return out, k_cache, v_cache
''', "W + 1 keys"),
    ('''
def decode_step(k_cache, v_cache, q, k, v, t):
    W = k_cache.shape[-2]
    valid = torch.arange(W) < t                                  # attends before storing: never itself
    s = (k_cache @ q[..., None]).squeeze(-1) / math.sqrt(q.shape[-1])
    out = (torch.softmax(s.masked_fill(~valid, -math.inf), -1)[..., None, :] @ v_cache).squeeze(-2)
    k_cache[:, :, t % W], v_cache[:, :, t % W] = k, v
    return out, k_cache, v_cache
''', "must see itself"),
    (_decode(valid="torch.ones(W, dtype=torch.bool)"), "empty slots"),
    (_decode(slot="min(t, W - 1)"), "replace the OLDEST"),
    ('''
def decode_step(k_cache, v_cache, q, k, v, t):
    W = k_cache.shape[-2]
    if t < W:                                                    # oldest first: fill slots 0, 1, ...
        k_cache[:, :, t], v_cache[:, :, t] = k, v
    else:                                                        # then shift -- dropping the newest, not the oldest
        k_cache = torch.cat([k_cache[:, :, :-1], k[:, :, None]], 2)
        v_cache = torch.cat([v_cache[:, :, :-1], v[:, :, None]], 2)
    valid = torch.arange(W) <= t
    s = (k_cache @ q[..., None]).squeeze(-1) / math.sqrt(q.shape[-1])
    w = torch.softmax(s.masked_fill(~valid, -math.inf), -1)
    return (w[..., None, :] @ v_cache).squeeze(-2), k_cache, v_cache
''', "replace the OLDEST"),
    (_decode(valid="torch.arange(W) <= t % W"), "not while s <= t mod W"),
    (_decode(scale="1.0"), "not scaled"),
    ('''
history = []

def decode_step(k_cache, v_cache, q, k, v, t):
    """Keeps its tokens in a global list: right for ONE sequence, and memory grows with t."""
    history.append((k, v))
    keys = torch.stack([a for a, _ in history[-k_cache.shape[-2]:]], 2)
    vals = torch.stack([b for _, b in history[-k_cache.shape[-2]:]], 2)
    w = torch.softmax((keys @ q[..., None]).squeeze(-1) / math.sqrt(q.shape[-1]), -1)
    return (w[..., None, :] @ vals).squeeze(-2), k_cache, v_cache
''', "keeps tokens outside the caches"),
    ('''
def decode_step(k_cache, v_cache, q, k, v, t):
    """An ordinary KV cache: it grows by one position per token."""
    if t == 0:
        k_cache, v_cache = k_cache[:, :, :0], v_cache[:, :, :0]
    k_cache = torch.cat([k_cache, k[:, :, None]], 2)
    v_cache = torch.cat([v_cache, v[:, :, None]], 2)
    keys, vals = k_cache[:, :, -4:], v_cache[:, :, -4:]
    w = torch.softmax((keys @ q[..., None]).squeeze(-1) / math.sqrt(q.shape[-1]), -1)
    return (w[..., None, :] @ vals).squeeze(-2), k_cache, v_cache
''', "never grows"),
    ('''
import torch.nn.functional as F
def decode_step(k_cache, v_cache, q, k, v, t):
    W = k_cache.shape[-2]
    k_cache[:, :, t % W], v_cache[:, :, t % W] = k, v
    valid = torch.arange(W) <= t
    out = F.scaled_dot_product_attention(q[:, :, None], k_cache, v_cache, attn_mask=valid)
    return out[:, :, 0], k_cache, v_cache
''', "FORBIDDEN"),
])


# ---- correct variants the review tried (08-14, alt09.py): each must get full marks ------------------------

ALSO_CORRECT = {"09_window_tiles": [
    # the grid's tiles on inputs zero-padded to a multiple of block (the way GPU kernels pad)
    '''
def window_attention(q, k, v, window, block):
    B, H, L, d = q.shape
    Lp = -(-L // block) * block
    pad = lambda t: torch.cat([t, t.new_zeros(B, H, Lp - L, t.shape[-1])], -2)
    qp, kp, vp = pad(q), pad(k), pad(v)
    out = torch.empty_like(qp)
    for q0 in range(0, Lp, block):
        q1 = q0 + block
        qi = qp[..., q0:q1, :] / math.sqrt(d)
        m = torch.full((B, H, block, 1), -math.inf, dtype=q.dtype); l = torch.zeros_like(m); acc = torch.zeros_like(qi)
        for k0 in range(max(0, q0 - window + 1) // block * block, q1, block):
            k1 = k0 + block
            s = qi @ kp[..., k0:k1, :].transpose(-2, -1)
            i = torch.arange(q0, q1)[:, None]; j = torch.arange(k0, k1)[None, :]
            s = s.masked_fill((j > i) | (i - j >= window), -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True)); ms = torch.where(m_new == -math.inf, 0.0, m_new)
            p = torch.exp(s - ms); a = torch.exp(m - ms)
            l = a * l + p.sum(-1, keepdim=True); acc = a * acc + p @ vp[..., k0:k1, :]; m = m_new
        out[..., q0:q1, :] = acc / l
    return out[..., :L, :]
''',
    # the band's tiles with the products written as broadcast-multiply-and-sum: counted like matmuls
    _tiles().replace("s = qi @ k[..., k0:k1, :].transpose(-2, -1)",
                     "s = (qi[..., :, None, :] * k[..., None, k0:k1, :]).sum(-1)")
            .replace("p @ v[..., k0:k1, :]", "(p[..., :, :, None] * v[..., None, k0:k1, :]).sum(-2)"),
]}
