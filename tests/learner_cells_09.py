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

# ---- 09_window_tiles: the band's tile list and its step -----------------------------------------------------

_BAND = '''
def band_tiles(L, window, block):
    return [(q0, k0) for q0 in range(0, L, block) for k0 in range({first}, min(q0 + block, L), block)]


def band_update(m, l, acc, q_i, k_j, v_j, q0, k0, window):
    s = q_i @ k_j.transpose(-2, -1) / {scale}
    i = torch.arange(q0, q0 + q_i.shape[-2])[:, None]
    j = torch.arange(k0, k0 + k_j.shape[-2])[None, :]
    s = s.masked_fill({hide}, -math.inf)
    m_new = torch.maximum(m, s.amax(-1, keepdim=True))
    m_sub = torch.where(m_new == -math.inf, 0.0, m_new)
    p, alpha = torch.exp(s - m_sub), torch.exp(m - m_sub)
    return m_new, alpha * l + p.sum(-1, keepdim=True), {rescaled} + p @ v_j
'''
_OK = dict(scale="math.sqrt(q_i.shape[-1])", first="max(0, q0 - window + 1) // block * block",
           hide="(j > i) | (i - j >= window)", rescaled="alpha * acc")
_PAIR = "(band_tiles, band_update)"


def _band(**change):
    return _BAND.format(**{**_OK, **change})


CELLS["09_window_tiles"] = (_PAIR, '''
def band_tiles(L, window, block):
    \"\"\"Per query block, walk the grid's key tiles down from the diagonal while the tile still reaches the
    block's oldest visible key q0 - W + 1.\"\"\"
    out = []
    for q0 in range(0, L, block):
        k0 = min(q0 + block, L) - 1 - (min(q0 + block, L) - 1) % block      # the diagonal tile
        while k0 >= 0 and k0 + block - 1 >= q0 - window + 1:
            out.append((q0, k0))
            k0 -= block
    return out


def band_update(m, l, acc, q_i, k_j, v_j, q0, k0, window):
    \"\"\"einsum, a where for the mask; no torch.softmax / logsumexp (F.scaled_dot_product_attention and
    flex_attention are not used).\"\"\"
    s = torch.einsum("bhid,bhjd->bhij", q_i, k_j) * q_i.shape[-1] ** -0.5
    gap = torch.arange(q0, q0 + q_i.shape[-2])[:, None] - torch.arange(k0, k0 + k_j.shape[-2])[None, :]
    s = torch.where((gap >= 0) & (gap < window), s, torch.tensor(-math.inf, dtype=s.dtype))
    m_new = torch.max(m, s.max(-1, keepdim=True).values)
    safe = m_new.nan_to_num(neginf=0.0)
    p, a = (s - safe).exp(), (m - safe).exp()
    return m_new, a * l + p.sum(-1, keepdim=True), a * acc + torch.einsum("bhij,bhjd->bhid", p, v_j)
''', [
    (_band(hide="(j > i) | (i - j > window)"), "off by one"),
    (_band(hide="i - j >= window"), "the diagonal tiles need the causal mask"),
    (_band(hide="j > i"), "the window mask is missing"),
    (_band(rescaled="acc"), "accumulator is not rescaled"),
    (_band(scale="1.0"), "not scaled"),
    (_band(first="0"), "holds no key any query of its block may see"),                 # every causal tile
    (_band(first="max(0, q0 - window + 1) // block * block + block"), "is missing"),
    # the review's H9-1 shortcuts as steps: an exact softmax over every tile seen so far (a stash), per row
    ('''
def band_tiles(L, window, block):
    return [(q0, k0) for q0 in range(0, L, block) for k0 in range(max(0, q0 - window + 1) // block * block,
                                                                    min(q0 + block, L), block)]

SEEN = {}
def band_update(m, l, acc, q_i, k_j, v_j, q0, k0, window):
    \"\"\"Per query row, one exact softmax over all the keys of the tiles seen so far; the state is ignored.\"\"\"
    SEEN.setdefault((q0, q_i.shape), []).append((k0, k_j, v_j))
    rows = []
    for r in range(q_i.shape[-2]):
        i = q0 + r
        ks = [(kk[..., n, :], vv[..., n, :]) for k0_, kk, vv in SEEN[(q0, q_i.shape)]
              for n in range(kk.shape[-2]) if 0 <= i - (k0_ + n) < window]
        if not ks:
            rows.append((torch.full_like(m[..., r, :], -math.inf), torch.zeros_like(l[..., r, :]), torch.zeros_like(acc[..., r, :])))
            continue
        s = torch.stack([(q_i[..., r, :] * kk).sum(-1) for kk, _ in ks], -1) / math.sqrt(q_i.shape[-1])
        mx = s.amax(-1, keepdim=True)
        e = torch.exp(s - mx)
        rows.append((mx, e.sum(-1, keepdim=True), (e[..., None] * torch.stack([vv for _, vv in ks], -2)).sum(-2)))
    return tuple(torch.stack([r[n] for r in rows], -2) for n in range(3))
''', "fold the tile into the state it is given"),
    ('''
def band_tiles(L, window, block):
    return [(q0, k0) for q0 in range(0, L, block) for k0 in range(max(0, q0 - window + 1) // block * block,
                                                                    min(q0 + block, L), block)]

def band_update(m, l, acc, q_i, k_j, v_j, q0, k0, window):
    \"\"\"The review's fused-op answer on one tile, merged into the state.\"\"\"
    i = torch.arange(q0, q0 + q_i.shape[-2])[:, None]; j = torch.arange(k0, k0 + k_j.shape[-2])[None, :]
    mask = torch.zeros(i.shape[0], j.shape[1], dtype=q_i.dtype).masked_fill((j > i) | (i - j >= window), -math.inf)
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q_i, k_j, v_j, 0.0, False, attn_mask=mask)[:2]
    lse = lse[..., None]
    m_new = torch.maximum(m, lse).nan_to_num(neginf=0.0)
    a, b = torch.exp(m - m_new), torch.exp(lse - m_new).nan_to_num(0.0)
    return m_new, a * l + b, a * acc + b * o.nan_to_num(0.0)
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
    out = F.scaled_dot_product_attention(q[:, :, None], k_cache, v_cache, attn_mask=valid.view(1, 1, 1, W))
    return out[:, :, 0], k_cache, v_cache
''', "FORBIDDEN"),
])


