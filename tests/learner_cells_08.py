'''Learner-style cells for lesson 08's step-driven builds (8.2 the forward's tile step, 8.3 the backward from the
lse, 8.6 the backward's tile step), in the format of ``tests/learner_cells.py``:
``CELLS[exercise_id] = (object expression, correct cell, [(wrong cell, hint), ...])``. (The other lesson-08 cells
live in ``learner_cells.py``.)

The wrong cells are the named mistakes and the review's shortcuts (2026-11-28 review, H8-1, M8-2): PyTorch's fused
flash kernels on a tile, a step that ignores the state or the lse/D it is given (a stash of the tiles seen, an
autograd pass through the dense forward). ``ALSO_CORRECT`` holds the variants that must get full marks: under
``torch.no_grad()`` / ``inference_mode()``, a zero-padded tile (M8-1), the gradients by autograd of the tile's
formula.
'''

CELLS = {}

# ---- 8.2: the forward's tile step --------------------------------------------------------------------------

CELLS["08_tiled_forward"] = ("flash_tile", '''
def flash_tile(m, l, acc, q_i, k_j, v_j, visible):
    """einsum and torch.where; no torch.softmax / torch.logsumexp (named here only)."""
    s = torch.einsum("bhid,bhjd->bhij", q_i, k_j) * q_i.shape[-1] ** -0.5
    s = torch.where(visible, s, torch.tensor(-math.inf, dtype=s.dtype))
    m_new = torch.max(m, s.max(dim=-1, keepdim=True).values)
    safe = m_new.nan_to_num(neginf=0.0)                         # no key seen yet: subtract 0
    p, alpha = (s - safe).exp(), (m - safe).exp()
    return m_new, alpha * l + p.sum(-1, keepdim=True), alpha * acc + torch.einsum("bhij,bhjd->bhid", p, v_j)
''', [('''
def flash_tile(m, l, acc, q_i, k_j, v_j, visible):
    s = (q_i @ k_j.transpose(-2, -1) / math.sqrt(q_i.shape[-1])).masked_fill(~visible, -math.inf)
    m_new = torch.maximum(m, s.amax(-1, keepdim=True))
    m_sub = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
    p, alpha = torch.exp(s - m_sub), torch.exp(m - m_sub)
    return m_new, alpha * l + p.sum(-1, keepdim=True), acc + p @ v_j
''', "accumulator is not rescaled"), ('''
def flash_tile(m, l, acc, q_i, k_j, v_j, visible):
    s = q_i @ k_j.transpose(-2, -1) / math.sqrt(q_i.shape[-1])           # visible ignored
    m_new = torch.maximum(m, s.amax(-1, keepdim=True))
    p, alpha = torch.exp(s - m_new), torch.exp(m - m_new)
    return m_new, alpha * l + p.sum(-1, keepdim=True), alpha * acc + p @ v_j
''', "`visible` is ignored"), ('''
SEEN = []
def flash_tile(m, l, acc, q_i, k_j, v_j, visible):
    """The review's shortcut in a step: stash every tile of the block and redo ONE exact softmax over all of
    them, ignoring the state it is given (H9-1's per-block softmax). The block is recognised in torch."""
    for q_seen, tiles in SEEN:
        if q_seen.shape == q_i.shape and torch.equal(q_seen, q_i):
            break
    else:
        tiles = []
        SEEN.append((q_i, tiles))
    tiles.append((k_j, v_j, visible))
    s = torch.cat([(q_i @ k.transpose(-2, -1) / math.sqrt(q_i.shape[-1])).masked_fill(~vis, -math.inf)
                   for k, _, vis in tiles], -1)
    vv = torch.cat([v for _, v, _ in tiles], -2)
    m_new = s.amax(-1, keepdim=True)
    p = torch.exp(s - m_new.nan_to_num(neginf=0.0))
    return m_new, p.sum(-1, keepdim=True), p @ vv
''', "fold the tile into the state it is given"), ('''
def flash_tile(m, l, acc, q_i, k_j, v_j, visible):
    """The review's H8-1 answer, on one tile: PyTorch's fused CPU flash kernel, its (out, lse) merged in."""
    mask = torch.zeros(visible.shape, dtype=q_i.dtype).masked_fill(~visible, -math.inf)
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q_i, k_j, v_j, 0.0, False, attn_mask=mask)[:2]
    lse = lse[..., None]
    m_new = torch.maximum(m, lse).nan_to_num(neginf=0.0)
    a, b = torch.exp(m - m_new), torch.exp(lse - m_new).nan_to_num(0.0)
    return m_new, a * l + b, a * acc + b * o.nan_to_num(0.0)
''', "FORBIDDEN")])

