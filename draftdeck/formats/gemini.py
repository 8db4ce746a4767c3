"""Gemini / Vertex AI tuning rows: ``{"systemInstruction"?: {"parts": [...]}, "contents": [{"role":
user|model|function, "parts": [...]}], "tools"?: [{"functionDeclarations": [...]}]}`` (the REST API's
camelCase, or the Python SDK's snake_case: ``system_instruction``, ``function_call``...).

Parts, in order: ``text`` -> text (a part with ``thought: true`` -> reasoning); ``functionCall``
(``name``, ``args``, ``id``?) -> a tool call; ``functionResponse`` (``name``, ``response``, ``id``?) ->
a tool message whose content is the response as JSON; ``inlineData`` (base64) / ``fileData`` (a URI,
never fetched) of an image type -> an image of the message, of any other type -> ``multimodal_content``;
any other part (``executableCode``, ``codeExecutionResult``...) would be lost:
``lost_part``. The thought ``thoughtSignature`` is the API's own token, not conversation: left out.
Function declarations become OpenAI function tools.
"""

from __future__ import annotations

from typing import Any

import orjson

from draftdeck.formats.common import (
    ROLE_ALIASES,
    ParseContext,
    RowRejected,
    TurnBuilder,
    text_of,
    train_flag,
)
from draftdeck.formats.images import base64_ref, ref_from_uri
from draftdeck.formats.model import IMAGE_PLACEHOLDER, Conversation, ImageRef, Message, ToolCall
from draftdeck.formats.openai import meta_of, with_system

FAMILY = "gemini"
SYSTEM_KEYS = ("systemInstruction", "system_instruction")
ROW_KEYS = ("contents", "tools", *SYSTEM_KEYS)
MEDIA_PARTS = ("inlineData", "inline_data", "fileData", "file_data")
IGNORED_PART_KEYS = frozenset({"thought", "thoughtSignature", "thought_signature", "videoMetadata"})


def looks_like(value: dict[str, Any]) -> bool:
    contents = value.get("contents")
    if not isinstance(contents, list):
        return False
    first = contents[0] if contents else None
    return first is None or (isinstance(first, dict) and ("parts" in first or "role" in first))


def _get(d: dict[str, Any], camel: str) -> Any:
    """A field under its camelCase name or the SDK's snake_case one."""
    value = d.get(camel)
    if value is None:
        snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
        value = d.get(snake)
    return value


def _image(part: dict[str, Any], at: str, ctx: ParseContext) -> ImageRef:
    """An ``inlineData`` (base64) or ``fileData`` (a URI: never fetched) part of an image type; any
    other media (audio, video, a PDF), or images when they are refused, is multimodal_content."""
    inline, file = _get(part, "inlineData"), _get(part, "fileData")
    media = inline if isinstance(inline, dict) else file if isinstance(file, dict) else {}
    mime = _get(media, "mimeType")
    if not (isinstance(mime, str) and mime.startswith("image/")) or ctx.options.images != "keep":
        what = f"{mime!r} data" if isinstance(mime, str) else "inline or file data"
        raise RowRejected("multimodal_content", f"{at} holds {what}; no drafter here learns from it")
    ctx.images = True
    if media is inline:
        return base64_ref(media.get("data"), mime, f"{at}.inlineData")
    return ref_from_uri(str(_get(media, "fileUri") or ""), ctx.base_dir, f"{at}.fileData")


def _parts(content: Any, role: str, where: str, ctx: ParseContext) -> list[Message]:
    if not isinstance(content, dict):
        raise RowRejected("unknown_format", f"{where} is a JSON {type(content).__name__}, not a content")
    parts = content.get("parts")
    if isinstance(parts, dict):
        parts = [parts]
    if not isinstance(parts, list):
        raise RowRejected("unknown_format", f"{where}.parts is not a list of parts")
    turn = TurnBuilder(role)
    for i, part in enumerate(parts):
        at = f"{where}.parts[{i}]"
        if not isinstance(part, dict):
            raise RowRejected("unknown_format", f"{at} is a JSON {type(part).__name__}, not a part")
        call, response = _get(part, "functionCall"), _get(part, "functionResponse")
        if "text" in part:
            text = text_of(part["text"], f"{at}.text", ctx)
            (turn.reasons if part.get("thought") is True else turn.texts).append(text)
        elif isinstance(call, dict):
            name, call_id = call.get("name"), call.get("id")
            turn.current.tool_calls.append(
                ToolCall(
                    name=name if isinstance(name, str) else "",
                    arguments=call.get("args", {}),
                    id=call_id if isinstance(call_id, str) else None,
                )
            )
        elif isinstance(response, dict):
            name, call_id = response.get("name"), response.get("id")
            body = response.get("response")
            tool = Message("tool", body if isinstance(body, str) else orjson.dumps(body).decode())
            tool.name = name if isinstance(name, str) else None
            tool.tool_call_id = call_id if isinstance(call_id, str) else None
            turn.result(tool)
        elif any(k in part for k in MEDIA_PARTS):
            turn.current.images.append(_image(part, at, ctx))
            turn.texts.append(IMAGE_PLACEHOLDER)
        else:
            kinds = [k for k in part if k not in IGNORED_PART_KEYS] or ["(empty)"]
            ctx.warn("lost_part", f"{at} is a {kinds[0]!r} part, which no reader keeps")
    return turn.messages(train_flag(content, where, ctx))


def _tools(value: Any, ctx: ParseContext) -> list[dict[str, Any]]:
    """Gemini tools ({functionDeclarations: [...]}) as OpenAI function tools."""
    if value is None:
        return []
    groups = value if isinstance(value, list) else [value]
    out: list[dict[str, Any]] = []
    for i, group in enumerate(groups):
        decls = _get(group, "functionDeclarations") if isinstance(group, dict) else None
        if isinstance(decls, list) and all(isinstance(d, dict) for d in decls):
            out.extend({"type": "function", "function": d} for d in decls)
        elif isinstance(group, dict) and "function" in group:
            out.append(group)
        else:
            keys = ", ".join(sorted(group)) if isinstance(group, dict) else type(group).__name__
            ctx.warn("lost_tools", f"tools[{i}] ({keys}) holds no function declarations DraftDeck reads")
    return out


def parse_row(value: dict[str, Any], ctx: ParseContext) -> list[Conversation]:
    messages: list[Message] = []
    for i, content in enumerate(value["contents"]):
        raw = content.get("role", "user") if isinstance(content, dict) else None
        role = ROLE_ALIASES.get(raw) if isinstance(raw, str) else None
        if role is None:
            raise RowRejected("unknown_role", f"contents[{i}] has role {raw!r}")
        messages.extend(_parts(content, role, f"contents[{i}]", ctx))
    system = None
    for key in SYSTEM_KEYS:
        if value.get(key) is not None:
            found = _parts(value[key], "system", key, ctx)
            system = "".join(m.content for m in found)
            if any(m.role != "system" or m.reasoning or m.tool_calls for m in found):
                ctx.warn("lost_system", f"{key} holds more than text")
    messages = with_system(system or None, messages, ctx)
    meta = meta_of(value, ROW_KEYS)
    return [Conversation(messages, tools=_tools(value.get("tools"), ctx), source_format=FAMILY, meta=meta)]