# ---- correct variants the review tried (08-14, alt09.py): each must get full marks ------------------------

ALSO_CORRECT = {"09_window_tiles": [
    # a tile zero-padded to block x block inside the step (the way GPU kernels pad edge tiles), and the band
    # as a set built from the visible pairs
    '''
def band_tiles(L, window, block):
    return sorted({(i // block * block, j // block * block) for i in range(L) for j in range(max(0, i - window + 1), i + 1)})


def band_update(m, l, acc, q_i, k_j, v_j, q0, k0, window):
    bq, bk, n = q_i.shape[-2], k_j.shape[-2], max(q_i.shape[-2], k_j.shape[-2], 8)
    pad = lambda t: torch.nn.functional.pad(t, (0, 0, 0, n - t.shape[-2]))
    s = pad(q_i) @ pad(k_j).transpose(-2, -1) / math.sqrt(q_i.shape[-1])
    i = torch.arange(q0, q0 + n)[:, None]; j = torch.arange(k0, k0 + n)[None, :]
    s = s.masked_fill((j > i) | (i - j >= window) | (j >= k0 + bk), -math.inf)[..., :bq, :]
    m_new = torch.maximum(m, s.amax(-1, keepdim=True)); ms = torch.where(m_new == -math.inf, 0.0, m_new)
    p = torch.exp(s - ms); a = torch.exp(m - ms)
    return m_new, a * l + p.sum(-1, keepdim=True), a * acc + p @ pad(v_j)
''',
]}
