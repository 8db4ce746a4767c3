"""The fast path for OpenAI ``messages`` rows with tool calls, agent data's usual row: assistant turns
calling functions (``{"id", "type", "function": {"name", "arguments"}}`` with JSON text arguments),
``tool`` turns answering them by ``tool_call_id``, and the row's ``tools``. They become the line and
duplicate key the general path gives them (openai's reader, check_conversation, the writer,
duplicate_key), without the canonical model.

It takes only rows the general path would keep with nothing to say, in the exact shapes above; any
other row (a missing or unknown key, a call no later turn answers in order, text with ``<think>``,
``<tool_call>`` or ``<tool_response>``, arguments that are not JSON, an empty turn, a top-level
system or provenance) goes to the general path, which names the fault. The tests compare both paths
byte for byte."""

from __future__ import annotations

from typing import Any

import orjson
from xxhash import xxh3_64_intdigest

from draftdeck.convert.checks import TURN_STYLE
from draftdeck.convert.fast_line import Result, kept_fields, row_line
from draftdeck.formats.model import PROVENANCE_KEY

# each target's (role key, text key, {role: the name it writes}), the tool role included (the
# writer writes it as it is in both targets)
_STYLE = {
    to: (role_key, text_key, {**names, "tool": "tool"})
    for to, (role_key, text_key, names) in TURN_STYLE.items()
}
_CALL_KEYS = frozenset({"id", "type", "function"})
_FUNCTION_KEYS = frozenset({"name", "arguments"})
_ROW_KEYS = ("messages", "tools")


def tool_row(value: dict[str, Any], to: str, dups: bool, origin: tuple[str, int | None]) -> Result | None:
    """(family, output line, duplicate key) of an OpenAI row with tool calls (see the module), or None
    for the general path. `value` is a row with a ``messages`` list and no media."""
    if "system" in value or "functions" in value or PROVENANCE_KEY in value:
        return None
    tools = value.get("tools")
    if tools is not None and tools != "":
        if type(tools) is not list or not all(type(t) is dict for t in tools):
            return None  # (JSON text, or not a list of definitions: parse_tools decides)
        if tools and "input_schema" in tools[0]:
            return None  # Anthropic's tool definitions: detection reads the row as theirs
    role_key, text_key, names = _STYLE[to]
    out_turns: list[dict[str, Any]] = []
    parts: list[Any] = []  # duplicate_key's parts of a conversation that is not plain
    has_user = has_assistant = has_calls = False
    # check_conversation's walk, on the shapes taken here: the role before (tool turns aside), whether
    # it called tools, and the ids of its calls no tool turn has answered yet
    prev = None
    prev_calls = False
    pending: set[str] = set()
    try:
        for m in value["messages"]:
            role = m["role"]
            content = m["content"]
            if type(content) is not str or type(role) is not str:
                return None
            turn: dict[str, Any] = {role_key: names[role], text_key: content}
            blank = not content or content.isspace()
            calls = None
            if len(m) == 2:
                if blank or role == "tool":
                    return None  # empty_turn, empty_assistant_turn; a result without its call's id
            elif role == "assistant" and len(m) == 3:
                calls = _calls(m["tool_calls"])
                if calls is None:
                    return None
                turn["tool_calls"] = calls[0]
            elif role == "tool" and len(m) == 3:
                cid = m["tool_call_id"]
                if blank or type(cid) is not str or cid not in pending:
                    return None  # empty_turn, or orphan_tool_result (or an answer the general path pairs)
                pending.discard(cid)
                turn["tool_call_id"] = cid
                if "<tool_response>" in content:
                    return None  # Hermes-style results: the general path lifts them
            else:
                return None
            if role == "assistant":
                if "<think>" in content or "<tool_call>" in content:
                    return None  # reasoning to split, Hermes-style calls
                if role == prev and not prev_calls:
                    return None  # non_alternating
                has_assistant = True
                if calls is not None:
                    has_calls = True
                    pending = calls[2]
                prev, prev_calls = role, calls is not None
            elif role == "user":
                if prev == "user":
                    return None  # non_alternating
                has_user = True
                pending = set()
                prev, prev_calls = role, False
            elif role != "system" and role != "tool":
                return None  # (a role the openai reader maps or refuses)
            out_turns.append(turn)
            parts += (
                role,
                content.strip() if content[:1].isspace() or content[-1:].isspace() else content,
                None,
            )
            if calls is not None:
                parts.append(calls[1])
    except (KeyError, TypeError):  # a missing key, an unknown or unhashable role, a turn that is no object
        return None
    if not has_calls or not has_user or not has_assistant or prev == "user":
        return None  # (plain rows are the plain fast path's), no_user_turn, trailing_user_turn...
    meta = kept_fields(value, _ROW_KEYS)
    if meta is None:
        return None
    if tools:
        meta.insert(0, "tools")  # written after the turns, as the writer writes a conversation's tools
    try:
        body = orjson.dumps(out_turns)
        line, _ = row_line(body, out_turns, value, meta, to, origin)
        dkey = xxh3_64_intdigest(orjson.dumps(parts)) if dups else None
    except orjson.JSONEncodeError:
        return None
    return "openai", line, dkey


def _calls(calls: Any) -> tuple[list[dict[str, Any]], list[tuple[str, str]], set[str]] | None:
    """An assistant turn's tool calls as the writer writes them (arguments re-encoded from their
    parsed JSON), as duplicate_key reads them ((name, repr of the parsed arguments)), and their ids;
    None for calls in any other shape than {"id": text, "type", "function": {"name": text,
    "arguments": JSON text}}."""
    if type(calls) is not list or not calls:
        return None
    written: list[dict[str, Any]] = []
    keyed: list[tuple[str, str]] = []
    ids: set[str] = set()
    for c in calls:
        if type(c) is not dict or c.keys() != _CALL_KEYS:
            return None
        fn, cid = c["function"], c["id"]
        if type(fn) is not dict or fn.keys() != _FUNCTION_KEYS or type(cid) is not str or not cid:
            return None
        name, raw = fn["name"], fn["arguments"]
        if type(name) is not str or type(raw) is not str:
            return None
        try:
            args = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None  # invalid_tool_arguments
        written.append(
            {
                "id": cid,
                "type": "function",
                "function": {"name": name, "arguments": orjson.dumps(args).decode()},
            }
        )
        keyed.append((name, repr(args)))
        ids.add(cid)
    return written, keyed, ids
