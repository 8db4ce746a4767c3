"""Prompt-only rows: the target model has to answer them (regeneration).

``prompt`` (text, or a list of OpenAI messages), ``question``, ``instruction`` without ``output``
(+ ``input``), and ``turns: [str, ...]`` (EAGLE's mt_bench: several user turns, each to be answered
in order; they become consecutive user messages). ``system`` becomes the first message.
"""

from __future__ import annotations

from typing import Any

from draftdeck.formats.common import ParseContext, RowRejected, text_of
from draftdeck.formats.model import Conversation, Message
from draftdeck.formats.openai import meta_of, parse_messages

FAMILY = "prompt"
KEYS = ("prompt", "question", "instruction", "turns")


def prompt_key(value: dict[str, Any]) -> str | None:
    for key in KEYS:
        v = value.get(key)
        if isinstance(v, str) or (key in ("turns", "prompt") and isinstance(v, list) and v):
            return key
    return None


def parse_row(value: dict[str, Any], ctx: ParseContext) -> list[Conversation]:
    key = prompt_key(value)
    assert key is not None
    messages: list[Message] = []
    system = value.get("system")
    if system:
        messages.append(Message("system", text_of(system, "system", ctx)))
    v = value[key]
    known: tuple[str, ...] = (key, "system")
    if key == "turns":
        for i, turn in enumerate(v):
            messages.append(Message("user", text_of(turn, f"turns[{i}]", ctx)))
    elif key == "prompt" and isinstance(v, list):
        if all(isinstance(t, str) for t in v):
            messages.extend(Message("user", t) for t in v)
        else:
            messages.extend(parse_messages(v, "prompt", ctx))
    elif key == "instruction":
        extra = text_of(value.get("input"), "input", ctx)
        messages.append(Message("user", f"{v}\n{extra}" if v and extra else (v or extra)))
        known = (key, "input", "system")
    else:
        messages.append(Message("user", v))
    if not messages:
        raise RowRejected("empty_conversation", f"{key} is empty")
    return [Conversation(messages, source_format=FAMILY, meta=meta_of(value, known))]
