"""Exercise set 10 — additive and linear attention (solutions/10_linear_and_additive_attention.ipynb).

References are computed here in float64 from the definitions (Bahdanau's score pair by pair, the explicit
kernel matrix φ(Q)φ(K)ᵀ for linear attention, closed-form FLOP counts), independently of the learner and
of ``attn_course.additive`` / ``attn_course.linear``. Hints are detected by computing what each common
mistake returns on the same inputs.
"""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ..spec import FORBID_COURSE, FORBID_SDPA, Case, Exercise, Verdict, close, diagnose, randint, choice, draw, distinct

__all__ = ["EXERCISES"]

_F64 = torch.float64


def _phi(x):
    return torch.where(x > 0, x + 1, torch.exp(x))                  # elu(x) + 1, written out


# ---- 10_additive_score --------------------------------------------------------------------------------

def _add_cases(gen):
    out = []
    for Lq, Lk, dq, dk, h in [(3, 5, 4, 6, 7), (6, 2, 8, 3, 5), (4, 4, 2, 9, 16), (1, 7, 5, 5, 3)]:
        out.append(Case(f"Lq={Lq}, Lk={Lk}, query_dim={dq}, key_dim={dk}, hidden={h}",
                        {"q": torch.randn(Lq, dq, generator=gen, dtype=_F64),
                         "k": torch.randn(Lk, dk, generator=gen, dtype=_F64),
                         "W_q": torch.randn(h, dq, generator=gen, dtype=_F64) * 0.7,
                         "W_k": torch.randn(h, dk, generator=gen, dtype=_F64) * 0.7,
                         "w_v": torch.randn(h, generator=gen, dtype=_F64)}))
    return out


def _add_answer(fn, case):
    i = case.inputs
    return {"scores": fn(i["q"], i["k"], i["W_q"], i["W_k"], i["w_v"])}


def _add_formula(case, *, tanh="pair"):
    i = case.inputs
    hq, hk = i["q"] @ i["W_q"].T, i["k"] @ i["W_k"].T                # (Lq, h), (Lk, h)
    if tanh == "pair":
        pre = torch.tanh(hq[:, None, :] + hk[None, :, :])
    elif tanh == "none":
        pre = hq[:, None, :] + hk[None, :, :]
    else:                                                          # tanh of each projection, then added
        pre = torch.tanh(hq)[:, None, :] + torch.tanh(hk)[None, :, :]
    return {"scores": pre @ i["w_v"]}


def _add_expected(case):
    i = case.inputs
    Lq, Lk = i["q"].shape[0], i["k"].shape[0]
    s = torch.empty(Lq, Lk, dtype=_F64)
    for a in range(Lq):                                            # one pair at a time, as in the paper
        for b in range(Lk):
            s[a, b] = i["w_v"] @ torch.tanh(i["W_q"] @ i["q"][a] + i["W_k"] @ i["k"][b])
    return {"scores": s}


def _add_judge(got, want, case):
    if close(got["scores"], want["scores"]):
        return Verdict(True)
    return diagnose(got, [
        ("the tanh is missing: without it the score w_vᵀ(W_q q + W_k k) = w_vᵀW_q q + w_vᵀW_k k splits into a "
         "query part plus a key part, and the softmax over keys ignores the query entirely.",
         _add_formula(case, tanh="none")),
        ("the tanh goes around the SUM W_q q_i + W_k k_j (one hidden vector per pair), not around each "
         "projection separately — tanh(a) + tanh(b) again splits into a query part plus a key part.",
         _add_formula(case, tanh="each")),
        ("rows are queries and columns keys: return (Lq, Lk), score[i, j] for query i and key j.",
         {"scores": _add_formula(case)["scores"].T} if want["scores"].shape[0] == want["scores"].shape[1] else None),
    ], "compare with score[i, j] = w_vᵀ tanh(W_q q_i + W_k k_j).")


# ---- 10_linear_by_hand --------------------------------------------------------------------------------

# Records the number of elements of the largest tensor any op creates. Its hook runs *inside* the learner's
# call (torch calls it for every op), and the runtime guard counts grading code called from outside the
# grader as a use of the forbidden ``attn_course``; so the hook is compiled under a filename of its own.
_LARGEST_SRC = """
class Largest(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out
"""
_ns = {"TorchDispatchMode": TorchDispatchMode, "torch": torch}
exec(compile(_LARGEST_SRC, "<attn_course largest-tensor recorder>", "exec"), _ns)
_Largest = _ns["Largest"]


