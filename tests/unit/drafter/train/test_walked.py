"""The walked tau: a hand-computed walk, and the batched pass against decoding-style drafter calls."""

from __future__ import annotations

import numpy as np
import torch

from draftdeck.drafter.model.dflash import DFlashDrafter
from draftdeck.drafter.train.walked import heldout_counts, spans, walk
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
    c = heldout_counts(drafter, target, [(ids, att, lm)], gamma=7.0, anchors_per_chunk=5)
    with torch.no_grad():
        want = [_sequential_walk(drafter, target, ids[r], lm[r]) for r in range(2)]
    assert (c.walked_accepted, c.walked_steps) == (sum(a for a, _ in want), sum(s for _, s in want))
    assert c.walked_accepted > 0
    assert c.anchor_blocks == 19 + 13 and c.total[1] == 32
    assert sum(c.walked_hist) == c.walked_steps
