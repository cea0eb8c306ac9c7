'''Learner-style cells for lesson 15's exercises (format: see learner_cells.py): correct work in another style,
each misconception the judges name, and the shortcut the build exercise forbids (a state per position).'''

CELLS = {}

CELLS["15_delta_rule"] = ("delta_rule", '''
def delta_rule(q, k, v, g, beta):
    """The matrix form S_t = a_t (I - b_t k kᵀ) S_{t-1} + b_t k vᵀ, one token at a time (attn_course not used)."""
    B, H, L, dk = k.shape
    eye = torch.eye(dk, dtype=q.dtype)
    S = torch.zeros(B, H, dk, v.shape[-1], dtype=q.dtype)
    o = torch.empty(B, H, L, v.shape[-1], dtype=q.dtype)
    for t in range(L):
        kt = k[:, :, t].unsqueeze(-1)                                   # (B, H, dk, 1)
        a, b = torch.exp(g[:, :, t])[..., None, None], beta[:, :, t][..., None, None]
        S = a * (eye - b * kt @ kt.transpose(-1, -2)) @ S + b * kt @ v[:, :, t].unsqueeze(-2)
        o[:, :, t] = (S.transpose(-1, -2) @ q[:, :, t].unsqueeze(-1)).squeeze(-1)
    return o, S
''', [('''
def delta_rule(q, k, v, g, beta):
    B, H, L, dk = k.shape
    S = torch.zeros(B, H, dk, v.shape[-1], dtype=q.dtype)
    outs = []
    for t in range(L):
        S = torch.exp(g[:, :, t])[..., None, None] * S + beta[:, :, t][..., None, None] * k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append((S * q[:, :, t, :, None]).sum(-2))
    return torch.stack(outs, 2), S
''', "plain (decayed) linear attention"), ('''
def delta_rule(q, k, v, g, beta):
    B, H, L, dk = k.shape
    S = torch.zeros(B, H, dk, v.shape[-1], dtype=q.dtype)
    outs = []
    for t in range(L):
        outs.append((S * q[:, :, t, :, None]).sum(-2))
        S = torch.exp(g[:, :, t])[..., None, None] * S
        u = beta[:, :, t, None] * (v[:, :, t] - (S * k[:, :, t, :, None]).sum(-2))
        S = S + k[:, :, t, :, None] * u[:, :, None, :]
    return torch.stack(outs, 2), S
''', "read the state AFTER"), ('''
def delta_rule(q, k, v, g, beta):
    B, H, L, dk = k.shape
    S = torch.zeros(B, H, dk, v.shape[-1], dtype=q.dtype)
    outs = []
    for t in range(L):
        S = g[:, :, t, None, None] * S
        u = beta[:, :, t, None] * (v[:, :, t] - (S * k[:, :, t, :, None]).sum(-2))
        S = S + k[:, :, t, :, None] * u[:, :, None, :]
        outs.append((S * q[:, :, t, :, None]).sum(-2))
    return torch.stack(outs, 2), S
''', "log-decay"), ('''
def delta_rule(q, k, v, g, beta):
    """Keeps every state: S_all[:, :, t] = S_t (one per position)."""
    B, H, L, dk = k.shape
    S_all = torch.zeros(B, H, L + 1, dk, v.shape[-1], dtype=q.dtype)
    for t in range(L):
        S = torch.exp(g[:, :, t])[..., None, None] * S_all[:, :, t]
        u = beta[:, :, t, None] * (v[:, :, t] - (S * k[:, :, t, :, None]).sum(-2))
        S_all[:, :, t + 1] = S + k[:, :, t, :, None] * u[:, :, None, :]
    o = (S_all[:, :, 1:] * q[..., None]).sum(-2)
    return o, S_all[:, :, -1]
''', "one state per position"), ('''
from attn_course.deltanet import gated_delta_rule_recurrent
def delta_rule(q, k, v, g, beta):
    return gated_delta_rule_recurrent(q, k, v, g, beta)
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

CELLS["15_cache_bytes"] = ("cache_bytes", '''
def cache_bytes(layers, seq_len):
    """Per group: numbers per layer, times the layer count; 2 bytes each (bf16)."""
    rules = {
        "gqa": lambda d: 2 * d["num_kv_heads"] * d["head_dim"] * min(seq_len, d.get("window") or seq_len),
        "mla": lambda d: (d["kv_lora_rank"] + d["qk_rope_head_dim"]) * seq_len,
        "delta": lambda d: d["num_heads"] * d["k_head_dim"] * d["head_dim"] + d["conv_channels"] * (d["conv_kernel"] - 1),
    }
    return sum(2 * rules[d["kind"]](d) * d["count"] for d in layers)
''', [('''
def cache_bytes(layers, seq_len):
    total = 0
    for d in layers:
        if d["kind"] == "gqa":
            total += 2 * d["num_kv_heads"] * d["head_dim"] * seq_len * d["count"]
        elif d["kind"] == "mla":
            total += (d["kv_lora_rank"] + d["qk_rope_head_dim"]) * seq_len * d["count"]
        else:
            total += (d["num_heads"] * d["k_head_dim"] * d["head_dim"] + d["conv_channels"] * 3) * d["count"]
    return 2 * total
''', "min(seq_len, window)"), ('''
def cache_bytes(layers, seq_len):
    total = 0
    for d in layers:
        if d["kind"] == "gqa":
            total += 2 * d["num_kv_heads"] * d["head_dim"] * min(seq_len, d.get("window", seq_len)) * d["count"]
        elif d["kind"] == "mla":
            total += (d["kv_lora_rank"] + d["qk_rope_head_dim"]) * seq_len * d["count"]
        else:
            total += (d["num_heads"] * d["k_head_dim"] * d["head_dim"] + d["conv_channels"] * 3) * seq_len * d["count"]
    return 2 * total
''', "does not grow with the sequence")])

CELLS["15_crossover"] = ("crossover", '''
import math

def crossover(layers):
    """Numbers, not bytes: the dtype cancels."""
    state = sum(d["count"] * (d["num_heads"] * d["k_head_dim"] * d["head_dim"] + d["conv_channels"] * (d["conv_kernel"] - 1))
                for d in layers if d["kind"] == "delta")
    grow = sum(d["count"] * (2 * d["num_kv_heads"] * d["head_dim"] if d["kind"] == "gqa" else d["kv_lora_rank"] + d["qk_rope_head_dim"])
               for d in layers if d["kind"] != "delta")
    return math.ceil(state / grow) if state % grow else state // grow
''', [('''
def crossover(layers):
    state = sum(d["count"] * (d["num_heads"] * d["k_head_dim"] * d["head_dim"] + d["conv_channels"] * (d["conv_kernel"] - 1))
                for d in layers if d["kind"] == "delta")
    grow = sum(d["count"] * (2 * d["num_kv_heads"] * d["head_dim"] if d["kind"] == "gqa" else d["kv_lora_rank"] + d["qk_rope_head_dim"])
               for d in layers if d["kind"] != "delta")
    return state // grow
''', "round UP"), ('''
def crossover(layers):
    state = sum(d["count"] * d["num_heads"] * d["k_head_dim"] * d["head_dim"] for d in layers if d["kind"] == "delta")
    grow = sum(d["count"] * (2 * d["num_kv_heads"] * d["head_dim"] if d["kind"] == "gqa" else d["kv_lora_rank"] + d["qk_rope_head_dim"])
               for d in layers if d["kind"] != "delta")
    return -(-state // grow)
''', "convolution")])