def _lin_cases(gen):
    out = []
    # B·H·E·Ev < Lq and B·H·max(E, Ev) < Lk: every tensor of the trick, batched over (b, h) — the (Lk, E, Ev)
    # outer product included — stays smaller than ONE head's Lq × Lk matrix, the thing the trick avoids
    for B, H, Lq, Lk, E, Ev in [(1, 2, 40, 40, 4, 3), (2, 1, 40, 60, 3, 5), (1, 1, 300, 300, 2, 2),
                                (2, 3, 200, 160, 3, 2)]:
        out.append(Case(f"B={B}, H={H}, Lq={Lq}, Lk={Lk}, E={E}, Ev={Ev}",
                        {"q": torch.randn(B, H, Lq, E, generator=gen, dtype=_F64),
                         "k": torch.randn(B, H, Lk, E, generator=gen, dtype=_F64),
                         "v": torch.randn(B, H, Lk, Ev, generator=gen, dtype=_F64)}))
    return out


def _lin_answer(fn, case):
    i = case.inputs
    rec = _Largest()
    with rec:
        out = fn(i["q"], i["k"], i["v"])
    pairs = i["q"].shape[-2] * i["k"].shape[-2]                      # one (batch, head)'s Lq × Lk matrix
    return {"out": out, "formed_Lq_x_Lk": torch.tensor(rec.largest >= pairs)}


def _lin_formula(q, k, v, *, phi=_phi, normalise=True, eps=1e-6):
    K = phi(q) @ phi(k).transpose(-2, -1)                          # (..., Lq, Lk) kernel matrix
    num = K @ v
    return num / (K.sum(-1, keepdim=True) + eps) if normalise else num


def _lin_expected(case):
    i = case.inputs
    return {"out": _lin_formula(i["q"], i["k"], i["v"]), "formed_Lq_x_Lk": torch.tensor(False)}


def _lin_judge(got, want, case):
    ok = close(got["out"], want["out"], atol=1e-6, rtol=1e-5)
    if ok and not bool(got["formed_Lq_x_Lk"]):
        return Verdict(True)
    if ok:
        return Verdict(False, "right values, but your code formed an Lq × Lk tensor: compute S = φ(K)ᵀV (E × Ev) "
                              "and z = Σ_j φ(k_j) first, then φ(Q)S / (φ(Q)z + eps) — the associativity trick.")
    i = case.inputs
    q, k, v = i["q"], i["k"], i["v"]
    return diagnose({"out": got["out"]}, [
        ("the normaliser is missing: divide φ(q_i)ᵀS by φ(q_i)ᵀz + eps, with z = Σ_j φ(k_j).",
         {"out": _lin_formula(q, k, v, normalise=False)}),
        ("φ(x) = elu(x) + 1: without the +1 the features can be negative, and so can the weights and the "
         "normaliser.", {"out": _lin_formula(q, k, v, phi=F.elu)}),
        ("that is softmax attention; linear attention replaces exp(qᵀk/√E) by φ(q)ᵀφ(k) with φ = elu + 1.",
         {"out": torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, -1) @ v}),
    ], "compare with out_i = φ(q_i)ᵀS / (φ(q_i)ᵀz + eps), S = Σ_j φ(k_j)v_jᵀ, z = Σ_j φ(k_j), φ = elu + 1.")


# ---- 10_recurrent_step --------------------------------------------------------------------------------

def _step_cases(gen):
    out = []
    for B, E, Ev in [(1, 4, 3), (3, 2, 5), (2, 6, 6), (4, 5, 1)]:
        out.append(Case(f"B={B}, E={E}, Ev={Ev}, a state after some tokens",
                        {"S": torch.rand(B, E, Ev, generator=gen, dtype=_F64) * 3,
                         "z": torch.rand(B, E, generator=gen, dtype=_F64) * 3 + 0.5,
                         "q": torch.randn(B, E, generator=gen, dtype=_F64),
                         "k": torch.randn(B, E, generator=gen, dtype=_F64) + 1,
                         "v": torch.randn(B, Ev, generator=gen, dtype=_F64) * 2}))
    return out


