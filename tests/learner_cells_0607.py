'''Learner-style cells for the build exercises of lessons 06 and 07 (format of ``tests/learner_cells.py``, merged
into its ``CELLS``): ``CELLS[exercise_id] = (function name, correct cell in another style than the solution,
[(wrong cell, hint substring the judge must print), ...])``; ``"FORBIDDEN"`` means the cell must be rejected for a
forbidden API. Written for the suite, not copied from ``solutions/``: CBAM assembled with nn.functional and einsum,
and a TPA decode step with a class-free RoPE, each with the classic mistakes its prompt names.
'''

CELLS = {}


def _edit(cell: str, old: str, new: str) -> str:
    """``cell`` with ``old`` replaced by ``new`` (``old`` must occur: a wrong cell differs where it says)."""
    assert old in cell, old
    return cell.replace(old, new)


# ---- 06_cbam_forward ------------------------------------------------------------------------------------

_CBAM = '''
import torch.nn.functional as F

def cbam_forward(x, W0, b0, W1, b1, conv_w):
    def shared_mlp(v):                                   # (B, C) -> (B, C)
        return F.linear(F.relu(F.linear(v, W0, b0)), W1, b1)
    gate_c = torch.sigmoid(shared_mlp(F.adaptive_avg_pool2d(x, 1).flatten(1))
                           + shared_mlp(F.adaptive_max_pool2d(x, 1).flatten(1))).unsqueeze(-1).unsqueeze(-1)
    refined = gate_c * x
    avg_c, max_c = refined.mean(1, keepdim=True), refined.max(dim=1, keepdim=True).values
    descriptor = torch.cat((avg_c, max_c), 1)
    gate_s = torch.sigmoid(F.conv2d(descriptor, conv_w, padding=(conv_w.shape[-1] - 1) // 2))
    return gate_s * refined, gate_c, gate_s
'''

CELLS["06_cbam_forward"] = ("cbam_forward", _CBAM, [
    (_edit(_edit(_edit(_CBAM, "refined = gate_c * x", "pre = x"), "avg_c, max_c = refined.mean(1, keepdim=True), "
           "refined.max(dim=1, keepdim=True).values", "avg_c, max_c = x.mean(1, keepdim=True), "
           "x.max(dim=1, keepdim=True).values"),
           "return gate_s * refined, gate_c, gate_s", "return gate_s * gate_c * x, gate_c, gate_s"),
     "computed from F"),
    (_edit(_CBAM, "descriptor = torch.cat((avg_c, max_c), 1)", "descriptor = torch.cat((max_c, avg_c), 1)"),
     "max before mean"),
    (_edit(_CBAM, "descriptor = torch.cat((avg_c, max_c), 1)", "descriptor = torch.cat((avg_c + max_c,) * 2, 1)"),
     "blog's"),
    (_edit(_CBAM, "avg_c, max_c = refined.mean(1, keepdim=True)", "avg_c, max_c = refined.sum(1, keepdim=True)"),
     "uses a SUM"),
    (_edit(_CBAM, "gate_s = torch.sigmoid(F.conv2d(descriptor, conv_w, padding=(conv_w.shape[-1] - 1) // 2))",
           "z = F.conv2d(descriptor, conv_w, padding=(conv_w.shape[-1] - 1) // 2)\n"
           "    gate_s = z.flatten(1).softmax(-1).view_as(z)").replace(
        "gate_c = torch.sigmoid(", "gate_c = torch.softmax(").replace(
        ".flatten(1))).unsqueeze(-1)", ".flatten(1)), dim=1).unsqueeze(-1)"), "a softmax where CBAM uses sigmoids"),
    (_edit(_CBAM, "\n                           + shared_mlp(F.adaptive_max_pool2d(x, 1).flatten(1))", ""),
     "that is SE"),
    (_edit(_CBAM, "avg_c, max_c = refined.mean(1, keepdim=True), refined.max(dim=1, keepdim=True).values",
           "avg_c, max_c = refined.mean(2, keepdim=True), refined.max(dim=2, keepdim=True).values"),
     "pool over the CHANNELS"),
    ('''
from attn_course import CBAM

def cbam_forward(x, W0, b0, W1, b1, conv_w):
    m = CBAM(x.shape[1], x.shape[1] // W0.shape[0], conv_w.shape[-1])
    m.load_state_dict({"channel.fc1.weight": W0, "channel.fc1.bias": b0, "channel.fc2.weight": W1,
                       "channel.fc2.bias": b1, "spatial.conv.weight": conv_w})
    y, (M_c, M_s) = m(x)
    return y, M_c, M_s
''', "FORBIDDEN"),
])

# the spatial-first mistake, written out (a learner swaps the two blocks)
CELLS["06_cbam_forward"][2].insert(0, ('''
import torch.nn.functional as F

def cbam_forward(x, W0, b0, W1, b1, conv_w):
    def shared_mlp(v):
        return F.linear(F.relu(F.linear(v, W0, b0)), W1, b1)
    descriptor = torch.cat((x.mean(1, keepdim=True), x.max(dim=1, keepdim=True).values), 1)
    gate_s = torch.sigmoid(F.conv2d(descriptor, conv_w, padding=conv_w.shape[-1] // 2))
    refined = gate_s * x
    gate_c = torch.sigmoid(shared_mlp(refined.mean((2, 3))) + shared_mlp(refined.amax((2, 3))))[..., None, None]
    return gate_c * refined, gate_c, gate_s
''', "spatial gate came first"))


