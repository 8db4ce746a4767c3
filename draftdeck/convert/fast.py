"""The fast path for the usual row, shared by the one-process convert and its workers (see
:mod:`draftdeck.convert.parallel`): plain OpenAI ``messages`` and ShareGPT ``conversations`` rows,
instruction/answer or prompt/response columns, and OpenAI rows with tool calls
(:mod:`draftdeck.convert.fast_tools`) become their output line and duplicate key without the canonical
model, the general checks or a second encoding of the text. Any row it does not take
goes to the general path (detection, parser, checks, writer), which gives the same bytes for the rows
it does take: the tests compare both paths byte for byte."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson
from xxhash import xxh3_64_intdigest

from draftdeck.convert.checks import TURN_STYLE, plain_duplicate_key
from draftdeck.convert.fast_line import Result, kept_fields, row_line
from draftdeck.convert.fast_tools import tool_row
from draftdeck.convert.placeholders import normalise
from draftdeck.formats import alpaca, sharegpt
from draftdeck.formats.common import RowRejected
from draftdeck.formats.detect import MEDIA_KEYS, detect
from draftdeck.formats.dialogue import dialogue_turns

_PLAIN_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_SHAREGPT_ROLES = {k: v for k, v in sharegpt.FROM_MAP.items() if v in ("system", "user", "assistant")}
_OPENAI_KEYS = ("messages", "tools")
_MEDIA = frozenset(MEDIA_KEYS)
# instruction-style columns: (instruction, extra input, answer), as draftdeck.formats.alpaca reads them
_INSTRUCTION_KEYS = {
    alpaca.ALPACA: ("instruction", "input", "output"),
    alpaca.INSTRUCTION_RESPONSE: ("instruction", "context", "response"),
}
# (row family, target) -> {a row's role: the name the target writes}, for the plain roles only
_NAMES = {
    (family, to): {raw: names[role] for raw, role in roles.items()}
    for family, roles in (("openai", _PLAIN_ROLES), ("sharegpt", _SHAREGPT_ROLES))
    for to, (_, _, names) in TURN_STYLE.items()
}
_ROLE_OF = {to: {name: role for role, name in names.items()} for to, (_, _, names) in TURN_STYLE.items()}


class _Plan(NamedTuple):
    """What the turn loop of one (row family, target) pair reads, unpacked once per row."""

    family: str
    role_key: str  # the row's keys
    text_key: str
    known: tuple[str, ...]  # the row's own top-level keys (the rest are kept fields)
    names_of: dict[str, str]  # a row's plain role -> the name the target writes
    out_role: str  # the target's keys
    out_text: str
    system_name: str  # the names the target writes (compared by identity: the same objects)
    user_name: str
    assistant_name: str


_PLANS = {
    (family, to): _Plan(
        family,
        role_key,
        text_key,
        known,
        _NAMES[family, to],
        out_role,
        out_text,
        names["system"],
        names["user"],
        names["assistant"],
    )
    for family, role_key, text_key, known in (
        ("openai", "role", "content", _OPENAI_KEYS),
        ("sharegpt", "from", "value", sharegpt.ROW_KEYS),
    )
    for to, (out_role, out_text, names) in TURN_STYLE.items()
}


def plain_row(
    value: Any, to: str, max_chars: int, dups: bool, origin: tuple[str, int | None] = ("", None)
) -> Result | None:
    """The fast path for the usual row, or None to take the general one.

    A list row qualifies when it is OpenAI ``messages`` or ShareGPT ``conversations`` of plain two-key
    turns (string role/from and content/value; system, user and assistant only; no ``<think>`` or
    ``<tool_call>`` in answers), no kept field the target reserves, no preference pair; an OpenAI
    row with tools or a turn of three keys when :func:`draftdeck.convert.fast_tools.tool_row` takes it;
    a column row (see :func:`_columns_row`) when detection reads it as alpaca, instruction_response or
    query_response of plain text. Either must pass the general checks with nothing to say: no empty
    turn, a user turn, an assistant turn last-but-not-user, alternating turns, at least one answer
    too long to be a placeholder candidate and no long field left unread. Then the result is what
    the general path gives, (family, output line, duplicate key), with `origin` (file, row) as the
    provenance.

    This runs once for every row of a convert (most of its time with one worker), so it is written
    for CPython's costs: one plan unpacked per row, names compared by identity, lists built only when
    a row needs them.
    """
    if type(value) is not dict or not _MEDIA.isdisjoint(value):  # media: the general path refuses it
        return None
    turns = value.get("messages")
    if type(turns) is list:
        if value.get("functions") is not None:
            return None  # (the legacy functions list becomes the row's tools)
        if value.get("tools") is not None:
            return tool_row(value, to, dups, origin)
        plan = openai_plan = _PLANS["openai", to]
        system = None
    else:
        turns = value.get("conversations")
        if type(turns) is not list:
            if "messages" in value or turns is not None:
                return None  # a list key of another kind: the general path names the fault
            return _columns_row(value, to, max_chars, dups, origin)
        if not turns:
            return None
        first = turns[0]
        if type(first) is dict and "role" in first and "from" not in first:
            return None  # OpenAI messages under `conversations`: the general path
        if value.get("tools") not in (None, ""):
            return None
        plan = _PLANS["sharegpt", to]
        openai_plan = None
        system = value.get("system")
        if system == "":
            system = None
        elif system is not None and type(system) is not str:
            return None
    _, role_key, text_key, known, names_of, out_role, out_text, system_name, user_name, assistant_name = plan
    # One pass over the turns: the checks of check_conversation on the only shapes that reach here
    # (all must pass) and the output turns, compared by the names written (one per role). `edges`: a
    # text the duplicate key strips. A turn that is no {role: str, text: str} object (a missing key,
    # an unknown or unhashable role, text that is no string) raises: the general path names it.
    out_turns: list[dict[str, str]] = []
    append = out_turns.append
    has_user = long_answer = edges = False
    long_len = max_chars * 4
    # answers too short by length alone to decide: normalised only when no answer is long by length
    # (normalise is most of a row's cost where it runs)
    short_answers: list[str] | None = None
    prev = None
    if system is not None:
        stripped = system.strip()  # (the same object when nothing is stripped)
        if not stripped:
            return None  # empty_turn
        edges = stripped is not system
        append({out_role: system_name, out_text: system})
    try:
        for t in turns:
            if len(t) != 2:  # (an OpenAI turn of three keys may call or answer a tool)
                return tool_row(value, to, dups, origin) if plan is openai_plan else None
            name = names_of[t[role_key]]
            text = t[text_key]
            stripped = text.strip()
            if stripped is not text:
                if not stripped:
                    return None  # empty_turn (or empty_conversation)
                edges = True
            elif not text:
                return None
            if name is system_name:
                if system is not None and len(out_turns) == 1:
                    return None  # (a top-level system and then a system turn: the general path decides)
            elif name is prev:
                return None  # non_alternating
            else:
                prev = name
                if name is user_name:
                    has_user = True
                elif not long_answer:
                    if len(text) > long_len:
                        long_answer = True  # placeholder_key is None: the row is not a candidate
                    elif short_answers is None:
                        short_answers = [text]
                    else:
                        short_answers.append(text)
            append({out_role: name, out_text: text})
    except (KeyError, TypeError, AttributeError):
        return None
    if not long_answer:
        long_answer = short_answers is not None and any(
            len(normalise(text)) > max_chars for text in short_answers
        )
    if not has_user or prev is not assistant_name or not long_answer:
        return None  # no_user_turn / no_assistant_turn / trailing_user_turn, or a placeholder candidate
    if len(value) == 1:  # the turns alone
        return _encoded(plan.family, out_turns, edges, value, (), to, dups, origin)
    meta = kept_fields(value, known)
    if meta is None:
        return None
    return _encoded(plan.family, out_turns, edges, value, meta, to, dups, origin)


def _columns_row(
    value: dict[str, Any], to: str, max_chars: int, dups: bool, origin: tuple[str, int | None]
) -> Result | None:
    """:func:`plain_row` for a row of text columns: detection (the general path's own, so that every
    shape tried before these still comes first) must read it as alpaca / instruction_response
    (instruction, input or context, answer) or query_response (a question and answer pair), with
    text values, no system or history, and a question that is no ``Human:`` / ``Assistant:`` dialogue."""
    try:
        family = detect(value)[0]
    except RowRejected:
        return None
    keys: tuple[str, ...] | None = _INSTRUCTION_KEYS.get(family)
    if keys is not None:
        first, second, answer_key = keys
        instruction, extra = value.get(first), value.get(second)
        if type(instruction) is not str or (extra is not None and type(extra) is not str):
            return None  # (numbers become their JSON text there)
        user = f"{instruction}\n{extra}" if instruction and extra else (instruction or extra or "")
    elif family == alpaca.QUERY_RESPONSE:
        pair = alpaca.pair_of(value)
        assert pair is not None
        first, answer_key = pair
        user = value[first]
        if dialogue_turns(user) is not None:
            return None  # an RLHF dialogue written as text: its turns
        keys = (first, answer_key)
    else:
        return None
    answer = value.get(answer_key)
    if type(answer) is not str or "system" in value or "history" in value:
        return None
    user_stripped, answer_stripped = user.strip(), answer.strip()
    if not user_stripped or not answer_stripped:
        return None  # empty_turn, empty_assistant_turn
    if len(answer) <= max_chars * 4 and len(normalise(answer)) <= max_chars:
        return None  # a placeholder candidate
    meta = kept_fields(value, keys)
    if meta is None:
        return None
    out_role, out_text, out_names = TURN_STYLE[to]
    out_turns = [
        {out_role: out_names["user"], out_text: user},
        {out_role: out_names["assistant"], out_text: answer},
    ]
    edges = user_stripped is not user or answer_stripped is not answer
    return _encoded(family, out_turns, edges, value, meta, to, dups, origin)


def _encoded(
    family: str,
    out_turns: list[dict[str, str]],
    edges: bool,
    value: dict[str, Any],
    meta: Sequence[str],
    to: str,
    dups: bool,
    origin: tuple[str, int | None],
) -> Result | None:
    """The output line and duplicate key of a row the fast path took (its turns as written, the
    kept fields `meta` of `value`), or None for an answer the general path must read."""
    try:
        body = orjson.dumps(out_turns)
    except orjson.JSONEncodeError:
        return None  # (text orjson cannot write: the general path's fallback decides)
    # `<think>` (reasoning to split) or `<tool_call>` (Hermes-style calls) in an answer: the general
    # path. Looked for in the encoded turns first, where orjson escapes no `<`, letter or `_`: one
    # memchr-speed scan for `<`, then a look at each `<` (code has a few); on a hit, in the answers.
    at = body.find(b"<")
    while at >= 0:
        if body.startswith(b"think>", at + 1) or body.startswith(b"tool_call>", at + 1):
            out_role, out_text, names = TURN_STYLE[to]
            if any(
                "<think>" in d[out_text] or "<tool_call>" in d[out_text]
                for d in out_turns
                if d[out_role] == names["assistant"]
            ):
                return None
            break
        at = body.find(b"<", at + 1)
    line, repeat = row_line(body, out_turns, value, meta, to, origin)
    if not dups:
        return family, line, None
    if edges or repeat:  # plain_duplicate_key's own parts (stripped texts, the repeat)
        role_key, text_key, _ = TURN_STYLE[to]
        role_of = _ROLE_OF[to]
        return (
            family,
            line,
            plain_duplicate_key([(role_of[d[role_key]], d[text_key]) for d in out_turns], to, repeat),
        )
    return family, line, xxh3_64_intdigest(body)  # the turns as written are plain_duplicate_key's parts
