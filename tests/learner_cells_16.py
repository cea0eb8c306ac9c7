'''Learner-style cells for the capstone (lesson 16), in the format of tests/learner_cells.py:
``CELLS[exercise_id] = (function name, correct cell, [(wrong cell, expected hint substring), ...])``.

The correct cell is a design in another style than the solution's: attention written by hand, ALiBi instead of
RoPE, multi-query attention (one KV head: 256 bytes per token), a GELU MLP, a dict cache. The wrong cells are
the capstone's typical failures: over the parameter budget, a wrong KV-cache report (bytes per token instead of
the total), a model that does not learn enough (no attention: a learned bigram), and a decode step that forgets
the token's position.
'''

CELLS = {}

_ALIBI_MQA = '''
import math
import torch
import torch.nn.functional as F
from torch import nn

def make_model(vocab_size):
    """MQA + ALiBi, written by hand: 2 layers, d=64, 4 query heads sharing ONE key/value head."""
    d, heads, layers, hd = 64, 4, 2, 16
    slopes = torch.tensor([2.0 ** (-8 * (i + 1) / heads) for i in range(heads)])     # ALiBi (Press et al.)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.q, self.kv, self.o = nn.Linear(d, d), nn.Linear(d, 2 * hd), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 3 * d), nn.GELU(), nn.Linear(3 * d, d))

        def attend(self, h, k, v, qpos):                 # h (B, Lq, d); k, v (B, 1, Lk, hd); qpos (Lq,)
            B, Lq, _ = h.shape
            q = self.q(h).view(B, Lq, heads, hd).transpose(1, 2)                 # (B, H, Lq, hd)
            kpos = torch.arange(k.shape[2])
            dist = (qpos[:, None] - kpos[None, :]).float()                       # (Lq, Lk)
            s = q @ k.transpose(-2, -1) / math.sqrt(hd) - slopes[:, None, None] * dist
            s = s.masked_fill(dist < 0, float("-inf"))                           # causal
            y = torch.softmax(s, -1) @ v                                         # (B, H, Lq, hd)
            return self.o(y.transpose(1, 2).reshape(B, Lq, d))

        def kv_of(self, h):
            k, v = self.kv(h).unsqueeze(1).split(hd, dim=-1)                    # (B, 1, L, hd) each
            return k, v

    class MQALM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab_size, d)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            self.out = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, vocab_size))

        def forward(self, idx):
            x = self.emb(idx)
            pos = torch.arange(idx.shape[1])
            for layer in self.layers:
                h = layer.n1(x)
                k, v = layer.kv_of(h)
                x = x + layer.attend(h, k, v, pos)
                x = x + layer.mlp(layer.n2(x))
            return self.out(x)

        def step(self, tok, state):
            state = state or {"k": [None] * layers, "v": [None] * layers}
            t = 0 if state["k"][0] is None else state["k"][0].shape[2]
            x, new = self.emb(tok), {"k": [], "v": []}
            for i, layer in enumerate(self.layers):
                h = layer.n1(x)
                k, v = layer.kv_of(h)
                if state["k"][i] is not None:
                    k, v = torch.cat([state["k"][i], k], 2), torch.cat([state["v"][i], v], 2)
                new["k"].append(k)
                new["v"].append(v)
                x = x + layer.attend(h, k, v, torch.tensor([t]))
                x = x + layer.mlp(layer.n2(x))
            return self.out(x), new

        def kv_cache_bytes(self, n):
            return 2 * layers * hd * 4 * n            # K and V, one head, float32

    return MQALM()
'''

_GQA = '''
import torch
import torch.nn.functional as F
from torch import nn
from attn_course import RMSNorm, TransformerBlock

def make_model(vocab_size):
    D, H, HKV, N = {D}, 4, {HKV}, {N}

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab_size, D)
            self.blocks = nn.ModuleList(TransformerBlock(D, H, HKV) for _ in range(N))
            self.norm, self.head = RMSNorm(D), nn.Linear(D, vocab_size, bias=False)

        def forward(self, codes):
            x = self.embed(codes)
            for b in self.blocks:
                x = b(x)
            return self.head(self.norm(x))

        def step(self, code, cache):
            t = 0 if cache is None else cache[0][0].shape[2]
            x, new = self.embed(code), []
            for i, b in enumerate(self.blocks):
                q, k, v = b.qkv(b.norm1(x), torch.tensor([{POS}]))
                if cache is not None:
                    k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
                new.append((k, v))
                y = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                x = x + b.attn.out_proj(y.transpose(1, 2).flatten(2))
                x = x + b.ffn(b.norm2(x))
            return self.head(self.norm(x)), new

        def kv_cache_bytes(self, n_tokens):
            return N * 2 * HKV * (D // H) * 4 * {TOKENS}

    return LM()
'''


