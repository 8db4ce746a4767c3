"""Conversations from input files, for the tokenize job.

The conversion pipeline (``draftdeck.convert.read_conversations``) reads every known chat shape;
when it is importable it is used. Until then (or if it is absent) this module reads the OpenAI
shape only: ``{"messages": [{"role", "content", "reasoning_content"?, "tool_calls"?}], "tools"?}``
(also under the key ``conversations``), enough for tokenizing already converted files.

The reading stage counts into its own report: ``rows_in`` per input row, ``rows_out`` per
conversation yielded, rejections by code. The tokenize stage then counts from those conversations.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from draftdeck.formats.model import Conversation, Message, SourceRef, ToolCall
from draftdeck.formats.readers import RowReader
from draftdeck.progress import Progress, no_progress
from draftdeck.quality import Report

ROLES = {"system", "user", "assistant", "tool"}


def _text(content: Any) -> str | None:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
            elif isinstance(p, str):
                parts.append(p)
            else:
                return None
        return "".join(parts)
    return None


def _tool_call(tc: Any) -> ToolCall | None:
    if not isinstance(tc, dict):
        return None
    fn: dict[str, Any] = tc["function"] if isinstance(tc.get("function"), dict) else tc
    name = fn.get("name")
    if not isinstance(name, str):
        return None
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            return ToolCall(name, json.loads(args), None, tc.get("id"))
        except json.JSONDecodeError:
            return ToolCall(name, None, args, tc.get("id"))
    return ToolCall(name, args, None, tc.get("id"))


def openai_conversation(value: Any, source: SourceRef) -> tuple[Conversation | None, str, str]:
    """(conversation, issue code, reason): the conversation, or None with why it was rejected."""
    if not isinstance(value, dict):
        return None, "not_an_object", f"a JSON {type(value).__name__}, not an object"
    msgs = value.get("messages", value.get("conversations"))
    if not isinstance(msgs, list) or not all(isinstance(m, dict) and "role" in m for m in msgs):
        return None, "unknown_format", "no OpenAI `messages` list of {role, content} (convert the file first)"
    if not msgs:
        return None, "empty_conversation", "the conversation has no messages"
    out = []
    for i, m in enumerate(msgs):
        role = m.get("role")
        if role not in ROLES:
            return None, "unknown_role", f"message {i} has role {role!r}"
        text = _text(m.get("content"))
        if text is None:
            return None, "unknown_format", f"message {i} has content DraftDeck cannot read as text"
        reasoning = m.get("reasoning_content", m.get("reasoning"))
        calls = [_tool_call(tc) for tc in (m.get("tool_calls") or [])]
        if any(c is None for c in calls):
            return None, "unknown_format", f"message {i} has a tool call without a function name"
        out.append(
            Message(
                role,
                text,
                reasoning if isinstance(reasoning, str) else None,
                [c for c in calls if c is not None],
                m.get("tool_call_id"),
                m.get("name"),
            )
        )
    tools = value.get("tools") or []
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError:
            tools = []
    return Conversation(out, tools if isinstance(tools, list) else [], source, "openai"), "", ""


def read_openai(
    paths: Sequence[Path], report: Report, progress: Progress = no_progress
) -> Iterator[Conversation]:
    done = 0
    for path in paths:
        with RowReader(path, display_name=str(path)) as reader:
            for row in reader:
                report.rows_in += 1
                where = row.line if row.line is not None else row.index
                if row.error:
                    report.reject(row.error, row.file, where, row.reason or "")
                    continue
                conv, code, reason = openai_conversation(row.value, SourceRef(row.file, row.line, row.index))
                if conv is None:
                    report.reject(code, row.file, where, reason)
                    continue
                report.rows_out += 1
                report.formats["openai"] += 1
                done += 1
                if done % 1024 == 0:
                    progress(done, None, "rows")
                yield conv


def read_inputs(
    paths: Sequence[Path], report: Report, progress: Progress = no_progress
) -> Iterator[Conversation]:
    """Conversations of `paths`, through the conversion pipeline when it is available."""
    try:
        from draftdeck.convert import read_conversations  # type: ignore[attr-defined]
    except ImportError:
        return read_openai(paths, report, progress)
    return read_conversations(list(paths), report, None, progress)  # type: ignore[no-any-return]
