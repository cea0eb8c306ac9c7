'''Learner-style cells for lesson 08's tiled backward (exercise 8.6), in the format of ``tests/learner_cells.py``:
``CELLS[exercise_id] = (function name, correct cell, [(wrong cell, hint), ...])``. (The other lesson-08 cells
live in ``learner_cells.py``.)

The correct cell runs FA2's loop order in another style than the solution (query tiles outside, an einsum per
product, dK/dV accumulated into per-tile lists); the wrong ones are the named mistakes (D_i forgotten, each
tile normalised by its own row sums instead of the saved lse, exp(S) unnormalised, the scale missing in dS),
the dense L × L backward of exercise 8.3, a dense backward by row strips, and a causal backward that visits
every tile.
'''

CELLS = {}

_TB = '''
def tiled_backward(q, k, v, out, lse, dout, causal, block):
    L, d = q.shape[-2:]
    scale = 1 / math.sqrt(d)
    D = {D}
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for k0 in range(0, L, block):
        k1 = min(k0 + block, L)
        kj, vj = k[..., k0:k1, :], v[..., k0:k1, :]
        for q0 in range({FIRST}, L, block):
            q1 = min(q0 + block, L)
            qi, do = q[..., q0:q1, :], dout[..., q0:q1, :]
            s = qi @ kj.transpose(-2, -1) * scale
            if causal:
                s = s.masked_fill(torch.arange(k0, k1)[None, :] > torch.arange(q0, q1)[:, None], -math.inf)
            p = {P}
            dv[..., k0:k1, :] += p.transpose(-2, -1) @ do
            ds = p * (do @ vj.transpose(-2, -1) - D[..., q0:q1, :]){SCALE}
            dq[..., q0:q1, :] += ds @ kj
            dk[..., k0:k1, :] += ds.transpose(-2, -1) @ qi
    return dq, dk, dv
'''
_TOK = dict(D="(dout * out).sum(-1, keepdim=True)", FIRST="k0 if causal else 0",
            P="torch.exp(s - lse[..., q0:q1, None])", SCALE=" * scale")


def _tb(**change):
    src = _TB
    for key, value in {**_TOK, **change}.items():
        src = src.replace("{" + key + "}", value)
    return src


CELLS["08_tiled_backward"] = ("tiled_backward", '''
def tiled_backward(q, k, v, out, lse, dout, causal, block):
    """Query tiles outside, key tiles inside (dQ finished per query tile, dK and dV summed over query tiles);
    einsum for every product. No torch.autograd, no softmax/logsumexp: P is exp(S - lse)."""
    L, d = q.shape[-2:]
    D = torch.einsum("bhld,bhld->bhl", dout, out)                     # D_i = rowsum(dO ∘ O)
    dq = torch.zeros_like(q)
    dk_parts = {k0: 0 for k0 in range(0, L, block)}
    dv_parts = {k0: 0 for k0 in range(0, L, block)}
    for q0 in range(0, L, block):
        q1 = min(q0 + block, L)
        rows = torch.arange(q0, q1)
        for k0 in range(0, q1 if causal else L, block):              # causal: key tiles up to the diagonal
            k1 = min(k0 + block, L)
            s = torch.einsum("bhid,bhjd->bhij", q[..., q0:q1, :], k[..., k0:k1, :]) / d ** 0.5
            if causal:
                s = torch.where(torch.arange(k0, k1)[None, :] <= rows[:, None], s, torch.tensor(-math.inf, dtype=s.dtype))
            p = (s - lse[..., q0:q1, None]).exp()
            dv_parts[k0] = dv_parts[k0] + torch.einsum("bhij,bhid->bhjd", p, dout[..., q0:q1, :])
            dp = torch.einsum("bhid,bhjd->bhij", dout[..., q0:q1, :], v[..., k0:k1, :])
            ds = p * (dp - D[..., q0:q1, None]) / d ** 0.5
            dq[..., q0:q1, :] += torch.einsum("bhij,bhjd->bhid", ds, k[..., k0:k1, :])
            dk_parts[k0] = dk_parts[k0] + torch.einsum("bhij,bhid->bhjd", ds, q[..., q0:q1, :])
    dk = torch.cat([dk_parts[k0] for k0 in range(0, L, block)], dim=-2)
    dv = torch.cat([dv_parts[k0] for k0 in range(0, L, block)], dim=-2)
    return dq, dk, dv
''', [
    (_tb(D="torch.zeros_like(out[..., :1])"), "D_i is missing"),
    (_tb(P="torch.exp(s - s.amax(-1, keepdim=True)) / torch.exp(s - s.amax(-1, keepdim=True)).sum(-1, keepdim=True)"),
     "not normalised by each tile's own row sums"),
    (_tb(P="torch.exp(s)"), "exp(S) alone is not normalised"),
    (_tb(SCALE=""), "the scale is missing in dS"),
    (_tb(FIRST="0"), "skip the tiles above the diagonal"),            # causal: every tile, masked
    ('''
def tiled_backward(q, k, v, out, lse, dout, causal, block):
    """Exercise 8.3's dense backward: the whole L x L matrices."""
    scale = 1 / math.sqrt(q.shape[-1])
    S = q @ k.transpose(-2, -1) * scale
    if causal:
        S = S.masked_fill(torch.ones(S.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    P = torch.exp(S - lse[..., None])
    dv = P.transpose(-2, -1) @ dout
    dS = P * (dout @ v.transpose(-2, -1) - (dout * out).sum(-1, keepdim=True))
    return dS @ k * scale, dS.transpose(-2, -1) @ q * scale, dv
''', "as large as the whole score matrix"),
    ('''
def tiled_backward(q, k, v, out, lse, dout, causal, block):
    """Dense by row strips: each query block against ALL keys at once."""
    L, d = q.shape[-2:]
    scale = 1 / math.sqrt(d)
    D = (dout * out).sum(-1, keepdim=True)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for q0 in range(0, L, block):
        q1 = min(q0 + block, L)
        s = q[..., q0:q1, :] @ k.transpose(-2, -1) * scale                  # (B, H, block, L)
        if causal:
            s = s.masked_fill(torch.arange(L)[None, :] > torch.arange(q0, q1)[:, None], -math.inf)
        p = torch.exp(s - lse[..., q0:q1, None])
        dv += p.transpose(-2, -1) @ dout[..., q0:q1, :]
        ds = p * (dout[..., q0:q1, :] @ v.transpose(-2, -1) - D[..., q0:q1, :]) * scale
        dq[..., q0:q1, :] = ds @ k
        dk += ds.transpose(-2, -1) @ q[..., q0:q1, :]
    return dq, dk, dv
''', "more than one tile's"),
    (_tb().replace("    L, d = q.shape[-2:]", "    L, d = q.shape[-2:]\n    _ = torch.autograd.grad"), "FORBIDDEN"),
])
