"""Builders for the evaluation tests: a briefly trained tiny target from `draftdeck.drafter.tiny`
(small shape so that it builds in a few seconds), its prompts as token ids, and a chi-square bound."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftdeck.drafter.target import Target
from draftdeck.drafter.tiny import TargetShape, build_target, build_tokenizer, write_prompts

SMALL_SHAPE = TargetShape(
    hidden_size=64, num_hidden_layers=2, intermediate_size=128, max_position_embeddings=512
)


@dataclass
class TinyWorld:
    target_dir: Path
    prompts: Path
    target: Target
    prompt_ids: list[list[int]]

    @property
    def eos_id(self) -> int:
        return int(self.target.tokenizer.eos_token_id)


def build_world(root: Path, *, steps: int = 60, n_prompts: int = 8, seed: int = 0) -> TinyWorld:
    tok_dir = build_tokenizer(root / "tokenizer", vocab_size=512, n_texts=1000, seed=seed)
    target_dir = build_target(
        root / "target", tok_dir, steps=steps, shape=SMALL_SHAPE, batch=8, seq_len=96, lr=1e-2, seed=seed
    )
    prompts = write_prompts(root / "prompts.jsonl", n_prompts, seed=seed + 1)
    target = Target.load(target_dir)
    ids = [
        prompt_ids(target.tokenizer, json.loads(line)["messages"])
        for line in prompts.read_text(encoding="utf-8").splitlines()
    ]
    return TinyWorld(target_dir, prompts, target, ids)


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    )


def chi2_bound(df: int, z: float = 3.09) -> float:
    """Upper quantile of chi-square with `df` degrees of freedom (Wilson-Hilferty; z 3.09 = 0.999)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
