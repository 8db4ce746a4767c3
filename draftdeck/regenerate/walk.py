"""The conversation walk: drop the source's assistant turns and ask the target for each one in order,
with the target's own earlier answers as history.

Answer slots: every source assistant turn, and every user (or tool) turn that no assistant turn
follows (so a user-only row gets one answer per user turn). System messages and tools are kept.
Tool results follow the target's answer only when it made as many tool calls as the source did
(their ids are mapped to the target's); otherwise the conversation ends at that answer
(`tool_calls_diverged`), because the source's tool results answer calls the target never made.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from draftdeck.formats.images import DEFAULT_LIMITS, ImageLimits
from draftdeck.formats.model import Conversation, Message
from draftdeck.formats.writers import to_openai
from draftdeck.quality import Action, Policy
from draftdeck.regenerate.answer import Answer, RowRejected, answer_issues
from draftdeck.regenerate.images import with_inline_images

Ask = Callable[[list[dict[str, Any]], list[dict[str, Any]]], Awaitable[Answer]]


@dataclass
class Walked:
    conversation: Conversation
    warnings: list[tuple[str, str]] = field(default_factory=list)
    completion_tokens: int = 0
    prompt_tokens: int = 0
    turns: list[dict[str, Any]] = field(default_factory=list)  # finish reason and tokens per answer
    endpoints: set[str] = field(default_factory=set)


def _slots(messages: list[Message]) -> list[tuple[int, bool]]:
    """(index, ask-here) for each kept message, with ask-here meaning: an answer comes after it."""
    out: list[tuple[int, bool]] = []
    for i, m in enumerate(messages):
        nxt = messages[i + 1].role if i + 1 < len(messages) else None
        if m.role == "assistant":
            out.append((i, True))
        else:
            out.append((i, m.role in ("user", "tool") and nxt in (None, "user")))
    return out


async def walk(
    conv: Conversation, ask: Ask, policy: Policy, reasoning_on: bool, limits: ImageLimits = DEFAULT_LIMITS
) -> Walked:
    """The conversation answered by the target; raises `RowRejected` on the first answer a check
    rejects (warned codes are collected in `Walked.warnings`). A turn's images are sent inline, read
    within `limits` (the job's data roots: draftdeck.regenerate.images)."""
    history: list[Message] = []
    result = Walked(conversation=conv)
    id_map: dict[str, str] = {}
    source_calls = 0
    messages = conv.messages
    turn = 0
    # each answer's token ids by its place in `history`: kept apart so that requests do not send them
    ids_at: dict[int, list[int]] = {}
    for i, asks in _slots(messages):
        m = messages[i]
        if m.role == "tool":
            history.append(
                Message("tool", m.content, None, [], id_map.get(m.tool_call_id or "", m.tool_call_id), m.name)
            )
        elif m.role != "assistant":
            history.append(m)
        if not asks:
            continue
        turn += 1
        source_calls = len(m.tool_calls) if m.role == "assistant" else 0
        request = to_openai(Conversation(messages=history))["messages"]
        with_inline_images(request, history, limits)
        answer = await ask(request, conv.tools)
        result.completion_tokens += answer.completion_tokens
        result.prompt_tokens += answer.prompt_tokens
        result.endpoints.add(answer.endpoint)
        result.turns.append(
            {"finish_reason": answer.finish_reason, "completion_tokens": answer.completion_tokens}
        )
        for code, reason in answer_issues(answer, reasoning_on, turn):
            act = policy.action(code)
            if act is Action.REJECT:
                raise RowRejected(code, reason)
            result.warnings.append((code, reason))  # FAIL codes are judged by the caller's policy
        if answer.token_ids:
            ids_at[len(history)] = answer.token_ids
        history.append(Message("assistant", answer.content, answer.reasoning, answer.tool_calls))
        following = messages[i + 1].role if i + 1 < len(messages) else None
        if following == "tool":
            if source_calls and len(answer.tool_calls) == source_calls:
                id_map = {
                    old.id or "": new.id or old.id or ""
                    for old, new in zip(m.tool_calls, answer.tool_calls, strict=True)
                }
                continue
            result.warnings.append(
                (
                    "tool_calls_diverged",
                    f"turn {turn}: the target made {len(answer.tool_calls)} tool calls where the source"
                    f" made {source_calls}; the conversation ends at this answer",
                )
            )
            break
    for at, ids in ids_at.items():
        history[at].token_ids = ids
    result.conversation = Conversation(
        messages=history,
        tools=conv.tools,
        source=conv.source,
        source_format=conv.source_format,
        meta=dict(conv.meta),
    )
    return result
