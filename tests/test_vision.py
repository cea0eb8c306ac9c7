"""SE / CBAM gates against their equations computed directly in float64 (Hu et al. 2018; Woo et al. 2018)."""
import matplotlib
import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import attn_course
from attn_course import CBAM, ChannelAttention, SpatialAttention, SqueezeExcitation


def _x(b=2, c=12, h=5, w=7, dtype=torch.float64):
    return torch.randn(b, c, h, w, dtype=dtype)


def _mlp_ref(f, fc1, fc2):
    """W_1 δ(W_0 f + b_0) + b_1, written as explicit matrix products."""
    hid = torch.clamp(f @ fc1.weight.T + fc1.bias, min=0)
    return hid @ fc2.weight.T + fc2.bias


def _spatial_ref(x, weight):
    """σ(conv([mean_c; max_c])) with the convolution as an explicit loop over kernel offsets."""
    B, C, H, W = x.shape
    k = weight.shape[-1]
    p = k // 2
    d = torch.stack([x.mean(1), x.max(1).values], dim=1)          # (B, 2, H, W)  mean first (paper)
    d = torch.nn.functional.pad(d, (p, p, p, p))
    s = torch.zeros(B, H, W, dtype=x.dtype)
    for ch in range(2):
        for u in range(k):
            for v in range(k):
                s = s + weight[0, ch, u, v] * d[:, ch, u:u + H, v:v + W]
    return torch.sigmoid(s)[:, None]


def test_top_level_names():
    assert attn_course.CBAM is CBAM and attn_course.SqueezeExcitation is SqueezeExcitation


@pytest.mark.parametrize("shape", [(2, 12, 5, 7), (1, 4, 1, 1), (3, 16, 8, 8)])
def test_squeeze_excitation_equals_formula(shape):
    x = _x(*shape)
    se = SqueezeExcitation(shape[1], reduction=4).double()
    y, s = se(x)
    z = x.sum(dim=(2, 3)) / (shape[2] * shape[3])                   # Eq. (2)
    s_ref = torch.sigmoid(_mlp_ref(z, se.fc1, se.fc2))              # Eq. (3)
    assert s.shape == (shape[0], shape[1], 1, 1)
    assert_close(s[:, :, 0, 0], s_ref)
    assert_close(y, x * s_ref[:, :, None, None])                    # Eq. (4)
    assert ((s > 0) & (s < 1)).all()


@pytest.mark.parametrize("shape", [(2, 12, 5, 7), (1, 4, 3, 2)])
def test_channel_attention_equals_formula(shape):
    x = _x(*shape)
    ca = ChannelAttention(shape[1], reduction=2).double()
    y, m = ca(x)
    f_avg = x.flatten(2).mean(-1)
    f_max = x.flatten(2).max(-1).values
    m_ref = torch.sigmoid(_mlp_ref(f_avg, ca.fc1, ca.fc2) + _mlp_ref(f_max, ca.fc1, ca.fc2))
    assert m.shape == (shape[0], shape[1], 1, 1)
    assert_close(m[:, :, 0, 0], m_ref)
    assert_close(y, x * m_ref[:, :, None, None])


def test_channel_attention_uses_max_pool_unlike_se():
    """Same weights, an input whose per-channel means are equal but maxima differ: SE cannot tell them apart."""
    se, ca = SqueezeExcitation(4, 2).double(), ChannelAttention(4, 2).double()
    ca.load_state_dict(se.state_dict())
    a = torch.zeros(1, 4, 4, 4, dtype=torch.float64)
    b = a.clone()
    b[0, :, 0, 0], b[0, :, 0, 1] = 3.0, -3.0                        # same mean, larger max
    assert_close(se(a)[1], se(b)[1])
    assert not torch.allclose(ca(a)[1], ca(b)[1])


@pytest.mark.parametrize("k", [3, 7, 1, 5])
@pytest.mark.parametrize("shape", [(2, 6, 9, 11), (1, 3, 4, 4)])
def test_spatial_attention_equals_formula(k, shape):
    x = _x(*shape)
    sa = SpatialAttention(k).double()
    y, m = sa(x)
    m_ref = _spatial_ref(x, sa.conv.weight)
    assert sa.conv.bias is None and sa.conv.weight.shape == (1, 2, k, k)
    assert m.shape == (shape[0], 1, shape[2], shape[3])
    assert_close(m, m_ref)
    assert_close(y, x * m_ref)


