"""Placeholder answers: which short answers are padding, not training targets (the design is at the top
of :mod:`draftdeck.convert`). Pure functions of one conversation, shared by the one-process reader and
the convert workers, plus the rule that turns counts into a verdict."""

from __future__ import annotations

from dataclasses import dataclass, replace

import orjson
from xxhash import xxh3_64_intdigest

from draftdeck.formats.model import Conversation

# Answers that are filler wherever they appear (after normalise: "OK." -> "ok", "..." -> ""): a few
# different prompts answered with one of these is enough to call it padding.
FILLERS = frozenset({"", "ok", "okay", "n/a", "todo", "tbd", "placeholder", "…"})
MODES = ("reject", "strip", "keep")


def normalise(text: str) -> str:
    """Case-folded, whitespace collapsed, trailing punctuation dropped."""
    return " ".join(text.lower().split()).rstrip(".!?\u3002\uff01 ")


def placeholder_key(conv: Conversation, max_chars: int) -> tuple[str, ...] | None:
    """The normalised answers of a candidate (every assistant turn short text: no tool calls, no
    reasoning), or None when the row cannot be a placeholder."""
    key = []
    for m in conv.messages:
        if m.role == "assistant":
            if m.tool_calls or m.reasoning or len(m.content) > max_chars * 4:
                return None
            n = normalise(m.content)
            if len(n) > max_chars:
                return None
            key.append(n)
    return tuple(key) if key else None


def prompt_key(conv: Conversation) -> int:
    """A 64-bit hash of what the answers respond to (every message but the assistant's): the same
    answer to the same prompt again is a duplicate, not a placeholder."""
    parts = [(m.role, m.content.strip()) for m in conv.messages if m.role != "assistant"]
    return xxh3_64_intdigest(orjson.dumps(parts))


def strip_answers(conv: Conversation) -> Conversation:
    """The row as a prompt, its placeholder answers removed: ready for regeneration."""
    return replace(conv, messages=[m for m in conv.messages if m.role != "assistant"])


def is_filler(key: tuple[str, ...]) -> bool:
    return all(k in FILLERS for k in key)


@dataclass(frozen=True)
class PlaceholderRule:
    """When an answer key is padding: a known filler on ``filler_rows`` different prompts, or any
    short answer on ``min_rows`` different prompts that are also ``min_share`` of the rows checked."""

    min_rows: int = 32
    min_share: float = 0.2
    filler_rows: int = 3

    def passes(self, key: tuple[str, ...], prompts: int, checked: int) -> bool:
        if is_filler(key):
            return prompts >= self.filler_rows
        return prompts >= self.min_rows and prompts >= self.min_share * checked

    def describe(self, key: tuple[str, ...]) -> str:
        if is_filler(key):
            return f"a known filler answer on at least {self.filler_rows} different prompts"
        return f"threshold: {self.min_rows} different prompts and {self.min_share:.0%} of the rows checked"