def _step_answer(fn, case):
    i = case.inputs
    before = {k: t.clone() for k, t in i.items()}
    out, S, z = fn(i["S"], i["z"], i["q"], i["k"], i["v"])
    changed = [k for k in ("S", "z", "q", "k", "v") if not torch.equal(i[k], before[k])]
    for k in changed:                                   # later cases and the judge see the inputs as drawn
        i[k].copy_(before[k])
    return {"out": out, "S": S, "z": z, "inputs_unchanged": torch.tensor(not changed)}


def _step_formula(case, *, read_first=False, normalise=True, phi=_phi, phi_q=None, eps=1e-6):
    i = case.inputs
    pk, pq = phi(i["k"]), (phi_q or phi)(i["q"])
    S = i["S"] + pk[:, :, None] * i["v"][:, None, :]
    z = i["z"] + pk
    S_r, z_r = (i["S"], i["z"]) if read_first else (S, z)
    num = (pq[:, :, None] * S_r).sum(1)
    out = num / ((pq * z_r).sum(-1, keepdim=True) + eps) if normalise else num
    return {"out": out, "S": S, "z": z}


def _step_expected(case):
    return {**_step_formula(case), "inputs_unchanged": torch.tensor(True)}


def _step_judge(got, want, case):
    if not bool(got["inputs_unchanged"]):
        return Verdict(False, "your code changed its inputs in place (e.g. `S += …`): the prompt asks for the new "
                              "state as new tensors — write S_new = S + …, z_new = z + …")
    if all(close(got[key], want[key]) for key in want):
        return Verdict(True)
    if not (close(got["S"], want["S"]) and close(got["z"], want["z"])):
        return diagnose({"S": got["S"], "z": got["z"]}, [
            ("the state update uses φ(k_t) = elu(k_t) + 1, not k_t itself: S += φ(k_t) v_tᵀ, z += φ(k_t).",
             {k: v for k, v in _step_formula(case, phi=lambda x: x).items() if k != "out"}),
            ("S and z must ADD the new token to the state (a running sum), not replace it.",
             {"S": _step_formula(case)["S"] - case.inputs["S"], "z": _step_formula(case)["z"] - case.inputs["z"]}),
        ], "the new state is S + φ(k_t) v_tᵀ (E × Ev) and z + φ(k_t) (E).")
    return diagnose({"out": got["out"]}, [
        ("off by one: the output reads the state BEFORE token t was added, so the token cannot attend to "
         "itself. Update S and z first, then read out_t = φ(q_t)ᵀS_t / (φ(q_t)ᵀz_t + eps).",
         {"out": _step_formula(case, read_first=True)["out"]}),
        ("the normaliser is missing: divide by φ(q_t)ᵀz_t + eps.", {"out": _step_formula(case, normalise=False)["out"]}),
        ("the query needs the feature map too: φ(q_t) = elu(q_t) + 1.",      # (the state is right: φ(k) was used)
         {"out": _step_formula(case, phi_q=lambda x: x)["out"]}),
    ], "the state is right; the output is φ(q_t)ᵀS_t / (φ(q_t)ᵀz_t + eps) with the UPDATED S_t and z_t.")


# ---- 10_crossover -------------------------------------------------------------------------------------

def _flops(L, E, Ev, *, pv=True):
    softmax = 2 * L * L * E + (2 * L * L * Ev if pv else 0)
    linear = 2 * L * E * Ev + 2 * L * E * Ev + L * E + 2 * L * E
    return softmax, linear


def _crossover(E, Ev, *, strict=True, pv=True):
    L = 1
    while True:
        s, lin = _flops(L, E, Ev, pv=pv)
        if lin < s or (not strict and lin <= s):
            return L
        L += 1


