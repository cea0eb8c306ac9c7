'''Learner-style cells for lesson 14's exercises (format of ``tests/learner_cells.py``, merged into its ``CELLS``):
``CELLS[exercise_id] = (function name, correct cell in another style than the solution, [(wrong cell, hint
substring the judge must print), ...])``; ``"FORBIDDEN"`` means the cell must be rejected for a forbidden API.
Written for the suite, not copied from ``solutions/``: every misconception a hint promises, the shortcuts the
prompts forbid, and — for the paged decode step — the versions that gather the sequence into one tensor.
'''

CELLS = {}


def _edit(cell: str, old: str, new: str) -> str:
    """``cell`` with ``old`` replaced by ``new`` (``old`` must occur: a wrong cell differs where it says)."""
    assert old in cell, old
    return cell.replace(old, new)


# ---- 14_pool_blocks -------------------------------------------------------------------------------------

_POOL = '''
def pool_blocks(memory_bytes, num_layers, num_kv_heads, head_dim, bytes_per_element, block_size):
    """Numbers per token (K and V, every layer), then per block, then whole blocks."""
    per_token = num_layers * 2 * num_kv_heads * head_dim
    per_block = per_token * block_size * bytes_per_element
    return int(memory_bytes // per_block)
'''

CELLS["14_pool_blocks"] = ("pool_blocks", _POOL, [
    (_edit(_POOL, "num_layers * 2 * num_kv_heads", "num_layers * num_kv_heads"), "keys AND values"),
    (_edit(_POOL, "num_layers * 2 * num_kv_heads", "2 * num_kv_heads"), "multiply by num_layers"),
    (_edit(_POOL, "block_size * bytes_per_element", "block_size"), "bytes_per_element"),
    (_edit(_POOL, "per_token * block_size * bytes_per_element", "per_token * bytes_per_element"),
     "counts token slots"),
    ("import math\n" + _edit(_POOL, "int(memory_bytes // per_block)", "math.ceil(memory_bytes / per_block)"),
     "round down"),
    ('''
from attn_course.paged import PagedKVCache
def pool_blocks(memory_bytes, num_layers, num_kv_heads, head_dim, bytes_per_element, block_size):
    one = PagedKVCache(1, block_size, num_kv_heads, head_dim).nbytes() // 4 * bytes_per_element * num_layers
    return memory_bytes // one
''', "FORBIDDEN"),
])


# ---- 14_shared_prefix_blocks ----------------------------------------------------------------------------

_SHARED = '''
import math

def shared_prefix_blocks(prefix_len, suffix_lengths, block_size):
    """Simulate the block tables: the prompt's, then each fork's own blocks from the first one it writes."""
    total = math.ceil(prefix_len / block_size)              # the prompt's sequence
    for u in suffix_lengths:
        first_written = prefix_len // block_size            # index of the block its first token goes to
        last = (prefix_len + u - 1) // block_size           # index of the block its last token goes to
        total += last - first_written + 1                   # copied partial block (if any) + new blocks
    return total
'''

CELLS["14_shared_prefix_blocks"] = ("shared_prefix_blocks", _SHARED, [
    (_edit(_SHARED, "first_written = prefix_len // block_size", "first_written = math.ceil(prefix_len / block_size)"),
     "copy-on-write"),
    (_edit(_SHARED, "total = math.ceil(prefix_len / block_size)", "total = 0"), "count its ceil"),
    (_edit(_SHARED, "first_written = prefix_len // block_size", "first_written = 0"), "count them once"),
    (_edit(_edit(_SHARED, "first_written = prefix_len // block_size", "first_written = 0"),
           "total = math.ceil(prefix_len / block_size)", "total = 0"), "without sharing"),
])


# ---- 14_paged_decode ------------------------------------------------------------------------------------
# the step reads the pool only through ``reader``: two-pass (scores block by block, one softmax, then the values
# block by block, each block read twice) as the correct cell; the mistakes edit it

_DECODE = '''
import math

def paged_decode(q, reader):
    \"\"\"Scores block by block (H x seq_len is small), one softmax, then the values block by block.\"\"\"
    H, d = q.shape
    B, seq_len, table = reader.block_size, reader.seq_len, reader.block_table
    spans = [(j, min(B, seq_len - j * B)) for j in range(-(-seq_len // B))]
    scores = []
    for j, n in spans:
        K, _ = reader.read(int(table[j]))
        H_kv = K.shape[0]
        kv_head = [h // (H // H_kv) for h in range(H)]
        scores.append(torch.einsum("hd,hnd->hn", q, K[kv_head, :n]) / math.sqrt(d))
    p = torch.softmax(torch.cat(scores, dim=1), dim=1)     # (H, seq_len)
    out = torch.zeros_like(q)
    start = 0
    for j, n in spans:
        _, V = reader.read(int(table[j]))
        out = out + torch.einsum("hn,hnd->hd", p[:, start:start + n], V[kv_head, :n])
        start += n
    return out
'''

