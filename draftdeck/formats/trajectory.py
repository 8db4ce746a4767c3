"""Agent trajectories (SWE-agent ``.traj`` and alike): ``history`` (or ``trajectory``) holding
OpenAI-style messages with ``tool_calls``, and tool results with ``tool_call_ids``.

When the messages carry an ``agent`` field with several values (a main agent and a reviewer, say),
each agent's messages form their own conversation: one input row, several output rows (counted
under rows_expanded). A ``trajectory`` of steps without roles (``{response|action, observation}``)
becomes assistant turns answered by user turns holding the observations.

Per-message bookkeeping fields (``agent``, ``message_type``, ``thought``, ``action``, ``is_demo``,
``cache_control``) are not kept: ``thought`` and ``action`` repeat what ``content`` and ``tool_calls``
already hold, the others describe the agent run rather than the conversation.
"""

from __future__ import annotations

from typing import Any

from draftdeck.formats.common import ParseContext, RowRejected, finish_assistant, text_of
from draftdeck.formats.model import Conversation, Message, SourceRef
from draftdeck.formats.openai import meta_of, parse_message

FAMILY = "trajectory"
KEYS = ("history", "trajectory")
MESSAGE_KEYS_IGNORED = {
    "agent",
    "message_type",
    "thought",
    "action",
    "is_demo",
    "cache_control",
    "tool_call_ids",
}


def is_message_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(m, dict) for m in v)


def trajectory_key(value: dict[str, Any]) -> str | None:
    for key in KEYS:
        v = value.get(key)
        if isinstance(v, list) and is_message_list(v) and ("role" in v[0] or key == "trajectory"):
            return key
    return None


def parse_row(value: dict[str, Any], ctx: ParseContext) -> list[Conversation]:
    key = trajectory_key(value)
    assert key is not None
    items: list[dict[str, Any]] = value[key]  # trajectory_key checked: a non-empty list of objects
    meta = meta_of(value, ("history", "trajectory", "tools"))
    if "role" not in items[0]:
        return [Conversation(_steps(items, ctx), source_format=FAMILY, meta=meta)]
    groups: dict[str, list[Message]] = {}
    for i, d in enumerate(items):
        agent = d.get("agent")
        slim = {k: v for k, v in d.items() if k not in MESSAGE_KEYS_IGNORED or k == "tool_call_ids"}
        groups.setdefault(agent if isinstance(agent, str) else "", []).append(
            parse_message(slim, f"{key}[{i}]", ctx)
        )
    tools = value.get("tools")
    out = []
    for agent, messages in groups.items():
        conv = Conversation(messages, source_format=FAMILY, meta=dict(meta))
        if isinstance(tools, list):
            conv.tools = tools
        if len(groups) > 1:
            conv.source = SourceRef(file="", path=f"agent={agent or '-'}")
        out.append(conv)
    return out


def _steps(items: list[dict[str, Any]], ctx: ParseContext) -> list[Message]:
    messages: list[Message] = []
    for i, step in enumerate(items):
        said = step.get("response", step.get("action"))
        if said is None:
            raise RowRejected("unknown_format", f"trajectory[{i}] has neither role, response nor action")
        messages.append(
            finish_assistant(Message("assistant", text_of(said, f"trajectory[{i}].response", ctx)))
        )
        obs = step.get("observation")
        if obs is not None:
            messages.append(Message("user", text_of(obs, f"trajectory[{i}].observation", ctx)))
    return messages
