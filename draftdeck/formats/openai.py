"""OpenAI chat messages: ``{"messages": [{"role", "content", ...}], "tools"?}``.

Content may be a string or typed parts (``{type: text, text|value}``, reasoning parts, tool_call
parts, image parts: see :mod:`draftdeck.formats.image_parts`; a message's own ``images`` list beside
``<image>`` placeholders in its text is read too). Assistant reasoning comes from
``reasoning_content`` / ``reasoning`` / reasoning parts, or a leading ``<think>...</think>`` block in
the text. Tool calls from ``tool_calls`` (or the legacy
``function_call``); tool results have role ``tool`` (legacy ``function``) and ``tool_call_id``. The
legacy top-level ``functions`` list is the row's tools when it has no ``tools``.
"""

from __future__ import annotations

from typing import Any

from draftdeck.formats.common import (
    EXTRA_KEYS,
    ROLE_ALIASES,
    ParseContext,
    RowRejected,
    finish_assistant,
    parse_content,
    parse_tool_call_value,
    parse_tools,
    read_extras,
    reasoning_of,
    text_of,
    tool_call_from_dict,
)
from draftdeck.formats.image_parts import message_images
from draftdeck.formats.model import Conversation, Message

FAMILY = "openai"
ROLE_MAP = ROLE_ALIASES
MESSAGE_KEYS = frozenset(
    {
        "role",
        "content",
        "reasoning_content",
        "reasoning",
        "thinking",
        "tool_calls",
        "tool_call_id",
        "name",
        "function_call",
        "tool_call_ids",
        "value",
        "images",
        *EXTRA_KEYS,
    }
)
ROW_KEYS = ("messages", "tools", "system")


def parse_message(d: Any, where: str, ctx: ParseContext, role_map: dict[str, str] = ROLE_MAP) -> Message:
    """One OpenAI-style message dict into a :class:`Message`; raises RowRejected on an unknown role."""
    if not isinstance(d, dict):
        raise RowRejected("unknown_format", f"{where} is a JSON {type(d).__name__}, not a message object")
    raw_role = d.get("role")
    role = role_map.get(raw_role) if isinstance(raw_role, str) else None
    if role is None:
        if raw_role is None:
            raise RowRejected(
                "unknown_format", f"{where} has no role (keys: {', '.join(sorted(d)) or 'none'})"
            )
        raise RowRejected("unknown_role", f"{where} has role {raw_role!r}")
    content = d.get("content")
    if content is None and "value" in d:  # mixed conventions: OpenAI's role with ShareGPT's value
        content = d["value"]
    parts = parse_content(content, where, ctx)
    msg = Message(role=role, content=parts.text, images=parts.images)  # type: ignore[arg-type]
    if "images" in d:
        message_images(d, msg, where, ctx)
    reasoning = reasoning_of(d, where, ctx)
    msg.reasoning = reasoning if reasoning is not None else parts.reasoning
    calls = list(parts.tool_calls)
    tc = d.get("tool_calls")
    if isinstance(tc, list):
        for i, call in enumerate(tc):
            if isinstance(call, dict):
                calls.append(tool_call_from_dict(call, f"{where}.tool_calls[{i}]", ctx))
            else:
                calls.extend(parse_tool_call_value(call, f"{where}.tool_calls[{i}]", ctx))
    elif tc is not None:
        calls.extend(parse_tool_call_value(tc, f"{where}.tool_calls", ctx))
    if d.get("function_call") is not None:
        calls.extend(parse_tool_call_value(d["function_call"], f"{where}.function_call", ctx))
    msg.tool_calls = calls
    call_id = d.get("tool_call_id")
    if call_id is None and isinstance(d.get("tool_call_ids"), list) and d["tool_call_ids"]:
        ids = d["tool_call_ids"]
        call_id = ids[0]
        if len(ids) > 1:
            ctx.warn(
                "unrepresentable_field", f"{where} answers {len(ids)} tool calls; only the first id was kept"
            )
    if call_id is not None:
        msg.tool_call_id = text_of(call_id, f"{where}.tool_call_id", ctx)
    name = d.get("name")
    if isinstance(name, str) and name:
        msg.name = name
    if len(d) > 2:
        read_extras(d, msg, where, ctx)
        for key, value in d.items():
            if value is not None and key not in MESSAGE_KEYS:
                ctx.warn(
                    "unrepresentable_field", f"message field {key!r} has no place in the canonical model"
                )
    return finish_assistant(msg)


