"""Lesson 06 §7's ablation, seed control beyond the notebook's: the notebook compares channel-first CBAM with the
spatial-first variant on seeds 0, 1 and 2; here seeds 3, 4 and 5 (initial weights and data stream), at the
notebook's budget, must go the same way with the notebook's margins: channel first more than 5 points more
accurate, and its spatial gate on the target more than 0.1 brighter."""
import pytest
import torch

from attn_course import CBAM
from attn_course.demos import vision as demo


class SpatialFirstCBAM(CBAM):
    def forward(self, x):
        x, M_s = self.spatial(x)
        x, M_c = self.channel(x)
        return x, (M_c, M_s)


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_channel_first_beats_spatial_first_on_other_seeds(seed):
    x_test, y_test, target, clutter = demo.make_batch(torch.Generator().manual_seed(123), 1000, masks=True)
    channel_first = demo.train_target_finder(attention=True, steps=150, seed=seed, progress=False)
    torch.manual_seed(seed)
    m = demo.TargetFinder(attention=True)                       # the same initial weights as channel_first
    arranged = SpatialFirstCBAM(len(demo.CHANNEL_NAMES), 2, 7)
    arranged.load_state_dict(m.cbam.state_dict())
    m.cbam = arranged
    spatial_first = demo.train_target_finder(model=m, steps=150, seed=seed, progress=False)
    acc = [demo.accuracy(x, x_test, y_test) for x in (channel_first, spatial_first)]
    gate = [demo.gate_means(x, x_test, target, clutter)["target"] for x in (channel_first, spatial_first)]
    assert acc[0] > 0.95 and acc[0] > acc[1] + 0.05, acc
    assert gate[0] > gate[1] + 0.1, gate
