"""Streaming readers for chat data files.

Every reader yields :class:`RawRow` values one at a time and never holds a whole file in memory:
JSONL (blank lines, CRLF, a BOM and a missing final newline are fine), JSON arrays of any size
(each item framed, then parsed alone), single or concatenated JSON objects, each plain, gzip or zstd
compressed. No record costs more memory than the row limit, however it is nested (MAX_DEPTH).
A row that cannot be parsed is yielded too, with an issue code and a reason, so the caller can
count it: nothing is skipped silently.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from itertools import chain
from pathlib import Path
from typing import IO, Any

import orjson

from draftdeck.errors import InputError
from draftdeck.formats.split import MAX_DEPTH, json_records
from draftdeck.progress import Progress, no_progress

DEFAULT_MAX_ROW_BYTES = 64 * 1024 * 1024
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_BOM = b"\xef\xbb\xbf"
_SKIP_CHUNK = 1 << 20


@dataclass(slots=True)
class RawRow:
    """One record of an input file, parsed or not.

    `line` is the 1-based line for JSONL, None inside JSON arrays and objects; `index` is the
    0-based position of the record in the file. When `error` (an issue code) is set, `value` is None
    and `reason` says what went wrong.
    """

    file: str
    index: int
    line: int | None
    value: Any
    nbytes: int
    error: str | None = None
    reason: str | None = None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else f"{self.file}[{self.index}]"


class _CountingReader(io.RawIOBase):
    """Counts the bytes read from the underlying (compressed) file, for progress in bytes."""

    def __init__(self, raw: IO[bytes]):
        self._raw = raw
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._raw.readinto(buffer)  # type: ignore[attr-defined]
        self.count += n or 0
        return n or 0

    def close(self) -> None:
        self._raw.close()
        super().close()


class _PrefixedReader(io.RawIOBase):
    """Serves `prefix` first, then the rest of `rest`: lets us sniff a stream we cannot seek (a pipe)."""

    def __init__(self, prefix: bytes, rest: IO[bytes]):
        self._prefix = prefix
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._prefix:
            n = min(len(buffer), len(self._prefix))
            buffer[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        return self._rest.readinto(buffer)  # type: ignore[attr-defined]


@dataclass
class OpenedFile:
    stream: io.BufferedReader
    counter: _CountingReader
    size: int | None
    compression: str | None


def open_data_file(path: Path) -> OpenedFile:
    """Open `path` for streaming, undoing gzip or zstd compression found by magic bytes."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path}: is a directory, not a data file")
    try:
        raw = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by the caller through OpenedFile
    except OSError as exc:
        raise InputError(f"{path}: cannot open ({exc.strerror})") from None
    counter = _CountingReader(raw)
    buffered = io.BufferedReader(counter, buffer_size=1 << 20)
    magic = buffered.peek(4)[:4]
    size = st.st_size if stat.S_ISREG(st.st_mode) else None
    if magic.startswith(_GZIP_MAGIC):
        import gzip  # (here: most inputs are plain files)

        inner: Any = gzip.GzipFile(fileobj=buffered, mode="rb")
        return OpenedFile(io.BufferedReader(inner, 1 << 20), counter, size, "gzip")
    if magic == _ZSTD_MAGIC:
        import zstandard

        inner = zstandard.ZstdDecompressor().stream_reader(buffered, read_across_frames=True)
        return OpenedFile(io.BufferedReader(inner, 1 << 20), counter, size, "zstd")
    return OpenedFile(buffered, counter, size, None)  # type: ignore[arg-type]


def _classify_error(data: bytes, exc: Exception) -> tuple[str, str]:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as uexc:
        return "encoding_error", f"not valid UTF-8 at byte {uexc.start}"
    msg = str(exc).split(": line ")[0]
    if msg.startswith("depth limit exceeded"):
        return (
            "too_deep",
            f"nested more than {MAX_DEPTH:,} levels deep (arrays and objects within each other)",
        )
    return "json_error", f"invalid JSON: {msg}"


