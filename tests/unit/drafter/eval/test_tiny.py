"""The tiny demo world: a 2,048-token BPE with ChatML and a mask token, a target folder that
AutoModelForCausalLM loads, prompts as messages JSONL; the same seed builds the same files."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import torch

from draftdeck.drafter.tiny import build_target, build_tokenizer, demo_conversations, write_prompts
from tests.support.eval import SMALL_SHAPE

torch.set_num_threads(1)


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


def test_tokenizer_has_chatml_a_mask_token_and_the_asked_vocabulary(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = build_tokenizer(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(str(folder))
    assert len(tok) == 2048
    assert tok.mask_token == "<|mask|>" and tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Count from 3 to 9."}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nCount from 3 to 9.<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert _digest(build_tokenizer(tmp_path / "again")) == _digest(folder)


def _loss(line: str) -> float:
    """The loss a training log line reports."""
    found = re.search(r" loss ([0-9.]+)", line)
    assert found, line
    return float(found[1])


def test_target_trains_loads_and_is_deterministic(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    tok = build_tokenizer(tmp_path / "tok", vocab_size=512, n_texts=500)
    losses: list[str] = []
    kw: dict[str, Any] = dict(steps=12, shape=SMALL_SHAPE, batch=4, seq_len=64, lr=1e-2)
    a = build_target(tmp_path / "a", tok, log=losses.append, **kw)
    b = build_target(tmp_path / "b", tok, **kw)
    first, last = (_loss(line) for line in (losses[0], losses[-1]))
    assert "steps/s" in losses[0] and "s left" in losses[0]  # a slow machine is told apart from a hung one
    assert last < first  # it learns
    model = AutoModelForCausalLM.from_pretrained(str(a))
    assert model.config.num_hidden_layers == SMALL_SHAPE.num_hidden_layers
    assert model.config.vocab_size == 512
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_prompts_are_messages_jsonl_without_answers(tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl", 25, seed=4)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 25
    assert all([m["role"] for m in r["messages"]] == ["user"] for r in rows)
    assert [r["messages"][0] for r in rows] == [c[0] for c in demo_conversations(25, 4)]
