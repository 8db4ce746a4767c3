"""The cache a verify step leaves on a hybrid target (Gated DeltaNet + attention: Qwen3.5/3.6,
Qwen3-Next) is the cache of the accepted prefix alone: every layer's recurrent state, convolution state
and keys, and the logits that follow, as if only the kept tokens had been run. A state committed at the
wrong position (the whole block's, or one position off) fails here even where a random tiny model's
greedy output would not notice."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from transformers import DynamicCache

from draftdeck.drafter.eval.hybrid_verify import RULES
from draftdeck.drafter.eval.spec_decode import TargetRunner
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.tiny_targets import tiny_causal_lm

VOCAB, PROMPT, BLOCK = 300, 12, 6


def _runner(arch: str) -> TargetRunner:
    return TargetRunner(Target(tiny_causal_lm(arch, vocab_size=VOCAB, layers=4)), eos_ids=[])


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _prefilled(runner: TargetRunner, prompt: list[int]) -> DynamicCache:
    cache = runner.new_cache()
    runner.forward(prompt, 0, cache, None)
    cache.crop(0)
    return cache


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    # the prefix's reference runs transformers' chunked rule, the verify step the per-position one
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_next"])
@pytest.mark.parametrize("kept", [1, 2, BLOCK - 1, BLOCK])
def test_a_verify_step_leaves_the_cache_of_the_accepted_prefix(arch: str, kept: int) -> None:
    runner = _runner(arch)
    assert runner.block_states.layer_ids  # the tiny target has Gated DeltaNet layers to record
    prompt, block, nxt = _ids(PROMPT, 0), _ids(BLOCK, 1), _ids(1, 2)

    verified = _prefilled(runner, prompt)
    saved = runner.save_state(verified)
    assert saved == []  # nothing to restore: the states per position are recorded instead
    runner.verify(block, PROMPT, verified, None)
    assert runner.keep(verified, block, PROMPT, kept, saved) == 0

    reference = _prefilled(runner, prompt)
    runner.forward(block[:kept], PROMPT, reference, None)
    reference.crop(0)

    assert verified.get_seq_length() == reference.get_seq_length() == PROMPT + kept
    ours: Any  # a cache layer of either kind, read by its attributes
    theirs: Any
    for ours, theirs in zip(verified.layers, reference.layers, strict=True):
        if getattr(ours, "recurrent_states", None):
            _close(ours.recurrent_states[0], theirs.recurrent_states[0])
            _close(ours.conv_states[0], theirs.conv_states[0])
        else:
            _close(ours.keys, theirs.keys)
    logits, _ = runner.forward(nxt, PROMPT + kept, verified, None)
    want, _ = runner.forward(nxt, PROMPT + kept, reference, None)
    _close(logits, want)


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_next"])
def test_verify_logits_equal_a_plain_forward_and_the_rules_are_put_back(arch: str) -> None:
    """The per-position rule gives the block the logits transformers' own kernels give, and the
    modeling module's rules are its own again once the verify forward is over."""
    runner = _runner(arch)
    modeling = sys.modules[type(runner.block_states.layers[0]).__module__]
    before = [getattr(modeling, name) for name in RULES]
    prompt, block = _ids(PROMPT, 3), _ids(BLOCK, 4)
    logits, _ = runner.verify(block, PROMPT, _prefilled(runner, prompt), None)
    want, _ = runner.forward(block, PROMPT, _prefilled(runner, prompt), None)
    _close(logits, want)
    assert [getattr(modeling, name) for name in RULES] == before


def test_a_target_without_gated_deltanet_records_nothing() -> None:
    runner = _runner("qwen3")
    assert runner.block_states.layers == []
    cache = _prefilled(runner, _ids(PROMPT, 5))
    block = _ids(BLOCK, 6)
    runner.verify(block, PROMPT, cache, None)
    assert runner.keep(cache, block, PROMPT, 2, runner.save_state(cache)) == 0
    assert cache.get_seq_length() == PROMPT + 2


def test_commit_refuses_a_forward_that_was_not_recorded() -> None:
    runner = _runner("qwen3_5")
    cache = _prefilled(runner, _ids(PROMPT, 7))
    block = _ids(BLOCK, 8)
    runner.forward(block, PROMPT, cache, None)  # not `verify`: no states per position
    with pytest.raises(RuntimeError, match="recorded"):
        runner.block_states.commit(cache, 2)
