"""The DFlash objective: anchors, labels, visibility, one batched forward, counts. These tests catch
SpecForge's tau ~ 1 bugs (a label shifted by one, `<=` visibility, an anchor seeing itself)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
from draftdeck.drafter.kinds.dflash.objective import (
    all_anchors,
    block_loss,
    build_blocks,
    dflash_loss,
    drafter_hidden,
    eligible_anchors,
    sample_anchors,
    slot_weights,
)
from tests.support.drafter import tiny_drafter_config, tiny_target

torch.set_num_threads(1)
B = 4
MASK = 299


def _mask(rows: list[str]) -> torch.Tensor:
    return torch.tensor([[int(c) for c in r] for r in rows])


def test_anchors_are_eligible_distinct_seeded_and_capped() -> None:
    lm = _mask(["0011110011", "0000000000", "0111111111"])
    ok = eligible_anchors(lm)
    assert ok[0].nonzero().flatten().tolist() == [2, 3, 4, 8]
    g = torch.Generator().manual_seed(3)
    pos, valid = sample_anchors(lm, 3, g)
    assert valid.tolist()[1] == [False] * 3
    for r in (0, 2):
        p = pos[r][valid[r]].tolist()
        assert len(p) == 3 == len(set(p)) and p == sorted(p) and all(ok[r, q] for q in p)
    again = sample_anchors(lm, 3, torch.Generator().manual_seed(3))
    assert torch.equal(again[0], pos) and torch.equal(again[1], valid)
    pos, valid = all_anchors(lm)
    assert pos[0][valid[0]].tolist() == [2, 3, 4, 8] and not valid[1].any()


def test_slot_k_labels_token_p_plus_k_and_slot_0_is_never_a_label() -> None:
    ids = torch.arange(100, 112)[None]  # distinct tokens: a shift by one changes every label
    lm = _mask(["001111111011"])
    anchors, valid = torch.tensor([[2, 6, 10]]), torch.tensor([[True, True, True]])
    bb = build_blocks(ids, lm, None, anchors, valid, B, MASK)
    assert bb.block_ids.view(3, B).tolist() == [
        [102, MASK, MASK, MASK],
        [106, MASK, MASK, MASK],
        [110] + [MASK] * 3,
    ]
    assert bb.labels[0, 0].tolist()[1:] == [103, 104, 105]
    assert bb.label_valid[0].tolist() == [
        [False, True, True, True],
        [False, True, True, False],  # position 9 is outside the loss mask
        [False, True, False, False],  # positions 12, 13 are past the sequence
    ]
    assert bb.position_ids[0, 12:].tolist() == [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]


def test_attention_mask_context_strictly_before_anchor_and_own_block_only() -> None:
    ids = torch.arange(100, 110)[None]
    att = torch.ones(1, 10, dtype=torch.long)
    att[0, 0] = 0  # a left-padded key is never visible
    anchors, valid = torch.tensor([[3, 6]]), torch.tensor([[True, True]])
    bb = build_blocks(ids, torch.ones(1, 10), att, anchors, valid, B, MASK)
    m = bb.layout.dense_mask()[0, 0]
    assert m.shape == (2 * B, 10 + 2 * B)
    for q in range(2 * B):
        p = int(anchors[0, q // B])
        assert m[q, :10].nonzero().flatten().tolist() == list(range(1, p))  # < p, never <= p
        own = list(range(10 + (q // B) * B, 10 + (q // B + 1) * B))
        assert m[q, 10:].nonzero().flatten().add(10).tolist() == own


def _setup(seed: int = 0) -> tuple:
    target = tiny_target(seed)
    cfg = tiny_drafter_config(target, layers=2, block_size=B)
    torch.manual_seed(seed + 1)
    drafter = DFlashDrafter(cfg)
    ids = torch.randint(0, 298, (2, 14))
    _, ctx = target.context_features(ids, None, cfg.target_layer_ids)
    return target, drafter, ids, ctx


def test_batched_blocks_equal_one_inference_call_per_anchor() -> None:
    """Training's flattened forward gives exactly what decoding computes for the same anchor:
    context = positions < p, block at positions p..p+B-1, nothing else visible."""
    target, drafter, ids, ctx = _setup()
    drafter.eval()
    anchors = torch.tensor([[3, 5, 9], [1, 8, 10]])
    valid = torch.ones_like(anchors, dtype=torch.bool)
    bb = build_blocks(ids, torch.ones_like(ids), None, anchors, valid, B, drafter.mask_token_id)
    h = drafter_hidden(drafter, target.embedding, ctx, bb)
    for r in range(2):
        for a, p in enumerate(anchors[r].tolist()):
            block = torch.tensor([[ids[r, p].item()] + [drafter.mask_token_id] * (B - 1)])
            one = drafter(
                position_ids=torch.arange(p + B)[None],
                noise_embedding=target.embed(block),
                target_hidden=ctx[r : r + 1, :p],
            )
            torch.testing.assert_close(h[r, a], one[0], atol=1e-5, rtol=1e-5)
            if p > 1:  # with `<=` (context up to and including p) the result differs
                leaky = drafter(
                    position_ids=torch.cat([torch.arange(p + 1), torch.arange(p, p + B)])[None],
                    noise_embedding=target.embed(block),
                    target_hidden=ctx[r : r + 1, : p + 1],
                )
                assert not torch.allclose(h[r, a], leaky[0], atol=1e-4)


@pytest.mark.parametrize("backend", ["dense", "blocked"])
def test_no_gradient_reaches_context_at_or_after_the_anchor_or_other_blocks(backend: str) -> None:
    target, drafter, ids, ctx = _setup()
    ctx = ctx.clone().requires_grad_(True)
    anchors, valid = torch.tensor([[4, 9], [2, 7]]), torch.ones(2, 2, dtype=torch.bool)
    bb = build_blocks(ids, torch.ones_like(ids), None, anchors, valid, B, drafter.mask_token_id, backend)  # type: ignore[arg-type]
    noise = F.embedding(bb.block_ids, target.embedding.weight).requires_grad_(True)
    h = drafter(
        position_ids=bb.position_ids,
        attention_mask=bb.layout,
        noise_embedding=noise,
        target_hidden=ctx,
    )
    h.view(2, 2, B, -1)[0, 0].sum().backward()  # block 0 of row 0, anchor 4
    per_pos = ctx.grad.abs().sum(-1)
    assert (per_pos[0, :4] > 0).all()  # everything strictly before the anchor is used
    assert (per_pos[0, 4:] == 0).all()  # the anchor's own position and later: nothing
    assert (per_pos[1] == 0).all()  # nor another row
    assert noise.grad is not None
    g = noise.grad.abs().sum(-1)
    assert (g[0, :B] > 0).all() and (g[0, B:] == 0).all()  # its own block, bidirectional; not block 1


def _oracle(bb, vocab: int, shift: int = 0) -> torch.Tensor:
    """Hidden states whose logits (through identity) put all mass on the label (or a shifted one)."""
    labels = bb.labels.roll(shift, dims=2) if shift else bb.labels
    return F.one_hot(labels, vocab).float() * 50.0


def test_logits_equal_to_labels_give_tau_b_and_a_shifted_label_does_not() -> None:
    ids = torch.arange(10, 42).view(2, 16)
    lm = torch.ones_like(ids)
    lm[:, :3] = 0
    anchors, valid = all_anchors(lm)
    bb = build_blocks(ids, lm, None, anchors, valid, B, MASK)
    full = (anchors + B - 1 < 16) & valid  # blocks whose every slot lies in the sequence
    res = block_loss(nn.Identity(), _oracle(bb, 64), bb, gamma=7.0)
    assert res.loss.item() < 1e-6
    assert res.counts.correct == res.counts.total and res.counts.total[1] > 0
    assert (res.runs[full] == B - 1).all()
    assert res.counts.anchor_hist[B] == int(full.sum())
    bad = block_loss(nn.Identity(), _oracle(bb, 64, shift=1), bb, gamma=7.0)
    assert bad.counts.anchor_accepted == 0 and bad.counts.tau_anchor == 1.0


def test_loss_is_weighted_mean_of_ce_with_exponential_slot_weights() -> None:
    torch.manual_seed(0)
    ids = torch.randint(0, 20, (1, 10))
    lm = torch.ones_like(ids)
    anchors, valid = torch.tensor([[1, 7]]), torch.tensor([[True, True]])
    bb = build_blocks(ids, lm, None, anchors, valid, B, 19)
    hidden = torch.randn(1, 2, B, 20)
    res = block_loss(nn.Identity(), hidden, bb, gamma=2.0)
    w = slot_weights(B, 2.0)
    assert w.tolist() == pytest.approx([0.0, 1.0, 0.6065306, 0.3678794])
    num = den = 0.0
    for a, p in enumerate([1, 7]):
        for k in range(1, B):
            if p + k < 10:
                ce = F.cross_entropy(hidden[0, a, k][None], ids[0, p + k][None]).item()
                num += w[k].item() * ce
                den += w[k].item()
    assert res.loss.item() == pytest.approx(num / den, rel=1e-5)
    assert res.counts.total == [0, 2, 2, 1]


def test_dflash_loss_backpropagates_into_the_drafter_only() -> None:
    target, drafter, ids, ctx = _setup()
    lm = torch.ones_like(ids)
    anchors, valid = sample_anchors(lm, 5, torch.Generator().manual_seed(0))
    res = dflash_loss(drafter, target.embedding, target.lm_head, ctx, ids, lm, None, anchors, valid, 7.0)
    res.loss.backward()
    assert all(p.grad is not None for p in drafter.parameters())
    assert all(p.grad is None for p in target.model.parameters())
    assert res.counts.anchor_blocks == 10
