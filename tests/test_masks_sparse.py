"""masks.dilated_mask and masks.global_local_mask against brute-force definitions (DESIGN Wave 2)."""
import pytest
import torch

from attn_course import masks


def _brute_dilated(L, w, r, causal):
    m = torch.zeros(L, L, dtype=torch.bool)
    for i in range(L):
        for j in range(L):
            ok = (i - j) % r == 0 and abs(i - j) < w * r and (j <= i or not causal)
            m[i, j] = ok
    return m


def _brute_global_local(L, w, g):
    g = set(g)
    m = torch.zeros(L, L, dtype=torch.bool)
    for i in range(L):
        for j in range(L):
            m[i, j] = abs(i - j) < w or i in g or j in g
    return m


@pytest.mark.parametrize("L, w, r", [(1, 1, 1), (7, 1, 3), (9, 2, 2), (13, 3, 4), (6, 10, 2), (11, 4, 1)])
@pytest.mark.parametrize("causal", [True, False])
def test_dilated_mask_matches_brute_force(L, w, r, causal):
    m = masks.dilated_mask(L, w, r, causal=causal)
    assert m.shape == (L, L) and m.dtype == torch.bool
    assert torch.equal(m, _brute_dilated(L, w, r, causal))


def test_dilated_mask_edge_cases():
    L = 12
    # dilation 1 is the plain sliding window; window 1 is the diagonal; window >= L with dilation 1 is full/causal
    for causal in (True, False):
        assert torch.equal(masks.dilated_mask(L, 4, 1, causal=causal), masks.sliding_window_mask(L, 4, causal=causal))
        assert torch.equal(masks.dilated_mask(L, 1, 3, causal=causal), torch.eye(L, dtype=torch.bool))
    assert torch.equal(masks.dilated_mask(L, L, 1), torch.ones(L, L, dtype=torch.bool).tril())
    # each causal row sees at most `window` keys, reaching back (window-1)*dilation positions
    m = masks.dilated_mask(40, 5, 3)
    assert int(m.sum(-1).max()) == 5 and bool(m[39, 39 - 12]) and not bool(m[39, 39 - 15])
    assert masks.dilated_mask(4, 2, 2, device="meta").device.type == "meta"
    for bad in (dict(window=0, dilation=1), dict(window=2, dilation=0), dict(window=2, dilation=1.5)):
        with pytest.raises(ValueError, match="window|dilation"):
            masks.dilated_mask(5, **bad)


@pytest.mark.parametrize("L, w, g", [(1, 1, [0]), (10, 2, [0]), (11, 3, [0, 7]), (9, 1, [8, 3, 3]),
                                     (6, 9, [2]), (8, 2, [])])
def test_global_local_mask_matches_brute_force(L, w, g):
    m = masks.global_local_mask(L, w, g)
    assert m.shape == (L, L) and m.dtype == torch.bool
    assert torch.equal(m, _brute_global_local(L, w, g))
    assert torch.equal(m, m.T)                                       # Longformer's pattern is symmetric


def test_global_local_mask_inputs():
    L = 10
    assert torch.equal(masks.global_local_mask(L, 3, []), masks.sliding_window_mask(L, 3, causal=False))
    assert torch.equal(masks.global_local_mask(L, 3, torch.tensor([4, 4, 1])), masks.global_local_mask(L, 3, [1, 4]))
    assert torch.equal(masks.global_local_mask(L, 3, 2), masks.global_local_mask(L, 3, [2]))
    with pytest.raises(ValueError, match=r"\[0, q_len=10\)"):
        masks.global_local_mask(L, 3, [10])
    with pytest.raises(ValueError, match=r"\[0, q_len=10\)"):
        masks.global_local_mask(L, 3, [-1])
    with pytest.raises(ValueError, match="integers"):
        masks.global_local_mask(L, 3, [0.5])
    with pytest.raises(ValueError, match="window"):
        masks.global_local_mask(L, 0, [1])