def parse_messages(items: Any, where: str, ctx: ParseContext) -> list[Message]:
    if not isinstance(items, list):
        raise RowRejected(
            "unknown_format", f"{where} is a JSON {type(items).__name__}, not a list of messages"
        )
    out: list[Message] = []
    append = out.append
    role_map = ROLE_MAP
    for i, d in enumerate(items):
        # Fast path, most rows: {"role": str, "content": str} and nothing else.
        if type(d) is dict and len(d) == 2:
            role = d.get("role")
            content = d.get("content")
            if type(role) is str and type(content) is str:
                mapped = role_map.get(role)
                if mapped is not None:
                    msg = Message(mapped, content)  # type: ignore[arg-type]
                    append(finish_assistant(msg) if mapped == "assistant" and "<think>" in content else msg)
                    continue
        append(parse_message(d, f"{where}[{i}]", ctx))
    return out


def meta_of(value: dict[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    """Top-level fields the model has no place for, kept verbatim (ids, categories...)."""
    return {k: v for k, v in value.items() if k not in known}


def system_text(value: Any, where: str, ctx: ParseContext) -> str | None:
    """A top-level system prompt: a string, or text blocks (Anthropic); None when there is none.
    Anything else cannot be kept: ``lost_system``."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, list):
        texts = []
        for i, block in enumerate(value):
            if isinstance(block, str):
                texts.append(block)
            elif isinstance(block, dict) and block.get("type", "text") == "text":
                texts.append(text_of(block.get("text"), f"{where}[{i}].text", ctx))
            else:
                kind = block.get("type") if isinstance(block, dict) else type(block).__name__
                ctx.warn("lost_system", f"{where}[{i}] is a {kind!r} block, not text")
        return "".join(texts)
    ctx.warn("lost_system", f"{where} is a JSON {type(value).__name__}, not text")
    return None


def with_system(system: str | None, messages: list[Message], ctx: ParseContext) -> list[Message]:
    """`messages` with a top-level system prompt first. When they open with a system message of
    other text, both are kept in order (``system_conflict``); the same text is kept once."""
    if system is None:
        return messages
    first = messages[0] if messages else None
    if first is not None and first.role == "system":
        if first.content == system:
            return messages
        ctx.warn("system_conflict", "a top-level system prompt and a different first system message")
    return [Message(role="system", content=system), *messages]


def parse_row(value: dict[str, Any], ctx: ParseContext, key: str = "messages") -> list[Conversation]:
    messages = parse_messages(value[key], key, ctx)
    if "system" in value:
        messages = with_system(system_text(value["system"], "system", ctx), messages, ctx)
    tools = parse_tools(value.get("tools"), "tools", ctx)
    known: tuple[str, ...] = (key, "tools", "system")
    if not tools and value.get("functions") is not None:
        tools, known = legacy_functions(value["functions"], ctx), (*known, "functions")
    meta = meta_of(value, known)
    return [Conversation(messages, tools=tools, source_format=FAMILY, meta=meta)]


def legacy_functions(value: Any, ctx: ParseContext) -> list[dict[str, Any]]:
    """OpenAI's legacy ``functions`` list (beside messages whose answers carry ``function_call``) as
    the row's tools: the template renders the definitions the calls depend on."""
    return [
        f if "function" in f else {"type": "function", "function": f}
        for f in parse_tools(value, "functions", ctx)
    ]
