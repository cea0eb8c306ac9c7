'''Learner-style cells for lesson 15's exercises (format: see learner_cells.py): correct work in another style,
each misconception the judges name, and the shortcut the build exercise forbids (a state per position).'''

CELLS = {}

# 15.1: the step over a chunk of C tokens (the grader drives the recurrence: C = 1 in one case, 1-4 in the others)
CELLS["15_delta_rule"] = ("delta_step", '''
def delta_step(S, q, k, v, g, beta):
    \"\"\"The matrix form S_t = a_t (I - b_t k kᵀ) S_{t-1} + b_t k vᵀ, token by token (attn_course not used).\"\"\"
    dk = k.shape[-1]
    eye = torch.eye(dk, dtype=q.dtype)
    o = torch.empty(*v.shape, dtype=q.dtype)
    for t in range(k.shape[2]):
        kt = k[:, :, t].unsqueeze(-1)                                   # (B, H, dk, 1)
        a, b = torch.exp(g[:, :, t])[..., None, None], beta[:, :, t][..., None, None]
        S = a * (eye - b * kt @ kt.transpose(-1, -2)) @ S + b * kt @ v[:, :, t].unsqueeze(-2)
        o[:, :, t] = (S.transpose(-1, -2) @ q[:, :, t].unsqueeze(-1)).squeeze(-1)
    return S, o
''', [('''
def delta_step(S, q, k, v, g, beta):
    outs = []
    for t in range(k.shape[2]):
        S = torch.exp(g[:, :, t])[..., None, None] * S + beta[:, :, t][..., None, None] * k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append((S * q[:, :, t, :, None]).sum(-2))
    return S, torch.stack(outs, 2)
''', "plain (decayed) linear attention"), ('''
def delta_step(S, q, k, v, g, beta):
    outs = []
    for t in range(k.shape[2]):
        outs.append((S * q[:, :, t, :, None]).sum(-2))
        S = torch.exp(g[:, :, t])[..., None, None] * S
        u = beta[:, :, t, None] * (v[:, :, t] - (S * k[:, :, t, :, None]).sum(-2))
        S = S + k[:, :, t, :, None] * u[:, :, None, :]
    return S, torch.stack(outs, 2)
''', "read the state AFTER"), ('''
def delta_step(S, q, k, v, g, beta):
    outs = []
    for t in range(k.shape[2]):
        S = g[:, :, t, None, None] * S
        u = beta[:, :, t, None] * (v[:, :, t] - (S * k[:, :, t, :, None]).sum(-2))
        S = S + k[:, :, t, :, None] * u[:, :, None, :]
        outs.append((S * q[:, :, t, :, None]).sum(-2))
    return S, torch.stack(outs, 2)
''', "log-decay"), ('''
def delta_step(S, q, k, v, g, beta):
    # the state after the chunk's FIRST token is returned: the next call starts from the wrong state
    outs, first = [], None
    for t in range(k.shape[2]):
        S = S * torch.exp(g[:, :, t])[..., None, None]
        u = beta[:, :, t, None] * (v[:, :, t] - (S * k[:, :, t, :, None]).sum(-2))
        S = S + k[:, :, t, :, None] * u[:, :, None, :]
        first = S if first is None else first
        outs.append((S * q[:, :, t, :, None]).sum(-2))
    return first, torch.stack(outs, 2)
''', "compare with"), ('''
from attn_course.deltanet import gated_delta_rule_recurrent
def delta_step(S, q, k, v, g, beta):
    o, S_new = gated_delta_rule_recurrent(q, k, v, g, beta, initial_state=S)
    return S_new, o
''', "FORBIDDEN")])

