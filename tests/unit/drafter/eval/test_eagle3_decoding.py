"""Real speculative decoding with an EAGLE-3 drafter: lossless (the target's greedy output token for
token, trained or not), and the walk over the training-time-test runs on the target's own answers
is that decoding, step for step (the same accepted drafts and verify steps)."""

from __future__ import annotations

import numpy as np
import torch

from draftdeck.drafter.eval.spec_decode import TargetRunner, generate_plain, generate_speculative
from draftdeck.drafter.kinds.eagle3.model import Eagle3Config, Eagle3Drafter
from draftdeck.drafter.kinds.eagle3.objective import ttt_loss
from draftdeck.drafter.kinds.eagle3.source import Eagle3Source
from draftdeck.drafter.train.walked import walk
from tests.support.drafter import cycle_batch, tiny_target

torch.set_num_threads(1)
STEPS, NEW = 3, 20


def _inputs(target, drafter, ids):
    with torch.no_grad():
        out = target.model(input_ids=ids, output_hidden_states=True)
    aux = torch.cat([out.hidden_states[i] for i in drafter.config.aux_layer_ids], dim=-1)
    return aux, target.embed(ids)


def test_eagle3_decoding_is_lossless_and_the_walk_is_that_decoding() -> None:
    target = tiny_target(0, vocab_size=160, layers=4, hidden=32)
    runner = TargetRunner(target, eos_ids=[])
    prompts = cycle_batch(6, 4, torch.Generator().manual_seed(0)).tolist()
    answers = [generate_plain(runner, p, NEW).output_ids for p in prompts]
    ids = torch.tensor([p + a for p, a in zip(prompts, answers, strict=True)])
    mask = torch.zeros_like(ids)
    mask[:, 4:] = 1
    torch.manual_seed(0)
    drafter = Eagle3Drafter(Eagle3Config.from_target(target.config, draft_vocab_size=160))
    drafter.set_vocab(torch.zeros(160, dtype=torch.long), torch.ones(160, dtype=torch.bool))
    untrained = [
        generate_speculative(runner, Eagle3Source(drafter, target), p, NEW, STEPS + 1) for p in prompts[:2]
    ]
    assert [g.output_ids for g in untrained] == answers[:2]
    aux, embeds = _inputs(target, drafter, ids)
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    for _ in range(25):  # part-trained: some chains accepted whole, some cut short
        ttt_loss(drafter, aux, embeds, ids, mask, None, STEPS).loss.backward()
        opt.step()
        opt.zero_grad()
    real = [generate_speculative(runner, Eagle3Source(drafter, target), p, NEW, STEPS + 1) for p in prompts]
    assert [g.output_ids for g in real] == answers  # lossless
    with torch.no_grad():
        runs = ttt_loss(drafter, aux, embeds, ids, mask, None, STEPS).runs
    # the chain drafted at t follows the anchor at t + 1
    at_anchor = torch.full_like(runs, -1)
    at_anchor[:, 1:] = runs[:, :-1]
    walked = walk(at_anchor.numpy(), mask.numpy().astype(np.int8), STEPS + 1)
    assert walked.walked_steps == sum(g.steps for g in real)
    assert walked.walked_accepted == sum(g.accepted for g in real)
    assert 0 < walked.walked_accepted < STEPS * walked.walked_steps  # neither none nor every draft
