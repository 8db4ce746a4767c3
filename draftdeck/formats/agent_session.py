"""Coding-agent session logs: JSONL, one event per line, the lines of a session forming one conversation.

A line is ``{"type": "user" | "assistant" | "summary" | "system" | ..., "uuid", "parentUuid",
"sessionId", "isSidechain"?, "timestamp", "message"?: an Anthropic Messages turn}`` (the log Claude
Code writes; other agents built on the Messages API write the same). The lines are grouped by
:mod:`draftdeck.formats.grouping`; one group reaches :func:`parse_row` as ``{"agent_session": [lines]}``:

- **a conversation** is a chain of lines linked by ``parentUuid``: a line without a parent (the
  session's start, a sidechain's start, a ``/clear``) opens a new one; a sidechain (a sub-agent's
  work) is its own conversation. Where a chain branches (a turn edited or retried), the path that
  leads to the chain's last line is kept, the abandoned branch counted as ``abandoned_branch``.
- **a log without links**: where no line of a session (or of its sidechain) names a parent (every
  ``parentUuid`` null: logs written so, or with their links stripped, are public), a null parent says
  nothing, and the lines are one conversation in file order; a ``summary`` line's ``leafUuid`` names
  the last message of a conversation, so the line after that leaf starts the next one.
- **turns**: the ``message`` of ``user`` / ``assistant`` lines, read as Anthropic turns
  (:mod:`draftdeck.formats.anthropic`): ``tool_use`` blocks are tool calls with their ids,
  ``tool_result`` blocks tool messages (``is_error`` kept), ``thinking`` the reasoning. The API
  streams one answer as several lines (a thinking block, a text block, a tool call), each with the
  same ``message.id``: they are one assistant turn again.
- ``summary``, ``system``, ``file-history-snapshot`` and other lines without a turn are
  ``session_metadata``: counted, not trained on. Line-level bookkeeping (``toolUseResult``, ``cwd``,
  ``usage``...) repeats what the turns hold or describes the run; the session id, working folder,
  branch and model are kept as the row's metadata.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from draftdeck.formats import anthropic
from draftdeck.formats.common import ParseContext, RowRejected
from draftdeck.formats.model import Conversation

FAMILY = "agent_session"
KEY = "agent_session"
TURN_TYPES = frozenset({"user", "assistant"})


def is_line(value: Any) -> bool:
    """Whether a raw row is a line of a session log (a turn or the session's metadata)."""
    if type(value) is not dict or not isinstance(value.get("type"), str):
        return False
    if "sessionId" in value or "parentUuid" in value:
        return True
    return value["type"] == "summary" and "leafUuid" in value  # a summary line has no session id


def is_metadata(value: Any) -> bool:
    """Within a session log: a line that is no turn (a summary, a system note, a file snapshot...)."""
    return type(value) is dict and isinstance(value.get("type"), str) and not is_turn(value)


def is_turn(value: dict[str, Any]) -> bool:
    message = value.get("message")
    return value.get("type") in TURN_TYPES and isinstance(message, dict) and "role" in message


def turn_lines(lines: list[tuple[int, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """The turn lines of a session's rows ((position, value) pairs), each linked to its nearest turn
    ancestor: a turn whose parent is a metadata line (a system note, a compaction boundary) hangs on
    that line's parent instead, so the chain does not break there."""
    links = {
        v["uuid"]: v.get("parentUuid") for _, v in lines if is_line(v) and isinstance(v.get("uuid"), str)
    }
    turns = [(pos, v) for pos, v in lines if is_line(v) and is_turn(v)]
    turn_ids = {v["uuid"] for _, v in turns if isinstance(v.get("uuid"), str)}
    out = []
    for pos, v in turns:
        parent, hops = v.get("parentUuid"), 0
        while isinstance(parent, str) and parent in links and parent not in turn_ids and hops < len(links):
            parent, hops = links[parent], hops + 1
        out.append((pos, v if parent == v.get("parentUuid") else {**v, "parentUuid": parent}))
    return out


def lane(line: dict[str, Any]) -> tuple[Any, bool, Any]:
    """The thread a line belongs to: its session, and within it the main thread or a sub-agent's."""
    return line.get("sessionId"), line.get("isSidechain") is True, line.get("agentId")


def leaves(values: Iterable[Any]) -> frozenset[str]:
    """The ``leafUuid`` of each summary line among `values`: the last message of a conversation."""
    return frozenset(
        v["leafUuid"]
        for v in values
        if type(v) is dict and v.get("type") == "summary" and isinstance(v.get("leafUuid"), str)
    )


def chains(lines: list[tuple[int, dict[str, Any]]], ends: frozenset[str] = frozenset()) -> list[list[int]]:
    """The conversations of a session's turn lines ((position, line) pairs, in file order): each a list
    of positions, grouped by parentUuid chain (a sidechain or a parentless line starts its own).

    A lane none of whose lines names a parent is read in file order instead: there a null parent is the
    log saying nothing, not a new conversation (each line would be one, none with both sides), and a
    line that is a summary's leaf (`ends`) is the last of its conversation."""
    linked = {lane(line) for _, line in lines if isinstance(line.get("parentUuid"), str)}
    group_of: dict[str, int] = {}  # uuid -> group
    last_of: dict[tuple[Any, bool, Any], int] = {}  # (session, sidechain, sub-agent) -> its latest group
    closed: set[tuple[Any, bool, Any]] = set()  # unlinked lanes whose latest line was a summary's leaf
    groups: list[list[int]] = []
    for pos, line in lines:
        parent = line.get("parentUuid")
        here = lane(line)
        if isinstance(parent, str) and parent in group_of:
            g = group_of[parent]
        elif (
            here not in last_of
            or here in closed
            or (here in linked and parent is None and "parentUuid" in line)
        ):
            g = len(groups)
            groups.append([])
        else:  # a parent we never saw (a metadata line, a cut log), no uuids at all, or a lane in file order
            g = last_of[here]
        groups[g].append(pos)
        last_of[here] = g
        uuid = line.get("uuid")
        if isinstance(uuid, str):
            group_of[uuid] = g
        if here not in linked and uuid in ends:
            closed.add(here)
        else:
            closed.discard(here)
    return groups


def main_path(group: list[int], lines: dict[int, dict[str, Any]]) -> list[int]:
    """The positions on the path from the group's first line to its last one, following parentUuid;
    the whole group when its lines carry no uuids or name no parent (a log in file order)."""
    by_uuid = {lines[p].get("uuid"): p for p in group if isinstance(lines[p].get("uuid"), str)}
    if not by_uuid or not any(isinstance(lines[p].get("parentUuid"), str) for p in group):
        return group
    path: list[int] = []
    seen: set[int] = set()
    pos: int | None = group[-1]
    while pos is not None and pos not in seen:
        seen.add(pos)
        path.append(pos)
        parent = lines[pos].get("parentUuid")
        pos = by_uuid.get(parent) if isinstance(parent, str) else None
    path.reverse()
    return path


def _messages(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Anthropic messages of a chain's lines: an answer streamed over several lines (one
    ``message.id``) is one message again."""
    out: list[dict[str, Any]] = []
    last_id: Any = None
    for line in lines:
        message = line["message"]
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
        mid = message.get("id") if message.get("role") == "assistant" else None
        if mid is not None and mid == last_id and out:
            out[-1]["content"].extend(blocks)
            continue
        out.append({"role": message.get("role"), "content": list(blocks)})
        last_id = mid
    return out


def parse_row(value: dict[str, Any], ctx: ParseContext) -> list[Conversation]:
    lines = value.get(KEY)
    if not isinstance(lines, list) or not all(isinstance(v, dict) for v in lines):
        raise RowRejected("unknown_format", f"{KEY} is not a list of session lines")
    turns = [line for line in lines if is_turn(line)]
    if not turns:
        raise RowRejected("empty_conversation", "the session has no user or assistant line")
    (conv,) = anthropic.parse_row({"messages": _messages(turns)}, ctx)
    conv.source_format = FAMILY
    conv.meta = _meta(turns)
    return [conv]


def _meta(lines: list[dict[str, Any]]) -> dict[str, Any]:
    first = lines[0]
    meta = {
        key: first[field]
        for key, field in (("session_id", "sessionId"), ("cwd", "cwd"), ("git_branch", "gitBranch"))
        if isinstance(first.get(field), str)
    }
    if first.get("isSidechain") is True:
        meta["sidechain"] = True
    models = {line["message"].get("model") for line in lines if line["message"].get("role") == "assistant"}
    models.discard(None)
    if models:
        meta["model"] = ", ".join(sorted(map(str, models)))
    return meta
