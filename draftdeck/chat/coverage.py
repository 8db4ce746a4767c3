"""What a chat template dropped: the parts of a conversation the drafter must see, looked for in what
the template rendered.

A template that renders only `message['content']` drops an answer's tool calls, and the row trains on
an empty answer (the end-of-turn token alone) while every count says it was kept. So after rendering,
each trained answer's content, tool calls (names, argument keys and values) and reasoning are looked
for in its trained text, and the tool definitions (by name) and system prompt in the rendered row,
by their own text, never by one template's format: a template may write arguments as JSON, as XML
parameters or as Python calls, and the values are there in each. A string is found as it is, or
JSON-escaped (as `tojson` writes it); surrounding whitespace does not count (templates trim).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from draftdeck.chat.spans import RenderedRow

# One code per part, so that a report says what was lost, and a policy can keep rows whose template
# drops a part on purpose (reasoning, for a target served without it).
DROPPED = {
    "content": "template_dropped_content",
    "tool_calls": "template_dropped_tool_calls",
    "reasoning": "template_dropped_reasoning",
    "tools": "template_dropped_tools",
    "system": "template_dropped_system",
}
FIX = "use a template that renders it (--chat-template FILE)"


def _found(needle: str, text: str) -> bool:
    needle = needle.strip()
    if not needle or needle in text:
        return True
    return any(json.dumps(needle, ensure_ascii=ascii)[1:-1] in text for ascii in (False, True))


def _leaves(value: Any) -> Iterator[str]:
    """The texts of a tool call's arguments a template must write: keys, strings and numbers."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, str):
        yield value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield json.dumps(value)


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw  # invalid JSON is kept as text: the text itself must be there
    return raw


def _preview(text: str) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= 60 else text[:57] + "...")


def dropped(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    rows: Sequence[RenderedRow],
    untrained: Sequence[int] = (),
) -> list[tuple[str, str]]:
    """(code, reason) for every part of the conversation its rendered `rows` lost (`render_rows`'
    output: one span per trained answer, in order). Empty: nothing was dropped."""
    out: list[tuple[str, str]] = []
    answers = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    trained = [(n, i) for n, i in enumerate(answers, 1) if i not in untrained]
    spans = [row.text[s:e] for row in rows for s, e in row.spans]
    for (n, i), text in zip(trained, spans, strict=False):
        m = messages[i]
        content = m.get("content")
        if isinstance(content, str) and not _found(content, text):
            out.append(
                (DROPPED["content"], f"answer {n}'s text {_preview(content)} is not in its trained tokens")
            )
        for call in m.get("tool_calls") or ():
            fn = call.get("function") or call
            name = str(fn.get("name") or "")
            lost = next(
                (t for t in (name, *_leaves(_arguments(fn.get("arguments")))) if not _found(t, text)), None
            )
            if lost is not None:
                missing = f"{_preview(lost)} is missing"
                out.append(
                    (
                        DROPPED["tool_calls"],
                        f"answer {n}'s tool call {name!r} is not in its trained tokens ({missing})",
                    )
                )
                break
        reasoning = m.get("reasoning_content")
        if isinstance(reasoning, str) and not _found(reasoning, text):
            out.append(
                (
                    DROPPED["reasoning"],
                    f"answer {n}'s reasoning {_preview(reasoning)} is not in its trained tokens",
                )
            )
    whole = "\n".join(row.text for row in rows)
    names = [str((t.get("function") or t).get("name") or "") for t in tools or ()]
    lost_tools = [name for name in names if not _found(name, whole)]
    if lost_tools:
        which = ", ".join(map(repr, lost_tools[:3]))
        out.append(
            (
                DROPPED["tools"],
                f"{len(lost_tools)} of {len(names)} tool definitions ({which}) are not in the row",
            )
        )
    for m in messages:
        content = m.get("content")
        if m.get("role") == "system" and isinstance(content, str) and not _found(content, whole):
            out.append(
                (DROPPED["system"], f"the system prompt {_preview(content)} is not in the rendered row")
            )
            break
    return [(code, f"{reason}: the chat template dropped it; {FIX}") for code, reason in out]
