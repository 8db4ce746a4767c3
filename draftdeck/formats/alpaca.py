"""Alpaca (``instruction``, ``input``, ``output`` + ``system``, ``history`` pairs), instruction/response
(Dolly's ``instruction``, ``context``, ``response``, ``category``) and the query/response family
(``query``/``response``, ``question``/``answer``, ``prompt``/``response``, ``prompt``/``completion``, or
torchtune's instruct default ``input``/``output``, with the same optional ``system`` and ``history``).

The user turn is the instruction, then the input (or Dolly's context) on the next line when there is
one (LLaMA-Factory's joining). ``history`` is a list of ``[user, assistant]`` pairs before the final
exchange.
"""

from __future__ import annotations

from typing import Any

from draftdeck.formats.common import ParseContext, RowRejected, finish_assistant, text_of
from draftdeck.formats.dialogue import dialogue_turns
from draftdeck.formats.model import Conversation, Message
from draftdeck.formats.openai import meta_of

ALPACA = "alpaca"
INSTRUCTION_RESPONSE = "instruction_response"
QUERY_RESPONSE = "query_response"
PAIRS = (
    ("query", "response"),
    ("question", "answer"),
    ("prompt", "response"),
    ("prompt", "completion"),
    ("input", "output"),
)


def history_messages(history: Any, ctx: ParseContext) -> list[Message]:
    if history is None:
        return []
    if not isinstance(history, list):
        raise RowRejected(
            "unknown_format", f"history is a JSON {type(history).__name__}, not a list of pairs"
        )
    out: list[Message] = []
    for i, pair in enumerate(history):
        if not (isinstance(pair, list | tuple) and len(pair) == 2):
            raise RowRejected("unknown_format", f"history[{i}] is not a [user, assistant] pair")
        out.append(Message("user", text_of(pair[0], f"history[{i}][0]", ctx)))
        out.append(finish_assistant(Message("assistant", text_of(pair[1], f"history[{i}][1]", ctx))))
    return out


def _build(
    value: dict[str, Any], user: str, answer: Any, answer_key: str, ctx: ParseContext
) -> list[Message]:
    messages: list[Message] = []
    system = value.get("system")
    if system:
        messages.append(Message("system", text_of(system, "system", ctx)))
    messages.extend(history_messages(value.get("history"), ctx))
    messages.append(Message("user", user))
    messages.append(finish_assistant(Message("assistant", text_of(answer, answer_key, ctx))))
    return messages


def parse_alpaca(value: dict[str, Any], ctx: ParseContext) -> list[Conversation]:
    return _instruction_row(value, ctx, ("instruction", "input", "output"), ALPACA)


def parse_instruction_response(value: dict[str, Any], ctx: ParseContext) -> list[Conversation]:
    """Dolly's shape: the `context` joins the instruction as Alpaca's `input` does."""
    return _instruction_row(value, ctx, ("instruction", "context", "response"), INSTRUCTION_RESPONSE)


def _instruction_row(
    value: dict[str, Any], ctx: ParseContext, keys: tuple[str, str, str], source_format: str
) -> list[Conversation]:
    """An (instruction, extra input, answer) row: the instruction and the extra input, one line each,
    make the user turn."""
    first, second, answer = keys
    instruction = text_of(value.get(first), first, ctx)
    extra = text_of(value.get(second), second, ctx)
    user = f"{instruction}\n{extra}" if instruction and extra else (instruction or extra)
    messages = _build(value, user, value.get(answer), answer, ctx)
    meta = meta_of(value, (*keys, "system", "history"))
    return [Conversation(messages, source_format=source_format, meta=meta)]


def pair_of(value: dict[str, Any]) -> tuple[str, str] | None:
    for q, a in PAIRS:
        if q in value and a in value and isinstance(value[q], str):
            return q, a
    return None


def parse_query_response(value: dict[str, Any], ctx: ParseContext) -> list[Conversation]:
    pair = pair_of(value)
    assert pair is not None
    q, a = pair
    question = text_of(value[q], q, ctx)
    turns = dialogue_turns(question)
    # an RLHF prompt ("Human: ... Assistant: ... Human: ... Assistant:"): its turns, then the answer
    if turns and turns[-1].role == "user":
        messages = _build(value, turns[-1].content, value[a], a, ctx)
        messages[-2:-1] = turns  # the earlier turns before the last question, after any system
        messages[-1].content = messages[-1].content.lstrip()  # " answer" after the last "Assistant:"
    else:
        messages = _build(value, question, value[a], a, ctx)
    meta = meta_of(value, (q, a, "system", "history"))
    return [Conversation(messages, source_format=QUERY_RESPONSE, meta=meta)]