CELLS["15_sink_attention"] = ("sink_attn", '''
def sink_attn(q, k, v, sinks, mask):
    """exp by hand with a max shift (no F.scaled_dot_product_attention): the sink joins the denominator only."""
    s = torch.einsum("bhqe,bhke->bhqk", q, k) / math.sqrt(q.shape[-1])
    s = torch.where(mask, s, torch.full_like(s, float("-inf")))
    b = sinks.view(1, -1, 1, 1)
    m = torch.maximum(s.amax(-1, keepdim=True), b)                      # finite: the sink is always there
    e = torch.exp(s - m)
    w = e / (e.sum(-1, keepdim=True) + torch.exp(b - m))
    return torch.einsum("bhqk,bhkv->bhqv", w, v), w
''', [('''
def sink_attn(q, k, v, sinks, mask):
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, -1).nan_to_num(0.0)
    return w @ v, w
''', "the sink is missing"), ('''
def sink_attn(q, k, v, sinks, mask):
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask, float("-inf"))
    col = sinks[0].expand(*s.shape[:-1], 1)
    w = torch.softmax(torch.cat([s, col], -1), -1)[..., :-1]
    return w @ v, w
''', "its own sink logit"), ('''
def sink_attn(q, k, v, sinks, mask):
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask, float("-inf"))
    col = sinks[:, None, None].expand(*s.shape[:-1], 1)
    w = torch.softmax(torch.cat([s, col], -1), -1)
    return w[..., :-1] @ v, w
''', "drop the sink's column"), ('''
def sink_attn(q, k, v, sinks, mask):
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    col = sinks[:, None, None].expand(*s.shape[:-1], 1)
    w = torch.softmax(torch.cat([s, col], -1), -1)[..., :-1]
    return w @ v, w
''', "apply the mask")])

# the delta state counted once per token (the first half of the conv-in-fp32 cell below differs only there)
_GROWS = '''
def cache_bytes(layers, seq_len):
    total = 0
    for d in layers:
        if d["kind"] == "gqa":
            total += 2 * 2 * d["num_kv_heads"] * d["head_dim"] * min(seq_len, d.get("window", seq_len)) * d["count"]
        elif d["kind"] == "mla":
            total += 2 * (d["kv_lora_rank"] + d["qk_rope_head_dim"]) * seq_len * d["count"]
        else:
            total += (4 * d["num_heads"] * d["k_head_dim"] * d["head_dim"] + 2 * d["conv_channels"] * 3) * seq_len * d["count"]
    return total
'''

CELLS["15_cache_bytes"] = ("cache_bytes", '''
def cache_bytes(layers, seq_len):
    \"\"\"Per group: bytes per layer (bf16 caches and conv inputs, fp32 delta state matrices), times the count.\"\"\"
    rules = {
        "gqa": lambda d: 2 * 2 * d["num_kv_heads"] * d["head_dim"] * min(seq_len, d.get("window") or seq_len),
        "mla": lambda d: 2 * (d["kv_lora_rank"] + d["qk_rope_head_dim"]) * seq_len,
        "delta": lambda d: 4 * d["num_heads"] * d["k_head_dim"] * d["head_dim"] + 2 * d["conv_channels"] * (d["conv_kernel"] - 1),
    }
    return sum(rules[d["kind"]](d) * d["count"] for d in layers)
''', [('''
def cache_bytes(layers, seq_len):
    total = 0
    for d in layers:
        if d["kind"] == "gqa":
            total += 2 * 2 * d["num_kv_heads"] * d["head_dim"] * seq_len * d["count"]
        elif d["kind"] == "mla":
            total += 2 * (d["kv_lora_rank"] + d["qk_rope_head_dim"]) * seq_len * d["count"]
        else:
            total += (4 * d["num_heads"] * d["k_head_dim"] * d["head_dim"] + 2 * d["conv_channels"] * 3) * d["count"]
    return total
''', "min(seq_len, window)"), (_GROWS, "does not grow with the sequence"), ('''
def cache_bytes(layers, seq_len):
    \"\"\"Everything in bf16 (the lesson's table before review M15-4).\"\"\"
    total = 0
    for d in layers:
        if d["kind"] == "gqa":
            total += 2 * d["num_kv_heads"] * d["head_dim"] * min(seq_len, d.get("window", seq_len)) * d["count"]
        elif d["kind"] == "mla":
            total += (d["kv_lora_rank"] + d["qk_rope_head_dim"]) * seq_len * d["count"]
        else:
            total += (d["num_heads"] * d["k_head_dim"] * d["head_dim"] + d["conv_channels"] * 3) * d["count"]
    return 2 * total
''', "kept in fp32"), (_GROWS.replace('(4 * d["num_heads"] * d["k_head_dim"] * d["head_dim"] + 2 * d["conv_channels"] * 3) * seq_len',
           '4 * (d["num_heads"] * d["k_head_dim"] * d["head_dim"] + d["conv_channels"] * 3)'),
     "convolution inputs are bf16")
])

