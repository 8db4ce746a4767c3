"""Speculative decoding on targets whose cache cannot simply be cut back after rejected drafts:
hybrid models with Gated DeltaNet layers (a recurrent state: Qwen3.5/3.6, Qwen3-Next) and
sliding-window attention past its window (Mistral, Gemma 3), and a Mamba-2 hybrid (Bamba), the one
kind still rolled back by replay. Greedy speculative output must equal plain greedy output token for
token, with drafts rejected on most steps (every third draft token is wrong)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

from draftdeck.drafter.eval.spec_decode import (
    ReferenceDrafts,
    TargetRunner,
    generate_plain,
    generate_speculative,
)
from draftdeck.drafter.kinds.dflash.model import DFlashDrafter
from draftdeck.drafter.kinds.dflash.source import DFlashSource
from draftdeck.drafter.model.target import Target
from draftdeck.drafter.tiny_targets import tiny_causal_lm
from tests.support.drafter import tiny_drafter_config

VOCAB, WINDOW, PROMPT, NEW, BLOCK = 300, 16, 24, 40, 4  # prompt + answer pass the window twice over


def _model(arch: str) -> Any:
    return tiny_causal_lm(arch, vocab_size=VOCAB, layers=4, window=WINDOW)


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_next", "mistral", "gemma3"])
def test_greedy_speculative_equals_plain_greedy_after_rejections(arch: str) -> None:
    runner = TargetRunner(Target(_model(arch).eval()), eos_ids=[])
    prompt = torch.randint(3, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(1)).tolist()
    plain = generate_plain(runner, prompt, NEW).output_ids
    spec = generate_speculative(runner, ReferenceDrafts(plain, wrong_every=3), prompt, NEW, BLOCK)
    assert spec.output_ids == plain
    assert 0 < spec.accepted < spec.proposed  # drafts were accepted, and rejected
    # a Gated DeltaNet layer's state is chosen among those its verify forward recorded, not replayed
    assert spec.replayed == 0


def test_a_dflash_drafter_on_a_hybrid_target_is_lossless() -> None:
    """The drafter reads the target's hidden states of committed positions while the target's
    recurrent state is set back under it to the one of the accepted prefix."""
    target = Target(_model("qwen3_5").eval())
    torch.manual_seed(0)
    drafter = DFlashDrafter(tiny_drafter_config(target, block_size=BLOCK))
    runner = TargetRunner(target, eos_ids=[])
    prompt = torch.randint(3, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(2)).tolist()
    plain = generate_plain(runner, prompt, NEW).output_ids
    spec = generate_speculative(runner, DFlashSource(drafter, target), prompt, NEW, BLOCK)
    assert spec.output_ids == plain
    assert spec.steps > 0 and spec.accepted < spec.proposed and spec.replayed == 0


def test_a_mamba_hybrid_is_still_rolled_back_by_replay() -> None:
    """A Mamba-2 layer's state cannot be recorded per position (only Gated DeltaNet's is), so it is
    saved, restored after a rejection, and the accepted tokens run again."""
    config = transformers.BambaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16,
        mamba_n_groups=1, mamba_chunk_size=16,
    )  # fmt: skip
    torch.manual_seed(0)
    runner = TargetRunner(Target(transformers.BambaForCausalLM(config).eval()), eos_ids=[])
    prompt = torch.randint(3, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(3)).tolist()
    plain = generate_plain(runner, prompt, 16).output_ids
    spec = generate_speculative(runner, ReferenceDrafts(plain, wrong_every=3), prompt, 16, BLOCK)
    assert spec.output_ids == plain
    assert 0 < spec.accepted < spec.proposed and spec.replayed > 0
