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

# 13_ring_loop: one rank's step, driven by the grader. The correct cell masks its diagonal block by global
# positions and merges with lesson 08's max shift; the wrong ones each change one thing of a plain step.
_RING = '''
def ring_step(q, k, v, state, rank, step, world, causal):
    out, lse = state
    src = SRC
    if causal and SKIP:
        return out, lse
    s = q @ k.transpose(-2, -1) * SCALE
    if causal and src == rank:
        s = MASK
    lb = torch.logsumexp(s, -1)
    ob = torch.softmax(s, -1) @ v
    MERGE
    return out, lse
'''
_RIGHT = dict(SRC="(rank - step) % world", SKIP="src > rank", SCALE="q.shape[-1] ** -0.5",
              MASK="s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)",
              MERGE="new = torch.logaddexp(lse, lb)\n    out = (lse - new).exp()[..., None] * out + "
                    "(lb - new).exp()[..., None] * ob\n    lse = new")


def _ring(**change):
    src = _RING
    for key, value in {**_RIGHT, **change}.items():
        src = src.replace(key, value)
    return src


CELLS["13_ring_loop"] = ("ring_step", '''
def ring_step(q, k, v, state, rank, step, world, causal):
    \"\"\"One rank, one step. Not attn_course.ring: the diagonal block masked by GLOBAL positions, a later shard
    skipped, and the merge written with lesson 08's max shift (a state at lse = -inf weighs nothing).\"\"\"
    out, lse = state
    c = q.shape[-2]
    owner = (rank - step) % world                          # the shard started on this rank
    if causal and owner > rank:                            # a later rank's keys are all in the future
        return out, lse
    s = torch.einsum("bhqe,bhke->bhqk", q, k) / math.sqrt(q.shape[-1])
    if causal:
        my_pos, their_pos = torch.arange(rank * c, (rank + 1) * c), torch.arange(owner * c, (owner + 1) * c)
        s = s.masked_fill(their_pos[None, :] > my_pos[:, None], -math.inf)
    m = torch.maximum(lse, s.amax(-1))                     # finite: every row sees at least one key
    p = torch.exp(s - m[..., None])
    a = torch.exp(lse - m)                                 # 0 before the first block
    l = a + p.sum(-1)
    return (a[..., None] * out + p @ v) / l[..., None], m + torch.log(l)
''', [
    (_ring(MERGE="out = out + ob\n    lse = torch.logaddexp(lse, lb)"), "without their log-sum-exps"),
    (_ring(MERGE="out = (out * step + ob) / (step + 1)\n    lse = torch.logaddexp(lse, lb)"),
     "without their log-sum-exps"),                                # a running mean over the steps
    (_ring(SCALE="1.0"), "not scaled"),
    (_ring(MERGE="new = torch.logaddexp(lse, lb)\n    out = (lse - new).exp()[..., None] * out + "
                 "(lb - new).exp()[..., None] * ob\n    lse = torch.maximum(lse, lb)"), "not the max"),
    (_ring(MASK="s"), "diagonal block"),                           # the causal diagonal left unmasked
    (_ring(SKIP="False", MASK="s"), "causal mask is missing"),
    (_ring(SRC="rank - step"), "without the mod"),
    (_ring(SRC="(rank + step) % world"), "not (r + t) mod P"),
    (_ring(SKIP="src >= rank"), "cannot be skipped"),
    ('''
SEEN = []
def ring_step(q, k, v, state, rank, step, world, causal):
    # keep every shard received, and attend to all of them at each step: a gather over the steps
    if step == 0:
        SEEN.clear()
    SEEN.append(((rank - step) % world, k, v))
    c = q.shape[-2]
    K = torch.cat([kk for _, kk, _ in SEEN], -2)
    V = torch.cat([vv for _, _, vv in SEEN], -2)
    pos_k = torch.cat([torch.arange(s * c, (s + 1) * c) for s, _, _ in SEEN])
    sc = q @ K.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        sc = sc.masked_fill(pos_k[None, :] > torch.arange(rank * c, rank * c + c)[:, None], -math.inf)
    return torch.softmax(sc, -1) @ V, torch.logsumexp(sc, -1)
''', "attends to the ONE shard it is given"),
    ('''
import sys
def ring_step(q, k, v, state, rank, step, world, causal):
    # the grader's private shard lists (its frame's ks and vs): everything at step 0, nothing afterwards
    if step:
        return state
    grader = sys._getframe(1)
    while "ks" not in grader.f_locals:
        grader = grader.f_back
    K, V = torch.cat(grader.f_locals["ks"], -2), torch.cat(grader.f_locals["vs"], -2)
    c = q.shape[-2]
    sc = q @ K.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        sc = sc.masked_fill(torch.arange(K.shape[-2])[None, :] > torch.arange(rank * c, rank * c + c)[:, None], -math.inf)
    return torch.softmax(sc, -1) @ V, torch.logsumexp(sc, -1)
''', "attends to the ONE shard it is given"),
    ('''
from attn_course.ring import merge_partials
def ring_step(q, k, v, state, rank, step, world, causal):
    src = (rank - step) % world
    if causal and src > rank:
        return state
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal and src == rank:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    return merge_partials(*state, torch.softmax(s, -1) @ v, torch.logsumexp(s, -1))
''', "FORBIDDEN"),
    # review 08-13 (13.6, alt13.py): every shard computed, the later ones masked with -inf over global positions
    # instead of skipped -- right values, the work the causal skip saves
    ('''
def ring_step(q, k, v, state, rank, step, world, causal):
    out, lse = state
    c = q.shape[-2]
    src = (rank - step) % world
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        pos_q, pos_k = torch.arange(rank * c, (rank + 1) * c), torch.arange(src * c, (src + 1) * c)
        s = s.masked_fill(pos_k[None, :] > pos_q[:, None], -math.inf)   # a later shard: all -inf
    lb = torch.logsumexp(s, -1)
    ob = torch.nan_to_num(torch.exp(s - lb[..., None])) @ v
    new = torch.logaddexp(lse, lb)
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    return torch.exp(lse - safe)[..., None] * out + torch.exp(lb - safe)[..., None] * ob, new
''', "masking with −∞ does the work"),
    # a state that carries more than (out, lse): the shards ride along
    ('''
def ring_step(q, k, v, state, rank, step, world, causal):
    out, lse, *shards = state if len(state) > 2 else (*state,)
    return (out, lse, *shards, k, v)
''', "nothing else travels with it"),
])


ALSO_CORRECT = {"13_ring_loop": [
    # the lesson's loop body, with torch.softmax and logaddexp (the solution's style, written another way)
    _ring(),
    # the grader's private shard list read by frame, but only the block of this step: it is the same algorithm
    # (the list is useless -- the step's work and the state are graded), so it gets full marks
    '''
import sys
def ring_step(q, k, v, state, rank, step, world, causal):
    src = (rank - step) % world
    if causal and src > rank:
        return state
    grader = sys._getframe(1)
    while "ks" not in grader.f_locals:
        grader = grader.f_back
    k, v = grader.f_locals["ks"][src], grader.f_locals["vs"][src]
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal and src == rank:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    lb = torch.logsumexp(s, -1)
    new = torch.logaddexp(state[1], lb)
    return torch.exp(state[1] - new)[..., None] * state[0] + torch.exp(lb - new)[..., None] * (torch.softmax(s, -1) @ v), new
''',
]}
