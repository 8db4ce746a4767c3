"""The demo world at the smoke size (`--smoke` of benchmarks/drafters.py and truth.py): the demo's
tokenizer, target and prompts from `draftdeck.drafter.tiny`, in the small shape tests/support/eval.py
builds in seconds (BPE 512, a 64 x 2 target trained briefly at a high rate), so that the script's own
path runs end to end in the tests. It measures nothing: the demo world is `build_tiny_demo`'s."""

from __future__ import annotations

from pathlib import Path

from draftdeck.drafter.tiny import TargetShape, TinyDemo, build_target, build_tokenizer, write_prompts

SHAPE = TargetShape(hidden_size=64, num_hidden_layers=2, intermediate_size=128, max_position_embeddings=512)
# 60 steps at lr 1e-2: the target ends its answers with words, not the placeholders tokenize rejects
TARGET_STEPS = 60


def smoke_world(workdir: Path, *, n_prompts: int, seed: int = 0) -> TinyDemo:
    """`build_tiny_demo`'s folders (tokenizer/, target/, prompts.jsonl) under `workdir`, small."""
    tokenizer = build_tokenizer(workdir / "tokenizer", vocab_size=512, n_texts=1000, seed=seed)
    target = build_target(
        workdir / "target",
        tokenizer,
        steps=TARGET_STEPS,
        shape=SHAPE,
        batch=8,
        seq_len=96,
        lr=1e-2,
        seed=seed,
    )
    prompts = write_prompts(workdir / "prompts.jsonl", n_prompts, seed=seed + 1)
    return TinyDemo(tokenizer, target, prompts)
