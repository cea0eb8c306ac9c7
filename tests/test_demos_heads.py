"""attn_course.demos.heads.KeyPairTask (lesson 02's one-head-vs-several task): targets, ceiling, embedding."""
from itertools import product

import pytest
import torch
from torch import nn

from attn_course.demos.heads import IGNORE, FieldEmbedding, KeyPairTask, NeighbourTask, make_model


@pytest.mark.parametrize("K, V, L, seed", [(4, 4, 12, 0), (5, 3, 9, 1), (3, 8, 6, 2), (3, 4, 8, 3)])
def test_targets_match_a_dictionary_lookup(K, V, L, seed):
    task = KeyPairTask(num_keys=K, num_values=V, seq_len=L)
    x, y = task.sample(torch.Generator().manual_seed(seed), 64)
    assert x.shape == y.shape == (64, L) and int(x.max()) < K * V
    scored = 0
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        value_of = {}
        for tok in row_x:
            assert value_of.setdefault(tok // V, tok % V) == tok % V          # one value per key and sequence
        for tok, target in zip(row_x, row_y):
            up, down = (tok // V + 1) % K, (tok // V - 1) % K
            if up in value_of and down in value_of:
                assert target == (value_of[up] - value_of[down]) % V
                scored += 1
            else:
                assert target == IGNORE
    assert 0 < scored < 64 * L            # some positions scored, some keys missing (skewed counts)


def test_three_keys_score_a_sequence_all_or_nothing():
    """Lesson 02's task (K=3): keys k+1 and k-1 are the two other keys, so a sequence is scored at every position
    when it holds all three keys and at none when one is missing."""
    task = KeyPairTask(num_keys=3, num_values=4, seq_len=8)
    x, y = task.sample(torch.Generator().manual_seed(0), 256)
    all_keys = torch.nn.functional.one_hot(x // task.num_values, 3).amax(1).all(-1)     # (B,)
    assert torch.equal((y != IGNORE).all(-1), all_keys) and torch.equal((y == IGNORE).all(-1), ~all_keys)
    assert 0 < int(all_keys.sum()) < 256


def test_key_counts_vary_between_sequences():
    task = KeyPairTask()
    x, _ = task.sample(torch.Generator().manual_seed(0), 256)
    counts = torch.nn.functional.one_hot(x // task.num_values, task.num_keys).sum(1)   # (B, K)
    assert len(set(counts[:, 0].tolist())) >= 6


@pytest.mark.parametrize("V", [2, 3, 4, 5, 8])
def test_unordered_ceiling_is_the_best_predictor_from_the_unordered_pair(V):
    # group the V² equally likely ordered pairs (a, b) by their unordered pair; the best guess for a group
    # is its most common answer (a - b) mod V
    groups = {}
    for a, b in product(range(V), repeat=2):
        groups.setdefault(frozenset((a, b)), []).append((a - b) % V)
    best = sum(max(answers.count(t) for t in answers) for answers in groups.values()) / V**2
    assert KeyPairTask(num_values=V).unordered_ceiling() == pytest.approx(best)
    assert KeyPairTask(num_values=4).unordered_ceiling() == 0.75


def test_model_embeds_key_and_value_as_two_added_vectors():
    task = KeyPairTask(num_keys=4, num_values=4, seq_len=12)
    model = make_model(task, d_model=16, num_heads=4)
    assert isinstance(model.tok, FieldEmbedding)
    x, _ = task.sample(torch.Generator().manual_seed(1), 3)
    torch.testing.assert_close(model.tok(x), model.tok.first.weight[x // 4] + model.tok.second.weight[x % 4])
    assert model(x).shape == (3, 12, 4)
    assert isinstance(make_model(NeighbourTask(), d_model=16).tok, nn.Embedding)    # other tasks: one table


@pytest.mark.parametrize("call, match", [
    (lambda: KeyPairTask(num_keys=2), r"num_keys=2 must be at least 3"),
    (lambda: KeyPairTask(num_values=0), r"num_values"),
    (lambda: make_model(NeighbourTask(vocab_size=8), fields=(3, 3)), r"fields=\(3, 3\) do not multiply to vocab_size=8"),
])
def test_value_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_key_role_weights_against_a_hand_built_head():
    """A model whose single head puts all its weight on key k+1 must read 1 on [q, 0] and 0 on [q, 1]."""
    import torch
    from attn_course.demos.heads import KeyPairTask, key_role_weights

    task = KeyPairTask()

    class Oracle(torch.nn.Module):
        def forward(self, x, need_weights=False):
            keys = x // task.num_values
            w = (keys[:, None, :] == (keys[:, :, None] + 1) % task.num_keys).float()   # (B, L, L) on key k+1
            w = w / w.sum(-1, keepdim=True).clamp_min(1)
            return None, w[:, None]

    Oracle.parameters = lambda self: iter([torch.zeros(1)])
    r = key_role_weights(Oracle(), task, n=64)
    assert r.shape == (4, 2, 1)
    torch.testing.assert_close(r[:, 0, 0], torch.ones(4))
    torch.testing.assert_close(r[:, 1, 0], torch.zeros(4))
