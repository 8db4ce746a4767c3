"""A row's source conversation: found in its source file by the line (JSONL) or record index the
tokenizer recorded, within a time budget, and shown as role/text pairs."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from draftdeck.browse.images import is_image_part, shown
from draftdeck.formats.model import IMAGE_PLACEHOLDER, ImageRef

SOURCE_SCAN_SECONDS = 3.0


@dataclass
class SourceRow:
    where: str | None = None  # "file:line" of the row found
    # when the row is a chat: {"role", "text", "parts"}, parts the text and images in order (see shown)
    messages: list[dict[str, Any]] | None = None
    raw: str | None = None  # the row as indented JSON, when it is not
    message: str | None = None  # why nothing (or not all) is shown
    value: Any = None  # the row as read (the image route finds the row's images in it)


def source_where(path: Path, index: int) -> str:
    """Where a source row is, as every message says it: ``file:line`` for JSONL (lines count from 1,
    as editors do), ``file[index]`` for records of a JSON array or a table (they count from 0); by
    the file's own shape, or ``file, row N`` when it cannot be read."""
    from draftdeck.formats.tables import open_reader

    try:
        with open_reader(path) as reader:
            lines = reader.container == "jsonl"
    except Exception:  # gone or unreadable: the number as recorded
        return f"{path.name}, row {index}"
    return f"{path.name}:{index}" if lines else f"{path.name}[{index}]"


def find_source_row(
    path: Path, index: int, seconds: float = SOURCE_SCAN_SECONDS, roots: Sequence[Path] | None = None
) -> SourceRow:
    """The row the tokenizer recorded as `index`: the 1-based line for JSONL, else the 0-based record
    (of a JSON array, a Parquet, Arrow, CSV or TSV table). Image files it names outside `roots` (None:
    anywhere) are shown as such, unlooked-at."""
    from draftdeck.formats.tables import open_reader

    deadline = time.monotonic() + seconds
    found = None
    try:
        with open_reader(path) as reader:
            for raw in reader:
                if (raw.line if raw.line is not None else raw.index) == index:
                    found = raw
                    break
                if time.monotonic() > deadline:
                    return SourceRow(
                        message=f"row {index} of {path.name} is too far into the file to fetch quickly"
                    )
    except Exception as exc:  # any unreadable file is a message in the panel, not a failed page
        return SourceRow(message=f"{path.name} cannot be read: {exc}")
    if found is None:
        return SourceRow(message=f"{path.name} has no line or record {index}")
    if found.error:
        return SourceRow(where=found.where, message=f"{found.where}: {found.reason}")
    messages = conversation(found.value, str(path.parent), roots)
    raw_json = (
        None
        if messages is not None
        else orjson.dumps(found.value, option=orjson.OPT_INDENT_2, default=str).decode()
    )
    return SourceRow(where=found.where, messages=messages, raw=raw_json, value=found.value)


def _chat(value: Any) -> tuple[list[dict[str, Any]], str, str] | None:
    """(messages, role key, text key) of a row of a common chat shape; None for anything else."""
    if not isinstance(value, dict):
        return None
    for key, role_key, text_key in (
        ("messages", "role", "content"),
        ("conversations", "from", "value"),
        ("conversations", "role", "content"),
    ):
        msgs = value.get(key)
        if isinstance(msgs, list) and msgs and all(isinstance(m, dict) and role_key in m for m in msgs):
            return msgs, role_key, text_key
    return None


def conversation(
    value: Any, folder: str | None = None, roots: Sequence[Path] | None = None
) -> list[dict[str, Any]] | None:
    """Role/content pairs from common chat shapes, for display; None when the shape is not a chat.
    Each message's ``parts`` are its text and images in order (draftdeck.browse.images.shown);
    `folder` is the source file's, which relative image paths are relative to."""
    chat = _chat(value)
    if chat is None:
        return None
    msgs, role_key, text_key = chat
    texts = [_text(m, text_key) for m in msgs]
    parts, _ = shown(value, msgs, text_key, texts, folder, roots)
    return [
        {"role": str(m.get(role_key)), "text": text, "parts": p}
        for m, text, p in zip(msgs, texts, parts, strict=True)
    ]


def row_image(value: Any, folder: str | None, k: int) -> ImageRef | None:
    """The k-th image the page numbered in the row (None: the row has no such image)."""
    chat = _chat(value)
    if chat is None or k < 0:
        return None
    msgs, _, text_key = chat
    _, refs = shown(value, msgs, text_key, [_text(m, text_key) for m in msgs], folder)
    return refs[k] if k < len(refs) else None


def _text(m: dict[str, Any], text_key: str) -> str:
    content = m.get(text_key)
    if isinstance(content, list):
        content = "\n".join(
            IMAGE_PLACEHOLDER
            if is_image_part(p)
            else str(p.get("text", p))
            if isinstance(p, dict)
            else str(p)
            for p in content
        )
    parts = [str(content) if content is not None else ""]
    for extra in ("reasoning_content", "reasoning", "tool_calls"):
        if m.get(extra):
            shown = m[extra] if isinstance(m[extra], str) else orjson.dumps(m[extra]).decode()
            parts.append(f"[{extra}] {shown}")
    return "\n".join(p for p in parts if p)
