"""Exercise set 06 — spatial and channel attention (solutions/06_spatial_and_channel_attention.ipynb).

References are computed here in float64 from the SE / CBAM equations, independently of the learner and of
the package. Hints are *detected*: each judge computes what the common mistakes (pooling axis, sigmoid vs
softmax, gate broadcasting, max-before-mean, unshared MLP...) produce on the same inputs and names the one
the learner's answer matches. Square cases (C == H == W) make the wrong-axis mistakes shape-compatible, so
they are caught by value and explained, not rejected by a shape check.
"""
from __future__ import annotations

import torch

from ..spec import Case, Exercise, FORBID_COURSE, Verdict, close, diagnose, randint, choice

__all__ = ["EXERCISES"]

_F64 = torch.float64


# ---- 06_spatial_pool: the 2-channel descriptor [mean_c; max_c] -------------------------------------------

def _pool_cases(gen):
    return [Case(f"x (B={B}, C={C}, H={H}, W={W})", {"x": torch.randn(B, C, H, W, generator=gen)})
            for B, C, H, W in [(2, 4, 4, 4), (1, 6, 6, 6), (2, 3, 5, 7)]]          # first two square: C == H == W


def _pool_answer(fn, case):
    return {"pooled": fn(case.inputs["x"])}


def _pool_ref(x, dim=1, order=("mean", "max")):
    x = x.to(_F64)
    maps = {"mean": x.mean(dim=dim), "max": x.amax(dim=dim)}
    return torch.stack([maps[k] for k in order], dim=1).float()


def _pool_expected(case):
    return {"pooled": _pool_ref(case.inputs["x"])}


def _pool_judge(got, want, case):
    if close(got["pooled"], want["pooled"]):
        return Verdict(True)
    x = case.inputs["x"]
    return diagnose(got["pooled"], [
        ("max comes before mean in your stack: that is the official code's ChannelPool; the paper (and this "
         "course) stacks [AvgPool; MaxPool], mean first.", _pool_ref(x, order=("max", "mean"))),
        ("you pooled over H (dim=2): the spatial gate pools over the CHANNELS (dim=1), keeping one value per "
         "position.", _pool_ref(x, dim=2)),
        ("you pooled over W (dim=3): the spatial gate pools over the CHANNELS (dim=1).", _pool_ref(x, dim=3)),
        ("both maps are the mean (or both the max): one must be mean_c, the other max_c.",
         _pool_ref(x, order=("mean", "mean"))),
        ("both maps are the max: the first must be the channel mean.", _pool_ref(x, order=("max", "max"))),
    ], "wrong values: pooled[:, 0] must be x.mean(dim=1) and pooled[:, 1] x.amax(dim=1).")


# ---- 06_channel_gate: CBAM's M_c from the shared MLP's weights -------------------------------------------

def _gate_cases(gen):
    out = []
    for B, C, r, H, W in [(2, 8, 2, 5, 5), (3, 6, 3, 4, 7), (1, 16, 4, 3, 3)]:
        h = C // r
        out.append(Case(f"x (B={B}, C={C}, H={H}, W={W}), hidden={h}", {
            "x": torch.randn(B, C, H, W, generator=gen),
            "W0": torch.randn(h, C, generator=gen) / C ** 0.5, "b0": torch.randn(h, generator=gen) * 0.1,
            "W1": torch.randn(C, h, generator=gen) / h ** 0.5, "b1": torch.randn(C, generator=gen) * 0.1}))
    return out


def _gate_answer(fn, case):
    i = case.inputs
    return {"M_c": fn(i["x"], i["W0"], i["b0"], i["W1"], i["b1"])}


def _gate_parts(case):
    i = {k: v.to(_F64) for k, v in case.inputs.items()}
    mlp = lambda f: torch.relu(f @ i["W0"].T + i["b0"]) @ i["W1"].T + i["b1"]          # noqa: E731
    return mlp(i["x"].mean(dim=(2, 3))), mlp(i["x"].amax(dim=(2, 3)))                # (B, C) each


def _gate_expected(case):
    a, m = _gate_parts(case)
    return {"M_c": torch.sigmoid(a + m)[:, :, None, None].float()}                      # Eq. (2) of CBAM