# reads every block, then concatenates them: the sequence gathered in torch (review H14-1's gather, with a reader)
_GATHER = '''
import math

def paged_decode(q, reader):
    H, d = q.shape
    blocks = [reader.read(b) for b in reader.block_table.tolist()]
    K = torch.cat([k for k, _ in blocks], 1)[:, :reader.seq_len]          # (H_kv, seq_len, d): the whole sequence
    V = torch.cat([v for _, v in blocks], 1)[:, :reader.seq_len]
    K, V = K.repeat_interleave(H // K.shape[0], 0), V.repeat_interleave(H // K.shape[0], 0)
    p = torch.softmax(torch.einsum("hd,hld->hl", q, K) / math.sqrt(d), dim=-1)
    return torch.einsum("hl,hld->hd", p, V)
'''

CELLS["14_paged_decode"] = ("paged_decode", _DECODE, [
    (_edit(_DECODE, "min(B, seq_len - j * B)", "B"), "stale keys"),
    (_edit(_DECODE, "h // (H // H_kv)", "h % H_kv"), "not h % H_kv"),
    (_edit(_DECODE, "reader.block_table", "reader.block_table.sort().values"), "in the block table's order"),
    (_edit(_DECODE, " / math.sqrt(d))", ")"), "1/sqrt(head_dim)"),
    (_GATHER, "gathered into one tensor"),
    # review M14-3: the sequence gathered one KV head at a time (L·d per head, under the old H_kv·L·d limit)
    ('''
import math

def paged_decode(q, reader):
    H, d = q.shape
    blocks = [reader.read(b) for b in reader.block_table.tolist()]
    H_kv = blocks[0][0].shape[0]
    outs = []
    for h in range(H):
        K = torch.cat([k[h // (H // H_kv)] for k, _ in blocks])[:reader.seq_len]     # (seq_len, d)
        V = torch.cat([v[h // (H // H_kv)] for _, v in blocks])[:reader.seq_len]
        outs.append(torch.softmax(K @ q[h] / math.sqrt(d), 0) @ V)
    return torch.stack(outs)
''', "gathered into one tensor"),
    # review M14-3: every slot of the pool scored, the table only used as a mask -- the reader refuses other blocks
    ('''
import math

def paged_decode(q, reader):
    H, d = q.shape
    mine = set(reader.block_table.tolist())
    scores, values = [], []
    b = 0
    while True:                                        # every block of the pool, whoever owns it
        try:
            K, V = reader.read(b)
        except ValueError:
            if b > 4 * len(mine) + 64:
                break
            b += 1
            continue
        g = H // K.shape[0]
        scores.append(torch.einsum("hd,hnd->hn", q, K.repeat_interleave(g, 0)) / math.sqrt(d))
        values.append(V.repeat_interleave(g, 0))
        b += 1
    table = reader.block_table.tolist()
    s = torch.cat([scores[sorted(mine).index(b)] for b in table], 1)[:, :reader.seq_len]
    v = torch.cat([values[sorted(mine).index(b)] for b in table], 1)[:, :reader.seq_len]
    return torch.einsum("hl,hld->hd", torch.softmax(s, -1), v)
''', "not one of the sequence's"),
    # the audit's walk-around of H14-1: the same gather in numpy, one block at a time (each block is small)
    ('''
import numpy as np

def paged_decode(q, reader):
    H = q.shape[0]
    blocks = [reader.read(b) for b in reader.block_table.tolist()]
    K = np.concatenate([k.numpy() for k, _ in blocks], 1)[:, :reader.seq_len]
    V = np.concatenate([v.numpy() for _, v in blocks], 1)[:, :reader.seq_len]
    g = H // K.shape[0]
    K, V = np.repeat(K, g, 0), np.repeat(V, g, 0)
    s = np.einsum("hd,hld->hl", q.numpy(), K) / np.sqrt(q.shape[1])
    p = np.exp(s - s.max(1, keepdims=True))
    return torch.from_numpy(np.einsum("hl,hld->hd", p / p.sum(1, keepdims=True), V))
''', "data stays in torch"),
    ('''
import torch.nn.functional as F

def paged_decode(q, reader):
    H, d = q.shape
    outs = []
    for h in range(H):
        blocks = [reader.read(b) for b in reader.block_table.tolist()]
        g = H // blocks[0][0].shape[0]
        K = torch.cat([k[h // g] for k, _ in blocks])[:reader.seq_len]
        V = torch.cat([v[h // g] for _, v in blocks])[:reader.seq_len]
        outs.append(F.scaled_dot_product_attention(q[h][None], K, V)[0])
    return torch.stack(outs)
''', "FORBIDDEN"),
])


