"""Where each record of a JSON array, a run of JSON values or a CSV file ends, found without parsing.

A parser that builds a file's structure as it reads costs memory that the file's author chooses: the
incremental JSON parser's prefix strings grew with the square of the nesting depth (a 200 KB file of
100,000 nested brackets took 20 GB), and a CSV parser needs a block that holds the largest cell. Here
the bytes are scanned a block at a time, with NumPy, for the few characters that decide where a record
ends (quotes, backslashes, brackets, commas, newlines), so each record's extent is known before anything
parses it:

- a record over the row limit is skipped and counted, never held (its :class:`Piece` has no data);
- every other record is parsed alone (orjson for JSON, with its nesting limit :data:`MAX_DEPTH`; Arrow
  for CSV rows, a chunk of whole rows at a time), so a bad record is rejected by itself and the records
  after it are still read.

Memory is a block plus the records being gathered (at most the row limit each), whatever the file holds.
Multi-byte UTF-8 characters never contain ASCII bytes, so scanning bytes is exact for UTF-8 text.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

# orjson's own nesting limit ("depth limit exceeded"), for JSONL lines and the records here alike: far
# above any chat file (a conversation is a few levels; a tool schema a dozen)
MAX_DEPTH = 1024
BLOCK_BYTES = 1 << 20

_QUOTE, _BACKSLASH, _COMMA, _NL, _CR = 34, 92, 44, 10, 13


# NumPy is imported when a scan first runs, not with this module: readers import it for every input,
# and most inputs (JSONL) never scan here, while the import is a tenth of a second of every start.
@cache
def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per byte value: opens a level, closes one, is structural ([ { ] } ,)."""
    import numpy as np

    opens = np.zeros(256, np.int8)
    opens[[ord("["), ord("{")]] = 1
    closes = np.zeros(256, np.int8)
    closes[[ord("]"), ord("}")]] = 1
    structural = np.zeros(256, bool)
    structural[[ord("["), ord("{"), ord("]"), ord("}"), _COMMA]] = True
    return opens, closes, structural


@dataclass(slots=True)
class Piece:
    """One record's bytes as found. `data` is empty when the record is over the limit (`size` says how
    big it is); `reason`, when set, says why these bytes are no record (the file ends inside one, ...)."""

    data: bytes
    size: int
    reason: str | None = None


class _Gather:
    """The bytes of the record being read, kept only while they fit the limit."""

    def __init__(self, limit: int):
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, data: bytes) -> None:
        self.size += len(data)
        if self.size <= self.limit:
            self.parts.append(data)
        elif self.parts:
            self.parts = []  # over the limit: only its size is kept

    def take(self) -> Piece:
        data = b"".join(self.parts) if self.size <= self.limit else b""
        piece = Piece(data, self.size)
        self.parts, self.size = [], 0
        return piece


def _blocks(stream: IO[bytes], block: int) -> Iterator[bytes]:
    while True:
        data = stream.read(block)
        if not data:
            return
        yield data


class _Escapes:
    """Which quotes a backslash escapes: those after an odd run of backslashes (a run may start in the
    block before; `odd` carries its parity)."""

    def __init__(self) -> None:
        self.odd = False

    def real_quotes(self, a: np.ndarray) -> np.ndarray:
        import numpy as np

        quotes = np.flatnonzero(a == _QUOTE)
        slashes = np.flatnonzero(a == _BACKSLASH)
        carried, self.odd = self.odd, False
        if slashes.size == 0:
            return quotes[1:] if carried and quotes.size and quotes[0] == 0 else quotes
        first = np.ones(slashes.size, bool)
        first[1:] = np.diff(slashes) != 1
        run_start = slashes[np.maximum.accumulate(np.where(first, np.arange(slashes.size), 0))]
        # the run ending just before each quote, if any
        j = np.minimum(np.searchsorted(slashes, quotes - 1), slashes.size - 1)
        after_run = slashes[j] == quotes - 1
        length = quotes - run_start[j] + np.where(run_start[j] == 0, int(carried), 0)
        escaped = after_run & (length % 2 == 1)
        if carried and quotes.size and quotes[0] == 0:
            escaped[0] = True
        if a[-1] == _BACKSLASH:
            tail = a.size - run_start[-1] + (int(carried) if run_start[-1] == 0 else 0)
            self.odd = tail % 2 == 1
        return quotes[~escaped]


class _JsonScan:
    """The structural characters of a JSON text outside its strings, block by block: where each is, what
    it is, and the nesting depth before it (those at depth 0 and 1 only)."""

    def __init__(self) -> None:
        self.escapes = _Escapes()
        self.in_string = False
        self.depth = 0

    def scan(self, data: bytes) -> tuple[list[int], list[int], list[int]]:
        import numpy as np

        a = np.frombuffer(data, np.uint8)
        quotes = self.escapes.real_quotes(a)
        opens, closes, structural = _tables()
        marks = np.flatnonzero(structural[a])
        marks = marks[(np.searchsorted(quotes, marks) + int(self.in_string)) % 2 == 0]
        self.in_string = (int(self.in_string) + quotes.size) % 2 == 1
        chars = a[marks]
        delta = opens[chars].astype(np.int64) - closes[chars]
        before = self.depth + np.cumsum(delta) - delta
        if delta.size:
            self.depth = int(before[-1] + delta[-1])
        keep = before <= 1  # records begin and end at depth 0 and 1: deeper marks are inside one
        return marks[keep].tolist(), chars[keep].tolist(), before[keep].tolist()


