"""Exercise set 06: the reference solutions pass every case; each common mistake fails with ITS hint."""
from functools import partial

import pytest
import torch

import exercise_kit
from attn_course.grading.exercises import get
from exercise_kit import results

# some cases cannot tell two mistakes apart, so a mistake need only be named on the cases that can
assert_hint = partial(exercise_kit.assert_hint, every=False)


# ---- reference solutions --------------------------------------------------------------------------------
def spatial_pool(x):
    return torch.cat([x.mean(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)], dim=1)


def channel_gate(x, W0, b0, W1, b1):
    mlp = lambda f: torch.relu(f @ W0.T + b0) @ W1.T + b1  # noqa: E731
    return torch.sigmoid(mlp(x.mean(dim=(2, 3))) + mlp(x.amax(dim=(2, 3))))[:, :, None, None]


def apply_gate(x, s):
    return x * s[:, :, None, None]


def cbam_params(channels, reduction, kernel_size):
    h = max(1, channels // reduction)
    return (channels * h + h) + (h * channels + channels) + 2 * kernel_size * kernel_size


@pytest.mark.parametrize("ex_id,obj", [("06_spatial_pool", spatial_pool), ("06_channel_gate", channel_gate),
                                       ("06_apply_gate", apply_gate), ("06_cbam_params", cbam_params)])
def test_reference_passes_every_case(ex_id, obj):
    res = results(ex_id, obj)
    assert len(res) >= 3 and all(ok for ok, _ in res), res


# ---- common mistakes, each with its detected hint -------------------------------------------------------
@pytest.mark.parametrize("fn,fragment", [
    (lambda x: torch.cat([x.amax(1, keepdim=True), x.mean(1, keepdim=True)], 1), "official code's ChannelPool"),
    (lambda x: torch.stack([x.mean(2), x.amax(2)], 1), "you pooled over H"),
    (lambda x: torch.stack([x.mean(3), x.amax(3)], 1), "you pooled over W"),
    (lambda x: torch.cat([x.mean(1, keepdim=True)] * 2, 1), "both maps are the mean"),
    (lambda x: torch.cat([x.amax(1, keepdim=True)] * 2, 1), "both maps are the max"),
    (lambda x: x.mean(1, keepdim=True) + x.amax(1, keepdim=True), "expected shape"),   # seed 000: a sum, 1 channel
])
def test_spatial_pool_mistakes(fn, fragment):
    assert_hint("06_spatial_pool", fn, fragment)


def _gate_mistake(kind):
    def fn(x, W0, b0, W1, b1):
        mlp = lambda f: torch.relu(f @ W0.T + b0) @ W1.T + b1  # noqa: E731
        a, m = mlp(x.mean(dim=(2, 3))), mlp(x.amax(dim=(2, 3)))
        g = {"softmax": torch.softmax(a + m, dim=1), "sig_sum": torch.sigmoid(a) + torch.sigmoid(m),
             "avg_only": torch.sigmoid(a), "max_only": torch.sigmoid(m), "mean": torch.sigmoid((a + m) / 2)}[kind]
        return g[:, :, None, None]
    return fn


@pytest.mark.parametrize("kind,fragment", [("softmax", "softmax over the channels"),
                                           ("sig_sum", "add the two MLP outputs FIRST"),
                                           ("avg_only", "that is SE"), ("max_only", "only the max-pooled"),
                                           ("mean", "ADDS them")])
def test_channel_gate_mistakes(kind, fragment):
    assert_hint("06_channel_gate", _gate_mistake(kind), fragment)


@pytest.mark.parametrize("fn,fragment", [
    (lambda x, s: x * s, "LAST two axes"),
    (lambda x, s: x * s[:, None, None, :], "width axis"),
    (lambda x, s: x * s.unsqueeze(-1), "TWO trailing axes"),
    (lambda x, s: x * s[0][None, :, None, None], "sample 0"),
])
def test_apply_gate_mistakes(fn, fragment):
    assert_hint("06_apply_gate", fn, fragment)


@pytest.mark.parametrize("fn,fragment", [
    (lambda C, r, k: 2 * C * max(1, C // r) + 2 * k * k, "biases"),
    (lambda C, r, k: 2 * (cbam_params(C, r, k) - 2 * k * k) + 2 * k * k, "SHARES one MLP"),
    (lambda C, r, k: cbam_params(C, r, k) + 1, "no bias"),
    (lambda C, r, k: cbam_params(C, r, k) - k * k, "TWO input channels"),
    (lambda C, r, k: cbam_params(C, r, k) - 2 * k * k, "forgot the spatial gate"),
    (lambda C, r, k: cbam_params(C, r, k) - 2 * k * k + 2 * k * k * C, "not the C channels"),
])
def test_cbam_params_mistakes(fn, fragment):
    assert_hint("06_cbam_params", fn, fragment)


def test_course_module_agrees_with_the_parameter_count():
    from attn_course import CBAM
    for C, r, k in [(64, 16, 7), (32, 8, 3), (10, 4, 7)]:
        assert sum(p.numel() for p in CBAM(C, r, k).parameters()) == cbam_params(C, r, k)


# ---- 06_cbam_forward: the reference equals attn_course.CBAM; each classic mistake is named ----------------
def cbam_forward(x, W0, b0, W1, b1, conv_w, *, order="channel_first", pool="mean_max", gate="sigmoid",
                 channel="shared", pool_dim=1):
    mlp = lambda f: torch.relu(f @ W0.T + b0) @ W1.T + b1  # noqa: E731

    def channel_gate(f):
        z = mlp(f.mean(dim=(2, 3))) + (mlp(f.amax(dim=(2, 3))) if channel == "shared" else 0)
        return (torch.softmax(z, 1) if gate == "softmax" else torch.sigmoid(z))[:, :, None, None]

    def spatial_gate(f):
        avg, mx = f.mean(pool_dim, keepdim=True), f.amax(pool_dim, keepdim=True)
        d = {"mean_max": [avg, mx], "max_mean": [mx, avg], "sum_max": [f.sum(1, keepdim=True), mx],
             "blog": [avg + mx, avg + mx]}[pool]
        z = torch.nn.functional.conv2d(torch.cat(d, 1), conv_w, padding=conv_w.shape[-1] // 2)
        return z.flatten(1).softmax(-1).view_as(z) if gate == "softmax" else torch.sigmoid(z)

    if order == "channel_first":
        M_c = channel_gate(x)
        M_s = spatial_gate(x * M_c)
        return x * M_c * M_s, M_c, M_s
    if order == "spatial_first":
        M_s = spatial_gate(x)
        M_c = channel_gate(x * M_s)
        return x * M_s * M_c, M_c, M_s
    M_c, M_s = channel_gate(x), spatial_gate(x)
    return x * M_c * M_s, M_c, M_s


def test_cbam_forward_reference_passes_and_equals_the_module():
    exercise_kit.assert_all_pass("06_cbam_forward", cbam_forward)
    from attn_course import CBAM
    torch.manual_seed(0)
    m = CBAM(10, 2, 5)
    x = torch.randn(2, 10, 4, 9)
    y, (M_c, M_s) = m(x)
    got = cbam_forward(x, m.channel.fc1.weight, m.channel.fc1.bias, m.channel.fc2.weight, m.channel.fc2.bias,
                       m.spatial.conv.weight)
    for a, b in zip(got, (y, M_c, M_s)):
        torch.testing.assert_close(a, b)
    ex = get("06_cbam_forward")                         # the grader's reference (equations) equals the module
    for case in ex.cases(torch.Generator().manual_seed(5)):
        i = case.inputs
        m = CBAM(i["x"].shape[1], case.params["reduction"], i["conv_w"].shape[-1])
        m.load_state_dict({"channel.fc1.weight": i["W0"], "channel.fc1.bias": i["b0"], "channel.fc2.weight": i["W1"],
                           "channel.fc2.bias": i["b1"], "spatial.conv.weight": i["conv_w"]})
        with torch.no_grad():
            y, (M_c, M_s) = m(i["x"])
        want = ex.expected(case)
        for key, b in zip(("y", "M_c", "M_s"), (y, M_c, M_s)):
            torch.testing.assert_close(want[key], b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kw,fragment", [
    ({"order": "spatial_first"}, "spatial gate came first"), ({"order": "parallel"}, "computed from F'"),
    ({"pool": "max_mean"}, "max before mean"), ({"pool": "sum_max"}, "uses a SUM"), ({"pool": "blog"}, "blog's"),
    ({"gate": "softmax"}, "a softmax where CBAM uses sigmoids"), ({"channel": "avg_only"}, "that is SE"),
    ({"pool_dim": 2}, "pool over the CHANNELS"),
])
def test_cbam_forward_mistakes(kw, fragment):
    assert_hint("06_cbam_forward", partial(cbam_forward, **kw), fragment)