_CROSS = '''
import math

def crossover(layers):
    \"\"\"Bytes: the delta state matrices in fp32 (4), the attention cache and the conv inputs in bf16 (2).\"\"\"
    state = sum(d["count"] * (4 * d["num_heads"] * d["k_head_dim"] * d["head_dim"] + 2 * d["conv_channels"] * (d["conv_kernel"] - 1))
                for d in layers if d["kind"] == "delta")
    grow = sum(2 * d["count"] * (2 * d["num_kv_heads"] * d["head_dim"] if d["kind"] == "gqa" else d["kv_lora_rank"] + d["qk_rope_head_dim"])
               for d in layers if d["kind"] != "delta")
    return ROUND
'''

CELLS["15_crossover"] = ("crossover", _CROSS.replace("ROUND", "math.ceil(state / grow) if state % grow else state // grow"), [
    (_CROSS.replace("ROUND", "state // grow"), "round UP"),
    # review 14-16 (15.4): "strictly more than": floor + 1 -- wrong exactly when the state is a multiple
    (_CROSS.replace("ROUND", "state // grow + 1"), "ceil, not floor + 1"),
    (_CROSS.replace("ROUND", "-(-state // grow)").replace('(4 * d["num_heads"]', '(2 * d["num_heads"]'),
     "compare bytes, not numbers"),
    (_CROSS.replace("ROUND", "-(-state // grow)").replace(' + 2 * d["conv_channels"] * (d["conv_kernel"] - 1)', ""),
     "convolution"),
    (_CROSS.replace("ROUND", "-(-state // grow)").replace('+ 2 * d["conv_channels"]', '+ 4 * d["conv_channels"]'),
     "convolution inputs are bf16"),
])


ALSO_CORRECT = {
    "15_delta_rule": [
        # review 14-16 M15-6: the lesson's chunked (UT) form, applied to each chunk the grader hands over, with
        # the state carried in: a triangular solve for the pseudo-values U, then outputs and the new state
        '''
def delta_step(S, q, k, v, g, beta):
    C = k.shape[2]
    gam = g.cumsum(-1)                                                  # log Γ_t: cumulative decay in the chunk
    decay = torch.exp(gam[..., :, None] - gam[..., None, :]).tril()     # Γ_t / Γ_i for i <= t
    A = (beta[..., :, None] * decay * (k @ k.transpose(-1, -2))).tril(-1)
    rhs = beta[..., None] * (v - torch.exp(gam)[..., None] * (k @ S))
    U = torch.linalg.solve_triangular(torch.eye(C, dtype=k.dtype) + A, rhs, upper=False)
    o = torch.exp(gam)[..., None] * (q @ S) + (decay * (q @ k.transpose(-1, -2))) @ U
    S_new = torch.exp(gam[..., -1:])[..., None] * S + (k * torch.exp(gam[..., -1:] - gam)[..., None]).transpose(-1, -2) @ U
    return S_new, o
''',
        # review 14-16 H15-1's list of states, now inside one step: it holds at most the chunk's C <= 4 states
        # (the grader keeps the sequence), and each o_t is read from its own state -- right, full marks
        '''
def delta_step(S, q, k, v, g, beta):
    states = []
    for t in range(k.shape[2]):
        S = S * torch.exp(g[:, :, t])[..., None, None]
        u = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, :, t]))
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, :, t], u)
        states.append(S)
    o = torch.stack([torch.einsum("bhkv,bhk->bhv", St, q[:, :, t]) for t, St in enumerate(states)], 2)
    return states[-1], o
''',
    ],
    "15_crossover": [
        # review 14-16: a binary search on L over the bytes themselves
        '''
def crossover(layers):
    def cache(L):
        return sum(2 * d["count"] * L * (2 * d["num_kv_heads"] * d["head_dim"] if d["kind"] == "gqa"
                                         else d["kv_lora_rank"] + d["qk_rope_head_dim"]) for d in layers if d["kind"] != "delta")
    state = sum(d["count"] * (4 * d["num_heads"] * d["k_head_dim"] * d["head_dim"] + 2 * d["conv_channels"] * (d["conv_kernel"] - 1))
                for d in layers if d["kind"] == "delta")
    lo, hi = 0, 1
    while cache(hi) < state:
        hi *= 2
    while lo + 1 < hi:                                  # cache(lo) < state <= cache(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cache(mid) < state else (lo, mid)
    return hi
''',
    ],
}
