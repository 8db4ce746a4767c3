"""The walked tau: a hand-computed walk, the batched pass against decoding-style drafter calls, the
walk that drafts only where it goes against the walk over every anchor, and the seeded sample."""

from __future__ import annotations

import numpy as np
import torch

from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
from draftdeck.drafter.kinds.dflash.objective import all_anchors, block_loss, build_blocks, drafter_hidden
from draftdeck.drafter.kinds.dflash.walked import Drafts, first_slots, heldout_counts
from draftdeck.drafter.model.loss_terms import CE_ONLY
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.train.walked import spans, walk, walk_steps
from tests.support.drafter import tiny_drafter_config, tiny_target

torch.set_num_threads(1)


def test_hand_computed_walk_over_two_spans_and_two_rows() -> None:
    b = 4
    mask = np.array([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0]])
    runs = np.full(mask.shape, -1)
    # row 0, span 2..11: p=2 run 3 -> 6; p=6 run 0 -> 7; p=7 run 2 -> 10; p=10 run 3 capped to 1 -> stop
    runs[0, [2, 6, 7, 10]] = [3, 0, 2, 3]
    # row 1, span 1..3: p=1 run 1 -> 3 = end; span 6..10: p=6 run 3 -> 10 = end
    runs[1, [1, 6]] = [1, 3]
    c = walk(runs, mask, b)
    assert (c.walked_steps, c.walked_accepted) == (6, 3 + 0 + 2 + 1 + 1 + 3)
    assert c.walked_hist == [0, 1, 2, 1, 2]  # tau incl. bonus per step: 4, 1, 3, 2 | 2, 4
    assert c.tau_walked == 1 + 10 / 6
    assert spans(mask)[0].tolist() == [2, 13, 18] and spans(mask)[1].tolist() == [11, 15, 22]


def test_walk_refuses_a_visited_position_without_a_draft() -> None:
    mask = np.array([[1, 1, 1, 1]])
    runs = np.array([[0, -1, -1, -1]])
    try:
        walk(runs, mask, 4)
    except ValueError as e:
        assert "flat index 1" in str(e)
    else:
        raise AssertionError("the walk accepted a missing draft")


def _sequential_walk(drafter: DFlashDrafter, target, ids: torch.Tensor, lm: torch.Tensor) -> tuple[int, int]:
    """Decoding-style: one drafter call per verify step on context < p, drafts compared with ids."""
    b = drafter.block_size
    _, ctx = target.context_features(ids[None], None, drafter.target_layer_ids)
    pos = lm.nonzero().flatten().tolist()
    g, e = pos[0], pos[-1]
    assert pos == list(range(g, e + 1))
    p, acc_sum, steps = g, 0, 0
    while p < e:
        block = torch.tensor([[ids[p].item()] + [drafter.mask_token_id] * (b - 1)])
        h = drafter(
            position_ids=torch.arange(p + b)[None],
            noise_embedding=target.embed(block),
            target_hidden=ctx[:, :p],
        )
        draft = drafter.compute_logits(h, target.lm_head)[0, 1:].argmax(-1)
        acc = 0
        while acc < min(b - 1, e - p) and draft[acc].item() == ids[p + 1 + acc].item():
            acc += 1
        acc_sum, steps, p = acc_sum + acc, steps + 1, p + 1 + acc
    return acc_sum, steps


def test_batched_walk_equals_a_decoding_style_walk_on_a_repetitive_text() -> None:
    target = tiny_target(0)
    drafter = DFlashDrafter(tiny_drafter_config(target, layers=1, block_size=4)).eval()
    # the drafter's own predictions as the "text" make long accepted runs likely; mix with noise
    torch.manual_seed(5)
    ids = torch.randint(0, 298, (2, 24))
    with torch.no_grad():
        _, ctx = target.context_features(ids, None, drafter.target_layer_ids)
        for p in range(4, 23):  # rewrite each next token as the drafter's slot-1 guess (teacher-forced)
            block = torch.tensor([[ids[0, p].item()] + [drafter.mask_token_id] * 3])
            h = drafter(
                position_ids=torch.arange(p + 4)[None],
                noise_embedding=target.embed(block),
                target_hidden=ctx[:1, :p],
            )
            ids[0, p + 1] = drafter.compute_logits(h, target.lm_head)[0, 1].argmax()
            _, ctx = target.context_features(ids, None, drafter.target_layer_ids)
    lm = torch.zeros_like(ids)
    lm[0, 4:] = 1
    lm[1, 6:20] = 1
    att = torch.ones_like(ids)
    c = heldout_counts(drafter, target, [(ids, att, lm)], 7.0, anchors_per_row=None, anchors_per_chunk=5)
    with torch.no_grad():
        want = [_sequential_walk(drafter, target, ids[r], lm[r]) for r in range(2)]
    assert (c.walked_accepted, c.walked_steps) == (sum(a for a, _ in want), sum(s for _, s in want))
    assert c.walked_accepted > 0
    assert c.anchor_blocks == 19 + 13 and c.total[1] == 32
    assert sum(c.walked_hist) == c.walked_steps


