"""glaive-function-calling (v2 and its derivatives): ``{"system": "SYSTEM: ... -\\n{function JSON}\\n\\n
{function JSON}", "chat": "USER: ...\\n\\n\\nASSISTANT: <functioncall> {...} <|endoftext|>\\n\\n\\n
FUNCTION RESPONSE: {...}\\n\\n\\nASSISTANT: ... <|endoftext|>"}``.

- The system text loses its ``SYSTEM:`` marker; the function definitions after it become OpenAI
  function tools (what the target's template renders) and the prose stays the system prompt. When
  they do not parse, the whole text stays the system prompt (``tools_kept_as_text``).
- The chat is cut at the ``USER:`` / ``ASSISTANT:`` / ``FUNCTION RESPONSE:`` markers that open a line;
  ``<|endoftext|>`` (the source model's end of turn, not the target's) is removed.
- ``<functioncall> {"name": ..., "arguments": '{...}'}``: the arguments are a JSON text in single
  quotes, which no JSON parser reads; they are read as the JSON they hold. A call that still does not
  parse stays text under ``invalid_tool_arguments``.
- ``FUNCTION RESPONSE:`` turns are tool messages named after the call they answer.
"""

from __future__ import annotations

import re
from json import JSONDecoder
from typing import Any

import orjson

from draftdeck.formats.common import ParseContext, RowRejected, text_of
from draftdeck.formats.model import Conversation, Message, ToolCall
from draftdeck.formats.openai import meta_of

FAMILY = "glaive"
ROW_KEYS = ("system", "chat")
MARKER = re.compile(r"(?:^|\n)[ \t]*(USER|ASSISTANT|FUNCTION RESPONSE):[ \t]?")
ROLES = {"USER": "user", "ASSISTANT": "assistant", "FUNCTION RESPONSE": "tool"}
END = "<|endoftext|>"
CALL = "<functioncall>"
QUOTED_ARGS = re.compile(
    r'^\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*\'(.*)\'\s*\}$', re.S
)


def looks_like(value: dict[str, Any]) -> bool:
    chat = value.get("chat")
    return isinstance(chat, str) and MARKER.search(chat) is not None


def _system(text: str, ctx: ParseContext) -> tuple[str, list[dict[str, Any]]]:
    """(system prompt, tools) of a glaive system text."""
    body = text.strip()
    if body.startswith("SYSTEM:"):
        body = body[len("SYSTEM:") :].lstrip()
    start = body.find("{")
    if start < 0:
        return body, []
    prose = body[:start].rstrip()
    if prose.endswith("-"):
        prose = prose[:-1].rstrip()
    decoder, tools, pos = JSONDecoder(), [], start
    try:
        while pos < len(body):
            fn, pos = decoder.raw_decode(body, pos)
            if not isinstance(fn, dict):
                raise ValueError("not an object")
            tools.append({"type": "function", "function": fn})
            while pos < len(body) and body[pos].isspace():
                pos += 1
    except ValueError as exc:
        ctx.warn("tools_kept_as_text", f"system: the function definitions do not parse ({exc}); kept as text")
        return body, []
    return prose, tools


def _call(text: str) -> ToolCall | None:
    """A ``<functioncall>`` body as a tool call, or None when it does not parse."""
    body = text.strip()
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        quoted = QUOTED_ARGS.match(body)
        if quoted is None:
            return None
        try:
            name = orjson.loads(f'"{quoted.group(1)}"')
            args = orjson.loads(quoted.group(2))
        except orjson.JSONDecodeError:
            return None
        return ToolCall(name=name, arguments=args)
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = value.get("arguments", {})
    if isinstance(args, str):
        try:
            args = orjson.loads(args)
        except orjson.JSONDecodeError:
            return None
    return ToolCall(name=value["name"], arguments=args)


def _answer(text: str, where: str, ctx: ParseContext) -> Message:
    at = text.find(CALL)
    if at < 0:
        return Message("assistant", text)
    call = _call(text[at + len(CALL) :])
    if call is None:
        ctx.warn("invalid_tool_arguments", f"{where}: the <functioncall> does not parse; kept as text")
        return Message("assistant", text)
    return Message("assistant", text[:at].rstrip(), tool_calls=[call])


def parse_row(value: dict[str, Any], ctx: ParseContext) -> list[Conversation]:
    chat = value["chat"]
    pieces = MARKER.split(chat)
    if pieces[0].strip():
        raise RowRejected(
            "unknown_format", f"chat: text before the first USER:/ASSISTANT: marker: {pieces[0][:60]!r}"
        )
    messages: list[Message] = []
    tools: list[dict[str, Any]] = []
    system = value.get("system")
    if system is not None and system != "":
        prompt, tools = _system(text_of(system, "system", ctx), ctx)
        if prompt:
            messages.append(Message("system", prompt))
    last_call: str | None = None
    for n, (marker, raw) in enumerate(zip(pieces[1::2], pieces[2::2], strict=True)):
        text = raw.strip()
        while text.endswith(END):
            text = text[: -len(END)].rstrip()
        role = ROLES[marker]
        if role == "assistant":
            msg = _answer(text, f"chat turn {n + 1}", ctx)
            if msg.tool_calls:
                last_call = msg.tool_calls[-1].name
        elif role == "tool":
            msg = Message("tool", text, name=last_call)
        else:
            msg = Message("user", text)
        messages.append(msg)
    return [Conversation(messages, tools=tools, source_format=FAMILY, meta=meta_of(value, ROW_KEYS))]