# ---- 8.3: the dense backward from out and lse ----------------------------------------------------------------

CELLS["08_backward_from_lse"] = ("attention_backward", '''
def attention_backward(q, k, v, out, lse, dout, causal):
    """By hand, under inference_mode (no autograd needed), no torch.softmax."""
    with torch.inference_mode():
        scale = q.shape[-1] ** -0.5
        S = torch.einsum("bhid,bhjd->bhij", q, k) * scale
        if causal:
            S = S + torch.full(S.shape[-2:], -math.inf, dtype=S.dtype).triu(1)
        P = (S - lse.unsqueeze(-1)).exp()
        dP = torch.einsum("bhid,bhjd->bhij", dout, v)
        dS = P * (dP - (dout * out).sum(-1, keepdim=True))
        return (torch.einsum("bhij,bhjd->bhid", dS, k) * scale, torch.einsum("bhij,bhid->bhjd", dS, q) * scale,
                torch.einsum("bhij,bhid->bhjd", P, dout))
''', [('''
def attention_backward(q, k, v, out, lse, dout, causal):
    scale = 1 / math.sqrt(q.shape[-1])
    S = q @ k.transpose(-2, -1) * scale
    if causal:
        S = S.masked_fill(torch.ones(S.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    P = torch.exp(S - lse[..., None])
    dS = P * (dout @ v.transpose(-2, -1))
    return dS @ k * scale, dS.transpose(-2, -1) @ q * scale, P.transpose(-2, -1) @ dout
''', "you left out D"), ('''
def attention_backward(q, k, v, out, lse, dout, causal):
    """The review's M8-2 shortcut: ignore out and lse, autograd through a forward of my own."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        S = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            S = S.masked_fill(torch.ones(S.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
        e = torch.exp(S - S.amax(-1, keepdim=True))
        o = (e / e.sum(-1, keepdim=True)) @ v
        return torch.autograd.grad(o, (q, k, v), dout)
''', "not from the lse"), ('''
def attention_backward(q, k, v, out, lse, dout, causal):
    """The review's M8-2 shortcut, by hand: recompute the lse by a forward pass instead of reading it."""
    scale = 1 / math.sqrt(q.shape[-1])
    S = q @ k.transpose(-2, -1) * scale
    if causal:
        S = S.masked_fill(torch.ones(S.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    m = S.amax(-1, keepdim=True)
    P = torch.exp(S - m) / torch.exp(S - m).sum(-1, keepdim=True)
    o = P @ v
    dS = P * (dout @ v.transpose(-2, -1) - (dout * o).sum(-1, keepdim=True))
    return dS @ k * scale, dS.transpose(-2, -1) @ q * scale, P.transpose(-2, -1) @ dout
''', "not from the lse"), ('''
def attention_backward(q, k, v, out, lse, dout, causal):
    """The review's H8-1 answer: PyTorch's fused CPU flash backward."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout, q, k, v, out, lse, 0.0, causal)
''', "FORBIDDEN")])

# ---- 8.6: the backward's tile step ---------------------------------------------------------------------------

_TB = '''
def tile_step(q_i, k_j, v_j, do_i, lse_i, D_i, visible):
    scale = 1 / math.sqrt(q_i.shape[-1])
    s = q_i @ k_j.transpose(-2, -1) * scale
    {MASK}
    p = {P}
    ds = p * (do_i @ v_j.transpose(-2, -1) - {D}){SCALE}
    return ds @ k_j, ds.transpose(-2, -1) @ q_i, p.transpose(-2, -1) @ do_i
'''
_TOK = dict(MASK="s = s.masked_fill(~visible, -math.inf)", P="torch.exp(s - lse_i[..., None])", D="D_i[..., None]",
            SCALE=" * scale")


def _tb(**change):
    src = _TB
    for key, value in {**_TOK, **change}.items():
        src = src.replace("{" + key + "}", value)
    return src