def _gate_judge(got, want, case):
    if close(got["M_c"], want["M_c"]):
        return Verdict(True)
    a, m = _gate_parts(case)
    g = lambda t: t[:, :, None, None].float()                                            # noqa: E731
    return diagnose(got["M_c"], [
        ("you used a softmax over the channels: CBAM's gates are independent sigmoids (they need not sum to 1).",
         g(torch.softmax(a + m, dim=1))),
        ("the sigmoid is applied to each branch and then summed: add the two MLP outputs FIRST, then one sigmoid.",
         g(torch.sigmoid(a) + torch.sigmoid(m))),
        ("only the average-pooled branch is used (that is SE): CBAM adds the max-pooled descriptor through the "
         "SAME MLP.", g(torch.sigmoid(a))),
        ("only the max-pooled branch is used: CBAM sums MLP(AvgPool) and MLP(MaxPool).", g(torch.sigmoid(m))),
        ("the two branches are averaged: Eq. (2) ADDS them before the sigmoid.", g(torch.sigmoid((a + m) / 2))),
    ], "wrong values: M_c = sigmoid(MLP(mean over H, W) + MLP(max over H, W)), MLP(f) = W1 relu(W0 f + b0) + b1.")


# ---- 06_apply_gate: broadcasting a (B, C) gate onto (B, C, H, W) -----------------------------------------

def _apply_cases(gen):
    return [Case(f"x (B={B}, C={C}, H={H}, W={W}), s (B={B}, C={C})",
                 {"x": torch.randn(B, C, H, W, generator=gen), "s": torch.rand(B, C, generator=gen)})
            for B, C, H, W in [(4, 4, 4, 4), (2, 3, 2, 3), (2, 5, 3, 4)]]   # first two: wrong axes broadcast silently


def _apply_answer(fn, case):
    return {"y": fn(case.inputs["x"], case.inputs["s"])}


def _apply_expected(case):
    x, s = case.inputs["x"].to(_F64), case.inputs["s"].to(_F64)
    return {"y": torch.einsum("bchw,bc->bchw", x, s).float()}


def _apply_judge(got, want, case):
    if close(got["y"], want["y"]):
        return Verdict(True)
    x, s = case.inputs["x"].to(_F64), case.inputs["s"].to(_F64)
    cands = [
        ("x * s lines the (B, C) gate up with the LAST two axes (H, W): reshape it to (B, C, 1, 1) first, "
         "e.g. s[:, :, None, None].", lambda: x * s),
        ("s[:, None, None, :] scales along the width axis W: the gate belongs on axes 0 and 1, (B, C, 1, 1).",
         lambda: x * s[:, None, None, :]),
        ("s.unsqueeze(-1) is (B, C, 1), which broadcasts against (C, H, W): it needs TWO trailing axes, "
         "(B, C, 1, 1).", lambda: x * s.unsqueeze(-1)),
        ("the gate of sample 0 was applied to every sample: use s[b] for sample b.",
         lambda: x * s[0][None, :, None, None]),
    ]
    out = []
    for hint, fn in cands:
        try:
            out.append((hint, fn().float()))
        except RuntimeError:                                   # that mistake cannot broadcast for this case
            pass
    return diagnose(got["y"], out, "wrong values: y[b, c] must be s[b, c] * x[b, c] for every position.")


# ---- 06_cbam_forward: assemble CBAM from its weights, graded against attn_course.CBAM ---------------------