def test_spatial_attention_order_is_mean_then_max():
    """Paper order [AvgPool; MaxPool]: a kernel that only reads input channel 0 must see the channel mean."""
    sa = SpatialAttention(1).double()
    with torch.no_grad():
        sa.conv.weight.zero_()
        sa.conv.weight[0, 0] = 1.0
    x = _x(1, 5, 3, 3)
    assert_close(sa(x)[1], torch.sigmoid(x.mean(1, keepdim=True)))


@pytest.mark.parametrize("k", [2, 4, 8])
def test_even_kernel_size_raises(k):
    with pytest.raises(ValueError, match=f"kernel_size={k} must be odd"):
        SpatialAttention(k)
    with pytest.raises(ValueError, match=f"kernel_size={k} must be odd"):
        CBAM(8, 2, kernel_size=k)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_kernel_size_or_reduction_raises(bad):
    with pytest.raises(ValueError, match="kernel_size must be a positive integer"):
        SpatialAttention(bad)
    with pytest.raises(ValueError, match="reduction must be a positive integer"):
        ChannelAttention(8, bad)
    with pytest.raises(ValueError, match="channels must be a positive integer"):
        SqueezeExcitation(bad, 2)


@pytest.mark.parametrize("cls", [SqueezeExcitation, ChannelAttention])
@pytest.mark.parametrize("channels,reduction,hidden", [(16, 4, 4), (10, 4, 2), (12, 5, 2), (3, 16, 1), (1, 1, 1)])
def test_hidden_width_is_floor_but_at_least_one(cls, channels, reduction, hidden):
    m = cls(channels, reduction)
    assert m.hidden == hidden
    assert m.fc1.weight.shape == (hidden, channels) and m.fc2.weight.shape == (channels, hidden)
    assert m(torch.randn(2, channels, 3, 3))[0].shape == (2, channels, 3, 3)


@pytest.mark.parametrize("cls", [SqueezeExcitation, ChannelAttention])
def test_wrong_channels_or_rank_raises(cls):
    m = cls(8, 2)
    with pytest.raises(ValueError, match=r"x has 6 channels .*channels=8"):
        m(torch.randn(2, 6, 4, 4))
    with pytest.raises(ValueError, match=r"x must have 4 dimensions, got shape \(2, 8, 4\)"):
        m(torch.randn(2, 8, 4))
    with pytest.raises(ValueError, match=r"x must have 4 dimensions"):
        SpatialAttention()(torch.randn(8, 4, 4))
    with pytest.raises(ValueError, match=r"x has 6 channels"):
        CBAM(8, 2)(torch.randn(1, 6, 4, 4))


@pytest.mark.parametrize("k", [3, 7])
def test_cbam_is_channel_then_spatial(k):
    x = _x(2, 8, 6, 5)
    cbam = CBAM(8, reduction=2, kernel_size=k).double()
    y, (m_c, m_s) = cbam(x)
    f_avg, f_max = x.mean(dim=(2, 3)), x.amax(dim=(2, 3))
    mlp = lambda f: _mlp_ref(f, cbam.channel.fc1, cbam.channel.fc2)  # noqa: E731
    m_c_ref = torch.sigmoid(mlp(f_avg) + mlp(f_max))[:, :, None, None]
    x1 = x * m_c_ref                                                  # F'
    m_s_ref = _spatial_ref(x1, cbam.spatial.conv.weight)              # from F', not from F
    assert_close(m_c, m_c_ref)
    assert_close(m_s, m_s_ref)
    assert_close(y, x1 * m_s_ref)                                     # F''
    assert m_c.shape == (2, 8, 1, 1) and m_s.shape == (2, 1, 6, 5)


def test_samples_are_independent():
    """Pooling is per sample: changing sample 1 never changes sample 0's gates."""
    cbam = CBAM(8, 2).double()
    x = _x(2, 8, 5, 5)
    x2 = x.clone()
    x2[1] = torch.randn_like(x2[1]) * 5
    (_, (c1, s1)), (_, (c2, s2)) = cbam(x), cbam(x2)
    assert_close(c1[0], c2[0])
    assert_close(s1[0], s2[0])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_matches_fp32(dtype):
    cbam = CBAM(8, 2)
    x = torch.randn(2, 8, 6, 6)
    y32, (c32, s32) = cbam(x)
    y, (c, s) = cbam.to(dtype)(x.to(dtype))
    assert y.dtype == c.dtype == s.dtype == dtype
    assert_close(c.float(), c32, atol=2e-2, rtol=2e-2)
    assert_close(s.float(), s32, atol=2e-2, rtol=2e-2)


