"""Drafter truth on hand-built numbers: the target's view of trained positions (greedy token, the
data token's probability, the greedy token's), agreement counts and the off-target rule, the head
check, counts that pack and add, and the target's own answers equal to plain greedy decoding."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from draftdeck.drafter.eval.spec_decode import TargetRunner, generate_plain
from draftdeck.drafter.train import truth
from draftdeck.drafter.train.counts import Counts
from draftdeck.drafter.train.truth import (
    Agreement,
    TruthUnavailable,
    agreement_of,
    describe,
    off_target,
    target_view,
)
from tests.support.eval import build_world

V = 5


def _head() -> nn.Linear:
    """Logits = the hidden state itself (hidden size = vocabulary), so each row of `hidden` names
    the target's distribution."""
    head = nn.Linear(V, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(V))
    return head


def _logits(*rows: list[float]) -> torch.Tensor:
    return torch.tensor([rows], dtype=torch.float32)


def test_the_view_reads_the_next_token_of_every_trained_position_from_the_previous_hidden_state() -> None:
    # position t is judged by the hidden state at t - 1
    hidden = _logits([9, 0, 0, 0, 0], [0, 0, 9, 0, 0], [0, 0, 0, 0, 9], [0, 9, 0, 0, 0])
    ids = torch.tensor([[3, 1, 2, 1]])
    mask = torch.tensor([[0, 1, 1, 1]])
    head = _head()
    view = target_view(head, hidden, head(hidden[:, -1:]), ids, mask)
    assert view.computed.tolist() == [[False, True, True, True]]
    assert view.greedy.tolist() == [[-1, 0, 2, 4]]
    p = torch.softmax(torch.tensor([9.0, 0, 0, 0, 0]), 0)
    assert view.top[0, 1].item() == pytest.approx(float(p[0]))  # the greedy token's probability
    assert view.prob[0, 1].item() == pytest.approx(float(p[1]))  # the data's token (1), not greedy
    assert view.prob[0, 2].item() == pytest.approx(float(p[0]))  # data 2 is the greedy token here
    a = agreement_of(view, ids)
    assert (a.tokens, a.matches) == (3, 1)
    assert a.prob_sum == pytest.approx(float(2 * p[1] + p[0]))
    assert a.expected_sum == pytest.approx(float(3 * p[0]))


def test_chunked_head_rows_give_the_same_view(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 11, V, generator=g)
    ids = torch.randint(0, V, (3, 11), generator=g)
    mask = (torch.rand(3, 11, generator=g) > 0.3).long()
    head = _head()
    whole = target_view(head, hidden, head(hidden[:, -1:]), ids, mask)
    monkeypatch.setattr(truth, "HEAD_ELEMENTS", 2 * V)  # two positions at a time
    parts = target_view(head, hidden, head(hidden[:, -1:]), ids, mask)
    assert torch.equal(whole.greedy, parts.greedy) and torch.allclose(whole.prob, parts.prob)
    # the first column has no previous position: never judged, even when trained
    assert not whole.computed[:, 0].any() and whole.computed.sum() == mask[:, 1:].sum()


def test_a_head_that_does_not_give_the_models_logits_is_refused_by_name() -> None:
    hidden = _logits([1, 2, 3, 0, 0], [0, 5, 1, 0, 0])
    capped = 2.0 * torch.tanh(hidden[:, -1:] / 2.0)  # a soft-capped model's logits
    with pytest.raises(TruthUnavailable, match="does not give the logits the model returns"):
        target_view(_head(), hidden, capped, torch.tensor([[0, 1]]), torch.tensor([[0, 1]]))


def test_the_disagreement_ratio_separates_greedy_sampled_and_foreign_data() -> None:
    # 100 tokens where the target's greedy token has probability 0.9: its temperature-1 samples
    # would differ from it on 10 of them
    greedy = Agreement(tokens=100, matches=100, prob_sum=90.0, expected_sum=90.0)
    sampled = Agreement(tokens=100, matches=92, prob_sum=83.0, expected_sum=90.0)
    foreign = Agreement(tokens=100, matches=60, prob_sum=55.0, expected_sum=90.0)
    assert greedy.disagreement_ratio == 0.0 and sampled.disagreement_ratio == pytest.approx(0.8)
    assert foreign.disagreement_ratio == pytest.approx(4.0)
    assert [off_target(a, 1.25) for a in (greedy, sampled, foreign)] == [False, False, True]
    assert not off_target(Agreement(), 1.25)  # nothing measured: no verdict
    assert foreign.share == pytest.approx(0.6) and foreign.mean_prob == pytest.approx(0.55)
    assert math.isnan(Agreement().share)


