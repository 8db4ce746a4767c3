"""Speculative decoding on targets whose cache cannot simply be cut back after rejected drafts:
hybrid models with Gated DeltaNet layers (a recurrent state: Qwen3.5/3.6, Qwen3-Next) and
sliding-window attention past its window (Mistral, Gemma 3). Greedy speculative output must equal
plain greedy output token for token, with drafts rejected on most steps."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from draftdeck.drafter.eval.spec_decode import (
    DFlashSource,
    TargetRunner,
    generate_plain,
    generate_speculative,
)
from draftdeck.drafter.model.dflash import DFlashDrafter
from draftdeck.drafter.model.target import Target
from tests.support.drafter import tiny_drafter_config

VOCAB, WINDOW, PROMPT, NEW, BLOCK = 300, 16, 24, 40, 4  # prompt + answer pass the window twice over
SMALL: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=512, tie_word_embeddings=False,
)  # fmt: skip
LINEAR: dict[str, Any] = dict(
    linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16
)


def _model(arch: str) -> Any:
    import transformers as tf

    torch.manual_seed(0)
    if arch == "qwen3_5":  # 3 Gated DeltaNet layers for each gated full-attention layer
        return tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(num_hidden_layers=4, **SMALL, **LINEAR))
    if arch == "qwen3_next":  # the same hybrid, with a mixture of experts
        moe = dict(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32
        )
        return tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(num_hidden_layers=4, **SMALL, **LINEAR, **moe))
    if arch == "mistral":
        return tf.MistralForCausalLM(tf.MistralConfig(num_hidden_layers=2, sliding_window=WINDOW, **SMALL))
    if arch == "gemma3":  # sliding-window layers beside a global one
        layer_types = ["sliding_attention", "full_attention"]
        config = tf.Gemma3TextConfig(
            num_hidden_layers=2, sliding_window=WINDOW, layer_types=layer_types, **SMALL
        )
        return tf.Gemma3ForCausalLM(config)
    raise ValueError(arch)


class _MostlyRight:
    """Proposes the target's own greedy continuation with every third draft token wrong: a rejection
    on most verify steps, and accepted drafts before it."""

    layer_ids: list[int] | None = None

    def __init__(self, continuation: list[int]):
        self.continuation, self.start = continuation, 0

    def begin(self, prompt_ids: list[int]) -> None:
        self.start = len(prompt_ids)

    def observe(self, features: torch.Tensor | None) -> None:
        pass

    def propose(self, committed: list[int], k: int) -> list[int]:
        at = len(committed) - self.start
        drafts = self.continuation[at : at + k]
        return [(t + 1) % VOCAB if (at + i) % 3 == 2 else t for i, t in enumerate(drafts)]


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_next", "mistral", "gemma3"])
def test_greedy_speculative_equals_plain_greedy_after_rejections(arch: str) -> None:
    runner = TargetRunner(Target(_model(arch).eval()), eos_ids=[])
    prompt = torch.randint(3, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(1)).tolist()
    plain = generate_plain(runner, prompt, NEW).output_ids
    spec = generate_speculative(runner, _MostlyRight(plain), prompt, NEW, BLOCK)
    assert spec.output_ids == plain
    assert 0 < spec.accepted < spec.proposed  # drafts were accepted, and rejected
    hybrid = arch.startswith("qwen3")
    # a recurrent state is rolled back by running the accepted tokens again; attention is only cut
    assert (spec.replayed > 0) == hybrid


def test_a_dflash_drafter_on_a_hybrid_target_is_lossless() -> None:
    """The drafter reads the target's hidden states of committed positions while the target's
    recurrent state is rolled back under it."""
    target = Target(_model("qwen3_5").eval())
    torch.manual_seed(0)
    drafter = DFlashDrafter(tiny_drafter_config(target, block_size=BLOCK))
    runner = TargetRunner(target, eos_ids=[])
    prompt = torch.randint(3, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(2)).tolist()
    plain = generate_plain(runner, prompt, NEW).output_ids
    spec = generate_speculative(runner, DFlashSource(drafter, target), prompt, NEW, BLOCK)
    assert spec.output_ids == plain
    assert spec.steps > 0 and spec.replayed > 0