def test_gradients_flow_to_every_parameter():
    cbam = CBAM(8, 2)
    y, _ = cbam(torch.randn(2, 8, 5, 5))
    y.square().sum().backward()
    for name, p in cbam.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


# --- figures -------------------------------------------------------------------------------------------
def test_overlay_and_channel_bars():
    from attn_course.viz import plot_channel_weights, plot_spatial_overlay
    img = torch.rand(3, 32, 40)
    ax = plot_spatial_overlay(img, torch.rand(1, 1, 8, 10), title="map")
    assert ax.get_title() == "map" and len(ax.images) == 2
    assert ax.images[1].get_array().shape == (32, 40)                # map upsampled to the image
    ax = plot_channel_weights(torch.rand(1, 5, 1, 1), labels=list("abcde"), highlight=2)
    assert len(ax.patches) == 5
    assert [t.get_text() for t in ax.get_xticklabels()] == list("abcde")
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 1            # gates live in (0, 1): full scale
    with pytest.raises(ValueError, match="labels has 2 entries but there are 5 channels"):
        plot_channel_weights(torch.rand(5), labels=["a", "b"])
    with pytest.raises(ValueError, match=r"attention map must have shape \(H, W\)"):
        plot_spatial_overlay(img, torch.rand(2, 8, 10))
    assert isinstance(ax.figure, matplotlib.figure.Figure)


# --- the synthetic task, the tiny CNN, the photo demo and the explorer ---------------------------------
from attn_course.demos import vision as demo  # noqa: E402