def _gqa(D=64, HKV=2, N=2, POS="t", TOKENS="n_tokens"):
    return _GQA.replace("{D}", str(D)).replace("{HKV}", str(HKV)).replace("{N}", str(N)) \
               .replace("{POS}", POS).replace("{TOKENS}", TOKENS)


_BIGRAM = '''
import torch
from torch import nn

def make_model(vocab_size):
    """No attention: each character predicts the next from itself (a learned bigram with an MLP)."""
    class Bigram(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Sequential(nn.Embedding(vocab_size, 64), nn.Linear(64, 256), nn.GELU(),
                                       nn.Linear(256, vocab_size))

        def forward(self, codes):
            return self.table(codes)

        def step(self, code, cache):
            return self.table(code), cache            # nothing to remember

        def kv_cache_bytes(self, n_tokens):
            return 0

    return Bigram()
'''

# ---- the review's shortcuts (review 2026-11-26, 08-14 §Capstone): each must score below full marks ----------

_MHA_BLOCKS = '''
import torch
import torch.nn.functional as F
from torch import nn
from attn_course import RMSNorm, TransformerBlock

def make_model(vocab_size):
    d, layers, heads = 64, {LAYERS}, 4

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab_size, d)
            self.blocks = nn.ModuleList(TransformerBlock(d, heads, heads, {BLOCK_ARGS}) for _ in range(layers))
            self.norm, self.head = RMSNorm(d), nn.Linear(d, vocab_size, bias=False)

        def forward(self, codes):
            x = self.embed(codes)
            for b in self.blocks:
                x = b(x)
            return self.head(self.norm(x))
{STEP}
    return M()
'''

_RECOMPUTE_STEP = '''
        def step(self, code, cache):              # the "cache" is the token codes: re-run forward on the prefix
            codes = code.to({CODE_DTYPE}) if cache is None else torch.cat([cache, code.to({CODE_DTYPE})], 1)
            return self.forward(codes.long())[:, -1:], codes

        def kv_cache_bytes(self, n):
            return n * {CODE_BYTES}
'''

# H14-2 (cap_exploit.py): a 3-layer full-MHA model whose step keeps only the token codes, 1 byte per token
RECOMPUTE_CODES = _MHA_BLOCKS.replace("{LAYERS}", "3").replace("{BLOCK_ARGS}", "ffn_dim=128").replace(
    "{STEP}", _RECOMPUTE_STEP.replace("{CODE_DTYPE}", "torch.uint8").replace("{CODE_BYTES}", "1"))
# the same with the codes stored as float32 (4 bytes per token): passes the floating-point rule, not the work rule
RECOMPUTE_FLOAT_CODES = _MHA_BLOCKS.replace("{LAYERS}", "3").replace("{BLOCK_ARGS}", "ffn_dim=128").replace(
    "{STEP}", _RECOMPUTE_STEP.replace("{CODE_DTYPE}", "torch.float32").replace("{CODE_BYTES}", "4"))

_WINDOW_STEP = '''
        def step(self, code, cache):              # a 64-slot rolling cache per layer
            W = 64
            t = 0 if cache is None else cache["t"]
            x, new = self.embed(code), {"t": t + 1, "kv": []}
            for i, b in enumerate(self.blocks):
                q, k, v = b.qkv(b.norm1(x), torch.tensor([t]))
                if cache is None:
                    K = torch.zeros(k.shape[0], k.shape[1], W, k.shape[3]); V = torch.zeros_like(K)
                else:
                    K, V = (c.clone() for c in cache["kv"][i])
                K[:, :, t % W] = k[:, :, 0]; V[:, :, t % W] = v[:, :, 0]
                filled = torch.arange(W) <= t
                y = F.scaled_dot_product_attention(q, K, V, attn_mask=filled[None, :])
                new["kv"].append((K, V))
                x = x + b.attn.out_proj(y.transpose(1, 2).flatten(2))
                x = x + b.ffn(b.norm2(x))
            return self.head(self.norm(x)), new

        def kv_cache_bytes(self, n):
            return 2 * 2 * 4 * 16 * 4 * min(n, 64)
'''

# M14-1 (cap_exploit.py): plain MHA (4 KV heads) with a sliding window of 64 and a 64-slot rolling cache: 512 B/token
WINDOW_64 = _MHA_BLOCKS.replace("{LAYERS}", "2").replace("{BLOCK_ARGS}", "window=64").replace("{STEP}", _WINDOW_STEP)

