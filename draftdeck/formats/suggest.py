"""A proposed ``--columns`` / ``--tags`` mapping for a row no reader recognises, from its field names
and values: what scan offers when it sees a file it cannot read. A proposal, never applied on its own:
the user reads it, corrects it, and passes it.

Field names are compared without case, ``_`` or ``-`` (``Complex_CoT`` is ``complexcot``). A field of
text is the user turn, the answer, its reasoning or the system prompt by its name; a row of exactly
two text fields that no name places (``{src, tgt}`` in another language) is read as prompt then
answer, in the row's order. A list of objects is a ``messages`` column, its tags found from the
turns' keys: the key whose values look like roles, and the key of the longest text.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from draftdeck.formats.columns import TAG_DEFAULTS, check_columns

NAMES: dict[str, tuple[str, ...]] = {
    "system": ("system", "systemprompt", "sys"),
    "prompt": ("prompt", "question", "instruction", "query", "input", "problem", "src", "source",
               "request", "human", "user", "context"),
    "reasoning": ("reasoning", "complexcot", "cot", "chainofthought", "thinking", "thought", "thoughts",
                  "rationale", "think"),
    "response": ("response", "answer", "output", "completion", "solution", "reply", "tgt", "target",
                 "assistant", "gpt", "bot"),
}  # fmt: skip
ROLE_WORDS = frozenset(
    {"user", "human", "assistant", "gpt", "bot", "model", "system", "tool", "function", "observation"}
)
ASSISTANT_WORDS = ("assistant", "gpt", "bot", "model", "ai", "chatbot")


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def suggest_mapping(row: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]] | None:
    """(columns, tags) that would read `row`, or None when no proposal makes a user turn."""
    texts = [k for k, v in row.items() if isinstance(v, str) and v.strip()]
    lists = [k for k, v in row.items() if isinstance(v, list) and v and all(isinstance(t, dict) for t in v)]
    for field in lists:
        tags = _tags(row[field])
        if tags is not None:
            turns = {"messages": field}
            if "system" in {_norm(k) for k in texts}:
                turns["system"] = next(k for k in texts if _norm(k) == "system")
            return turns, tags
    columns: dict[str, str] = {}
    placed: set[str] = set()
    for key, names in NAMES.items():
        # the better name first; between two fields of one name (`question` and `Question`), the longer
        ranked = sorted(
            (k for k in texts if k not in placed and _norm(k) in names),
            key=lambda k: (names.index(_norm(k)), -len(row[k])),
        )
        if ranked:
            columns[key] = ranked[0]
            placed.add(ranked[0])
    if "prompt" not in columns and len(texts) == 2 and not placed:
        columns = {"prompt": texts[0], "response": texts[1]}
    if "prompt" not in columns:
        return None
    check_columns(columns)
    return {k: columns[k] for k in ("system", "prompt", "reasoning", "response") if k in columns}, {}


def _tags(turns: list[dict[str, Any]]) -> dict[str, str] | None:
    """The tags of a list of turns: which key holds the role, which the text, and the role names."""
    keys = [k for k in turns[0] if all(isinstance(t.get(k), str) for t in turns)]
    # a role: short words, few of them (a role word itself counts most)
    role_keys = [k for k in keys if len({t[k] for t in turns}) <= 4 and all(len(t[k]) <= 20 for t in turns)]
    if not role_keys:
        return None
    role_key = min(
        role_keys,
        key=lambda k: (not any(t[k].lower() in ROLE_WORDS for t in turns), sum(len(t[k]) for t in turns)),
    )
    text_keys = [k for k in keys if k != role_key]
    if not text_keys:
        return None
    content_key = max(text_keys, key=lambda k: sum(len(t[k]) for t in turns))
    roles = list(dict.fromkeys(str(t[role_key]) for t in turns))
    tags = {"role_tag": role_key, "content_tag": content_key}
    speakers = [r for r in roles if r.lower() != "system"]
    assistant = next(
        (r for r in speakers if r.lower() in ASSISTANT_WORDS), speakers[1] if len(speakers) > 1 else None
    )
    user = next((r for r in speakers if r != assistant), None)
    if user is not None:
        tags["user_tag"] = user
    if assistant is not None:
        tags["assistant_tag"] = assistant
    return {k: v for k, v in tags.items() if TAG_DEFAULTS[k] != v}


def option_text(columns: dict[str, str], tags: dict[str, str]) -> str:
    """The mapping as command-line options (``--columns prompt=Question --tags role_tag=speaker``)."""
    parts = [
        *(f"--columns {shlex.quote(f'{k}={v}')}" for k, v in columns.items()),
        *(f"--tags {shlex.quote(f'{k}={v}')}" for k, v in tags.items()),
    ]
    return " ".join(parts)