# ---- 07_tpa_decode_step -----------------------------------------------------------------------------------

_STEP = '''
def tpa_decode_step(x, cache, w, num_heads):
    batch, pos = x.shape[0], cache["A_k"].shape[1]
    d = cache["B_k"].shape[-1]
    half = d // 2
    inv = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32) * 2 / d))
    cos, sin = torch.cos(pos * inv), torch.sin(pos * inv)

    def rotate(t):                                        # (..., d): pairs (i, i + d/2)
        a, b = t[..., :half], t[..., half:]
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)

    def project(name, R_axis_last, rot=False):
        y = torch.matmul(x, w[name].transpose(0, 1))[:, 0]                     # (B, out)
        t = y.reshape(batch, num_heads, -1) if R_axis_last else y.reshape(batch, -1, d)
        return (rotate(t) if rot else t).unsqueeze(1)

    new_cache = {
        "A_k": torch.cat([cache["A_k"], project("W_A_k", True)], 1),
        "B_k": torch.cat([cache["B_k"], project("W_B_k", False, rot=True)], 1),
        "A_v": torch.cat([cache["A_v"], project("W_A_v", True)], 1),
        "B_v": torch.cat([cache["B_v"], project("W_B_v", False)], 1),
    }
    A_q, B_q = project("W_A_q", True), project("W_B_q", False, rot=True)
    Q = (A_q @ B_q.squeeze(1).unsqueeze(1)) / A_q.shape[-1]                     # (B, 1, H, d)
    K = (new_cache["A_k"] @ new_cache["B_k"]) / new_cache["A_k"].shape[-1]      # (B, S+1, H, d)
    V = (new_cache["A_v"] @ new_cache["B_v"]) / new_cache["A_v"].shape[-1]
    scores = (Q.permute(0, 2, 1, 3) @ K.permute(0, 2, 3, 1)) / d ** 0.5         # (B, H, 1, S+1)
    ctx = torch.softmax(scores, -1) @ V.permute(0, 2, 1, 3)                     # (B, H, 1, d)
    out = ctx.permute(0, 2, 1, 3).reshape(batch, 1, -1) @ w["W_o"].transpose(0, 1)
    return out, (new_cache["A_k"], new_cache["B_k"], new_cache["A_v"], new_cache["B_v"])
'''

CELLS["07_tpa_decode_step"] = ("tpa_decode_step", _STEP, [
    (_edit(_STEP, "cos, sin = torch.cos(pos * inv), torch.sin(pos * inv)",
           "cos, sin = torch.cos((pos - 1) * inv), torch.sin((pos - 1) * inv)"), "sits at position S"),
    (_edit(_STEP, 'project("W_B_k", False, rot=True)', 'project("W_B_k", False)'), "into the cache ROTATED"),
    (_edit(_STEP, 'project("W_B_v", False)', 'project("W_B_v", False, rot=True)'), "values get no RoPE"),
    (_edit(_STEP, ') / A_q.shape[-1]', ')').replace(') / new_cache["A_k"].shape[-1]', ')').replace(
        ') / new_cache["A_v"].shape[-1]', ')'), "1/R scale is missing"),
    (_edit(_STEP, "t = y.reshape(batch, num_heads, -1) if R_axis_last",
           "t = y.reshape(batch, -1, num_heads).transpose(1, 2) if R_axis_last"), "head-major"),
    (_edit(_STEP, ") / d ** 0.5 ", ") "), "divide q·k by √d_h"),
    (_edit(_STEP, 'torch.cat([cache["A_k"], project("W_A_k", True)], 1)',
           'torch.cat([project("W_A_k", True), cache["A_k"]], 1)').replace(
        'torch.cat([cache["B_k"], project("W_B_k", False, rot=True)], 1)',
        'torch.cat([project("W_B_k", False, rot=True), cache["B_k"]], 1)').replace(
        'torch.cat([cache["A_v"], project("W_A_v", True)], 1)', 'torch.cat([project("W_A_v", True), cache["A_v"]], 1)').replace(
        'torch.cat([cache["B_v"], project("W_B_v", False)], 1)', 'torch.cat([project("W_B_v", False), cache["B_v"]], 1)'),
     "at the END of the cache"),
    (_edit(_STEP, 'return out, (new_cache["A_k"], new_cache["B_k"], new_cache["A_v"], new_cache["B_v"])',
           'return out, (new_cache["A_k"], K, new_cache["A_v"], V)'), "holds the per-head keys"),
    ('''
from attn_course import TensorProductAttention
from attn_course.tpa import TPACache

def tpa_decode_step(x, cache, w, num_heads):
    H, (B, S, _, Rk), d = num_heads, cache["A_k"].shape, cache["B_k"].shape[-1]
    m = TensorProductAttention(x.shape[-1], H, d, w["W_A_q"].shape[0] // H, Rk, cache["A_v"].shape[-1])
    m.load_state_dict({f"{k}.weight": v for k, v in w.items() if k != "W_o"} | {"out_proj.weight": w["W_o"]})
    c = TPACache(); c.update(cache["A_k"], cache["B_k"], cache["A_v"], cache["B_v"])
    out, _ = m(x, cache=c)
    return out, (c.A_k, c.B_k, c.A_v, c.B_v)
''', "FORBIDDEN"),
])
