"""Anthropic Messages: ``{"system"?: text | text blocks, "messages": [{"role", "content": text | blocks}],
"tools"?: [{"name", "description", "input_schema"}]}`` (the API's request shape, and Bedrock's Claude
fine-tuning rows).

Blocks, in order, become the canonical messages:

- ``text`` -> the message's text; ``thinking`` -> its reasoning (the ``signature`` is the API's proof
  that the reasoning is Claude's, not conversation: it is left out); ``redacted_thinking`` -> the
  message's ``redacted_reasoning`` (encrypted: kept so the row round-trips, shown by no template,
  warned as ``redacted_reasoning``).
- ``tool_use`` -> a tool call with its ``id``, ``name`` and ``input`` as the arguments.
- ``tool_result`` (inside a user turn) -> a tool message answering ``tool_use_id``, its ``content`` a
  string or text blocks, ``is_error`` kept; text beside the results stays a user message, in order.
- ``image`` -> an image of the message (its ``source``: base64 data; a URL, never fetched, is
  ``image_url_unread``), an IMAGE_PLACEHOLDER in its text where it stood, in a tool result too;
  ``document`` -> ``multimodal_content``; any other block would be lost: ``lost_part``.

Tool definitions become OpenAI function tools (``input_schema`` -> ``parameters``), what chat
templates render.
"""

from __future__ import annotations

from typing import Any

from draftdeck.formats.common import (
    ROLE_ALIASES,
    ParseContext,
    RowRejected,
    TurnBuilder,
    finish_assistant,
    parse_tools,
    text_of,
    train_flag,
)
from draftdeck.formats.images import anthropic_source
from draftdeck.formats.model import IMAGE_PLACEHOLDER, Conversation, ImageRef, Message, ToolCall
from draftdeck.formats.openai import meta_of, system_text, with_system

FAMILY = "anthropic"
# Block types only Anthropic's API has (its server tools' blocks included: no reader keeps those, and
# the row is refused as lost_part under its own family's name).
BLOCK_TYPES = frozenset(
    {
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
        "document",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "search_result",
        "container_upload",
    }
)
MEDIA_BLOCKS = ("image", "document")
ROW_KEYS = ("messages", "system", "tools")


def looks_like(value: dict[str, Any]) -> bool:
    """Whether a row of role/content messages uses Anthropic's blocks (or a system of blocks, or
    Anthropic tool definitions): the OpenAI reader would lose them."""
    system = value.get("system")
    if isinstance(system, list):
        return True
    tools = value.get("tools")
    if isinstance(tools, list) and tools and isinstance(tools[0], dict) and "input_schema" in tools[0]:
        return True
    messages = value.get("messages")
    if not isinstance(messages, list):
        return False
    for m in messages:
        content = m.get("content") if type(m) is dict else None
        if type(content) is list:
            for block in content:
                if type(block) is dict and (
                    block.get("type") in BLOCK_TYPES or (block.get("type") == "image" and "source" in block)
                ):
                    return True
    return False


def _image_block(block: dict[str, Any], where: str, ctx: ParseContext) -> ImageRef:
    """An ``image`` block's image; refused as multimodal_content when the options refuse images."""
    if ctx.options.images != "keep":
        raise RowRejected(
            "multimodal_content", f"{where} is an 'image' block; images are refused (--images reject)"
        )
    source = block.get("source")
    if not isinstance(source, dict):
        raise RowRejected("image_missing", f"{where} is an 'image' block without a source")
    return anthropic_source(source, f"{where}.source", ctx)


def _result(block: dict[str, Any], where: str, ctx: ParseContext) -> Message:
    """A tool_result block as a tool message: its content a string, or text and image blocks."""
    result = Message("tool")
    content = block.get("content")
    if content is None or isinstance(content, str):
        result.content = content or ""
        return result
    blocks = content if isinstance(content, list) else [content]
    texts = []
    for i, item in enumerate(blocks):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "text":
            texts.append(text_of(item.get("text"), f"{where}[{i}].text", ctx))
        elif kind == "image":
            result.images.append(_image_block(item, f"{where}[{i}]", ctx))
            texts.append(IMAGE_PLACEHOLDER)
        elif kind in MEDIA_BLOCKS:
            raise RowRejected("multimodal_content", f"{where}[{i}] is a {kind!r} block")
        else:
            ctx.warn("lost_part", f"{where}[{i}] is a {kind or type(item).__name__!r} block, not text")
    result.content = "".join(texts)
    return result


