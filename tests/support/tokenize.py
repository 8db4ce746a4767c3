"""Shared helpers and session fixtures for the chat/tokenize/shards tests (tokenizers built once,
cached under tests/.tokenizers/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from draftdeck.chat import testing
from draftdeck.chat.render import load_tokenizer
from draftdeck.formats.model import Conversation, Message, SourceRef, ToolCall
from tests.conftest import FIXTURES as TEST_FIXTURES

FIXTURES = TEST_FIXTURES / "tokenize"


@pytest.fixture(scope="session")
def qwen_dir() -> Path:
    return testing.qwen36_tokenizer()


@pytest.fixture(scope="session")
def qwen_tok(qwen_dir: Path) -> Any:
    return load_tokenizer(qwen_dir)


@pytest.fixture(scope="session")
def small_dir() -> Path:
    return testing.small_bpe_tokenizer()


@pytest.fixture(scope="session")
def small_tok(small_dir: Path) -> Any:
    return load_tokenizer(small_dir)


@pytest.fixture(scope="session")
def gentags_dir() -> Path:
    return testing.generation_tags_tokenizer()


@pytest.fixture(scope="session")
def gentags_tok(gentags_dir: Path) -> Any:
    return load_tokenizer(gentags_dir)


def conv(*messages: Message, line: int = 1, tools: list[dict[str, Any]] | None = None) -> Conversation:
    return Conversation(list(messages), tools or [], SourceRef("mem.jsonl", line))


def u(text: str) -> Message:
    return Message("user", text)


def a(text: str, reasoning: str | None = None, calls: list[ToolCall] | None = None) -> Message:
    return Message("assistant", text, reasoning, calls or [])


def id_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The ids of each maximal run of trained tokens."""
    runs: list[list[int]] = []
    prev = 0
    for i, m in zip(ids, mask, strict=True):
        if m and not prev:
            runs.append([])
        if m:
            runs[-1].append(i)
        prev = m
    return runs


def trained_runs(tok: Any, ids: list[int], mask: list[int]) -> list[str]:
    """Decode each maximal run of trained tokens."""
    return [tok.decode(r, skip_special_tokens=False) for r in id_runs(ids, mask)]


def untrained_text(tok: Any, ids: list[int], mask: list[int]) -> str:
    return tok.decode([i for i, m in zip(ids, mask, strict=True) if not m], skip_special_tokens=False)