def _runs_at_every_anchor(drafter: DFlashDrafter, target, ids: torch.Tensor, att, lm) -> np.ndarray:
    """The former held-out pass: a block drafted at every eligible anchor, every slot through the head."""
    with torch.no_grad():
        _, ctx = target.context_features(ids, att, drafter.target_layer_ids)
        a, v = all_anchors(lm)
        blocks = build_blocks(ids, lm, att, a, v, drafter.block_size, drafter.mask_token_id)
        res = block_loss(target.lm_head, drafter_hidden(drafter, target.embedding, ctx, blocks), blocks, 7.0)
    runs = torch.full(ids.shape, -1, dtype=torch.long)
    rows = torch.arange(a.shape[0])[:, None].expand_as(a)
    runs[rows[v], a[v]] = res.runs[v]
    return runs.numpy()


def _learnt_pair(block: int = 8) -> tuple[DFlashDrafter, Target, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A drafter fitted a little to a periodic text (long accepted runs and rejections both happen),
    three rows of different lengths and spans."""
    target = tiny_target(1)
    torch.manual_seed(2)
    drafter = DFlashDrafter(tiny_drafter_config(target, layers=1, block_size=block))
    ids = (torch.arange(3 * 40).view(3, 40) * 7 % 13).long()
    ids[1, 20:] = torch.randint(0, 298, (20,))  # noise: short runs
    att = torch.ones_like(ids)
    att[2, 30:] = 0
    lm = torch.zeros_like(ids)
    lm[0, 3:], lm[1, 5:17], lm[1, 19:38], lm[2, 2:30] = 1, 1, 1, 1
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    with torch.no_grad():
        _, ctx = target.context_features(ids, att, drafter.target_layer_ids)
    for _ in range(30):
        a, v = all_anchors(lm)
        blocks = build_blocks(ids, lm, att, a, v, block, drafter.mask_token_id)
        res = block_loss(target.lm_head, drafter_hidden(drafter, target.embedding, ctx, blocks), blocks, 7.0)
        opt.zero_grad()
        res.loss.backward()
        opt.step()
    return drafter.eval(), target, ids, att, lm


def test_reading_slot_1_then_the_visited_blocks_gives_the_walk_of_every_slot_read() -> None:
    drafter, target, ids, att, lm = _learnt_pair()
    runs = _runs_at_every_anchor(drafter, target, ids, att, lm)
    want = walk(runs, lm.numpy(), drafter.block_size)
    got = heldout_counts(drafter, target, [(ids, att, lm)], 7.0, judge=False)
    assert want.walked_steps > 0 and 0 < want.walked_accepted < want.walked_steps * (drafter.block_size - 1)
    assert max(i for i, n in enumerate(want.walked_hist) if n) > 2  # some steps accepted several drafts
    assert (got.walked_steps, got.walked_accepted, got.walked_hist) == (
        want.walked_steps,
        want.walked_accepted,
        want.walked_hist,
    )
    assert got.anchor_blocks == 0 and got.weight_sum == 0 and sum(got.total) == 0  # anchors_per_row 0


def test_the_sampled_figures_depend_on_the_row_alone() -> None:
    drafter, target, ids, att, lm = _learnt_pair()
    together = heldout_counts(drafter, target, [(ids, att, lm)], 7.0, judge=False, anchors_per_row=5)
    alone = [
        heldout_counts(drafter, target, [(ids[i : i + 1], att[i : i + 1], lm[i : i + 1])], 7.0, judge=False,
                       anchors_per_row=5)
        for i in range(3)
    ]  # fmt: skip
    assert together.anchor_blocks == together.total[1] == 3 * 5  # 5 of each row's eligible anchors
    assert together.anchor_accepted == sum(c.anchor_accepted for c in alone)
    assert together.total == [sum(t) for t in zip(*(c.total for c in alone), strict=True)]
    assert together.correct == [sum(t) for t in zip(*(c.correct for c in alone), strict=True)]
    assert together.walked_steps == sum(c.walked_steps for c in alone)
    every = heldout_counts(drafter, target, [(ids, att, lm)], 7.0, judge=False, anchors_per_row=None)
    eligible = int(((lm[:, :-1] == 1) & (lm[:, 1:] == 1)).sum())
    assert every.total[1] == every.anchor_blocks == eligible
    assert (every.walked_steps, every.walked_hist) == (together.walked_steps, together.walked_hist)
    assert abs(together.loss - every.loss) < 0.5 * every.loss  # a sample of the same loss


def test_phase_2_drafts_again_only_the_visited_blocks_whose_slot_1_was_right() -> None:
    drafter, target, ids, att, lm = _learnt_pair()
    with torch.no_grad():
        tf = target.teacher_forced(ids, att, drafter.target_layer_ids)
        positions = torch.arange(ids.shape[1]).expand(ids.shape)
        context = (tf.context, drafter.context_kv(tf.context, positions))
        runs, _ = first_slots(
            drafter, target, (ids, att, lm), context, tf, 7.0, per_row=0, seed=0, mix=CE_ONLY,
            attention="blocked", anchors_per_chunk=7,
        )  # fmt: skip
        drafts = Drafts(drafter, target, (ids, att, lm), context, runs, "blocked")
        steps = walk_steps(drafts, lm.numpy())
    assert drafts.drafted == int((steps.accepted > 0).sum()) > 0  # a step that accepted a draft
    assert int((runs == -2).sum()) > drafts.drafted  # blocks whose slot 1 was right but never visited