_TIES = [(E, Ev) for E in range(2, 40) for Ev in range(2, 40)        # the counts are equal at some integer L
         if E * (4 * Ev + 3) % (2 * (E + Ev)) == 0 and E * (4 * Ev + 3) // (2 * (E + Ev)) > 1]


def _cross_cases(gen):
    def make(g):
        E, Ev = choice(g, (16, 32, 64, 128)) + randint(g, 0, 3), choice(g, (16, 64, 128, 256))
        return E, Ev, distinct(_crossover(E, Ev), _crossover(E, Ev, pv=False), _crossover(E, Ev) - 1)
    # each mistake below gives its own L, different from the answer; one case has a tie (where "<=" and "<"
    # answer differently)
    shapes = [draw(gen, make, lambda x: x[2])[:2] for _ in range(3)]
    shapes.insert(1, choice(gen, _TIES))
    return [Case(f"E={E}, Ev={Ev}", params={"E": E, "Ev": Ev}) for E, Ev in shapes]


def _cross_answer(fn, case):
    return {"L": torch.tensor(int(fn(*case.params.values())), dtype=torch.int64)}


def _cross_expected(case):
    return {"L": torch.tensor(_crossover(**case.params), dtype=torch.int64)}


def _cross_judge(got, want, case):
    g, p = int(got["L"]), case.params
    if g == int(want["L"]):
        return Verdict(True)
    E, Ev = p["E"], p["Ev"]
    hints = [hint for hint, value in [
        ("softmax attention has TWO L×L matmuls: QKᵀ (2·L²·E) and PV (2·L²·Ev).", _crossover(E, Ev, pv=False)),
        ("at the returned L both counts are equal; the question asks for the first L where linear attention "
         "needs strictly FEWER FLOPs.", _crossover(E, Ev, strict=False)),
        ("that is the last L where softmax attention is still cheaper (or as cheap); return the first L where "
         "linear attention is cheaper.", _crossover(E, Ev) - 1),
    ] if g == value and value != int(want["L"])]
    if hints:                          # where the counts tie, "<=" and "one too few" give the same L: name both
        return Verdict(False, " — or ".join(hints))
    return Verdict(False, "count per head: softmax 2L²E + 2L²Ev; linear 2LEEv (S) + 2LEEv (φ(Q)S) + LE (z) + "
                          "2LE (φ(Q)z); return the smallest L with linear < softmax.")


# ---- 10_find_the_bug ----------------------------------------------------------------------------------

_BUGS = {"plus_one": "φ must be elu(x) + 1 (the +1 keeps features, weights and normaliser positive)",
         "normaliser": "the normaliser is missing (divide by φ(q_i)ᵀz_i + eps, z_i = Σ_{j≤i} φ(k_j))",
         "off_by_one": "the prefix sum is off by one: query i must include key i (an inclusive cumsum, not "
                       "cumsum − current)"}


def _causal_formula(q, k, v, *, plus_one=True, normaliser=True, off_by_one=False, eps=1e-6):
    phi = _phi if plus_one else F.elu
    K = phi(q) @ phi(k).transpose(-2, -1)
    L = q.shape[-2]
    K = K * torch.ones(L, L, dtype=q.dtype).tril(-1 if off_by_one else 0)
    num = K @ v
    return num / (K.sum(-1, keepdim=True) + eps) if normaliser else num


def _bug_cases(gen):
    out = []
    for B, H, L, E, Ev in [(1, 2, 7, 3, 4), (2, 1, 12, 4, 2), (1, 3, 5, 2, 3), (2, 2, 16, 5, 5)]:
        out.append(Case(f"B={B}, H={H}, L={L}, E={E}, Ev={Ev}",
                        {"q": torch.randn(B, H, L, E, generator=gen, dtype=_F64),
                         "k": torch.randn(B, H, L, E, generator=gen, dtype=_F64),
                         "v": torch.randn(B, H, L, Ev, generator=gen, dtype=_F64)}))
    return out


def _bug_answer(fn, case):
    i = case.inputs
    return {"out": fn(i["q"], i["k"], i["v"])}


def _bug_expected(case):
    i = case.inputs
    return {"out": _causal_formula(i["q"], i["k"], i["v"])}


def _bug_judge(got, want, case):
    if close(got["out"], want["out"], atol=1e-6, rtol=1e-5):
        return Verdict(True)
    i = case.inputs
    cands = []
    for flags in itertools.product([False, True], repeat=3):          # which bugs are still there
        if not any(flags):
            continue
        left = [name for name, f in zip(_BUGS, flags) if f]
        kw = {"plus_one": not flags[0], "normaliser": not flags[1], "off_by_one": flags[2]}
        hint = ("still there: " + "; ".join(_BUGS[n] for n in left) + ".")
        cands.append((hint, {"out": _causal_formula(i["q"], i["k"], i["v"], **kw)}))
    cands.sort(key=lambda c: c[0].count(";"))                         # fewest remaining bugs first
    return diagnose(got, cands, "compare with out_i = Σ_{j≤i} φ(q_i)ᵀφ(k_j) v_j / (Σ_{j≤i} φ(q_i)ᵀφ(k_j) + eps), "
                                "φ = elu + 1.")


# ---- 10_chunked_scan: the grader runs the scan, the learner writes one chunk's step ----------------------

def _chunk_ref(S, z, pq, pk, v, *, intra="tril", state="after", accumulate=True, normalise=True, eps=1e-6):
    """One chunk (C rows) from the state S (E, Ev), z (E) of the earlier tokens, with the learner's choices:
    ``intra`` "tril" (j <= i), "strict" (j < i) or "full"; ``state`` "after" (the answer) or "before" (the chunk
    folded into S before its intra part). Returns (out, S_new, z_new)."""
    A = pq @ pk.transpose(-2, -1)
    A = {"tril": A.tril(), "strict": A.tril(-1), "full": A}[intra]
    kv, ks = pk.transpose(-2, -1) @ v, pk.sum(-2)
    S_new, z_new = (S + kv, z + ks) if accumulate else (kv, ks)
    S_r, z_r = (S_new, z_new) if state == "before" else (S, z)
    num = pq @ S_r + A @ v
    out = num / ((pq @ z_r[..., None]).squeeze(-1) + A.sum(-1) + eps)[..., None] if normalise else num
    return out, S_new, z_new


def _scan_cases(gen):
    out = []
    for n in range(4):
        B, H, E, Ev, C = randint(gen, 1, 2), randint(gen, 1, 2), randint(gen, 2, 5), randint(gen, 2, 5), randint(gen, 4, 8)
        L = C * randint(gen, 3, 6) + (0 if n == 3 else randint(gen, 1, C - 1))      # the last chunk shorter, but once
        # ReLU features: many exact zeros (a row of zeros makes the normaliser just eps); case 1 is tiny, so
        # that eps is as large as the sums it is added to
        scale = 1e-3 if n == 1 else 1.0
        pq, pk = (torch.relu(torch.randn(B, H, L, E, generator=gen, dtype=_F64)) * scale for _ in range(2))
        pk[..., 0, :] = 0.0                                                  # key 0 adds nothing
        S0 = torch.rand(B, H, E, Ev, generator=gen, dtype=_F64) * (n % 2) * 3   # cases 1, 3: earlier tokens
        z0 = torch.rand(B, H, E, generator=gen, dtype=_F64) * (n % 2) * 3
        out.append(Case(f"B={B}, H={H}, L={L}, E={E}, Ev={Ev}, chunk={C}" + (", tiny features" if n == 1 else "")
                        + (", from a state of earlier tokens" if n % 2 else ", from the empty state"),
                        {"phi_q": pq, "phi_k": pk, "v": torch.randn(B, H, L, Ev, generator=gen, dtype=_F64),
                         "S0": S0, "z0": z0}, {"chunk": C}))
    return out


def _scan_drive(step, case):
    """The grader's scan: chunk after chunk of ``chunk`` tokens (the last may be shorter), the state the step
    returned carried to the next; the outputs and the final state are graded."""
    i, C = case.inputs, case.params["chunk"]
    S, z, outs = i["S0"].clone(), i["z0"].clone(), []
    for c0 in range(0, i["v"].shape[-2], C):
        o, S, z = step(S, z, *(i[n][..., c0:c0 + C, :].clone() for n in ("phi_q", "phi_k", "v")))
        outs.append(o)
    return {"out": torch.cat(outs, -2), "S": S, "z": z}


def _scan_expected(case):
    """Dense, from the definition: out_i = (φq_i·S0 + Σ_{j<=i} (φq_i·φk_j) v_j) / (φq_i·z0 + Σ_{j<=i} φq_i·φk_j + eps)."""
    i = case.inputs
    pq, pk, v = i["phi_q"], i["phi_k"], i["v"]
    K = (pq @ pk.transpose(-2, -1)).tril()
    den = (pq @ i["z0"][..., None]).squeeze(-1) + K.sum(-1) + 1e-6
    return {"out": (pq @ i["S0"] + K @ v) / den[..., None], "S": i["S0"] + pk.transpose(-2, -1) @ v,
            "z": i["z0"] + pk.sum(-2)}


def _scan_judge(got, want, case):
    if all(close(got[k], want[k], atol=1e-6, rtol=1e-5) for k in want):
        return Verdict(True)
    if close(got["out"], want["out"], atol=1e-6, rtol=1e-5):
        return Verdict(False, "the outputs are right but the state you return is not: S_new = S + φ(K_c)ᵀV_c and "
                              "z_new = z + Σ φ(k_j) over the chunk — the grader carries it to the next chunk and "
                              "checks the last one.")
    drive = lambda **kw: _scan_drive(lambda *a: _chunk_ref(*a, **kw), case)  # noqa: E731
    return diagnose({"out": got["out"]}, [(hint, {"out": drive(**kw)["out"]}) for hint, kw in [
        ("the normaliser is missing: divide by φ(q_i)·z + Σ_{j<=i in the chunk} φ(q_i)·φ(k_j) + eps.",
         dict(normalise=False)),
        ("eps is missing: where every φ(q_i)·φ(k_j) is 0 the normaliser is 0 and the output 0/0 — add eps = 1e-6 "
         "once, to the whole denominator.", dict(eps=0.0)),
        ("eps is added twice (once per part?): add eps = 1e-6 once, to the sum of the inter- and intra-chunk "
         "denominators.", dict(eps=2e-6)),
        ("not causal inside the chunk: query i may see keys j <= i of its own chunk only (tril of the C × C block).",
         dict(intra="full")),
        ("the diagonal is excluded inside the chunk: query i sees key i too (tril, not tril(−1)).", dict(intra="strict")),
        ("the state is updated BEFORE the chunk's intra part, so the chunk's keys are counted twice: read S and z, "
         "add the intra-chunk part, and only then fold the chunk into S and z.", dict(state="before")),
        ("the state must accumulate (S_new = S + φ(K_c)ᵀV_c), not hold the last chunk only.", dict(accumulate=False)),
    ]], "the step must read the earlier tokens from the S, z it is given (they may hold tokens the grader saw "
        "elsewhere): out_i = (φ(q_i)S + Σ_{j<=i in chunk} (φ(q_i)·φ(k_j)) v_j) / (φ(q_i)·z + Σ_{j<=i in chunk} "
        "φ(q_i)·φ(k_j) + eps).")


EXERCISES = [
    Exercise("10_additive_score", 2, "Bahdanau's additive score by hand",
             "a function additive_scores(q, k, W_q, W_k, w_v) -> scores (Lq, Lk)",
             _add_cases, _add_answer, _add_expected, _add_judge, forbidden=FORBID_COURSE, kind="build"),
    Exercise("10_linear_by_hand", 3, "Linear attention with the associativity trick",
             "a function linear_attn(q, k, v) -> out",
             _lin_cases, _lin_answer, _lin_expected, _lin_judge, forbidden=FORBID_SDPA + FORBID_COURSE, kind="build"),
    Exercise("10_recurrent_step", 2, "One recurrent step of causal linear attention",
             "a function rnn_step(S, z, q, k, v) -> (out, S_new, z_new)",
             _step_cases, _step_answer, _step_expected, _step_judge, forbidden=FORBID_COURSE, kind="build"),
    Exercise("10_crossover", 2, "Where linear attention starts to pay off",
             "a function crossover(E, Ev) -> int", _cross_cases, _cross_answer, _cross_expected, _cross_judge,
             forbidden=FORBID_COURSE, kind="compute"),
    Exercise("10_find_the_bug", 3, "Find the bugs in causal linear attention",
             "a function causal_linear_attention(q, k, v) -> out",
             _bug_cases, _bug_answer, _bug_expected, _bug_judge, forbidden=FORBID_COURSE, kind="debug"),
    Exercise("10_chunked_scan", 3, "Causal linear attention as a chunked scan: the chunk step",
             "a function chunk_step(S, z, phi_q, phi_k, v) -> (out, S_new, z_new)",
             _scan_cases, _scan_drive, _scan_expected, _scan_judge, forbidden=FORBID_SDPA + FORBID_COURSE,
             kind="build"),
]