def _cbam_cases(gen):
    """Non-square maps with C != H, and one square C == H == W (a wrong-axis pooling keeps its shape there)."""
    out = []
    sizes = [(2, randint(gen, 6, 10), randint(gen, 5, 7), randint(gen, 8, 11), 2, 7),
             (1, 2 * randint(gen, 5, 8), randint(gen, 3, 5), randint(gen, 6, 9), 4, choice(gen, (3, 5))),
             (2, 6, 6, 6, 3, 7)]
    for B, C, H, W, r, k in sizes:
        h = max(1, C // r)
        out.append(Case(f"x (B={B}, C={C}, H={H}, W={W}), hidden={h}, kernel {k}x{k}", {
            "x": torch.randn(B, C, H, W, generator=gen),
            "W0": torch.randn(h, C, generator=gen) / C ** 0.5, "b0": torch.randn(h, generator=gen) * 0.1,
            "W1": torch.randn(C, h, generator=gen) / h ** 0.5, "b1": torch.randn(C, generator=gen) * 0.1,
            "conv_w": torch.randn(1, 2, k, k, generator=gen) / k}, params={"reduction": r}))
    return out


def _cbam_answer(fn, case):
    i = case.inputs
    y, M_c, M_s = fn(i["x"], i["W0"], i["b0"], i["W1"], i["b1"], i["conv_w"])
    return {"y": y, "M_c": M_c, "M_s": M_s}


def _cbam_variant(case, *, order="channel_first", pool=("mean", "max"), gate="sigmoid", channel="shared"):
    """CBAM's forward in float64 by the equations, with switches for the classic mistakes; with none switched on,
    the reference (the tests check it against ``attn_course.CBAM``; this module never imports it)."""
    i = {k: v.to(_F64) for k, v in case.inputs.items()}
    x, k = i["x"], i["conv_w"].shape[-1]
    mlp = lambda f: torch.relu(f @ i["W0"].T + i["b0"]) @ i["W1"].T + i["b1"]                # noqa: E731

    def channel_gate(f):
        a, m = mlp(f.mean(dim=(2, 3))), mlp(f.amax(dim=(2, 3)))
        z = {"shared": a + m, "avg_only": a}[channel]
        g = torch.softmax(z, dim=1) if gate == "softmax" else torch.sigmoid(z)
        return g[:, :, None, None]

    def spatial_gate(f):
        maps = {"mean": f.mean(dim=1, keepdim=True), "max": f.amax(dim=1, keepdim=True),
                "sum": f.sum(dim=1, keepdim=True)}
        if pool == "blog":                                       # one summed map, fed to both conv inputs
            d = maps["mean"] + maps["max"]
            d = torch.cat([d, d], 1)
        else:
            d = torch.cat([maps[p] for p in pool], 1)
        z = torch.nn.functional.conv2d(d, i["conv_w"], padding=k // 2)
        if gate == "softmax":
            return z.flatten(1).softmax(-1).view_as(z)
        return torch.sigmoid(z)

    if order == "channel_first":
        M_c = channel_gate(x); x1 = x * M_c
        M_s = spatial_gate(x1); y = x1 * M_s
    elif order == "spatial_first":
        M_s = spatial_gate(x); x1 = x * M_s
        M_c = channel_gate(x1); y = x1 * M_c
    else:                                                        # both gates from F, applied together
        M_c, M_s = channel_gate(x), spatial_gate(x)
        y = x * M_c * M_s
    return {"y": y.float(), "M_c": M_c.float(), "M_s": M_s.float()}


def _cbam_judge(got, want, case):
    if all(close(got[key], want[key]) for key in want):
        return Verdict(True)

    def v(**kw):
        try:
            return _cbam_variant(case, **kw)
        except RuntimeError:                                     # that mistake cannot run on this case's shapes
            return None
    return diagnose(got, [
        ("the spatial gate came first: CBAM gates the channels FIRST (F' = M_c(F) ⊗ F) and computes M_s from "
         "the channel-gated F' (F'' = M_s(F') ⊗ F').", v(order="spatial_first")),
        ("both gates were computed from F and applied together: M_s must be computed from F' = M_c(F) ⊗ F, the "
         "channel-gated map.", v(order="parallel")),
        ("the spatial descriptor stacks max before mean: the paper (and attn_course.CBAM) stacks "
         "[AvgPool; MaxPool] over the channels, mean first.", v(pool=("max", "mean"))),
        ("the spatial descriptor uses a SUM over the channels where the paper takes the mean: "
         "[mean_c; max_c].", v(pool=("sum", "max"))),
        ("the spatial descriptor is the blog's MaxPool + AvgPool, one summed map: CBAM stacks the two maps as "
         "TWO channels, [mean_c; max_c], and the conv weighs them separately.", v(pool="blog")),
        ("a softmax where CBAM uses sigmoids: the gates are independent values in (0, 1) (they need not sum "
         "to 1, over channels or positions).", v(gate="softmax")),
        ("the channel gate uses only the average-pooled descriptor (that is SE): the max-pooled one goes "
         "through the SAME, shared MLP and the two outputs are added before the sigmoid.", v(channel="avg_only")),
    ], "wrong values: y = M_s(F') ⊗ F' with F' = M_c(F) ⊗ F, M_c = σ(MLP(avg_hw F) + MLP(max_hw F)), "
       "M_s = σ(conv_k×k([mean_c F'; max_c F'])) with padding k // 2.")


def _cbam_error_hint(case, error):
    """A conv that received other than 2 input channels: the descriptor was pooled over the wrong axis."""
    if "to have 2 channels" in error:
        return ("the spatial gate's conv reads 2 maps, [mean_c; max_c]: pool over the CHANNELS (dim=1, "
                "keepdim=True) and concatenate along dim 1.")
    return None


# ---- 06_cbam_params: a number to compute ------------------------------------------------------------------

def _params_cases(gen):
    out = []
    for C, r, k in [(16 * randint(gen, 2, 8), choice(gen, (8, 16)), 7), (8 * randint(gen, 2, 8), choice(gen, (4, 8)), 3),
                    (randint(gen, 5, 40), randint(gen, 2, 6), choice(gen, (3, 5, 7)))]:
        out.append(Case(f"CBAM(channels={C}, reduction={r}, kernel_size={k})", params={"C": C, "r": r, "k": k}))
    return out


def _params_answer(fn, case):
    p = case.params
    return {"n": torch.tensor(int(fn(p["C"], p["r"], p["k"])), dtype=torch.int64)}


def _params_parts(case):
    C, r, k = case.params["C"], case.params["r"], case.params["k"]
    h = max(1, C // r)
    return C, h, k


def _params_expected(case):
    C, h, k = _params_parts(case)
    return {"n": torch.tensor((C * h + h) + (h * C + C) + 2 * k * k, dtype=torch.int64)}


def _params_judge(got, want, case):
    if torch.equal(got["n"], want["n"]):
        return Verdict(True)
    C, h, k = _params_parts(case)
    n = int(got["n"])
    mistakes = {
        C * h * 2 + 2 * k * k: "you left out the two Linear biases (h + C parameters).",
        2 * ((C * h + h) + (h * C + C)) + 2 * k * k: "you counted two MLPs: CBAM SHARES one MLP between the "
                                                   "average- and the max-pooled descriptors.",
        (C * h + h) + (h * C + C) + 2 * k * k + 1: "the spatial conv has no bias (bias=False).",
        (C * h + h) + (h * C + C) + k * k: "the spatial conv has TWO input channels ([mean_c; max_c]): 2·k·k weights.",
        (C * h + h) + (h * C + C) + 2 * k * k * C: "the spatial conv reads the 2 pooled maps, not the C channels.",
        (C * h + h) + (h * C + C): "you forgot the spatial gate's conv (2·k·k weights).",
    }
    return Verdict(False, mistakes.get(n, "count fc1 (C·h + h), fc2 (h·C + C) and the 2→1 k×k conv "
                                          "without bias; hidden h = max(1, C // r)."))


EXERCISES = [
    Exercise("06_spatial_pool", 2, "The spatial gate's descriptor",
             "a function spatial_pool(x: (B, C, H, W)) -> (B, 2, H, W), [mean over C; max over C]",
             _pool_cases, _pool_answer, _pool_expected, _pool_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("06_channel_gate", 3, "CBAM's channel gate from its weights",
             "a function channel_gate(x, W0, b0, W1, b1) -> M_c (B, C, 1, 1)",
             _gate_cases, _gate_answer, _gate_expected, _gate_judge, forbidden=FORBID_COURSE, kind="build"),
    Exercise("06_apply_gate", 1, "Broadcast a channel gate",
             "a function apply_gate(x: (B, C, H, W), s: (B, C)) -> (B, C, H, W)",
             _apply_cases, _apply_answer, _apply_expected, _apply_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("06_cbam_params", 2, "Count CBAM's parameters",
             "a function cbam_params(channels, reduction, kernel_size) -> int",
             _params_cases, _params_answer, _params_expected, _params_judge, forbidden=FORBID_COURSE, kind="compute"),
    Exercise("06_cbam_forward", 4, "Assemble CBAM from its weights",
             "a function cbam_forward(x, W0, b0, W1, b1, conv_w) -> (y (B, C, H, W), M_c (B, C, 1, 1), M_s (B, 1, H, W))",
             _cbam_cases, _cbam_answer, _cbam_variant, _cbam_judge, forbidden=FORBID_COURSE,
             error_hint_fn=_cbam_error_hint, kind="build"),
]