def _sniff_container(stream: io.BufferedReader, suffix: str) -> tuple[str, bytes]:
    """Decide between JSONL, a JSON array and (concatenated) JSON objects.

    Returns the container name and the bytes consumed to decide (to be served again).
    """
    head = stream.peek(1 << 16)[: 1 << 16]
    body = head[3:] if head.startswith(_BOM) else head
    first = body.lstrip()[:1]
    if first == b"[" and not suffix.endswith(".jsonl"):  # a .jsonl line may be an array: a (bad) row
        return "json-array", b""
    if first == b"{" and not suffix.endswith(".jsonl"):
        # A JSONL file's first line is a complete object; a pretty-printed object's is not.
        line = stream.readline(DEFAULT_MAX_ROW_BYTES)
        text = line[3:] if line.startswith(_BOM) else line
        try:
            complete = isinstance(orjson.loads(text), dict)
        except orjson.JSONDecodeError:
            complete = False
        return ("jsonl" if complete else "json"), line
    return "jsonl", b""


class RowReader:
    """Iterates the records of one file; `bytes_read`, `size` and `container` describe it."""

    def __init__(
        self, path: Path, *, display_name: str | None = None, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
    ):
        self.path = path
        self.name = display_name or str(path)
        self.max_row_bytes = max_row_bytes
        self._opened = open_data_file(path)
        self.size = self._opened.size
        self.compression = self._opened.compression
        self.container, self._consumed = _sniff_container(
            self._opened.stream, path.name.lower().removesuffix(".gz").removesuffix(".zst")
        )

    @property
    def bytes_read(self) -> int:
        return self._opened.counter.count

    def close(self) -> None:
        self._opened.stream.close()

    def __enter__(self) -> RowReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[RawRow]:
        if self.container == "jsonl":
            return self._jsonl()
        return self._incremental()

    def _jsonl(self) -> Iterator[RawRow]:
        return _jsonl_rows(self.name, self._opened.stream, self._consumed, self.max_row_bytes)

    def _incremental(self) -> Iterator[RawRow]:
        """The records of a JSON array (its items) or of concatenated JSON values, each framed first
        (draftdeck.formats.split: nothing is built for a record over the limit) and parsed alone."""
        head = self._consumed[3:] if self._consumed.startswith(_BOM) else self._consumed
        source = _PrefixedReader(head, self._opened.stream) if head else self._opened.stream
        level = 1 if self.container == "json-array" else 0
        for index, piece in enumerate(json_records(source, level, self.max_row_bytes)):  # type: ignore[arg-type]
            if piece.reason is not None:
                yield RawRow(
                    self.name,
                    index,
                    None,
                    None,
                    piece.size,
                    "json_error",
                    f"invalid JSON after record {index}: {piece.reason}",
                )
            elif piece.size > self.max_row_bytes:
                why = f"record of {piece.size:,} bytes exceeds the limit of {self.max_row_bytes:,} bytes"
                yield RawRow(self.name, index, None, None, piece.size, "oversize_row", why)
            else:
                yield _parsed(self.name, index, None, piece.data)


def _parsed(name: str, index: int, line: int | None, data: bytes) -> RawRow:
    """One record's bytes as a RawRow: its value, or why it is none (too deep, not JSON, not UTF-8)."""
    try:
        return RawRow(name, index, line, orjson.loads(data), len(data))
    except orjson.JSONDecodeError as exc:
        code, reason = _classify_error(data, exc)
        return RawRow(name, index, line, None, len(data), code, reason)


