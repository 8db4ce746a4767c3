"""Turn pairs (ms-swift's "sharegpt" format): ``{"system"?, "conversation": [{"human", "assistant"}, ...]}``.

Each object is one exchange: the human text, then the assistant's answer. A last pair without an
``assistant`` is a prompt still to be answered (the row is prompt-only there). Other keys on a pair
have no place in the canonical model and are counted as unrepresentable_field.
"""

from __future__ import annotations

from typing import Any

from draftdeck.formats.common import ParseContext, RowRejected, finish_assistant, keys_of, text_of
from draftdeck.formats.model import Conversation, Message
from draftdeck.formats.openai import meta_of

FAMILY = "turn_pairs"
PAIR_KEYS = frozenset({"human", "assistant"})


def parse_row(value: dict[str, Any], ctx: ParseContext, key: str = "conversation") -> list[Conversation]:
    turns = value[key]
    if not isinstance(turns, list):
        raise RowRejected("unknown_format", f"{key} is a JSON {type(turns).__name__}, not a list")
    messages: list[Message] = []
    system = value.get("system")
    if system:
        messages.append(Message("system", text_of(system, "system", ctx)))
    for i, pair in enumerate(turns):
        where = f"{key}[{i}]"
        if not isinstance(pair, dict):
            raise RowRejected("unknown_format", f"{where} is a JSON {type(pair).__name__}, not a pair object")
        if "human" not in pair and "assistant" not in pair:
            raise RowRejected(
                "unknown_format", f"{where} has neither human nor assistant (keys: {keys_of(pair)})"
            )
        if "human" in pair:
            messages.append(Message("user", text_of(pair["human"], f"{where}.human", ctx)))
        if "assistant" in pair:
            answer = text_of(pair["assistant"], f"{where}.assistant", ctx)
            messages.append(finish_assistant(Message("assistant", answer)))
        for extra in pair.keys() - PAIR_KEYS:
            ctx.warn("unrepresentable_field", f"{where} field {extra!r} has no place in the canonical model")
    return [Conversation(messages, source_format=FAMILY, meta=meta_of(value, (key, "system")))]