# Low (buffers are free): a trigram table counted from the training text (128³ entries) held in a buffer beside
# the course's kind of GQA model: 2,097,152 numbers the parameter count used to miss
BUFFER_TABLE = '''
import torch
import torch.nn.functional as F
from torch import nn
from attn_course import RMSNorm, TransformerBlock
from attn_course.demos.textlm import TextData

def make_model(vocab_size):
    D, H, HKV, N = 64, 4, 2, 2
    train = TextData().train
    table = torch.ones(vocab_size, vocab_size, vocab_size)
    table.index_put_((train[:-2], train[1:-1], train[2:]), torch.ones(len(train) - 2), accumulate=True)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab_size, D)
            self.blocks = nn.ModuleList(TransformerBlock(D, H, HKV) for _ in range(N))
            self.norm, self.head = RMSNorm(D), nn.Linear(D, vocab_size, bias=False)
            self.register_buffer("trigram", (table / table.sum(-1, keepdim=True)).log(), persistent=False)

        def forward(self, codes):
            x = self.embed(codes)
            for b in self.blocks:
                x = b(x)
            prev = torch.cat([codes[:, :1], codes[:, :-1]], 1)
            return self.head(self.norm(x)) + self.trigram[prev, codes]

        def step(self, code, cache):
            t = 0 if cache is None else cache["kv"][0][0].shape[2]
            prev = code if cache is None else torch.full_like(code, cache["prev"])
            x, new = self.embed(code), []
            for i, b in enumerate(self.blocks):
                q, k, v = b.qkv(b.norm1(x), torch.tensor([t]))
                if cache is not None:
                    k, v = torch.cat([cache["kv"][i][0], k], 2), torch.cat([cache["kv"][i][1], v], 2)
                new.append((k, v))
                y = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                x = x + b.attn.out_proj(y.transpose(1, 2).flatten(2))
                x = x + b.ffn(b.norm2(x))
            return self.head(self.norm(x)) + self.trigram[prev, code], {"kv": new, "prev": int(code[0, 0])}

        def kv_cache_bytes(self, n_tokens):
            return N * 2 * HKV * (D // H) * 4 * n_tokens

    return LM()
'''

# ---- review 2026-11-28 (14-16), H16-1: constant-work recompute over a fixed float buffer of 128 token codes ----
BUF_RECOMPUTE = _MHA_BLOCKS.replace("{LAYERS}", "3").replace("{BLOCK_ARGS}", "ffn_dim=128").replace("{STEP}", """
        def step(self, code, cache):              # a float32 buffer of 128 codes; the whole forward every step
            buf, t = (torch.zeros(code.shape[0], 128), 0) if cache is None else (cache[0].clone(), cache[1])
            buf[:, t] = code[:, 0].float()
            return self.forward(buf.long())[:, t:t + 1], (buf, t + 1)

        def kv_cache_bytes(self, n):
            return 128 * 4
""")

# ---- issue 39: numbers the model uses but does not register (each must count toward the parameter budget) ----
# The course's kind of GQA model (108,928 parameters) plus a fixed table of 128 x 512 numbers added to the
# embedding, kept where nn.Module.parameters() and buffers() do not look: 174,464 numbers in all.
_EXTRA = _gqa().replace("x = self.embed(codes)", "x = self.embed(codes) + EXTRA[codes, :D]") \
               .replace("x, new = self.embed(code), []", "x, new = self.embed(code) + EXTRA[code, :D], []")
HIDDEN = {
    # a closure: a tensor made in make_model and captured by the methods
    "closure": _EXTRA.replace("    D, H, HKV, N =", "    EXTRA = torch.randn(vocab_size, 512)\n    D, H, HKV, N ="),
    # a plain list inside the nn.Module (not registered)
    "list in the module": _EXTRA.replace("EXTRA[", "self.extra[0][").replace(
        "self.embed = nn.Embedding(vocab_size, D)",
        "self.embed = nn.Embedding(vocab_size, D)\n            self.extra = [torch.randn(vocab_size, 512)]"),
    # a fixed random projection at the cell's top level, named by the methods' code
    "random projection": _EXTRA.replace("EXTRA[codes, :D]", "PROJ_IN[codes] @ PROJ_OUT").replace(
        "EXTRA[code, :D]", "PROJ_IN[code] @ PROJ_OUT").replace(
        "def make_model(vocab_size):",
        "PROJ_IN, PROJ_OUT = torch.randn(128, 256), torch.randn(256, 64) / 16\n\ndef make_model(vocab_size):"),
    # a table counted from text, held as Python lists (numbers outside any tensor)
    "text table": _EXTRA.replace("EXTRA[", "torch.tensor(TABLE)[").replace(
        "    D, H, HKV, N =",
        "    from attn_course.demos.textlm import TextData\n"
        "    text = TextData().train.tolist()\n"
        "    TABLE = [[0.0] * 512 for _ in range(vocab_size)]\n"
        "    for a, b in zip(text, text[1:]):\n"
        "        TABLE[a][b] += 1e-3\n"
        "    D, H, HKV, N ="),
}

