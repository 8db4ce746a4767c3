"""Hermes-style tool calls written as text (NousResearch's function-calling sets and the many mixes
built on them): ``<tool_call>{"name", "arguments"}</tool_call>`` inside assistant text and
``<tool_response>...</tool_response>`` inside tool turns, in OpenAI or ShareGPT rows.

With ``tool_tags="parse"`` (the default) they become what the target's own template renders from
structure: tool calls on the assistant message (the text around them stays its content) and one
tool message per response (named after the call when its JSON says so). A block that is not JSON
stays text under ``tool_tags_unparsed``, with the rest of its message as it was. With
``tool_tags="keep"`` the text is left alone. A row whose tags were lifted counts as ``hermes``.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from draftdeck.formats.common import ParseContext, parse_arguments
from draftdeck.formats.model import Conversation, Message, ToolCall

FAMILY = "hermes"
CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
RESPONSE = re.compile(r"<tool_response>\s*(.*?)\s*</tool_response>", re.S)


def has_tags(messages: list[Message]) -> bool:
    return any(
        ("<tool_call>" in m.content if m.role == "assistant" else "<tool_response>" in m.content)
        for m in messages
        if m.role in ("assistant", "tool")
    )


def raw_has_tags(value: dict[str, Any]) -> bool:
    """Whether a raw row's text holds the tags (for ``--from hermes``), before any parsing."""
    text = orjson.dumps(value)
    return b"<tool_call>" in text or b"<tool_response>" in text


def _calls(msg: Message, where: str, ctx: ParseContext) -> Message:
    found = list(CALL.finditer(msg.content))
    calls: list[ToolCall] = []
    for m in found:
        try:
            value = orjson.loads(m.group(1))
        except orjson.JSONDecodeError:
            value = None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            ctx.warn("tool_tags_unparsed", f"{where}: a <tool_call> block is not a JSON call; kept as text")
            return msg
        args, raw = parse_arguments(value.get("arguments", value.get("parameters", {})), where, ctx)
        call_id = value.get("id")
        calls.append(ToolCall(value["name"], args, raw, call_id if isinstance(call_id, str) else None))
    msg.content = CALL.sub("", msg.content).strip()
    msg.tool_calls = [*msg.tool_calls, *calls]
    return msg


def _responses(msg: Message, where: str, ctx: ParseContext) -> list[Message]:
    found = list(RESPONSE.finditer(msg.content))
    if not found:
        return [msg]
    outside = RESPONSE.sub("", msg.content).strip()
    if outside:
        ctx.warn("tool_tags_unparsed", f"{where}: text outside the <tool_response> blocks; kept as text")
        return [msg]
    out = []
    for m in found:
        body = m.group(1)
        tool = Message("tool", body, tool_call_id=msg.tool_call_id, name=msg.name, train=msg.train)
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError:
            value = None
        if isinstance(value, dict) and isinstance(value.get("name"), str) and tool.name is None:
            tool.name = value["name"]
        out.append(tool)
    return out


def lift(conv: Conversation, ctx: ParseContext) -> bool:
    """Turn the tags of `conv` into structure, in place; True when any was lifted."""
    out: list[Message] = []
    lifted = False
    for i, m in enumerate(conv.messages):
        where = f"message {i}"
        if m.role == "assistant" and "<tool_call>" in m.content:
            before = len(m.tool_calls)
            out.append(_calls(m, where, ctx))
            lifted |= len(m.tool_calls) > before
        elif m.role == "tool" and "<tool_response>" in m.content:
            parts = _responses(m, where, ctx)
            lifted |= parts[0] is not m
            out.extend(parts)
        else:
            out.append(m)
    conv.messages = out
    return lifted
