"""Lesson 10 demos and explorer: the four scorings learn reversal; recall separates softmax from linear attention."""
import pytest
import torch

from attn_course.demos.linear import RecallTask, ScoringAttention, train_recall, train_scoring, train_scorings
from attn_course.demos.reverse import ReversalTask, reversal_attention
from attn_course.widgets.linear import KINDS, ScoringExplorer, flops, largest_intermediate


@pytest.mark.parametrize("scoring", ["dot", "additive", "linear"])
def test_each_scoring_learns_the_anti_diagonal(scoring):
    model, res = train_scoring(scoring)
    w, _, _ = reversal_attention(model, ReversalTask(), "ABCDEFGH")
    assert res.accuracy >= 0.95
    assert torch.equal(w.argmax(-1), torch.arange(7, -1, -1))
    torch.testing.assert_close(w.sum(-1), torch.ones(8), atol=1e-4, rtol=0)


def test_scorings_trained_together_match_each_seed_alone():
    # lesson 10 trains each scoring's three seeds as one batch; seed i must end where it ends alone
    together = train_scorings("additive", seeds=(0, 1), steps=40)
    _, alone = train_scoring("additive", seed=1, steps=40)
    torch.testing.assert_close(together[1][1].losses, alone.losses, atol=1e-4, rtol=1e-4)
    assert together[1][1].accuracy == pytest.approx(alone.accuracy, abs=2e-3)


def test_scoring_validation():
    with pytest.raises(ValueError, match="scoring must be one of"):
        ScoringAttention(8, 4, scoring="cosine")


def test_recall_task():
    keys, values, target = RecallTask(num_pairs=5, num_keys=7).sample(torch.Generator().manual_seed(0), 32)
    assert keys.shape == (32, 6) and values.shape == (32, 5)
    for b in range(32):
        assert len(set(keys[b, :5].tolist())) == 5
        j = keys[b, :5].tolist().index(keys[b, 5].item())
        assert target[b] == values[b, j]
    with pytest.raises(ValueError, match="num_keys"):
        RecallTask(num_pairs=8, num_keys=4)


def test_recall_softmax_beats_linear_at_equal_size():
    m_soft, soft, _ = train_recall("softmax", qk_dim=8)
    _, lin, _ = train_recall("linear", qk_dim=8)
    assert soft >= 0.9 and soft - lin >= 0.2, (soft, lin)
    assert len(m_soft.losses) == 150 and sum(m_soft.losses[-50:]) < 0.2 * sum(m_soft.losses[:50])


def test_recall_linear_with_more_features_than_pairs_recalls():
    # lesson 10's control: the gap is the features' capacity (E = 8 < 16 pairs), not the training
    _, lin32, _ = train_recall("linear", qk_dim=32, seed=1)
    assert lin32 >= 0.9, lin32


def test_explorer_views_and_costs():
    ex = ScoringExplorer()
    for kind in KINDS:
        view = ex.update(kind, num_features=256, draw=False)
        assert view.weights.shape == (12, 12) and (view.weights >= 0).all()
        torch.testing.assert_close(view.weights.sum(-1), torch.ones(12, dtype=torch.float64), atol=1e-5, rtol=0)
    assert ex.update(KINDS[2], draw=False).anti_diagonal_mass > 0.9                 # the fitted additive scorer
    assert flops(KINDS[0], 1024, 64) == 2 * 1024 ** 2 * 128
    assert flops(KINDS[3], 1024, 64) == 4 * 1024 * 64 * 64 + 3 * 1024 * 64
    assert largest_intermediate(KINDS[2], 100, 16) == 100 * 100 * 16
    with pytest.raises(ValueError, match="kind must be one of"):
        ex.weights("nope")
    L, E = 256, 16                                                                   # additive: 4LEh + 4L²h + 2L²Ev
    assert flops(KINDS[2], L, E) == 4 * L * E * E + 3 * L * L * E + L * L * E + 2 * L * L * E
    box = ex.widget()
    m = box.controls["num_features"]
    assert m.disabled                                  # the default scoring has no random features: m is greyed out
    box.controls["kind"].value = KINDS[4]
    assert box.children[-1].outputs and not m.disabled
    box.controls["kind"].value = KINDS[3]
    assert m.disabled