# ---- 14_split_kv ----------------------------------------------------------------------------------------
# the merge, graded on partials the grader makes (log-sum-exps far apart, an empty split with lse = -inf)

_SPLIT = '''
def merge_splits(split_out, split_lse):
    \"\"\"Pairwise, as a tree of kernels would: fold the splits in one at a time with logaddexp.\"\"\"
    out, lse = split_out[0], split_lse[0]
    for o, l in zip(split_out[1:], split_lse[1:]):
        new = torch.logaddexp(lse, l)
        safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)      # both empty so far: weigh nothing
        out = torch.exp(lse - safe)[..., None] * out + torch.exp(l - safe)[..., None] * o
        lse = new
    return out, lse
'''

CELLS["14_split_kv"] = ("merge_splits", _SPLIT, [
    ('''
def merge_splits(split_out, split_lse):
    return split_out.mean(0), torch.logsumexp(split_lse, 0)
''', "weight split s by exp(lse_s − lse)"),
    ('''
def merge_splits(split_out, split_lse):
    w = torch.exp(split_lse)                           # no max subtracted: overflows far from 0
    return (w[..., None] * split_out).sum(0) / w.sum(0)[..., None], torch.log(w.sum(0))
''', "subtract the largest lse_s"),
    ('''
def merge_splits(split_out, split_lse):
    w = torch.softmax(split_lse, 0)
    return (w[..., None] * split_out).sum(0), split_lse.amax(0)
''', "not the largest lse_s"),
    ('''
import math
def merge_splits(split_out, split_lse):
    l2 = split_lse / math.log(2)
    m = l2.amax(0)
    w = torch.exp2(l2 - m)
    return (w[..., None] * split_out).sum(0) / w.sum(0)[..., None], m + torch.log2(w.sum(0))
''', "NATURAL log"),
    ('''
from attn_course.decoding import merge_splits as course_merge
def merge_splits(split_out, split_lse):
    return course_merge(split_out, split_lse)
''', "FORBIDDEN"),
])


ALSO_CORRECT = {
    "14_paged_decode": [
        # review 14-16: the online softmax one TOKEN at a time, reading each block once
        '''
import math

def paged_decode(q, reader):
    H, d = q.shape
    m = torch.full((H,), -math.inf, dtype=q.dtype)
    l = torch.zeros(H, dtype=q.dtype)
    acc = torch.zeros(H, d, dtype=q.dtype)
    for j, b in enumerate(reader.block_table.tolist()):
        K, V = reader.read(b)
        g = H // K.shape[0]
        for i in range(min(reader.block_size, reader.seq_len - j * reader.block_size)):
            k, v = K[:, i].repeat_interleave(g, 0), V[:, i].repeat_interleave(g, 0)     # (H, d): one token
            s = (q * k).sum(-1) / math.sqrt(d)
            m_new = torch.maximum(m, s)
            a, p = torch.exp(m - m_new), torch.exp(s - m_new)
            l, acc, m = a * l + p, a[:, None] * acc + p[:, None] * v, m_new
    return acc / l[:, None]
''',
        # review 14-16: each block's own softmax, merged by log-sum-exp
        '''
import math

def paged_decode(q, reader):
    H, d = q.shape
    out, lse = None, None
    for j, b in enumerate(reader.block_table.tolist()):
        K, V = reader.read(b)
        n = min(reader.block_size, reader.seq_len - j * reader.block_size)
        g = H // K.shape[0]
        s = torch.einsum("hd,hnd->hn", q, K[:, :n].repeat_interleave(g, 0)) / math.sqrt(d)
        lb = torch.logsumexp(s, -1)
        ob = torch.einsum("hn,hnd->hd", torch.exp(s - lb[:, None]), V[:, :n].repeat_interleave(g, 0))
        if out is None:
            out, lse = ob, lb
        else:
            new = torch.logaddexp(lse, lb)
            out, lse = torch.exp(lse - new)[:, None] * out + torch.exp(lb - new)[:, None] * ob, new
    return out
''',
    ],
    "14_split_kv": [
        # review 14-16: base 2 inside (exp2/log2, as kernels do), the natural lse out
        '''
import math
LOG2E = 1 / math.log(2)
def merge_splits(split_out, split_lse):
    l2 = split_lse * LOG2E
    m = l2.amax(0)
    w = torch.exp2(l2 - m)
    total = w.sum(0)
    return (w[..., None] * split_out).sum(0) / total[..., None], (m + torch.log2(total)) / LOG2E
''',
        # all at once with torch.logsumexp and softmax over the splits
        '''
def merge_splits(split_out, split_lse):
    return torch.einsum("sh,shd->hd", torch.softmax(split_lse, 0), split_out), torch.logsumexp(split_lse, 0)
''',
    ],
}
