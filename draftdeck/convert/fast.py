"""The convert workers' fast path for the usual row (see :mod:`draftdeck.convert.parallel`)."""

from __future__ import annotations

from typing import Any

import orjson
from xxhash import xxh3_64_intdigest

from draftdeck.convert.checks import UNUSED_TEXT_CHARS
from draftdeck.convert.placeholders import normalise
from draftdeck.formats import sharegpt
from draftdeck.formats.detect import media_of
from draftdeck.formats.model import PROVENANCE_KEY, mix_source_of, origin_of, provenance_value, repeat_of
from draftdeck.formats.writers import RESERVED, SHAREGPT_FROM, encode_line

_PLAIN_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_SHAREGPT_ROLES = {k: v for k, v in sharegpt.FROM_MAP.items() if v in ("system", "user", "assistant")}
_OPENAI_KEYS = ("messages", "tools")


def plain_row(
    value: Any, to: str, max_chars: int, dups: bool, origin: tuple[str, int | None] = ("", None)
) -> tuple[str, bytes, int | None] | None:
    """The fast path for the usual row, or None to take the general one.

    A row qualifies when it is OpenAI ``messages`` or ShareGPT ``conversations`` of plain two-key turns
    (string role/from and content/value; system, user and assistant only; no ``<think>`` or
    ``<tool_call>`` in answers), no tools, no kept field the target reserves, and when the general
    checks would find nothing: no empty turn, a user turn, an assistant turn last-but-not-user,
    alternating turns, and at least one answer too long to be a placeholder candidate. Then the
    result is what the general path gives, (family, output line, duplicate key), without building the
    canonical model: the tests compare both paths byte for byte.
    """
    if type(value) is not dict or media_of(value) is not None:  # media: the general path refuses it
        return None
    known: tuple[str, ...]
    turns = value.get("messages")
    if type(turns) is list:
        family, role_key, text_key, role_map, known = "openai", "role", "content", _PLAIN_ROLES, _OPENAI_KEYS
        if value.get("tools") is not None or value.get("functions") is not None:
            return None  # tools to read (the legacy functions list becomes them)
        system = None
    else:
        turns = value.get("conversations")
        if type(turns) is not list or not turns:
            return None
        first = turns[0]
        if type(first) is dict and "role" in first and "from" not in first:
            return None  # OpenAI messages under `conversations`: the general path
        family, role_key, text_key, role_map, known = (
            "sharegpt",
            "from",
            "value",
            _SHAREGPT_ROLES,
            sharegpt.ROW_KEYS,
        )
        if value.get("tools") not in (None, ""):
            return None
        system = value.get("system")
        if system == "":
            system = None
        elif system is not None and type(system) is not str:
            return None
    roles: list[str] = []
    texts: list[str] = []
    if system is not None:
        roles.append("system")
        texts.append(system)
    for t in turns:
        if type(t) is not dict or len(t) != 2:
            return None
        raw = t.get(role_key)
        text = t.get(text_key)
        if type(raw) is not str or type(text) is not str:
            return None
        role = role_map.get(raw)
        if role is None or (role == "system" and system is not None and len(roles) == 1):
            return None  # (a top-level system and then a system turn: the general path decides)
        roles.append(role)
        texts.append(text)
    # the checks of check_conversation, on the only shapes that reach here: all must pass
    has_user = long_answer = False
    prev = None
    for role, text in zip(roles, texts, strict=True):
        if not text or text.isspace():
            return None  # empty_turn (or empty_conversation)
        if role == "system":
            continue
        if role == prev:
            return None  # non_alternating
        prev = role
        if role == "user":
            has_user = True
        elif "<think>" in text or "<tool_call>" in text:
            return None  # reasoning to split, or Hermes-style calls: the general path
        elif not long_answer and (len(text) > max_chars * 4 or len(normalise(text)) > max_chars):
            long_answer = True  # placeholder_key is None: the row is not a candidate
    if not has_user or prev != "assistant" or not long_answer:
        return None  # no_user_turn / no_assistant_turn / trailing_user_turn, or a placeholder candidate
    meta = [k for k in value if k not in known]
    if meta and not RESERVED.isdisjoint(meta):
        return None
    if any(type(value[k]) is str and len(value[k]) >= UNUSED_TEXT_CHARS for k in meta):
        return None  # a long field the reader leaves: the general path says whether it was unused
    if to == "sharegpt":
        out: dict[str, Any] = {
            "conversations": [
                {"from": SHAREGPT_FROM[r], "value": t} for r, t in zip(roles, texts, strict=True)
            ]
        }
    else:
        out = {"messages": [{"role": r, "content": t} for r, t in zip(roles, texts, strict=True)]}
    for k in meta:
        out[k] = value[k]
    kept = value.get(PROVENANCE_KEY)
    found = origin_of(kept, *origin)  # as the writers do (`origin`: file, row)
    if found is not None:
        out[PROVENANCE_KEY] = provenance_value(found, mix_source_of(kept), repeat_of(kept))
    dkey = None
    if dups:  # the parts of duplicate_key, in the same order
        parts: list[object] = []
        for r, t in zip(roles, texts, strict=True):
            parts += (r, t.strip() if t[0].isspace() or t[-1].isspace() else t, None)
        repeat = repeat_of(kept)
        if repeat:
            parts.append(("repeat", repeat))
        dkey = xxh3_64_intdigest(orjson.dumps(parts))
    return family, encode_line(out), dkey