# ---- correct variants that must score full marks ---------------------------------------------------------------
# Lesson 14 section 7's int8 KV cache: keys and values as int8 with a float32 scale per (head, token), the forward
# fake-quantised the same way (straight-through in training). 2 layers x (2 x 2 KV heads x 16 x 1 B + 2 x 2 x 4 B)
# = 160 bytes per token, scales included. STORE=torch.float16: a float16 cache, 256 bytes per token.
_QUANT_KV = _gqa().replace("    D, H, HKV, N =", """    store = STORE

    def quant(x):                                  # (B, H, L, 16) -> (stored, scale or None)
        if store == torch.int8:
            s = x.abs().amax(-1, keepdim=True).clamp_min(1e-8) / 127
            return torch.round(x / s).clamp(-127, 127).to(torch.int8), s
        return x.to(store), None

    def dequant(qx, s):
        return qx.float() * s if s is not None else qx.float()

    def fake(x):
        return x + (dequant(*quant(x)) - x).detach()

    D, H, HKV, N =""").replace("""            for b in self.blocks:
                x = b(x)
            return self.head(self.norm(x))""", """            for b in self.blocks:
                q, k, v = b.qkv(b.norm1(x))
                y = F.scaled_dot_product_attention(q, fake(k), fake(v), is_causal=True, enable_gqa=True)
                x = x + b.attn.out_proj(y.transpose(1, 2).flatten(2))
                x = x + b.ffn(b.norm2(x))
            return self.head(self.norm(x))""").replace(
    "t = 0 if cache is None else cache[0][0].shape[2]", "t = 0 if cache is None else cache[0][0].shape[2]").replace(
    """                if cache is not None:
                    k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
                new.append((k, v))
                y = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)""", """                (kq, ks), (vq, vs) = quant(k), quant(v)
                if cache is not None:
                    pk, pks, pv, pvs = cache[i]
                    kq, vq = torch.cat([pk, kq], 2), torch.cat([pv, vq], 2)
                    if ks is not None:
                        ks, vs = torch.cat([pks, ks], 2), torch.cat([pvs, vs], 2)
                new.append((kq, ks, vq, vs))
                y = F.scaled_dot_product_attention(q, dequant(kq, ks), dequant(vq, vs), enable_gqa=True)""").replace(
    "return N * 2 * HKV * (D // H) * 4 * n_tokens",
    "return N * 2 * HKV * n_tokens * ((D // H) * torch.empty(0, dtype=store).element_size() "
    "+ (4 if store == torch.int8 else 0))")
INT8_KV = _QUANT_KV.replace("STORE", "torch.int8")
FP16_KV = _QUANT_KV.replace("STORE", "torch.float16")

# the review's shortcuts: (cell, the point it must lose, a substring of that point's hint)
SHORTCUTS = {
    "recompute, token codes": (RECOMPUTE_CODES, "kv", "re-runs the model over the prefix"),
    "recompute over a fixed float buffer": (BUF_RECOMPUTE, "kv", "128.0× your forward's"),
    **{f"hidden numbers: {name}": (src, "parameters", "over the budget of 150,000") for name, src in HIDDEN.items()},
    "recompute, float codes": (RECOMPUTE_FLOAT_CODES, "kv", "re-runs the model over the prefix"),
    "MHA + window 64": (WINDOW_64, "kv", "does not change the logits at the last position"),
    "trigram table in a buffer": (BUFFER_TABLE, "parameters", "over the budget of 150,000"),
}

CELLS["16_capstone"] = ("make_model", _ALIBI_MQA, [
    (_gqa(D=96, HKV=1), "over the budget of 150,000"),                 # 219k parameters
    (_gqa(TOKENS="1"), "you report bytes per token"),                  # forgot × n_tokens
    (_BIGRAM, "is not below the bar"),                                 # no attention: ~2.5 nats/char
    (_gqa(POS="0"), "give each step its true position"),               # RoPE at 0 in every step
])
