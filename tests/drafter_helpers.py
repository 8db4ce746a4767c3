"""Builders shared by the drafter tests: a tiny random-init Qwen3 target (in memory or saved as a
local HF folder with the project's small test BPE), and a drafter config for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftdeck.drafter.config import DrafterConfig
from draftdeck.drafter.target import Target


def tiny_target_config(vocab_size: int = 300, layers: int = 4, hidden: int = 64, **kw: Any) -> Any:
    from transformers import Qwen3Config

    values: dict[str, Any] = dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        intermediate_size=2 * hidden,
        vocab_size=vocab_size,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    values.update(kw)
    return Qwen3Config(**values)


def tiny_target(seed: int = 0, **kw: Any) -> Target:
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    return Target(Qwen3ForCausalLM(tiny_target_config(**kw)))


def tiny_drafter_config(target: Target, *, layers: int = 1, block_size: int = 4, **kw: Any) -> DrafterConfig:
    kw.setdefault("mask_token_id", target.config.vocab_size - 1)
    return DrafterConfig.from_target(target.config, layers=layers, block_size=block_size, **kw)


def saved_target(folder: Path, seed: int = 0, **kw: Any) -> Path:
    """A tiny Qwen3 target saved with the small test BPE tokenizer (vocabulary sized to fit it)."""
    from transformers import AutoTokenizer

    from draftdeck.chat.testing import small_bpe_tokenizer

    tok = AutoTokenizer.from_pretrained(small_bpe_tokenizer())
    kw.setdefault("vocab_size", len(tok) + 8)
    target = tiny_target(seed, **kw)
    target.model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
