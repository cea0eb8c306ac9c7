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

_DECODE = '''
import math

def paged_decode(q, k_pool, v_pool, block_table, seq_len):
    """Scores block by block (H x seq_len is small), one softmax, then the values block by block."""
    H, d = q.shape
    H_kv, B = k_pool.shape[1], k_pool.shape[2]
    kv_head = [h // (H // H_kv) for h in range(H)]
    spans = [(j, min(B, seq_len - j * B)) for j in range(-(-seq_len // B))]
    scores = []
    for j, n in spans:
        K = k_pool[int(block_table[j])][kv_head, :n]       # (H, n, d): this block's keys for every query head
        scores.append(torch.einsum("hd,hnd->hn", q, K) / math.sqrt(d))
    p = torch.softmax(torch.cat(scores, dim=1), dim=1)     # (H, seq_len)
    out = torch.zeros_like(q)
    start = 0
    for j, n in spans:
        V = v_pool[int(block_table[j])][kv_head, :n]
        out = out + torch.einsum("hn,hnd->hd", p[:, start:start + n], V)
        start += n
    return out
'''

_GATHER = '''
import math

def paged_decode(q, k_pool, v_pool, block_table, seq_len):
    H, d = q.shape
    H_kv = k_pool.shape[1]
    K = k_pool[block_table].transpose(0, 1).reshape(H_kv, -1, d)[:, :seq_len]   # the whole sequence at once
    V = v_pool[block_table].transpose(0, 1).reshape(H_kv, -1, d)[:, :seq_len]
    K, V = K.repeat_interleave(H // H_kv, 0), V.repeat_interleave(H // H_kv, 0)
    p = torch.softmax(torch.einsum("hd,hld->hl", q, K) / math.sqrt(d), dim=-1)
    return torch.einsum("hl,hld->hd", p, V)
'''

CELLS["14_paged_decode"] = ("paged_decode", _DECODE, [
    (_edit(_DECODE, "min(B, seq_len - j * B)", "B"), "stale keys"),
    (_edit(_DECODE, "h // (H // H_kv)", "h % H_kv"), "not h % H_kv"),
    (_edit(_DECODE, "int(block_table[j])", "int(block_table.sort().values[j])"), "in the block table's order"),
    (_edit(_DECODE, " / math.sqrt(d))", ")"), "1/sqrt(head_dim)"),
    (_GATHER, "whole sequence's keys or values gathered"),
    ('''
import torch.nn.functional as F

def paged_decode(q, k_pool, v_pool, block_table, seq_len):
    H, d = q.shape
    H_kv, B = k_pool.shape[1], k_pool.shape[2]
    outs = []
    for h in range(H):
        K = torch.cat([k_pool[int(b), h // (H // H_kv)] for b in block_table])[:seq_len]
        V = torch.cat([v_pool[int(b), h // (H // H_kv)] for b in block_table])[:seq_len]
        outs.append(F.scaled_dot_product_attention(q[h][None], K, V)[0])
    return torch.stack(outs)
''', "FORBIDDEN"),
])


# ---- 14_split_kv ----------------------------------------------------------------------------------------

_SPLIT = '''
import math

def split_kv_decode(q, k, v, num_splits):
    """All splits at once: pad the keys to S·C, mask the padding, softmax per split, then merge."""
    H, L, E = k.shape
    C = math.ceil(L / num_splits)
    S = num_splits
    pad = S * C - L
    kp = torch.cat([k, k.new_zeros(H, pad, E)], dim=1).view(H, S, C, E)
    vp = torch.cat([v, v.new_zeros(H, pad, v.shape[-1])], dim=1).view(H, S, C, v.shape[-1])
    x = torch.einsum("he,hsce->hsc", q, kp) / math.sqrt(E)
    x = x.masked_fill(torch.arange(S * C).view(S, C) >= L, float("-inf"))
    lse = torch.logsumexp(x, dim=-1)                                   # (H, S)
    o = torch.einsum("hsc,hscd->hsd", torch.exp(x - lse[..., None]), vp)
    total = torch.logsumexp(lse, dim=-1, keepdim=True)                 # (H, 1)
    out = torch.einsum("hs,hsd->hd", torch.exp(lse - total), o)
    return out, o.transpose(0, 1), lse.transpose(0, 1)
'''

_MERGE = "out = torch.einsum(\"hs,hsd->hd\", torch.exp(lse - total), o)"

CELLS["14_split_kv"] = ("split_kv_decode", _SPLIT, [
    (_edit(_SPLIT, _MERGE, "out = o.mean(dim=1)"), "weight split s by exp(lse_s − lse)"),
    ('''
import math

def split_kv_decode(q, k, v, num_splits):
    E = q.shape[-1]
    outs, lses = [], []
    for k_s, v_s in zip(k.tensor_split(num_splits, dim=1), v.tensor_split(num_splits, dim=1)):
        x = (k_s @ q[..., None])[..., 0] / math.sqrt(E)
        lse = torch.logsumexp(x, -1)
        outs.append(torch.einsum("hl,hld->hd", torch.exp(x - lse[:, None]), v_s))
        lses.append(lse)
    split_out, split_lse = torch.stack(outs), torch.stack(lses)
    w = torch.softmax(split_lse, dim=0)
    return (w[..., None] * split_out).sum(0), split_out, split_lse
''', "not torch.tensor_split's sizes"),
    (_edit(_edit(_SPLIT, "lse = torch.logsumexp(x, dim=-1)                                   # (H, S)",
                 "lse = torch.logsumexp(x, dim=-1) / math.log(2)                      # (H, S)"),
           "torch.exp(x - lse[..., None])", "torch.exp(x - lse[..., None] * math.log(2))"), "NATURAL log-sum-exp"),
    (_edit(_SPLIT, "return out, o.transpose(0, 1), lse.transpose(0, 1)",
           "return out, (o * torch.exp(lse)[..., None]).transpose(0, 1), lse.transpose(0, 1)"),
     "normalised over its own keys"),
    (_edit(_SPLIT, " / math.sqrt(E)\n", "\n"), "1/sqrt(E)"),
    ('''
import torch.nn.functional as F

def split_kv_decode(q, k, v, num_splits):
    C = -(-k.shape[1] // num_splits)
    outs = [F.scaled_dot_product_attention(q[:, None], k_s, v_s)[:, 0] for k_s, v_s in
            zip(k.split(C, dim=1), v.split(C, dim=1))]
    lses = [torch.logsumexp(k_s @ q[..., None] / q.shape[-1] ** 0.5, dim=1)[..., 0] for k_s in k.split(C, dim=1)]
    split_out, split_lse = torch.stack(outs), torch.stack(lses)
    return (torch.softmax(split_lse, 0)[..., None] * split_out).sum(0), split_out, split_lse
''', "FORBIDDEN"),
])