def test_the_agreement_reads_as_a_sentence_that_names_what_was_compared() -> None:
    # the log said "would agree on 90.0%: 4.00x their disagreements": figures without their meaning
    said = describe(Agreement(tokens=1000, matches=600, prob_sum=550.0, expected_sum=900.0))
    assert "greedy choice of next token is the data's token on 60.0% of 1,000 trained tokens" in said
    assert "its own samples at temperature 1 would match its greedy choice on 90.0%" in said
    assert "departs from the target's greedy choice 4.00 times as often as those samples would" in said
    assert "well above 1 when another model or person wrote it" in said
    assert said.endswith("a mean probability of 0.550") and "x their" not in said


def test_truth_counts_pack_add_and_name_their_metrics() -> None:
    a = Counts(4, walked_accepted=3, walked_steps=2)
    a.add_agreement(Agreement(10, 7, 6.5, 8.0))
    walk = Counts(4, walked_accepted=5, walked_steps=4)
    walk.walked_hist = [0, 1, 1, 1, 1]
    a.add_target_walk(walk)
    b = Counts.from_tensors(4, *a.to_tensors())
    assert b == a
    both = a + b
    assert (both.agree_tokens, both.agree_matches, both.agree_expected_sum) == (20, 14, 16.0)
    assert both.tau_target_walked == pytest.approx(1 + 10 / 8) and both.target_walked_hist == [0, 2, 2, 2, 2]
    m = a.heldout_metrics()
    assert m["heldout/target_walked/accepted"] == 5 and m["heldout/agreement/expected_sum"] == 8.0
    src = a.source_metrics("data/a.jsonl")
    assert src["heldout/source/data/a.jsonl/walked/steps"] == 2
    assert src["heldout/source/data/a.jsonl/agreement/matches"] == 7
    assert Counts(4).truth_metrics("preflight") == {}  # nothing measured, nothing written


def test_the_targets_own_answers_are_its_plain_greedy_decoding(tmp_path: Path) -> None:
    world = build_world(tmp_path / "world", n_prompts=6)
    runner = TargetRunner(world.target, world.target.eos_ids())
    caps = [12, 3, 12, 7, 12, 1]
    rows = truth.target_answers(world.target, world.prompt_ids, caps, batch_size=4)
    for prompt, cap, (ids, mask) in zip(world.prompt_ids, caps, rows, strict=True):
        want = generate_plain(runner, prompt, cap).output_ids
        assert ids.tolist() == prompt + want  # left-padded batches, same tokens
        assert mask.tolist() == [0] * len(prompt) + [1] * len(want)


def test_every_turn_is_answered_after_the_targets_own_earlier_answers(tmp_path: Path) -> None:
    """A two-turn row: turn 2 is generated after the target's answer to turn 1 and the data's tokens
    between the turns, each answer capped at the data's; a one-turn row as before."""
    world = build_world(tmp_path / "world", n_prompts=2)
    runner = TargetRunner(world.target, world.target.eos_ids())
    p1, p2 = world.prompt_ids
    data1, between, data2 = [7] * 6, [5, 6, *p2], [9] * 4  # the data's answers are not the target's
    ids = torch.tensor(p1 + data1 + between + data2).numpy()
    mask = torch.tensor([0] * len(p1) + [1] * 6 + [0] * len(between) + [1] * 4).numpy()
    one_ids, one_mask = torch.tensor(p2 + data1).numpy(), torch.tensor([0] * len(p2) + [1] * 6).numpy()
    two, one = truth.target_turns(world.target, [(ids, mask), (one_ids, one_mask)], 64, batch_size=2)
    first = generate_plain(runner, p1, 6).output_ids
    second = generate_plain(runner, p1 + first + between, 4).output_ids
    assert two[0].tolist() == p1 + first + between + second  # on policy: after its own first answer
    assert two[1].tolist() == [0] * len(p1) + [1] * len(first) + [0] * len(between) + [1] * len(second)
    assert one[0].tolist() == p2 + generate_plain(runner, p2, 6).output_ids
    assert truth.trained_spans(mask) == [(len(p1), len(p1) + 6), (len(p1) + 6 + len(between), len(ids))]
