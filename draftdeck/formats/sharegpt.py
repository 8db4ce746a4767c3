"""ShareGPT: ``{"conversations": [{"from": human|gpt|system|function_call|observation|tool, "value"}],
"system"?, "tools"?}``.

- A top-level ``system`` becomes the first message; ``tools`` may be a list or a JSON string (``"[]"``).
- ``function_call`` turns hold a call ``{"name", "arguments"}`` (or a list of calls) as JSON text; they
  attach to the assistant turn just before them when it has no calls yet, else become their own turn.
- ``observation`` / ``tool`` turns are tool results.
- ``reasoning_content`` on a turn is the reasoning (a leading ``<think>`` block in text too);
  ``<tool_call>`` XML inside text stays text: it is what the model generated.
- Turns with ``role``/``content`` under ``conversations`` (SpecForge) are read as OpenAI messages.
- The same from/value turns under ``messages`` (LLaMA-Factory's sharegpt columns renamed) read the same.
- Turns that mix the conventions read as what they mean: ``from`` with ``content``, ``role`` with
  ``value``.
- LLaMA-Factory's multimodal rows: ``<image>`` placeholders in the turns and an ``images`` list of
  paths relative to the file (read by :mod:`draftdeck.formats.detect` for every shape: see
  :mod:`draftdeck.formats.image_parts`).
"""

from __future__ import annotations

from typing import Any

from draftdeck.formats import openai
from draftdeck.formats.common import (
    EXTRA_KEYS,
    ROLE_ALIASES,
    ParseContext,
    RowRejected,
    finish_assistant,
    parse_tool_call_value,
    parse_tools,
    read_extras,
    reasoning_of,
    text_of,
    tool_call_from_dict,
)
from draftdeck.formats.image_parts import message_images
from draftdeck.formats.model import Conversation, Message

FAMILY = "sharegpt"
FROM_MAP = {
    **ROLE_ALIASES,
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "function_call": "function_call",
}
TURN_KEYS = frozenset(
    {
        "from",
        "value",
        "content",
        "reasoning_content",
        "reasoning",
        "tool_calls",
        "tool_call_id",
        "name",
        "images",
        *EXTRA_KEYS,
    }
)
ROW_KEYS = ("conversations", "system", "tools")


def parse_turn(d: Any, where: str, ctx: ParseContext, messages: list[Message]) -> None:
    """Append the message(s) of one ShareGPT turn to `messages`."""
    if not isinstance(d, dict):
        raise RowRejected("unknown_format", f"{where} is a JSON {type(d).__name__}, not a turn object")
    if "from" not in d and "role" in d:
        messages.append(openai.parse_message(d, where, ctx))
        return
    raw = d.get("from")
    role = FROM_MAP.get(raw) if isinstance(raw, str) else None
    if role is None:
        if raw is None:
            raise RowRejected(
                "unknown_format", f"{where} has no 'from' (keys: {', '.join(sorted(d)) or 'none'})"
            )
        raise RowRejected("unknown_role", f"{where} has from {raw!r}")
    value = d.get("value")
    if value is None and "value" not in d:  # mixed conventions: ShareGPT's from with OpenAI's content
        value = d.get("content")
    if role == "function_call":
        calls = parse_tool_call_value(value, where, ctx)
        prev = messages[-1] if messages else None
        if prev is not None and prev.role == "assistant" and not prev.tool_calls:
            prev.tool_calls = calls
        else:
            messages.append(Message(role="assistant", content="", tool_calls=calls))
        return
    msg = Message(role=role, content=text_of(value, f"{where}.value", ctx))  # type: ignore[arg-type]
    if "images" in d:
        message_images(d, msg, where, ctx)
    msg.reasoning = reasoning_of(d, where, ctx)
    tc = d.get("tool_calls")
    if isinstance(tc, list):
        msg.tool_calls = [
            tool_call_from_dict(c, f"{where}.tool_calls[{i}]", ctx)
            if isinstance(c, dict)
            else parse_tool_call_value(c, f"{where}.tool_calls[{i}]", ctx)[0]
            for i, c in enumerate(tc)
        ]
    if d.get("tool_call_id") is not None:
        msg.tool_call_id = text_of(d["tool_call_id"], f"{where}.tool_call_id", ctx)
    name = d.get("name")
    if isinstance(name, str) and name:
        msg.name = name
    if len(d) > 2:
        read_extras(d, msg, where, ctx)
        for key, v in d.items():
            if v is not None and key not in TURN_KEYS:
                ctx.warn("unrepresentable_field", f"turn field {key!r} has no place in the canonical model")
    messages.append(finish_assistant(msg))


def parse_row(value: dict[str, Any], ctx: ParseContext, key: str = "conversations") -> list[Conversation]:
    """The turns under `key` (`conversations`, or `messages` where LLaMA-Factory's sharegpt column is
    named so)."""
    turns = value[key]
    if not isinstance(turns, list):
        raise RowRejected("unknown_format", f"{key} is a JSON {type(turns).__name__}, not a list")
    messages: list[Message] = []
    append = messages.append
    from_map = FROM_MAP
    for i, turn in enumerate(turns):
        # Fast path, most rows: {"from": str, "value": str} and nothing else.
        if type(turn) is dict and len(turn) == 2:
            src = turn.get("from")
            text = turn.get("value")
            if type(src) is str and type(text) is str:
                role = from_map.get(src)
                if role is not None and role != "function_call":
                    msg = Message(role, text)  # type: ignore[arg-type]
                    append(finish_assistant(msg) if role == "assistant" and "<think>" in text else msg)
                    continue
        parse_turn(turn, f"{key}[{i}]", ctx, messages)
    if "system" in value:
        messages = openai.with_system(openai.system_text(value["system"], "system", ctx), messages, ctx)
    tools = parse_tools(value.get("tools"), "tools", ctx)
    fmt = FAMILY
    known = ROW_KEYS if key == "conversations" else (key, "system", "tools")
    return [Conversation(messages, tools=tools, source_format=fmt, meta=openai.meta_of(value, known))]
