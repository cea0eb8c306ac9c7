'''Learner-style cells for lesson 13 (format: see tests/learner_cells.py), written for the suite and NOT copied
from the solutions: for every exercise a correct cell in another style than the solution, and the
misconceptions whose hints the judges promise (forbidden shortcuts, a ring that gathers everything).'''

CELLS = {}

CELLS["13_merge_partials"] = ("merge", '''
def merge(out1, lse1, out2, lse2):
    """Stack the two parts and let logsumexp do the max trick (attn_course.ring.merge_partials is not used);
    a row with no key on either side stays zero."""
    lses = torch.stack([lse1, lse2])                      # (2, Lq)
    lse = torch.logsumexp(lses, dim=0)
    w = torch.exp(lses - lse.nan_to_num(neginf=0.0)).nan_to_num(0.0)
    return w[0].unsqueeze(-1) * out1 + w[1].unsqueeze(-1) * out2, lse
''', [('''
def merge(out1, lse1, out2, lse2):
    return 0.5 * (out1 + out2), torch.logaddexp(lse1, lse2)
''', "you averaged the two outputs"), ('''
def merge(out1, lse1, out2, lse2):
    # ring-flash-attention's update: right wherever both parts saw a key
    out = out1 - torch.sigmoid(lse2 - lse1).unsqueeze(-1) * (out1 - out2)
    return out, lse1 - torch.nn.functional.logsigmoid(lse1 - lse2)
''', "sigmoid form"), ('''
def merge(out1, lse1, out2, lse2):
    a, b = lse1.exp(), lse2.exp()                          # overflows for large logits
    return (a[:, None] * out1 + b[:, None] * out2) / (a + b)[:, None], (a + b).log()
''', "NaN"), ('''
def merge(out1, lse1, out2, lse2):
    lse = torch.logaddexp(lse1, lse2)
    safe = lse.clamp_min(-1e300)
    return (lse1 - safe).exp()[:, None] * out1 + (lse2 - safe).exp()[:, None] * out2, torch.maximum(lse1, lse2)
''', "not the max"), ('''
from attn_course.ring import merge_partials
def merge(out1, lse1, out2, lse2):
    return merge_partials(out1, lse1, out2, lse2)
''', "FORBIDDEN")])

CELLS["13_ring_schedule"] = ("shard_at", '''
def shard_at(rank, step, world):
    """Walk back `step` hops around the ring, one at a time."""
    src = rank
    for _ in range(step):
        src = world - 1 if src == 0 else src - 1
    return src
''', [('''
def shard_at(r, t, P):
    return (r + t) % P
''', "wrong direction"), ('''
def shard_at(r, t, P):
    return r - t
''', "modulo P"), ('''
def shard_at(r, t, P):
    return (r - t - 1) % P
''', "t hops")])

CELLS["13_zigzag_positions"] = ("zigzag_positions", '''
def zigzag_positions(rank, world, L):
    chunk = L // (2 * world)
    starts = [rank * chunk, (2 * world - 1 - rank) * chunk]
    return [s + i for s in starts for i in range(chunk)]
''', [('''
def zigzag_positions(rank, world, L):
    n = L // world
    return torch.arange(rank * n, rank * n + n)
''', "contiguous layout"), ('''
def zigzag_positions(rank, world, L):
    c = L // (2 * world)
    return torch.cat([torch.arange(L)[(2 * world - 1 - rank) * c:(2 * world - rank) * c], torch.arange(L)[rank * c:(rank + 1) * c]])
''', "wrong order"), ('''
def zigzag_positions(rank, world, L):
    c = L // (2 * world)
    return torch.cat([torch.arange(rank * c, rank * c + c), torch.arange((world - 1 - rank) * c, (world - rank) * c)])
''', "not P−1−r")])

CELLS["13_ring_bytes"] = ("ring_bytes", '''
def ring_bytes(P, B, H, L, E, nbytes):
    """attn_course.ring.ring_comm_bytes would tell -- by hand: every hop but the last carries K and V."""
    shard_bytes = B * H * (L // P) * E * nbytes
    return sum(2 * shard_bytes for _hop in range(P - 1))
''', [('''
def ring_bytes(world, batch, heads, seq_len, head_dim, elem_bytes):
    return world * 2 * batch * heads * (seq_len // world) * head_dim * elem_bytes
''', "P hops"), ('''
def ring_bytes(world, batch, heads, seq_len, head_dim, elem_bytes):
    return (world - 1) * batch * heads * (seq_len // world) * head_dim * elem_bytes
''', "both K and V"), ('''
def ring_bytes(world, batch, heads, seq_len, head_dim, elem_bytes):
    return (world - 1) * 2 * batch * heads * seq_len * head_dim * elem_bytes
''', "L/P positions"), ('''
def ring_bytes(world, batch, heads, seq_len, head_dim, elem_bytes):
    shard = batch * heads * (seq_len // world) * head_dim * elem_bytes
    return 4 * (world - 1) * shard // world
''', "Ulysses"), ('''
import attn_course.ring as r
def ring_bytes(world, batch, heads, seq_len, head_dim, elem_bytes):
    return r.ring_comm_bytes(world=world, batch=batch, heads=heads, seq_len=seq_len, head_dim=head_dim,
                             elem_bytes=elem_bytes)
''', "FORBIDDEN")])