def _jsonl_rows(
    name: str, stream: IO[bytes], prefix: bytes, limit: int, first_line: int = 1, *, bom: bool = True
) -> Iterator[RawRow]:
    """The rows of the JSONL text `prefix` + `stream`, its lines numbered from `first_line`; a BOM is
    dropped on line 1 if `bom`. A line over `limit` is skipped in chunks, never held whole (its row is
    oversize_row with its full size). Lines are read, framed and parsed in this one loop: it runs once
    per row of every JSONL input (convert's hot path), where a generator per stage cost a resume and a
    tuple each."""
    loads, decode_error = orjson.loads, orjson.JSONDecodeError
    readline = stream.readline
    cap = limit + 1
    lineno = first_line - 1
    index = 0
    lines: Iterator[bytes] = iter(partial(readline, cap), b"")  # (the calls in C, not in this loop)
    if prefix:
        if not prefix.endswith(b"\n"):
            prefix += readline(max(cap - len(prefix), 1))
        lines = chain((prefix,), lines)
    for line in lines:
        lineno += 1
        if len(line) > limit and not line.endswith(b"\n"):
            size = len(line)
            while True:
                chunk = readline(_SKIP_CHUNK)
                size += len(chunk)
                if not chunk or chunk.endswith(b"\n"):
                    break
            why = f"row of {size:,} bytes exceeds the limit of {limit:,} bytes"
            yield RawRow(name, index, lineno, None, size, "oversize_row", why)
            index += 1
            continue
        if lineno == 1 and bom and line.startswith(_BOM):
            line = line[3:]
            if not line:
                continue
        if line.isspace():  # blank (isspace: no copy of the line, unlike strip)
            continue
        try:
            value = loads(line)
        except decode_error as exc:
            code, reason = _classify_error(line, exc)
            if code == "json_error" and not line.endswith(b"\n"):
                reason = f"{reason} (the last line is truncated)"
            yield RawRow(name, index, lineno, None, len(line), code, reason)
        else:
            yield RawRow(name, index, lineno, value, len(line))
        index += 1


class _RangeReader(io.RawIOBase):
    """The bytes [start, end) of a file; counts the newlines it reads."""

    def __init__(self, raw: IO[bytes], start: int, end: int):
        raw.seek(start)
        self._raw = raw
        self._left = end - start
        self.newlines = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._left <= 0:
            return 0
        view = memoryview(buffer)[: self._left]
        n = self._raw.readinto(view) or 0  # type: ignore[attr-defined]
        self._left -= n
        self.newlines += view[:n].tobytes().count(b"\n")
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


class JsonlRange:
    """The rows of bytes [start, end) of an uncompressed JSONL file, as :class:`RowReader` yields them.

    `start` must be 0 or follow a newline, and `end` must follow a newline or be the file's end (see
    :func:`jsonl_chunks`). Lines are numbered from `first_line`; after iterating, `newlines` is the
    number of newlines in the range (what the next range's first line number adds). `index` counts
    the rows within the range (from 0).
    """

    def __init__(
        self,
        path: Path,
        start: int,
        end: int,
        first_line: int = 1,
        *,
        display_name: str | None = None,
        max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
    ):
        self.path, self.start, self.end, self.first_line = path, start, end, first_line
        self.name = display_name or str(path)
        self.max_row_bytes = max_row_bytes
        self.newlines = 0

    def __iter__(self) -> Iterator[RawRow]:
        raw = open(self.path, "rb", buffering=0)  # noqa: SIM115 - closed with the stream below
        counter = _RangeReader(raw, self.start, self.end)
        with io.BufferedReader(counter, buffer_size=1 << 20) as stream:
            yield from _jsonl_rows(
                self.name, stream, b"", self.max_row_bytes, self.first_line, bom=self.start == 0
            )
            self.newlines = counter.newlines


def jsonl_chunks(path: Path, chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """Split an uncompressed JSONL file into (start, end) byte ranges of about `chunk_bytes`.

    Every range but the last ends just after a newline, so no line (and no UTF-8 character: a newline
    byte never occurs inside one) is cut; a line longer than `chunk_bytes` makes its range longer.
    Only a few bytes around each cut are read. Yields nothing for an empty file.
    """
    if chunk_bytes < 1:
        raise ValueError("chunk_bytes must be positive")
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        start = 0
        while start < size:
            cut = start + chunk_bytes
            if cut >= size:
                yield start, size
                return
            f.seek(cut - 1)  # a range may end right after a newline at its last byte
            while True:
                window = f.read(1 << 16)
                if not window:
                    cut = size
                    break
                nl = window.find(b"\n")
                if nl >= 0:
                    cut += nl
                    break
                cut += len(window)
            yield start, cut
            start = cut


def iter_rows(
    path: Path, *, progress: Progress = no_progress, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
) -> Iterator[RawRow]:
    """Yield every record of `path`, reporting progress in bytes of the file as stored."""
    with RowReader(path, max_row_bytes=max_row_bytes) as reader:
        for i, row in enumerate(reader):
            if i % 1024 == 0:
                progress(reader.bytes_read, reader.size, "bytes")
            yield row
        progress(reader.bytes_read, reader.size, "bytes")
