"""Agent event streams (OpenHands trajectories): one JSON list of events, one conversation per stream.

An event is ``{"id", "source": "user" | "agent" | "environment", "action": "message" | "run" | "edit" |
"finish" | ..., "args"}`` or ``{..., "observation": "run" | "edit" | "error" | ..., "content",
"cause"}``. Events of the model's own turns carry ``tool_call_metadata``: the ``model_response`` (an
OpenAI chat.completion whose message holds the text and the ``tool_calls``) and the ``tool_call_id``
an observation answers. A stream reaches :func:`parse_row` as ``{"events": [...]}`` (a file that is
one list of events, grouped by :mod:`draftdeck.formats.grouping`, or a row holding the list; older
histories hold ``[action, observation]`` pairs, and evaluation outputs hold them under ``history``):

- ``system`` action -> the system prompt (``args.content``) and the tools (``args.tools``);
- a ``message`` action -> a user or assistant turn (``args.content``);
- an agent action with ``tool_call_metadata`` -> the assistant turn of its ``model_response``, once
  per response (several actions of one response share it: its tool calls, their ids, its text and
  reasoning as the model wrote them); where the response was trimmed to its id (or not recorded), a
  turn of the ``args.thought`` and one call per action, of its function name and ``args``;
- an observation answering a call -> a tool message with that ``tool_call_id`` (``error``
  observations flagged as errors); ``finish`` -> the assistant's final text.

Everything else (agent state changes, recalls, null events, observations that answer no call) is
``session_metadata``: :func:`is_turn` tells it, counted, never trained on.
"""

from __future__ import annotations

from typing import Any

from draftdeck.formats import openai
from draftdeck.formats.common import ParseContext, RowRejected, finish_assistant, parse_tools, text_of
from draftdeck.formats.model import Conversation, Message, ToolCall

FAMILY = "event_stream"
KEY = "events"
SOURCES = frozenset({"user", "agent", "environment"})
TEXT_ACTIONS = frozenset({"message", "system", "finish"})
# bookkeeping in an action's args, not what the model called the tool with
ARG_NOISE = frozenset({"thought", "security_risk", "confirmation_state", "is_confirmed", "blocking"})


def is_event(value: Any) -> bool:
    return (
        type(value) is dict
        and value.get("source") in SOURCES
        and ("action" in value or "observation" in value)
    )


def is_event_list(value: Any) -> bool:
    """A list of events, or of [action, observation] pairs (older OpenHands histories)."""
    if not isinstance(value, list) or not value:
        return False
    first = value[0]
    return is_event(first) or (isinstance(first, list) and bool(first) and is_event(first[0]))


def flat(events: list[Any]) -> list[Any]:
    """The events of a list of events or of [action, observation] pairs, in order."""
    out: list[Any] = []
    for item in events:
        if isinstance(item, list):
            out.extend(item)
        else:
            out.append(item)
    return out


def events_key(value: dict[str, Any]) -> str | None:
    """The key of a row's list of events: ``events``, or ``history`` (OpenHands' evaluation outputs)."""
    for key in (KEY, "history"):
        if is_event_list(value.get(key)):
            return key
    return None


def _call_id(event: dict[str, Any]) -> str | None:
    meta = event.get("tool_call_metadata")
    call_id = meta.get("tool_call_id") if isinstance(meta, dict) else None
    return call_id if isinstance(call_id, str) else None


def _response_id(event: dict[str, Any]) -> str | None:
    meta = event.get("tool_call_metadata")
    response = meta.get("model_response") if isinstance(meta, dict) else None
    rid = response.get("id") if isinstance(response, dict) else None
    return str(rid) if rid is not None else None


def _response(event: dict[str, Any]) -> dict[str, Any] | None:
    """The OpenAI message of the model response an action came from (None when not recorded)."""
    meta = event.get("tool_call_metadata")
    response = meta.get("model_response") if isinstance(meta, dict) else None
    choices = response.get("choices") if isinstance(response, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        if isinstance(message, dict):
            return message
    return None


def is_turn(event: dict[str, Any]) -> bool:
    """Whether an event is part of the conversation (the rest is the stream's bookkeeping)."""
    if "observation" in event:
        return _call_id(event) is not None
    action = event.get("action")
    if action in TEXT_ACTIONS:
        return True
    return event.get("source") == "agent" and event.get("tool_call_metadata") is not None


def _args(event: dict[str, Any]) -> dict[str, Any]:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _text(event: dict[str, Any], where: str, ctx: ParseContext) -> str:
    args = _args(event)
    for key in ("content", "final_thought"):
        if args.get(key):
            return text_of(args[key], f"{where}.args.{key}", ctx)
    return text_of(event.get("message"), f"{where}.message", ctx)


def _fallback_turn(event: dict[str, Any], where: str, ctx: ParseContext) -> Message:
    """An action whose model response was not recorded: its thought and one call of its args."""
    args = _args(event)
    meta = event.get("tool_call_metadata") or {}
    name = meta.get("function_name") if isinstance(meta, dict) else None
    arguments = {k: v for k, v in args.items() if k not in ARG_NOISE}
    call = ToolCall(name=name if isinstance(name, str) else str(event.get("action")), arguments=arguments)
    call.id = _call_id(event)
    thought = text_of(args.get("thought"), f"{where}.args.thought", ctx)
    return Message("assistant", thought, tool_calls=[call])


def parse_row(value: dict[str, Any], ctx: ParseContext) -> list[Conversation]:
    key = events_key(value)
    if key is None:
        raise RowRejected("unknown_format", f"{KEY} is not a list of agent events")
    events = flat(value[key])
    messages: list[Message] = []
    tools: list[dict[str, Any]] = []
    turns: dict[str, Message] = {}  # each model response's assistant turn, made once
    for i, event in enumerate(events):
        where = f"{key}[{i}]"
        if not isinstance(event, dict) or not is_turn(event):
            continue
        action = event.get("action")
        if "observation" in event:
            result = Message("tool", text_of(event.get("content"), f"{where}.content", ctx))
            result.tool_call_id = _call_id(event)
            meta = event.get("tool_call_metadata") or {}
            if isinstance(meta.get("function_name"), str):
                result.name = meta["function_name"]
            result.is_error = event.get("observation") == "error"
            messages.append(result)
        elif action == "system":
            messages.append(Message("system", _text(event, where, ctx)))
            tools = parse_tools(_args(event).get("tools"), f"{where}.args.tools", ctx)
        elif event.get("tool_call_metadata") is not None:
            rid = _response_id(event)
            made = turns.get(rid) if rid is not None else None
            response = _response(event)
            if made is not None:
                if response is None:  # a trimmed response: this action's call joins its turn
                    made.tool_calls.extend(_fallback_turn(event, where, ctx).tool_calls)
                continue
            if response is None:
                turn = _fallback_turn(event, where, ctx)
            else:
                reply = {k: v for k, v in response.items() if k in openai.MESSAGE_KEYS}
                turn = openai.parse_message({**reply, "role": "assistant"}, where, ctx)
            messages.append(turn)
            if rid is not None:
                turns[rid] = turn
        else:  # a message, or a finish without a recorded response
            role = "user" if event.get("source") == "user" else "assistant"
            messages.append(finish_assistant(Message(role, _text(event, where, ctx))))  # type: ignore[arg-type]
    meta = openai.meta_of(value, (key,))
    return [Conversation(messages, tools=tools, source_format=FAMILY, meta=meta)]