def _shape_counts(x):
    """Independent of the model: cut each image into 5×5 cells, read the 3×3 glyph inside each by brightness,
    and count the glyphs of each shape -> (B, 4)."""
    B, _, S, _ = x.shape
    cells = x.amax(1)[:, : S // 5 * 5, : S // 5 * 5].unfold(1, 5, 5).unfold(2, 5, 5)[..., 1:4, 1:4] > 0.5
    match = (cells.flatten(1, 2)[:, :, None] == demo.GLYPHS.bool()).flatten(-2).all(-1)   # (B, cells, 4)
    return match.sum(1)


def test_make_batch_has_one_blue_target_whose_glyph_is_the_label():
    g = torch.Generator().manual_seed(1)
    x, y, target, clutter = demo.make_batch(g, 16, masks=True)
    assert x.shape == (16, 3, 20, 20) and y.shape == (16,) and y.dtype == torch.int64
    assert (target.sum(dim=(1, 2)) == 9).all() and (clutter.sum(dim=(1, 2)) == 5 * 9).all()   # 3×3 boxes
    assert not (target & clutter).any()
    blue = (x[:, 2] > 0.5) & (x[:, 0] < 0.5) & (x[:, 1] < 0.5)     # pure-blue pixels: the target only
    assert (blue.sum(dim=(1, 2)) == 5).all() and not (blue & ~target).any()
    assert ((x.amax(1) > 0.5) & clutter).sum() == 16 * 5 * 5          # every clutter glyph has 5 lit pixels
    for i in range(16):
        r, c = target[i].nonzero().min(0).values.tolist()           # top-left corner of the target box
        assert torch.equal(x[i, 2, r:r + 3, c:c + 3] > 0.5, demo.GLYPHS[y[i]].bool())
    assert (_shape_counts(x).sum(1) == 6).all()
    x2, y2 = demo.make_batch(torch.Generator().manual_seed(1), 16)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    with pytest.raises(ValueError, match="size=10 holds 4 cells, too few for n_clutter=5"):
        demo.make_batch(g, 2, size=10)


def test_glyph_features_separate_colour_and_shape():
    """Hand-built image: the four glyphs, each in a known colour; shape channel s is 1 exactly on glyph s's box."""
    x = torch.zeros(1, 3, 10, 10)
    corners = [(1, 1), (1, 6), (6, 1), (6, 6)]
    for s, ((r, c), rgb) in enumerate(zip(corners, demo.COLOURS)):
        x[0, :, r:r + 3, c:c + 3] = demo.GLYPHS[s] * rgb[:, None, None]
    f = demo.glyph_features(x)
    assert f.shape == (1, 7, 10, 10) and len(demo.CHANNEL_NAMES) == 7
    R, G, B = x[0]
    assert_close(f[0, 0], 2 * x[0].amax(0) - 1)
    assert_close(f[0, 1], R - G)
    assert_close(f[0, 2], B - (R + G) / 2)
    for s, (r, c) in enumerate(corners):
        box = torch.zeros(10, 10)
        box[r:r + 3, c:c + 3] = 1
        assert_close(f[0, 3 + s], box)                              # colour-blind: same for every colour
    blue_yellow = f[0, 2][x[0].amax(0) > 0.5]
    assert blue_yellow.max() == 1 and (blue_yellow[blue_yellow < 1] < 0).all()   # only the blue glyph is positive


def test_front_end_pooling_equals_max_pool2d_exactly():
    """The front end's shifted-copy pooling gives F.max_pool2d(x, 3, stride=1, padding=1)'s values bit for bit,
    on signed maps of odd and even, square and non-square sizes, and batched under vmap as in fit_many."""
    g = torch.Generator().manual_seed(0)
    for shape in [(2, 4, 20, 20), (1, 3, 7, 5), (3, 1, 1, 1), (2, 2, 2, 9)]:
        x = torch.randn(shape, generator=g)
        assert torch.equal(demo._max_pool_3x3(x), F.max_pool2d(x, 3, stride=1, padding=1))
    x = torch.randn(3, 2, 4, 6, 6, generator=g)
    assert torch.equal(torch.vmap(demo._max_pool_3x3)(x),
                       torch.stack([F.max_pool2d(t, 3, stride=1, padding=1) for t in x]))


def test_flops_and_params_match_hand_count():
    S, C, K = 20, 7, 4
    plain = 2 * (9 * K * S * S) + 2 * (K * K)                                              # matched filters, linear
    gates = 2 * 2 * (C * (C // 2) + (C // 2) * C) + 2 * (2 * 49 * S * S)                  # 2 MLP passes, 7×7 conv
    assert demo.count_flops(demo.TargetFinder(False), (1, 3, S, S)) == plain
    assert demo.count_flops(demo.TargetFinder(True), (1, 3, S, S)) == plain + gates
    assert demo.count_params(demo.TargetFinder(False)) == K * K + K                        # the classifier only
    extra = (C * 3 + 3) + (3 * C + C) + 2 * 49                                             # fc1, fc2, spatial conv
    assert demo.count_params(demo.TargetFinder(True)) - demo.count_params(demo.TargetFinder(False)) == extra


def test_cbam_flops_are_a_small_fraction_of_a_3x3_conv():
    """Lesson 06 §8: on a ResNet-stage feature map CBAM costs well under 1 % of one 3×3 conv's FLOPs."""
    B, C, S, h = 2, 64, 28, 64 // 16
    conv = 2 * (C * C * 9) * S * S * B                                   # 3×3 conv C->C (bias not counted)
    cbam = 2 * B * 2 * (C * h + h * C) + 2 * (2 * 49) * S * S * B       # 2 MLP passes, 2->1 7×7 conv
    assert demo.count_flops(torch.nn.Conv2d(C, C, 3, padding=1), (B, C, S, S)) == conv
    assert demo.count_flops(CBAM(C), (B, C, S, S)) == cbam
    assert cbam / conv < 0.01


@pytest.fixture(scope="module")
def test_set():
    return demo.make_batch(torch.Generator().manual_seed(123), 500, masks=True)


def test_without_attention_the_cnn_cannot_beat_the_shape_histogram(test_set):
    """Without gates the pooled vector is the shape histogram; the best any classifier can do from it is to
    guess the most frequent shape (the target is a uniformly random one of the 6 glyphs). The head starts as
    that guess (the identity), and training does not take the plain model past it."""
    x, y, _, _ = test_set
    counts = _shape_counts(x).float()
    bayes = (counts.amax(1) / counts.sum(1)).mean().item()         # expected accuracy of the best guess
    with torch.no_grad():
        vote = demo.TargetFinder(attention=False)(x).argmax(-1)    # untrained
    assert (counts.gather(1, vote[:, None])[:, 0] == counts.amax(1)).all()   # a most frequent shape, always
    plain = demo.train_target_finder(False, progress=False)
    acc = demo.accuracy(plain, x, y)
    assert 0.3 < bayes < 0.55 and bayes - 0.15 < acc < bayes + 0.05


@pytest.mark.parametrize("seed", [0, 1])
def test_cbam_finds_the_blue_glyph(test_set, seed):
    x, y, target, clutter = test_set
    model = demo.train_target_finder(True, seed=seed, progress=False)
    assert demo.accuracy(model, x, y) > 0.95
    logits, (m_c, m_s) = model.forward_with_gates(x)
    assert logits.shape == (500, 4) and m_c.shape == (500, 7, 1, 1) and m_s.shape == (500, 1, 20, 20)
    g = demo.gate_means(model, x, target, clutter)
    assert_close(g["target"], m_s[:, 0][target].mean().item())
    assert g["target"] > 0.8 and g["clutter"] < 0.2 and g["background"] < 0.2    # spotlight on the target
    gate = dict(zip(demo.CHANNEL_NAMES, m_c.mean(0).flatten().tolist()))
    colour = ["light–dark", "red–green", "blue–yellow"]
    assert max(colour, key=gate.get) == "blue–yellow" and gate["blue–yellow"] > 0.95
    assert gate["red–green"] < 0.1                                  # useless for finding blue: closed


def test_photo_features_and_hand_set_cbam():
    img = demo.load_photo(size=48)
    assert img.shape[0] == 3 and max(img.shape[1:]) == 48 and 0 <= img.min() and img.max() <= 1
    f = demo.photo_features(img)
    assert f.shape == (1, len(demo.FEATURE_NAMES), *img.shape[1:])
    assert_close(f.mean(dim=(2, 3)), torch.zeros(1, f.shape[1]), atol=1e-5, rtol=0)
    _, (m_c, m_s) = demo.hand_set_cbam(0)(f)
    want = torch.full((7,), torch.sigmoid(torch.tensor(-4.0)).item())
    want[0] = torch.sigmoid(torch.tensor(4.0))
    assert_close(m_c.flatten(), want)
    red = f[0, 0].flatten()
    corr = torch.corrcoef(torch.stack([red, m_s.flatten()]))[0, 1]
    assert corr > 0.7                                              # the map follows the kept channel


def test_cbam_view_switches_and_explorer():
    from attn_course.widgets.vision import cbam_view, vision_explorer
    f = demo.photo_features(demo.load_photo(size=32))
    on = cbam_view(f, 2)
    off_c = cbam_view(f, 2, channel_gate=False)
    off_s = cbam_view(f, 2, spatial_gate=False)
    assert torch.equal(off_c["channel"], torch.ones(7)) and torch.equal(off_s["spatial"], torch.ones(f.shape[-2:]))
    assert_close(off_s["output"], f * on["channel"][None, :, None, None])
    assert not torch.allclose(on["spatial"], off_c["spatial"])   # the channel gate decides where CBAM looks
    with pytest.raises(ValueError, match="emphasise=9 is not a channel index for C=7"):
        cbam_view(f, 9)
    box = vision_explorer(demo.load_photo(size=32))
    before = box.children[-1].outputs[0]["data"]["image/png"]
    box.controls["emphasise"].value = 5                           # re-renders the figure
    assert box.children[-1].outputs[0]["data"]["image/png"] != before


def test_train_target_finder_trains_the_model_it_is_given():
    """``model=``: that very model is trained (same data stream as a fresh one); with its initial weights
    equal to a fresh model's, training gives the same parameters as ``train_target_finder()``."""
    torch.manual_seed(0)
    given = demo.TargetFinder(attention=True)
    before = {n: p.clone() for n, p in given.named_parameters()}
    trained = demo.train_target_finder(model=given, steps=5, progress=False)
    fresh = demo.train_target_finder(attention=True, steps=5, progress=False)
    assert trained is given
    assert any(not torch.equal(before[n], p) for n, p in trained.named_parameters())
    for (n, p), q in zip(trained.named_parameters(), fresh.parameters()):
        torch.testing.assert_close(p, q, msg=n)