CELLS["13_causal_blocks"] = ("block_kind", '''
SKIP, DIAGONAL, FULL = 0, 1, 2

def block_kind(rank, src, world):
    return [FULL, DIAGONAL, SKIP][(src > rank) + (src >= rank)]
''', [('''
def block_kind(rank, src, world):
    if src > rank:
        return 2
    if src == rank:
        return 1
    return 0
''', "still the bug"), ('''
def block_kind(rank, src, world):
    return 2 if src <= rank else 0
''', "causal on its diagonal"), ('''
def block_kind(rank, src, world):
    return 2 if src < rank else 0
''', "cannot be skipped"), ('''
def block_kind(rank, src, world):
    return 2 if src < rank else 1
''', "skip them instead")])

# 13_ring_loop: the correct cell masks its diagonal block by global positions and keeps lesson 08's running
# max and sum; the wrong ones each change one thing of a plain loop.
_RING = '''
def ring_forward(q, rank, world, ring, causal):
    scale = q.shape[-1] ** -0.5
    out, lse = None, torch.full(q.shape[:-1], -math.inf, dtype=q.dtype)
    for t in range(world):
        k, v = ring.kv()
        src = SRC
        if out is None:
            out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
        if not (causal and SKIP):
            s = q @ k.transpose(-2, -1) * SCALE
            if causal and src == rank:
                s = MASK
            lb = torch.logsumexp(s, -1)
            ob = torch.softmax(s, -1) @ v
            MERGE
        PASS
    return out, lse
'''
_RIGHT = dict(SRC="(rank - t) % world", SKIP="src > rank", SCALE="scale",
              MASK="s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)",
              MERGE="new = torch.logaddexp(lse, lb)\n            out = (lse - new).exp()[..., None] * out + "
                    "(lb - new).exp()[..., None] * ob\n            lse = new",
              PASS="if t < world - 1:\n            ring.pass_on()")


def _ring(**change):
    src = _RING
    for key, value in {**_RIGHT, **change}.items():
        src = src.replace(key, value)
    return src


