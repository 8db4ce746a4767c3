"""Builders shared by the drafter tests: a tiny random-init Qwen3 target (in memory or saved as a
local HF folder with the project's small test BPE), and a drafter config for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftdeck.drafter.model.config import DrafterConfig
from draftdeck.drafter.model.target import Target


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


def write_dataset(
    out: Path, rows: list[tuple[list[int], list[int]]], tokenizer_folder: Path, source: str = "gen.jsonl"
) -> Path:
    """A DraftDeck shard folder of (input_ids, loss_mask) rows, with the manifest's tokenizer
    fingerprint computed the way draftdeck.tokenize does."""
    import numpy as np
    from transformers import AutoTokenizer

    from draftdeck.chat.render import tokenizer_fingerprint
    from draftdeck.shards.store import ShardRow, ShardWriter, write_pretokenized_metadata

    template = AutoTokenizer.from_pretrained(tokenizer_folder).chat_template or ""
    w = ShardWriter(out, shard_rows=64)
    for i, (ids, mask) in enumerate(rows):
        w.add(ShardRow(np.asarray(ids, np.int32), np.asarray(mask, np.uint8), source, i, -1, False))
    shards = w.close()
    fp = tokenizer_fingerprint(tokenizer_folder, template, {})
    write_pretokenized_metadata(
        out, shards, fingerprint=fp, chat_template=template, tokenizer_path=tokenizer_folder
    )
    return out


def greedy_rows(
    folder: Path, n: int, prompt_len: int = 6, gen_len: int = 40, seed: int = 0
) -> list[tuple[list[int], list[int]]]:
    """The target's own greedy continuations of random prompts: mask = the generated tokens."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size - 8
    prompts = torch.randint(0, vocab, (n, prompt_len), generator=g)
    with torch.no_grad():
        out = model.generate(
            prompts, max_new_tokens=gen_len, do_sample=False, min_new_tokens=gen_len, pad_token_id=0
        )
    return [(row.tolist(), [0] * prompt_len + [1] * gen_len) for row in out]


CYCLE_START, CYCLE_LEN = 100, 24


def cycle_batch(n: int, length: int, g: torch.Generator, stride: int = 1) -> torch.Tensor:
    """Rows of a counting language: token[i + 1] = token[i] + `stride` in a cycle of CYCLE_LEN ids."""
    start = torch.randint(0, CYCLE_LEN, (n, 1), generator=g)
    return CYCLE_START + (start + stride * torch.arange(length)) % CYCLE_LEN


def learnable_target(folder: Path, steps: int = 60, seed: int = 0, stride: int = 1) -> Path:
    """A tiny Qwen3 target trained briefly on the counting language (counting by `stride`), so that
    its greedy text has structure a drafter can learn; saved with the small test BPE."""
    saved_target(folder, seed, hidden=64, layers=2)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        ids = cycle_batch(16, 32, g, stride)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(folder)
    return folder


@torch.no_grad()
def greedy_text(
    folder: Path, n: int, prompt_len: int = 4, gen_len: int = 28, seed: int = 1
) -> list[tuple[list[int], list[int]]]:
    """The target's own greedy continuations of counting prompts (mask = generated tokens)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = cycle_batch(n, prompt_len, torch.Generator().manual_seed(seed))
    for _ in range(gen_len):
        nxt = model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
    return [(row.tolist(), [0] * prompt_len + [1] * gen_len) for row in ids]