def _message(d: Any, where: str, ctx: ParseContext) -> list[Message]:
    """The canonical messages of one Anthropic message (a user turn of tool results gives several)."""
    if not isinstance(d, dict):
        raise RowRejected("unknown_format", f"{where} is a JSON {type(d).__name__}, not a message object")
    raw_role = d.get("role")
    role = ROLE_ALIASES.get(raw_role) if isinstance(raw_role, str) else None
    if role is None:
        raise RowRejected("unknown_role", f"{where} has role {raw_role!r}")
    content = d.get("content")
    if not isinstance(content, list):
        msg = Message(role, text_of(content, f"{where}.content", ctx))  # type: ignore[arg-type]
        msg.train = train_flag(d, where, ctx)
        return [finish_assistant(msg)]
    turn = TurnBuilder(role)
    for i, block in enumerate(content):
        at = f"{where}.content[{i}]"
        if isinstance(block, str):
            turn.texts.append(block)
            continue
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            turn.texts.append(text_of(block.get("text"), f"{at}.text", ctx))
        elif kind == "thinking":
            turn.reasons.append(text_of(block.get("thinking"), f"{at}.thinking", ctx))
        elif kind == "redacted_thinking":
            turn.current.redacted_reasoning = text_of(block.get("data"), f"{at}.data", ctx)
            ctx.warn("redacted_reasoning", f"{at} is redacted thinking: kept, but no template shows it")
        elif kind == "tool_use":
            name = block.get("name")
            call_id = block.get("id")
            turn.current.tool_calls.append(
                ToolCall(
                    name=name if isinstance(name, str) else "",
                    arguments=block.get("input", {}),
                    id=call_id if isinstance(call_id, str) else None,
                )
            )
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            result = _result(block, f"{at}.content", ctx)
            result.tool_call_id = call_id if isinstance(call_id, str) else None
            result.is_error = block.get("is_error") is True
            turn.result(result)
        elif kind == "image":
            turn.current.images.append(_image_block(block, at, ctx))
            turn.texts.append(IMAGE_PLACEHOLDER)
        elif kind in MEDIA_BLOCKS:
            raise RowRejected("multimodal_content", f"{at} is a {kind!r} block; no drafter here learns it")
        else:
            ctx.warn("lost_part", f"{at} is a {kind or type(block).__name__!r} block, which no reader keeps")
    return turn.messages(train_flag(d, where, ctx))


def tools_of(value: Any, ctx: ParseContext) -> list[dict[str, Any]]:
    """Anthropic tool definitions as OpenAI function tools; OpenAI-shaped ones as they are."""
    tools = parse_tools(value, "tools", ctx)
    out = []
    for t in tools:
        if "input_schema" in t and "function" not in t:
            fn = {k: v for k, v in t.items() if k not in ("input_schema", "type")}
            fn["parameters"] = t["input_schema"]
            out.append({"type": "function", "function": fn})
        else:
            out.append(t)
    return out


def parse_row(value: dict[str, Any], ctx: ParseContext) -> list[Conversation]:
    items = value.get("messages")
    if not isinstance(items, list):
        raise RowRejected("unknown_format", "messages is not a list of messages")
    messages: list[Message] = []
    for i, d in enumerate(items):
        messages.extend(_message(d, f"messages[{i}]", ctx))
    messages = with_system(system_text(value.get("system"), "system", ctx), messages, ctx)
    meta = meta_of(value, ROW_KEYS)
    return [Conversation(messages, tools=tools_of(value.get("tools"), ctx), source_format=FAMILY, meta=meta)]