CELLS["13_ring_loop"] = ("ring_forward", '''
def ring_forward(q, rank, world, ring, causal):
    """One rank of the ring. Not attn_course.ring.ring_attention: the diagonal block masked by GLOBAL positions,
    later shards skipped (but still relayed), and lesson 08's running max m and sum l."""
    c = q.shape[-2]
    my_pos = torch.arange(rank * c, (rank + 1) * c)
    m = torch.full(q.shape[:-1], -math.inf, dtype=q.dtype)
    l = torch.zeros_like(m)
    acc = 0
    for step in range(world):
        k, v = ring.kv()
        owner = (rank - step) % world                      # the shard started on this rank
        if not (causal and owner > rank):                  # a later rank's keys are all in the future
            s = torch.einsum("bhqe,bhke->bhqk", q, k) / math.sqrt(q.shape[-1])
            if causal:
                their_pos = torch.arange(owner * c, (owner + 1) * c)
                s = s.masked_fill(their_pos[None, :] > my_pos[:, None], -math.inf)
            m_new = torch.maximum(m, s.amax(-1))
            shift = torch.where(m_new == -math.inf, 0.0, m_new)
            p = torch.exp(s - shift[..., None])
            alpha = torch.exp(m - shift)
            l, acc, m = alpha * l + p.sum(-1), alpha[..., None] * acc + p @ v, m_new
        if step != world - 1:
            ring.pass_on()
    return acc / l[..., None], m + torch.log(l)
''', [
    (_ring(MERGE="out = (out * t + ob) / (t + 1) if t else ob\n            lse = torch.logaddexp(lse, lb)"),
     "without their log-sum-exps"),                              # averaging (a running mean)
    (_ring(MERGE="out = out + ob\n            lse = torch.logaddexp(lse, lb)"), "without their log-sum-exps"),
    (_ring(SCALE="1.0"), "not scaled"),
    (_ring(MERGE="new = torch.logaddexp(lse, lb)\n            out = (lse - new).exp()[..., None] * out + "
                 "(lb - new).exp()[..., None] * ob\n            lse = torch.maximum(lse, lb)"), "not the max"),
    (_ring(MASK="s"), "diagonal block"),                           # the causal diagonal left unmasked
    (_ring(SKIP="False"), "LATER ranks"),                          # future shards not skipped
    (_ring(SKIP="False", MASK="s"), "causal mask is missing"),
    (_ring(SRC="rank - t"), "without the mod"),
    (_ring(SRC="(rank + t) % world"), "not (r + t) mod P"),
    (_ring(SKIP="src >= rank"), "cannot be skipped"),
    (_ring(PASS="ring.pass_on()"), "back where it started"),      # P passes: one more after the last step
    (_ring(PASS="if t < min(rank, world - 1) or not causal and t < world - 1:\n            ring.pass_on()"),
     "every rank passes its shard on P − 1"),                     # stops relaying once it has what it needs
    ('''
def ring_forward(q, rank, world, ring, causal):
    # gather everything, then attend once: the ring refuses a list of shards
    shards = []
    for t in range(world):
        shards.append(ring.kv())
        if t < world - 1:
            ring.pass_on()
    shards = shards[::-1][world - 1 - rank:] + shards[::-1][:world - 1 - rank]
    K = torch.cat([k for k, _ in shards], -2)
    V = torch.cat([v for _, v in shards], -2)
    s = q @ K.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(s, -1) @ V, torch.logsumexp(s, -1)
''', "keeps ONE shard at a time"),
    ('''
def ring_forward(q, rank, world, ring, causal):
    # gather copies, then attend once: a whole K of the sequence
    ks, vs = {}, {}
    for t in range(world):
        k, v = ring.kv()
        ks[(rank - t) % world], vs[(rank - t) % world] = k.clone(), v.clone()
        if t < world - 1:
            ring.pass_on()
    K = torch.cat([ks[s] for s in range(world)], -2)
    V = torch.cat([vs[s] for s in range(world)], -2)
    c = q.shape[-2]
    s = q @ K.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.arange(K.shape[-2])[None, :] > torch.arange(rank * c, rank * c + c)[:, None],
                          -math.inf)
    return torch.softmax(s, -1) @ V, torch.logsumexp(s, -1)
''', "never gathers them"),
    ('''
from attn_course.ring import merge_partials
def ring_forward(q, rank, world, ring, causal):
    out = lse = None
    for t in range(world):
        k, v = ring.kv()
        src = (rank - t) % world
        if not (causal and src > rank):
            s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            if causal and src == rank:
                s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
            ob, lb = torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)
            out, lse = (ob, lb) if out is None else merge_partials(out, lse, ob, lb)
        if t < world - 1:
            ring.pass_on()
    return out, lse
''', "FORBIDDEN"),
    # review 08-14 (13.6, alt13.py): every shard computed, the later ones masked with -inf over global positions
    # instead of skipped -- right values, the work the causal skip saves
    ('''
def ring_forward(q, rank, world, ring, causal):
    c = q.shape[-2]
    my_pos = torch.arange(rank * c, (rank + 1) * c)
    m = torch.full(q.shape[:-1], -math.inf, dtype=q.dtype)
    l = torch.zeros_like(m)
    acc = 0
    for step in range(world):
        k, v = ring.kv()
        owner = (rank - step) % world                      # the shard started on this rank
        s = torch.einsum("bhqe,bhke->bhqk", q, k) / math.sqrt(q.shape[-1])
        if causal:
            their_pos = torch.arange(owner * c, (owner + 1) * c)
            s = s.masked_fill(their_pos[None, :] > my_pos[:, None], -math.inf)
        m_new = torch.maximum(m, s.amax(-1))
        shift = torch.where(m_new == -math.inf, 0.0, m_new)
        p = torch.exp(s - shift[..., None])
        alpha = torch.exp(m - shift)
        l, acc, m = alpha * l + p.sum(-1), alpha[..., None] * acc + p @ v, m_new
        if step != world - 1:
            ring.pass_on()
    return acc / l[..., None], m + torch.log(l)
''', "masking them with −∞ does the work"),
    ('''
def ring_forward(q, rank, world, ring, causal):
    # alt13.py verbatim: one shard at a time, but the causal mask built from global positions on every shard
    c = q.shape[-2]
    pos_q = torch.arange(rank * c, (rank + 1) * c)
    out, lse = None, None
    for t in range(world):
        k, v = ring.kv()
        src = (rank - t) % world
        pos_k = torch.arange(src * c, (src + 1) * c)
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            s = s.masked_fill(pos_k[None, :] > pos_q[:, None], -math.inf)   # a later shard: all -inf
        lb = torch.logsumexp(s, -1)
        ob = torch.nan_to_num(torch.exp(s - lb[..., None])) @ v
        if out is None:
            out, lse = ob, lb
        else:
            new = torch.logaddexp(lse, lb)
            safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
            out = torch.exp(lse - safe)[..., None] * out + torch.exp(lb - safe)[..., None] * ob
            lse = new
        if t < world - 1:
            ring.pass_on()
    return out, lse
''', "masking them with −∞ does the work"),
])


ALSO_CORRECT = {"13_ring_loop": [
    # overlap style (review 08-14, alt13.py): start the hop first, as isend/irecv would, then compute on the
    # shard already in hand
    '''
def ring_forward(q, rank, world, ring, causal):
    lse = torch.full(q.shape[:-1], -math.inf, dtype=q.dtype)
    out = None
    for t in range(world):
        k, v = ring.kv()
        if t < world - 1:
            ring.pass_on()
        src = (rank - t) % world
        if causal and src > rank:
            continue
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal and src == rank:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
        lb = torch.logsumexp(s, -1); ob = torch.softmax(s, -1) @ v
        if out is None:
            out = torch.zeros_like(ob)
        new = torch.logaddexp(lse, lb)
        out = torch.exp(lse - new)[..., None] * out + torch.exp(lb - new)[..., None] * ob
        lse = new
    return out, lse
''',
]}
