"""Tiny random models of the architectures drafters are trained for, built offline from transformers'
own classes: the shapes that matter to DraftDeck (hybrid linear attention, sliding windows, mixtures of
experts) at a size a CPU runs in milliseconds. For tests and benchmarks; weights are random."""

from __future__ import annotations

from typing import Any

# The architectures whose cache needs more than a crop to undo rejected drafts: a recurrent state
# (hybrid Gated DeltaNet) or a sliding window; and plain Qwen3, the reference.
ARCHITECTURES = ("qwen3", "qwen3_5", "qwen3_next", "mistral", "gemma3")
# Qwen3.5/3.6 as published: `Qwen3_5ForConditionalGeneration`, the hybrid text model under a vision tower
PUBLISHED = "qwen3_5_vision"


def tiny_causal_lm(
    arch: str, *, vocab_size: int = 300, hidden: int = 64, layers: int = 4, window: int = 16, seed: int = 0
) -> Any:
    """A `...ForCausalLM` of `arch` in eval mode: `layers` decoder layers of width `hidden`, heads of 16,
    a sliding `window` where the architecture has one."""
    import torch
    import transformers as tf

    small: dict[str, Any] = dict(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // 16, num_key_value_heads=max(1, hidden // 32), head_dim=16,
        max_position_embeddings=4096, tie_word_embeddings=False,
    )  # fmt: skip
    linear: dict[str, Any] = dict(
        linear_num_value_heads=hidden // 16, linear_num_key_heads=max(1, hidden // 32),
        linear_key_head_dim=16, linear_value_head_dim=16,
    )  # fmt: skip
    torch.manual_seed(seed)
    model: Any
    if arch == "qwen3":
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**small))
    elif arch == "qwen3_5":  # three Gated DeltaNet layers for each gated full-attention layer
        model = tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(**small, **linear))
    elif arch == PUBLISHED:
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden,
                      patch_size=8, spatial_merge_size=2, temporal_patch_size=2)  # fmt: skip
        config = tf.Qwen3_5Config(text_config={**small, **linear}, vision_config=vision)
        model = tf.Qwen3_5ForConditionalGeneration(config)
    elif arch == "qwen3_next":  # the same hybrid, with a mixture of experts
        moe: dict[str, Any] = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden // 2,
                   shared_expert_intermediate_size=hidden // 2)  # fmt: skip
        model = tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(**small, **linear, **moe))
    elif arch == "mistral":  # every layer slides
        model = tf.MistralForCausalLM(tf.MistralConfig(**small, sliding_window=window))
    elif arch == "gemma3":  # sliding layers beside global ones
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        model = tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**small, sliding_window=window, layer_types=types))
    else:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join((*ARCHITECTURES, PUBLISHED))}")
    return model.eval()
