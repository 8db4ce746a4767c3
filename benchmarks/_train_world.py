"""The world the training benchmarks run in: a random-init Qwen3 target with the project's small test
BPE, and synthetic shards of random ids whose last 7/8 are trained (benchmarks/train.py on the CPU,
benchmarks/train_gpu.py on a lent GPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def build_world(
    root: Path, *, seq: int, rows: int, hidden: int, layers: int, heads: int, kv_heads: int, vocab: int = 0
) -> tuple[Path, Path]:
    """(target folder, dataset folder) under `root`; the vocabulary is at least the tokenizer's."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from draftdeck.chat.render import tokenizer_fingerprint
    from draftdeck.chat.testing import small_bpe_tokenizer
    from draftdeck.shards.store import ShardRow, ShardWriter, write_pretokenized_metadata

    tok = AutoTokenizer.from_pretrained(small_bpe_tokenizer())
    cfg = Qwen3Config(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        intermediate_size=3 * hidden,
        vocab_size=max(vocab, len(tok) + 8),
        max_position_embeddings=max(4096, seq),
    )
    torch.manual_seed(0)
    target = root / "target"
    Qwen3ForCausalLM(cfg).save_pretrained(target)
    tok.save_pretrained(target)
    rng = np.random.default_rng(0)
    w = ShardWriter(root / "ds", shard_rows=256)
    for i in range(rows):
        mask = np.zeros(seq, np.uint8)
        mask[seq // 8 :] = 1
        w.add(ShardRow(rng.integers(0, len(tok), seq).astype(np.int32), mask, "bench.jsonl", i, -1, False))
    fp = tokenizer_fingerprint(target, tok.chat_template or "", {})
    write_pretokenized_metadata(root / "ds", w.close(), fingerprint=fp, chat_template=tok.chat_template)
    return target, root / "ds"
