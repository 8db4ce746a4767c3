"""Dialogues written as text with ``Human:`` / ``Assistant:`` markers (Anthropic's HH-RLHF and the
DeepSpeed-Chat sets derived from it): ``"\\n\\nHuman: ...\\n\\nAssistant: ..."``, or inline, ``" Human: ...
Assistant:"``. A prompt ends on an empty ``Assistant:``, the slot its answer fills."""

from __future__ import annotations

import re

from draftdeck.formats.common import finish_assistant
from draftdeck.formats.model import Message

# a turn marker of a dialogue written as text (one that opens with "Human:"), after any whitespace
_MARKER = re.compile(r"(?:\A|(?<=\s))(Human|Assistant):[ \t]?")
_MARKED_ROLES = {"Human": "user", "Assistant": "assistant"}
_OPENS = re.compile(r"\s*Human:")


def dialogue_turns(text: str) -> list[Message] | None:
    """The turns of a dialogue written as text with ``Human:`` / ``Assistant:`` markers, None unless
    the text opens with ``Human:``. A last, empty ``Assistant:`` (the slot a prompt leaves for the
    answer) is no turn."""
    if not _OPENS.match(text):  # the usual text: one look at its start
        return None
    marks = list(_MARKER.finditer(text))
    out: list[Message] = []
    for k, m in enumerate(marks):
        end = marks[k + 1].start() if k + 1 < len(marks) else len(text)
        said = text[m.end() : end].strip()
        role = _MARKED_ROLES[m.group(1)]
        if said or k + 1 < len(marks) or role != "assistant":
            out.append(finish_assistant(Message(role, said)))  # type: ignore[arg-type]
    return out
