"""Files whose conversations span many rows: an agent session log (a line per event) and an agent event
stream (a JSON list of events). :func:`group_rows` turns their rows into conversation rows and keeps
every input row accounted for.

Which kind a file is, is judged once, by its first readable row; a file of any other kind passes
through untouched (no cost for the usual chat file). Rows of a grouped file are held until the file
ends (a session's lines may interleave with a sidechain's), then yielded in file order:

- the first row of each conversation carries the whole conversation (``{"agent_session": [...]}``,
  ``{"events": [...]}``), which the per-row detection reads like any other row;
- each later row of it is yielded as an accounted rejection, ``merged_event`` naming the row that
  carries it (``abandoned_branch`` for a session line off the kept path);
- metadata rows (a session's summary lines, an event stream's state changes) as ``session_metadata``;
- rows of another kind in the same file (and unreadable ones) as they came;
- every row of a conversation whose rows together pass the row limit as ``oversize_row`` (the limit is
  on a conversation, whatever the rows it is made of).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain
from pathlib import Path
from typing import Any

from draftdeck.formats import agent_session, event_stream
from draftdeck.formats.common import ParseOptions
from draftdeck.formats.readers import DEFAULT_MAX_ROW_BYTES, RawRow, RowReader


def kind_of(value: Any) -> str | None:
    """The grouped kind a file starting with this row is ("agent_session", "event_stream"), or None."""
    if agent_session.is_line(value):
        return agent_session.FAMILY
    if event_stream.is_event(value) or (isinstance(value, list) and event_stream.is_event_list([value])):
        return event_stream.FAMILY
    return None


def starts_grouped(path: Path) -> bool:
    """Whether the JSON file `path` is a session log or an event stream (its first readable row says)."""
    with RowReader(path) as reader:
        for row in reader:
            if row.error is None:
                return kind_of(row.value) is not None
    return False


GROUPED = frozenset({agent_session.FAMILY, event_stream.FAMILY})


def groups(options: ParseOptions) -> bool:
    """Whether rows are grouped under these options: not when a declared mapping or a forced shape
    other than the grouped ones reads every row as it is."""
    return not options.columns and (options.from_format is None or options.from_format in GROUPED)


def group_rows(rows: Iterable[RawRow], limit: int = DEFAULT_MAX_ROW_BYTES) -> Iterator[RawRow]:
    """`rows` of one file, with a session log's or event stream's rows grouped into conversations of at
    most `limit` bytes. Reads up to the first readable row at once (it says the file's kind); a file
    of another kind is `rows` itself after those, with no generator of ours in between (this runs on
    every row of every convert)."""
    it = iter(rows)
    head: list[RawRow] = []
    kind = None
    for row in it:
        head.append(row)
        if row.error is None:
            kind = kind_of(row.value)
            break
    if kind is None:
        return chain(head, it)
    held = [*head, *it]
    return _sessions(held, limit) if kind == agent_session.FAMILY else _stream(held, limit)


def _folded(row: RawRow, code: str, reason: str) -> RawRow:
    return RawRow(row.file, row.index, row.line, None, row.nbytes, code, reason)


def _where(row: RawRow) -> str:
    return f"line {row.line}" if row.line is not None else f"record {row.index}"


def _oversize(
    held: list[RawRow], rows: Iterable[int], first: RawRow, size: int, limit: int
) -> dict[int, RawRow]:
    """Every row of a conversation over the limit, rejected as oversize_row (the conversation is lost)."""
    why = f"part of the conversation at {_where(first)}: its {size:,} bytes exceed the limit of {limit:,}"
    return {pos: _folded(held[pos], "oversize_row", why) for pos in rows}


def _sessions(held: list[RawRow], limit: int) -> Iterator[RawRow]:
    turns = agent_session.turn_lines([(pos, row.value) for pos, row in enumerate(held) if row.error is None])
    values = dict(turns)
    ends = agent_session.leaves(row.value for row in held if row.error is None)
    verdicts: dict[int, RawRow] = {}
    for group in agent_session.chains(turns, ends):
        path = agent_session.main_path(group, values)
        first = held[path[0]]
        size = sum(held[p].nbytes for p in group)
        if size > limit:
            verdicts.update(_oversize(held, group, first, size, limit))
            continue
        verdicts[path[0]] = RawRow(
            first.file, first.index, first.line, {agent_session.KEY: [values[p] for p in path]}, size
        )
        on_path = set(path)
        for pos in group:
            if pos == path[0]:
                continue
            if pos in on_path:
                reason = f"merged into the session conversation at {_where(first)}"
                verdicts[pos] = _folded(held[pos], "merged_event", reason)
            else:
                reason = f"on a branch the session at {_where(first)} left (an edited or retried turn)"
                verdicts[pos] = _folded(held[pos], "abandoned_branch", reason)
    for pos, row in enumerate(held):
        if pos in verdicts:
            yield verdicts[pos]
        elif row.error is None and agent_session.is_metadata(row.value):
            kind = row.value.get("type")
            yield _folded(row, "session_metadata", f"a {kind!r} line of the session log, not a turn")
        else:
            yield row


def _stream(held: list[RawRow], limit: int) -> Iterator[RawRow]:
    """A file of events (or of [action, observation] pairs, a row each): one conversation."""

    def events_of(row: RawRow) -> list[Any]:
        if row.error is not None:
            return []
        found = event_stream.flat([row.value]) if isinstance(row.value, list) else [row.value]
        return found if found and all(event_stream.is_event(e) for e in found) else []

    events = {pos: events_of(row) for pos, row in enumerate(held)}
    turns = [pos for pos, evs in events.items() if any(event_stream.is_turn(e) for e in evs)]
    first = held[turns[0]] if turns else None
    size = sum(held[p].nbytes for p, evs in events.items() if evs)
    over = _oversize(held, turns, first, size, limit) if first is not None and size > limit else {}
    for pos, row in enumerate(held):
        if pos in over:
            yield over[pos]
        elif not events[pos]:
            yield row
        elif first is not None and pos == turns[0]:
            value = {event_stream.KEY: [e for p in turns for e in events[p] if event_stream.is_turn(e)]}
            yield RawRow(row.file, row.index, row.line, value, size)
        elif pos in turns:
            assert first is not None
            reason = f"merged into the event stream's conversation at {_where(first)}"
            yield _folded(row, "merged_event", reason)
        else:
            what = events[pos][0].get("action") or events[pos][0].get("observation")
            yield _folded(row, "session_metadata", f"a {what!r} event of the stream, not a turn")