CELLS["08_tiled_backward"] = ("tile_step", '''
def tile_step(q_i, k_j, v_j, do_i, lse_i, D_i, visible):
    """einsum for every product, under torch.no_grad(); P = exp(S - lse) (no softmax, no logsumexp)."""
    with torch.no_grad():
        d = q_i.shape[-1]
        s = torch.einsum("bhid,bhjd->bhij", q_i, k_j) / d ** 0.5
        p = torch.where(visible, (s - lse_i[..., None]).exp(), torch.zeros((), dtype=s.dtype))
        dp = torch.einsum("bhid,bhjd->bhij", do_i, v_j)
        ds = p * (dp - D_i.unsqueeze(-1)) / d ** 0.5
        return (torch.einsum("bhij,bhjd->bhid", ds, k_j), torch.einsum("bhij,bhid->bhjd", ds, q_i),
                torch.einsum("bhij,bhid->bhjd", p, do_i))
''', [
    (_tb(D="0.0"), "D_i is missing"),
    (_tb(P="torch.exp(s - s.amax(-1, keepdim=True)) / torch.exp(s - s.amax(-1, keepdim=True)).sum(-1, keepdim=True)"),
     "not normalised by each tile's own row sums"),
    (_tb(P="torch.exp(s)"), "exp(S) alone is not normalised"),
    (_tb(SCALE=""), "the scale is missing in dS"),
    (_tb(MASK="pass"), "`visible` is ignored"),
    ('''
def tile_step(q_i, k_j, v_j, do_i, lse_i, D_i, visible):
    """The review's H8-1 answer, on one tile: the fused backward, with an out rebuilt so that rowsum(dO*out) = D."""
    out = do_i * (D_i / (do_i * do_i).sum(-1))[..., None]
    causal = bool((~visible).any())
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        do_i, q_i, k_j, v_j, out, lse_i, 0.0, causal)
''', "FORBIDDEN"),
])

ALSO_CORRECT = {
    "08_tiled_backward": [
        # zero-padded to a multiple of 8 rows (review M8-1): the padded keys are hidden, the padded rows dropped
        '''
def tile_step(q_i, k_j, v_j, do_i, lse_i, D_i, visible):
    """Pads the tile to 8 x 8 as a GPU kernel pads its edge tiles."""
    bq, bk, pad = q_i.shape[-2], k_j.shape[-2], lambda t, n: torch.nn.functional.pad(t, (0, 0, 0, n - t.shape[-2]))
    Q, K, V, dO = pad(q_i, 8), pad(k_j, 8), pad(v_j, 8), pad(do_i, 8)
    lse = torch.nn.functional.pad(lse_i, (0, 8 - bq)); D = torch.nn.functional.pad(D_i, (0, 8 - bq))
    vis = torch.zeros(8, 8, dtype=torch.bool); vis[:bq, :bk] = visible
    scale = 1 / math.sqrt(q_i.shape[-1])
    p = torch.exp((Q @ K.transpose(-2, -1) * scale).masked_fill(~vis, -math.inf) - lse[..., None])
    ds = p * (dO @ V.transpose(-2, -1) - D[..., None]) * scale
    return (ds @ K)[..., :bq, :], (ds.transpose(-2, -1) @ Q)[..., :bk, :], (p.transpose(-2, -1) @ dO)[..., :bk, :]
''',
        # the tile's gradients by autograd of its own formula, lse and D as given (the math, not a shortcut)
        '''
def tile_step(q_i, k_j, v_j, do_i, lse_i, D_i, visible):
    """d/d(q, k, v) of sum(dO * P V) - sum(D * rowsum P), with P = exp(S - lse): the tile's dq, dk, dv."""
    q, k, v = (t.detach().requires_grad_() for t in (q_i, k_j, v_j))
    with torch.enable_grad():
        P = torch.exp((q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~visible, -math.inf)
                      - lse_i[..., None])
        f = (do_i * (P @ v)).sum() - (D_i * P.sum(-1)).sum()
        return torch.autograd.grad(f, (q, k, v))
''',
    ],
    "08_tiled_forward": [
        # under inference_mode, state kept as (m, l, acc) with an einsum-free broadcast product
        '''
def flash_tile(m, l, acc, q_i, k_j, v_j, visible):
    with torch.inference_mode():
        s = (q_i[..., :, None, :] * k_j[..., None, :, :]).sum(-1) / math.sqrt(q_i.shape[-1])
        s = s.masked_fill(~visible, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        shift = torch.where(torch.isinf(m_new), 0.0, m_new)
        p = torch.exp(s - shift)
        a = torch.exp(m - shift)
        return m_new.clone(), (a * l + p.sum(-1, keepdim=True)).clone(), (a * acc + p @ v_j).clone()
''',
    ],
}