def json_records(stream: IO[bytes], level: int, limit: int, block: int = BLOCK_BYTES) -> Iterator[Piece]:
    """The records of a JSON text: the items of its top-level array (`level` 1), or its top-level values
    one after another (`level` 0: one object, or objects concatenated). A record's bytes keep the
    whitespace around it (JSON parsers skip it); an empty array yields nothing. What is not a record
    (data after the array, a bracket closing nothing, a text that ends inside a record) is yielded as a
    Piece with a `reason`."""
    scan = _JsonScan()
    gather = _Gather(limit)
    started = ended = broken = False  # the array opened / closed; a bracket closed nothing (level 0)
    items = 0
    for data in _blocks(stream, block):
        if broken:
            gather.add(data)
            continue
        start = 0
        marks, chars, before = scan.scan(data)
        for pos, char, depth in zip(marks, chars, before, strict=True):
            closes = char in (93, 125)
            if level == 0:
                if closes and depth == 0:  # a bracket that closes nothing: what follows cannot be framed
                    broken = True
                    break
                if closes and depth == 1:
                    gather.add(data[start : pos + 1])
                    yield gather.take()
                    start = pos + 1
                continue
            if ended or depth > 1:
                continue
            if not started:
                if depth == 0 and char == 91:
                    started, start = True, pos + 1
                continue
            if char == _COMMA or closes:  # depth 1: the end of an item
                gather.add(data[start:pos])
                start = pos + 1
                piece = gather.take()
                if char == _COMMA or items or piece.size > limit or piece.data.strip():
                    items += 1
                    yield piece
                ended = closes
        if ended or started or level == 0:
            gather.add(data[start:])
    rest = gather.take()
    content = rest.size > limit or bool(rest.data.strip())
    if broken:
        yield Piece(b"", rest.size, "a closing bracket with nothing open: the rest of the file is not JSON")
    elif level == 0:
        if content:
            yield Piece(rest.data, rest.size, None if scan.depth == 0 else "the file ends inside a value")
    elif not ended:
        yield Piece(b"", rest.size, "the array is not closed: the file ends inside it")
    elif content:
        yield Piece(b"", rest.size, "data after the array's closing bracket")


def row_ends(a: np.ndarray, quoted: bool) -> tuple[np.ndarray, bool]:
    """Where rows end in a block of CSV (the positions of their last byte: a newline outside quotes)
    and whether the block ends inside quotes. A doubled quote inside quotes toggles twice: parity is
    exact for RFC 4180 quoting."""
    import numpy as np

    quotes = np.flatnonzero(a == _QUOTE)
    newlines = np.flatnonzero((a == _NL) | (a == _CR))
    if newlines.size:  # "\r\n" ends a row at its "\n"
        lone = a[np.minimum(newlines + 1, a.size - 1)] != _NL
        newlines = newlines[(a[newlines] == _NL) | (lone & (newlines + 1 < a.size))]
    ends = newlines[(np.searchsorted(quotes, newlines) + int(quoted)) % 2 == 0]
    return ends, (int(quoted) + quotes.size) % 2 == 1


def csv_chunks(stream: IO[bytes], limit: int, block: int = BLOCK_BYTES) -> Iterator[Piece]:
    """The rows of a CSV or TSV text: first the header row alone, then whole rows, many to a piece (about
    a block's worth). A row over `limit` bytes comes alone with no data (`size` is its size); a text that
    ends inside quotes ends with a Piece whose `reason` says so."""
    import numpy as np

    gather = _Gather(limit)  # the row being read
    chunk: list[bytes] = []
    chunk_size = 0
    quoted = False
    header = True
    for data in _blocks(stream, block):
        a = np.frombuffer(data, np.uint8)
        ends, quoted = row_ends(a, quoted)
        if not ends.size:
            gather.add(data)
            continue
        cuts = (ends + 1).tolist()
        gather.add(data[: cuts[0]])
        row = gather.take()
        if header:
            yield row
            header = False
        elif row.size > limit:
            if chunk:
                yield Piece(b"".join(chunk), chunk_size)
                chunk, chunk_size = [], 0
            yield Piece(b"", row.size)
        else:
            chunk.append(row.data)
            chunk_size += row.size
        lengths = np.diff(ends)
        if lengths.size and lengths.max() > limit:
            spans = _split_at_oversize(cuts, lengths, limit)
        else:
            spans = [(cuts[0], cuts[-1], False)]
        for lo, hi, oversize in spans:
            if oversize:
                if chunk:
                    yield Piece(b"".join(chunk), chunk_size)
                    chunk, chunk_size = [], 0
                yield Piece(b"", hi - lo)
            elif hi > lo:
                chunk.append(data[lo:hi])
                chunk_size += hi - lo
        if chunk_size >= block:
            yield Piece(b"".join(chunk), chunk_size)
            chunk, chunk_size = [], 0
        gather.add(data[cuts[-1] :])
    if chunk:
        yield Piece(b"".join(chunk), chunk_size)
    rest = gather.take()
    if header:  # the header row is all there is
        yield rest
    elif rest.size and (rest.size > limit or rest.data.strip()):
        if quoted:
            yield Piece(b"", rest.size, "the file ends inside a quoted value")
        elif rest.size > limit:
            yield Piece(b"", rest.size)
        else:  # the last row without its newline
            yield Piece(rest.data, rest.size)


def _split_at_oversize(cuts: list[int], lengths: np.ndarray, limit: int) -> list[tuple[int, int, bool]]:
    """Byte spans [lo, hi) between `cuts`, runs of rows within the limit apart from each row over it."""
    import numpy as np

    spans: list[tuple[int, int, bool]] = []
    lo = cuts[0]
    for i in np.flatnonzero(lengths > limit).tolist():
        if cuts[i] > lo:
            spans.append((lo, cuts[i], False))
        spans.append((cuts[i], cuts[i + 1], True))
        lo = cuts[i + 1]
    if cuts[-1] > lo:
        spans.append((lo, cuts[-1], False))
    return spans
