"""What the mix reads of one converted row (a dict in the JSONL shape convert wrote): its facts for
the filters and the composition table, and its duplicate key. Pure functions of the row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from xxhash import xxh3_64_intdigest

from draftdeck.formats.model import PROVENANCE_KEY
from draftdeck.formats.writers import encode_line
from draftdeck.mix.recipe import MixSource


@dataclass(frozen=True, slots=True)
class Shape:
    """Where a JSONL shape keeps its turns: the list's key, a turn's role key and text key."""

    turns: str
    role: str
    text: str
    system: str
    assistant: str


SHAPES = {
    "openai": Shape("messages", "role", "content", "system", "assistant"),
    "sharegpt": Shape("conversations", "from", "value", "system", "gpt"),
}


@dataclass(frozen=True, slots=True)
class Facts:
    turns: int  # messages other than system
    chars: int  # characters of every message's text and reasoning
    answer_chars: int  # the same of the assistant messages: what the drafter is trained on
    tool_calls: bool
    reasoning: bool


def facts(row: dict[str, Any], shape: Shape) -> Facts:
    turns = chars = answer = 0
    tools = reasoning = False
    for m in row[shape.turns]:
        role = m.get(shape.role)
        n = len(_text(m.get(shape.text))) + len(m.get("reasoning_content") or "")
        chars += n
        if role != shape.system:
            turns += 1
        if role == shape.assistant:
            answer += n
            tools = tools or bool(m.get("tool_calls"))
            reasoning = reasoning or bool(m.get("reasoning_content"))
    return Facts(turns, chars, answer, tools, reasoning)


def filter_reason(source: MixSource, f: Facts) -> str | None:
    """Why `source`'s filters leave a row out (None: they keep it)."""
    if source.min_turns is not None and f.turns < source.min_turns:
        return f"{f.turns} turns, under min_turns {source.min_turns}"
    if source.max_turns is not None and f.turns > source.max_turns:
        return f"{f.turns} turns, above max_turns {source.max_turns}"
    if source.min_chars is not None and f.chars < source.min_chars:
        return f"{f.chars:,} characters, under min_chars {source.min_chars:,}"
    if source.max_chars is not None and f.chars > source.max_chars:
        return f"{f.chars:,} characters, above max_chars {source.max_chars:,}"
    if source.has_tool_calls is not None and f.tool_calls != source.has_tool_calls:
        return (
            "no tool calls (has_tool_calls: true)"
            if source.has_tool_calls
            else "tool calls (has_tool_calls: false)"
        )
    if source.has_reasoning is not None and f.reasoning != source.has_reasoning:
        return (
            "no reasoning (has_reasoning: true)"
            if source.has_reasoning
            else "reasoning (has_reasoning: false)"
        )
    return None


def duplicate_key(row: dict[str, Any], shape: Shape) -> int:
    """A 64-bit hash of the normalised conversation: each message's role, text without surrounding
    white space, reasoning, tool calls and training flag (what convert's duplicate check compares),
    so the same conversation from two sources, in two shapes, has one key."""
    parts: list[Any] = []
    for m in row[shape.turns]:
        text = m.get(shape.text) or ""
        # content parts (a message with images): as they are, each image named by its content's hash
        parts.append((m.get(shape.role), text.strip() if isinstance(text, str) else text,
                      m.get("reasoning_content"), m.get("tool_calls"), m.get("weight")))  # fmt: skip
    images = row.get("images")  # ShareGPT's: the same text with other images is another conversation
    return xxh3_64_intdigest(orjson.dumps([parts, images] if images else parts))


def _text(content: Any) -> str:
    """A message's text: its content, or the text of its content parts (a message with images)."""
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return content or ""


def origin(row: dict[str, Any]) -> tuple[str, int | None]:
    """(file, row) the converted row came from, as its provenance says."""
    prov = row.get(PROVENANCE_KEY)
    if isinstance(prov, dict):
        return str(prov.get("file") or "?"), prov.get("row") if isinstance(prov.get("row"), int) else None
    return "?", None


_TAIL = b',"' + PROVENANCE_KEY.encode() + b'":'


def named_line(line: bytes, name: bytes, repeat: int = 0) -> bytes:
    """A converted JSONL line whose provenance also names its mix source (and its repeat number): the
    bytes ``encode_line(with_source(orjson.loads(line), name, repeat))`` gives, without parsing the
    whole row when the provenance is its last key (as convert writes it)."""
    at = line.rfind(_TAIL)
    if at > 0 and line.endswith(b"}}\n"):
        try:
            prov = orjson.loads(line[at + len(_TAIL) : -2])
        except orjson.JSONDecodeError:  # the provenance is not the last key
            prov = None
        if isinstance(prov, dict):
            return line[:at] + _TAIL + orjson.dumps(_named(prov, name.decode(), repeat)) + b"}\n"
    return encode_line(with_source(orjson.loads(line), name.decode(), repeat))


def with_source(row: dict[str, Any], name: str, repeat: int = 0) -> dict[str, Any]:
    """`row` whose provenance names its mix source (beside the original file and row) and, for a
    repeat of an upsampled source, which repeat it is (so later duplicate checks know it is one)."""
    prov = row.get(PROVENANCE_KEY)
    row[PROVENANCE_KEY] = _named(prov if isinstance(prov, dict) else {}, name, repeat)
    return row


def _named(prov: dict[str, Any], name: str, repeat: int) -> dict[str, Any]:
    out = {**prov, "source": name}
    out.pop("repeat", None)  # a repeat of an earlier mix: this mix decides again
    if repeat:
        out["repeat"] = repeat
    return out
