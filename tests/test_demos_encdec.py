"""demos.encdec: lesson 04's encoder–decoder has the three attentions of Vaswani et al. §3.2.3, with the masks
each needs, and learns the digit task."""
import torch

from attn_course.demos import cross as toy
from attn_course.demos import encdec


def test_three_attentions_with_their_masks():
    torch.manual_seed(0)
    model = encdec.ToyEncoderDecoder(d_model=16, num_heads=2).eval()
    src, tgt_in, _, lengths = toy.sample_batch(torch.Generator().manual_seed(0), 8)
    logits, (w_enc, w_dec, w_cross) = model(src, tgt_in, need_weights=True)
    B, Ls, Lt = src.shape[0], src.shape[1], tgt_in.shape[1]
    assert logits.shape == (B, Lt, 10)
    assert w_enc.shape == (B, 2, Ls, Ls) and w_dec.shape == (B, 2, Lt, Lt) and w_cross.shape == (B, 2, Lt, Ls)
    real = torch.arange(Ls) < lengths[:, None]                                     # (B, Ls)
    for w in (w_enc, w_cross):                                                     # padded source keys: exactly 0
        assert (w.masked_select(~real[:, None, None, :].expand_as(w)) == 0).all()
    assert (w_dec.triu(1) == 0).all()                                             # causal decoder
    torch.testing.assert_close(w_dec.sum(-1), torch.ones(B, 2, Lt))
    # a later word never changes an earlier position's output (causality of the whole model)
    changed = tgt_in.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 10
    out2, _ = model(src, changed)
    torch.testing.assert_close(out2[:, :-1], logits[:, :-1])
    # the fused path (no weights) equals the explicit one
    torch.testing.assert_close(model(src, tgt_in)[0], logits, atol=1e-5, rtol=1e-4)


def test_it_learns_the_task():
    model, losses = encdec.train_encoder_decoder(300, seed=0, progress=False)
    assert len(losses) == 300 and losses[-1] < losses[0] / 10
    assert encdec.exact_match(model, n=300) > 0.95
