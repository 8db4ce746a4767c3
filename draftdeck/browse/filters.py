"""Which rows a user asks for: filters on the shards' columns, bounded text search, navigation.

Structural filters (source, truncated, turn, length, trained fraction) are vectorised over the
memory-mapped columns (Arrow compute) and computed once per (dataset, filter). Text search decodes
rows in batches, with a bounded budget per request, and says how far it looked.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.compute as pc

from draftdeck.browse.errors import BrowseError
from draftdeck.browse.tokens import TokenTable
from draftdeck.shards.store import ShardDataset
from draftdeck.units import count

SEARCH_BUDGET_ROWS = 20_000
SEARCH_BUDGET_SECONDS = 2.0
SEARCH_BATCH = 512
MAX_CACHED_MATCHES = 32


@dataclass(frozen=True)
class Filters:
    source: str | None = None
    truncated: bool | None = None
    turn: int | None = None
    min_len: int | None = None
    max_len: int | None = None
    min_frac: float | None = None
    max_frac: float | None = None
    q: str | None = None

    @property
    def structural(self) -> bool:
        return any(v is not None for k, v in self.__dict__.items() if k != "q")

    def query(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in self.__dict__.items():
            if value is None:
                continue
            out[key] = ("1" if value else "0") if isinstance(value, bool) else str(value)
        return out

    @classmethod
    def parse(cls, params: dict[str, str]) -> Filters:
        """From query parameters; empty values mean no filter. Raises BrowseError saying what is wrong."""

        def get(name: str) -> str | None:
            value = params.get(name)
            return value.strip() if value and value.strip() else None

        def integer(name: str) -> int | None:
            value = get(name)
            if value is None:
                return None
            try:
                n = int(value)
            except ValueError:
                raise BrowseError(f"{name} must be a whole number, not {value!r}") from None
            if n < (-1 if name == "turn" else 0):
                raise BrowseError(
                    f"{name} must be 0 or more{' (or -1: every turn)' if name == 'turn' else ''}, not {n}"
                )
            return n

        def fraction(name: str) -> float | None:
            value = get(name)
            if value is None:
                return None
            try:
                f = float(value)
            except ValueError:
                raise BrowseError(f"{name} must be a number between 0 and 1, not {value!r}") from None
            if not (0.0 <= f <= 1.0) or math.isnan(f):
                raise BrowseError(f"{name} must be between 0 and 1, not {value}")
            return f

        trunc = get("truncated")
        if trunc not in (None, "1", "0", "true", "false", "yes", "no"):
            raise BrowseError(f"truncated must be yes or no, not {trunc!r}")
        f = cls(
            source=get("source"),
            truncated=None if trunc is None else trunc in ("1", "true", "yes"),
            turn=integer("turn"),
            min_len=integer("min_len"),
            max_len=integer("max_len"),
            min_frac=fraction("min_frac"),
            max_frac=fraction("max_frac"),
            q=get("q"),
        )
        if f.min_len is not None and f.max_len is not None and f.min_len > f.max_len:
            raise BrowseError(f"the length range is empty: min_len {f.min_len} > max_len {f.max_len}")
        if f.min_frac is not None and f.max_frac is not None and f.min_frac > f.max_frac:
            raise BrowseError(
                f"the trained-fraction range is empty: min_frac {f.min_frac} > max_frac {f.max_frac}"
            )
        return f


_matches_lock = threading.Lock()


def matching_rows(store: ShardDataset, f: Filters) -> np.ndarray | None:
    """Sorted indices of the rows passing the structural filters (None: every row passes). Cached with
    the store (the last MAX_CACHED_MATCHES filters of each), so they go when the store goes."""
    if not f.structural:
        return None
    key = (f.source, f.truncated, f.turn, f.min_len, f.max_len, f.min_frac, f.max_frac)
    cache: OrderedDict[tuple[Any, ...], np.ndarray] = store.derived("matches", OrderedDict)
    with _matches_lock:
        hit = cache.get(key)
        if hit is not None:
            cache.move_to_end(key)
            return hit
    keep = np.ones(len(store), dtype=bool)
    if f.source is not None:
        col = store.column("source")
        if col is None:
            raise BrowseError("this dataset has no source column to filter on")
        keep &= np.asarray(pc.fill_null(pc.equal(col, f.source), False).to_numpy(zero_copy_only=False))
    if f.truncated is not None:
        col = store.column("truncated")
        if col is None:
            raise BrowseError("this dataset has no truncated column to filter on")
        keep &= np.asarray(col.to_numpy(zero_copy_only=False), dtype=bool) == f.truncated
    if f.turn is not None:
        col = store.column("turn")
        if col is None:
            raise BrowseError("this dataset has no turn column to filter on")
        keep &= np.asarray(col.to_numpy(zero_copy_only=False)) == f.turn
    if f.min_len is not None or f.max_len is not None:
        lengths = store.lengths()
        if f.min_len is not None:
            keep &= lengths >= f.min_len
        if f.max_len is not None:
            keep &= lengths <= f.max_len
    if f.min_frac is not None or f.max_frac is not None:
        lengths = store.lengths()
        frac = store.n_trained() / np.maximum(lengths, 1)
        if f.min_frac is not None:
            keep &= frac >= f.min_frac - 1e-12
        if f.max_frac is not None:
            keep &= frac <= f.max_frac + 1e-12
    rows = np.flatnonzero(keep)
    with _matches_lock:
        cache[key] = rows
        while len(cache) > MAX_CACHED_MATCHES:
            cache.popitem(last=False)
    return rows


@dataclass
class Step:
    """Where a navigation request landed: a row, or None with a message saying why."""

    row: int | None
    message: str | None = None
    searched: int = 0  # rows decoded for a text search
    resume_at: int | None = None  # where to continue a search that ran out of budget


def _candidates(store: ShardDataset, f: Filters, start: int, direction: int) -> Iterator[int]:
    """Rows passing the structural filters, from `start` (inclusive) in `direction`."""
    n = len(store)
    rows = matching_rows(store, f)
    if rows is None:
        yield from (range(start, n) if direction > 0 else range(start, -1, -1))
        return
    if direction > 0:
        at = int(np.searchsorted(rows, start, side="left"))
        yield from (int(r) for r in rows[at:])
    else:
        at = int(np.searchsorted(rows, start, side="right")) - 1
        yield from (int(r) for r in rows[at::-1] if at >= 0)


def first_match(
    store: ShardDataset, table: TokenTable | None, f: Filters, start: int, direction: int
) -> Step:
    """The first row at or after `start` (before, when direction < 0) passing every filter, text search
    included. The search decodes at most SEARCH_BUDGET_ROWS rows / SEARCH_BUDGET_SECONDS per call."""
    n = len(store)
    if n == 0:
        return Step(None, "this dataset has no rows")
    if not 0 <= start < n:
        edge = "last" if start >= n else "first"
        return Step(None, f"this is the {edge} row" + (" that matches" if f.structural or f.q else ""))
    if not f.q:
        for row in _candidates(store, f, start, direction):
            return Step(row)
        return Step(
            None, "no row matches these filters" + (" in this direction" if start not in (0, n - 1) else "")
        )
    if table is None:
        raise BrowseError("text search needs the tokenizer, which this dataset does not name")
    needle = f.q.casefold()
    deadline = time.monotonic() + SEARCH_BUDGET_SECONDS
    searched = 0
    batch: list[int] = []
    last = start
    candidates = _candidates(store, f, start, direction)
    while True:
        batch = [r for _, r in zip(range(SEARCH_BATCH), candidates, strict=False)]
        if not batch:
            return Step(
                None,
                f"no row contains {f.q!r}" + (" with these filters" if f.structural else ""),
                searched=searched,
            )
        texts = table.decode(store.take_ids(np.asarray(batch, dtype=np.int64)))
        searched += len(batch)
        for row, text in zip(batch, texts, strict=True):
            if needle in text.casefold():
                return Step(row, searched=searched)
        last = batch[-1]
        if searched >= SEARCH_BUDGET_ROWS or time.monotonic() > deadline:
            resume = last + direction
            if not 0 <= resume < n:
                return Step(None, f"no row contains {f.q!r}", searched=searched)
            return Step(
                None,
                f"{f.q!r} not found in the {count(searched, 'rows')} searched (up to row {last:,})",
                searched=searched,
                resume_at=resume,
            )


def random_match(store: ShardDataset, table: TokenTable | None, f: Filters, rng: random.Random) -> Step:
    n = len(store)
    if n == 0:
        return Step(None, "this dataset has no rows")
    rows = matching_rows(store, f)
    if rows is not None and len(rows) == 0:
        return Step(None, "no row matches these filters")
    pick = rng.randrange(n) if rows is None else int(rows[rng.randrange(len(rows))])
    if not f.q:
        return Step(pick)
    step = first_match(store, table, f, pick, 1)
    if step.row is None and step.resume_at is None and pick > 0:
        step = first_match(store, table, f, 0, 1)  # wrap around once
    return step


def position_in(store: ShardDataset, f: Filters, row: int) -> tuple[int | None, int]:
    """(1-based position of `row` among the rows passing the structural filters, how many pass)."""
    rows = matching_rows(store, f)
    if rows is None:
        return row + 1, len(store)
    at = int(np.searchsorted(rows, row))
    return (at + 1 if at < len(rows) and rows[at] == row else None), len(rows)


NAVIGATIONS = ("next", "prev", "random", "first", "row", "resume")


def navigate(
    store: ShardDataset, table: TokenTable | None, f: Filters, to: str, current: int, rng: random.Random
) -> Step:
    """Where a navigation lands: to = next | prev | random | first | row (current is the row) | resume (a
    search continued from current)."""
    if to == "row":
        if not 0 <= current < len(store):
            raise BrowseError(
                f"row {current} is out of range: this dataset has rows 0 to {len(store) - 1}"
                if len(store)
                else "this dataset has no rows"
            )
        return Step(current)
    if to == "next":
        return first_match(store, table, f, current + 1, 1)
    if to == "prev":
        return (
            first_match(store, table, f, current - 1, -1)
            if current > 0
            else Step(None, "this is the first row")
        )
    if to == "random":
        return random_match(store, table, f, rng)
    if to in ("first", "resume"):
        return first_match(store, table, f, current if to == "resume" else 0, 1)
    raise BrowseError(f"unknown navigation {to!r}: use next, prev, random, first or row")
