"""A declared column mapping, for shapes no reader can guess (``{src, tgt}`` rows, a medical dataset's
``Question`` / ``Complex_CoT`` / ``Response``): ``--columns KEY=FIELD`` and ``--tags KEY=VALUE`` with
LLaMA-Factory's names (``dataset_info.json``), plus ``reasoning``.

Columns: ``prompt`` and ``query`` (the user turn: the prompt, then the query on the next line, as
LLaMA-Factory joins them), ``response`` (the answer), ``reasoning`` (the answer's reasoning, kept
structured), ``system``, ``history`` (``[user, assistant]`` pairs before), ``tools``; or ``messages``: a
list of turns, read with the tags (``role_tag``, ``content_tag``, ``user_tag``, ``assistant_tag``,
``system_tag``, ``observation_tag``, ``function_tag``; defaults ``role``, ``content``, ``user``,
``assistant``, ``system``, ``observation``, ``function_call``).

A mapping overrides detection for its input: every row is read by it, and a row that lacks a field it
names is rejected as ``format_mismatch`` naming the field. Fields it does not name stay in the row's
meta, as every reader keeps them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from draftdeck.formats import sharegpt
from draftdeck.formats.alpaca import history_messages
from draftdeck.formats.common import (
    ParseContext,
    RowRejected,
    finish_assistant,
    keys_of,
    parse_tools,
    text_of,
)
from draftdeck.formats.model import Conversation, Message
from draftdeck.formats.openai import meta_of, system_text, with_system

FAMILY = "columns"
COLUMN_KEYS = ("prompt", "query", "response", "reasoning", "system", "history", "tools", "messages")
TAG_DEFAULTS = {
    "role_tag": "role",
    "content_tag": "content",
    "user_tag": "user",
    "assistant_tag": "assistant",
    "system_tag": "system",
    "observation_tag": "observation",
    "function_tag": "function_call",
}
# the ShareGPT role each tag's turns become (ShareGPT's reader knows calls and results by these names)
_SHAREGPT_ROLE = {
    "user_tag": "human",
    "assistant_tag": "gpt",
    "system_tag": "system",
    "observation_tag": "observation",
    "function_tag": "function_call",
}


def check_columns(columns: Mapping[str, str]) -> None:
    """Raise ValueError for columns that cannot read any row: an unknown key, ``messages`` beside
    the single-turn columns, or no user turn."""
    unknown = [k for k in columns if k not in COLUMN_KEYS]
    if unknown:
        raise ValueError(f"unknown key {', '.join(unknown)} (known: {', '.join(COLUMN_KEYS)})")
    if not columns:
        return
    if "messages" in columns:
        single = [k for k in ("prompt", "query", "response", "reasoning", "history") if k in columns]
        if single:
            raise ValueError(f"messages=FIELD reads the whole conversation: drop {', '.join(single)}")
    elif "prompt" not in columns and "query" not in columns:
        raise ValueError("name the user turn: prompt=FIELD (and query=FIELD for a second part)")


def check_tags(tags: Mapping[str, str], columns: Mapping[str, str]) -> None:
    """Raise ValueError for tags that name no key, or that have no ``messages`` column to read."""
    unknown = [k for k in tags if k not in TAG_DEFAULTS]
    if unknown:
        raise ValueError(f"unknown key {', '.join(unknown)} (known: {', '.join(TAG_DEFAULTS)})")
    if tags and "messages" not in columns:
        raise ValueError("they name the keys of a messages column's turns: give --columns messages=FIELD too")


def check_mapping(columns: Mapping[str, str], tags: Mapping[str, str]) -> None:
    """Both checks, each message naming its option (raises ValueError)."""
    for name, check in (
        ("--columns", lambda: check_columns(columns)),
        ("--tags", lambda: check_tags(tags, columns)),
    ):
        try:
            check()
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None


def mapping_text(columns: Mapping[str, str], tags: Mapping[str, str]) -> str:
    """The mapping as a user wrote it, for messages and reports."""
    return " ".join([*(f"{k}={v}" for k, v in columns.items()), *(f"{k}={v}" for k, v in tags.items())])


def parse_mapped(value: dict[str, Any], ctx: ParseContext) -> list[Conversation]:
    """Read one row by the declared mapping (ctx.options.columns / tags). Raises RowRejected."""
    columns, tags = dict(ctx.options.columns), dict(ctx.options.tags)
    missing = [f"{field!r} ({key})" for key, field in columns.items() if field not in value]
    if missing:
        raise RowRejected(
            "format_mismatch",
            f"the row has no {', '.join(missing)}, which --columns names; keys: {keys_of(value)}",
        )
    if "messages" in columns:
        return _messages(value, columns, tags, ctx)
    messages: list[Message] = []
    messages.extend(history_messages(value.get(columns["history"]) if "history" in columns else None, ctx))
    parts = [text_of(value[columns[k]], columns[k], ctx) for k in ("prompt", "query") if k in columns]
    messages.append(Message("user", "\n".join(p for p in parts if p)))
    if "response" in columns:
        answer = Message("assistant", text_of(value[columns["response"]], columns["response"], ctx))
        if "reasoning" in columns:
            reasoning = text_of(value[columns["reasoning"]], columns["reasoning"], ctx)
            answer.reasoning = reasoning or None
        messages.append(finish_assistant(answer))
    if "system" in columns:
        messages = with_system(system_text(value[columns["system"]], columns["system"], ctx), messages, ctx)
    tools = parse_tools(value[columns["tools"]], columns["tools"], ctx) if "tools" in columns else []
    meta = meta_of(value, tuple(columns.values()))
    return [Conversation(messages, tools=tools, source_format=FAMILY, meta=meta)]


def _messages(
    value: dict[str, Any], columns: dict[str, str], tags: dict[str, str], ctx: ParseContext
) -> list[Conversation]:
    """A list of turns under the tags' names, read as ShareGPT turns (calls and results included)."""
    field = columns["messages"]
    turns = value[field]
    if not isinstance(turns, list):
        raise RowRejected(
            "format_mismatch", f"{field!r} (messages) is a JSON {type(turns).__name__}, not a list"
        )
    names = {**TAG_DEFAULTS, **tags}
    role_tag, content_tag = names["role_tag"], names["content_tag"]
    roles = {names[tag]: role for tag, role in _SHAREGPT_ROLE.items()}
    canonical = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or role_tag not in turn:
            raise RowRejected("format_mismatch", f"{field}[{i}] has no {role_tag!r} (role_tag)")
        role = roles.get(str(turn[role_tag]))
        if role is None:
            known = ", ".join(f"{names[t]} ({t})" for t in _SHAREGPT_ROLE)
            raise RowRejected(
                "format_mismatch", f"{field}[{i}]: role {turn[role_tag]!r} is none of the tags' {known}"
            )
        canonical.append({"from": role, "value": turn.get(content_tag)})
    row: dict[str, Any] = {"conversations": canonical}
    for key in ("system", "tools"):
        if key in columns:
            row[key] = value[columns[key]]
    [conv] = sharegpt.parse_row(row, ctx)
    conv.source_format = FAMILY
    conv.meta = meta_of(value, tuple(columns.values()))
    return [conv]
