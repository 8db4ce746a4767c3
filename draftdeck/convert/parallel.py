"""`convert` with worker processes: large JSONL inputs are cut into byte ranges converted in parallel.

Split of the work (design):

- **Workers** (:mod:`draftdeck.convert.workers`) do everything a row needs that depends on the row
  alone, one byte range at a time, and send back a record per row (its line number, its issues, its
  encoded line). Plain OpenAI / ShareGPT rows that pass every check take a fast path
  (:func:`draftdeck.convert.fast.plain_row`) that gives the same line and hash without building the
  canonical model.
- **The parent** replays the records in input order through the very same state as the one-process
  path (:class:`draftdeck.convert.RowState`: policy verdicts, the placeholder buffer, the duplicate set)
  and writes the encoded lines. So the counts, the examples (the first ones in input order), the
  output bytes and a policy failure (at the same row) are those of ``workers=1``. Each worker has
  its own pipe and the parent reads them in turn in its own thread (no helper threads to contend
  with for the GIL); the usual rows of a range come back packed (:class:`Chunk`).

Ranges come from :func:`draftdeck.formats.readers.jsonl_chunks`: they end just after a newline (the
parent reads only a few bytes around each cut). A worker numbers its lines from 1 and counts the
newlines of its range; the parent, walking the ranges in order, adds the lines of the earlier ranges,
so line numbers in examples and reasons are those of the whole file. At most twice as many ranges
as workers are in flight, so memory stays flat whatever the input size. Inputs that are not plain
(uncompressed) JSONL files larger than one range (JSON arrays, gzip/zstd, Parquet, Arrow,
``save_to_disk`` folders) are read in the parent, through the same record path. The Parquet target
stays on the one-process path (``convert`` decides). With ``workers=1`` every input is read in the
parent through the same records (no worker process): the one-process convert of a JSONL target, whose
usual rows take the fast path too (:func:`_convert_whole` writes them without building anything).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from draftdeck.convert.checks import where_prefix
from draftdeck.convert.fast import plain_row
from draftdeck.convert.options import PROGRESS_EVERY_ROWS, ConvertOptions
from draftdeck.convert.reading import input_files
from draftdeck.convert.verdicts import RowState
from draftdeck.convert.workers import COMPLEX, Chunk, Prepared, Record, Workers, preparer
from draftdeck.errors import JobFailed
from draftdeck.formats.grouping import group_rows, groups, starts_grouped
from draftdeck.formats.readers import RawRow, RowReader, jsonl_chunks
from draftdeck.formats.tables import open_reader
from draftdeck.formats.writers import Writer, meta_collision
from draftdeck.issue_codes import Action
from draftdeck.progress import Progress, no_progress
from draftdeck.quality import Report

CHUNK_BYTES = 4 << 20
_FAST_BLOCK_BYTES = 1 << 20  # as the writer's own buffer


# -- the parent ---------------------------------------------------------------------------------------
class _Out:
    """Writes what the parent keeps, in order, and counts rows_out."""

    def __init__(self, writer: Writer, report: Report):
        self.writer = writer
        self.report = report

    def item(self, item: Prepared) -> None:
        if item.collisions:
            src = item.source
            for key in item.collisions:
                self.report.warn(*meta_collision(src, key))
        assert item.data is not None
        self.writer.write_line(item.data)
        self.report.rows_out += 1

    def block(self, data: memoryview, rows: int) -> None:
        self.writer.write_block(data, rows)
        self.report.rows_out += rows


def _apply(
    records: Iterable[Record], state: RowState, name: str, lines_before: int = 0
) -> Iterator[Prepared]:
    """Count `records` in the report and judge them, exactly as read_conversations does its rows.

    `lines_before`: the lines of the file before the records' range (their numbers count from 1).
    """
    report = state.report
    formats = report.formats
    release = state.release
    for rec in records:
        report.rows_in += 1
        kind, line, index, what, rest = rec
        if lines_before and line is not None:
            line += lines_before
            if kind == "p":
                rest = [p._replace(line=p.line + lines_before) for p in rest]
        if kind == "x":
            if state.action(what) is Action.FAIL:
                raise state.fail(what, name, line, rest)
            report.reject(what, name, line, where_prefix(line, index, None) + rest)
            continue
        formats[what] += 1
        if kind == "s":
            data, dkey = rest
            item = Prepared(name, line, index, None, [], None, dkey, data, None)
            state.checked += 1
            if release(item, dkey):
                yield item
            continue
        if not rest:
            report.reject(
                "empty_conversation", name, line, where_prefix(line, index, None) + "no conversation"
            )
            continue
        if len(rest) > 1:
            report.rows_expanded += len(rest) - 1
        for item in rest:
            if item.issues and not state.verdict(item, item.issues):
                continue
            state.checked += 1
            if item.pkey is None:
                if release(item, item.dkey):
                    yield item
            else:
                assert item.prompt is not None
                yield from state.placeholder(item, item.pkey, item.dkey, item.prompt)


def _convert_whole(
    rows: Iterable[RawRow],
    state: RowState,
    name: str,
    out: _Out,
    to: str,
    progress: Callable[[], None],
    folder: str | None = None,
) -> None:
    """Convert, count and write the rows of a file read in this process, in order (the one-process
    convert's hot loop): a usual row is given to the fast path here and, when it takes it, counted and
    written without a record, a Prepared or a SourceRef; any other row (or a usual row that repeats an
    earlier one) goes through preparer and _apply, as a worker's would. `progress` is called every
    PROGRESS_EVERY_ROWS rows."""
    options = state.options
    report = state.report
    formats = report.formats
    seen = state.seen
    dups = options.check_duplicates
    max_chars = options.placeholder_max_chars
    file_base = state.file_base(name)
    parse_options = state.parse_options
    # a forced shape or a declared mapping is the general path's (a plain row may not be of it)
    fast = parse_options.from_format is None and not parse_options.columns
    prepare = preparer(name, options, to, fast=False, folder=folder)  # the rows the fast path leaves
    # The lines of the rows the fast path took since the last general row, written and counted (rows
    # in, checked, out) at once: before any other row is judged (it may read the counts, or fail the
    # job after them) and every _FAST_BLOCK_BYTES.
    block: list[bytes] = []
    block_bytes = 0
    block_families: dict[str, int] = {}  # the block's rows by family (added to the report's with them)

    def flush() -> None:
        nonlocal block_bytes
        n = len(block)
        if n:
            out.writer.write_lines(block, block_bytes)
            report.rows_in += n
            state.checked += n
            report.rows_out += n
            for family, count in block_families.items():
                formats[family] += count
            block.clear()
            block_families.clear()
            block_bytes = 0

    until_progress = 0
    for row in rows:
        if not until_progress:
            progress()
            until_progress = PROGRESS_EVERY_ROWS
        until_progress -= 1
        line = row.line
        took = (
            plain_row(row.value, to, max_chars, dups, (name, line if line is not None else row.index))
            if fast and row.error is None
            else None
        )
        if took is None:
            flush()
            for item in _apply((prepare(row),), state, name):
                out.item(item)
            continue
        family, data, dkey = took
        if dkey is not None:  # (None: duplicates are not checked)
            if dkey in seen:  # a duplicate: its verdict and warning as _apply gives them
                flush()
                for item in _apply((("s", line, row.index, family, (data, dkey)),), state, name):
                    out.item(item)
                continue
            seen[dkey] = file_base | (0 if line is None else line + 1)
        block_families[family] = block_families.get(family, 0) + 1
        block.append(data)
        block_bytes += len(data)
        if block_bytes >= _FAST_BLOCK_BYTES:
            flush()
    flush()


def _apply_chunk(chunk: Chunk, state: RowState, name: str, out: _Out, lines_before: int) -> None:
    """:func:`_apply` for a worker's packed chunk: usual rows are written in blocks of the blob."""
    report = state.report
    formats = report.formats
    seen = state.seen
    dups = state.options.check_duplicates
    file_base = state.file_base(name)
    families, lines, sizes, dkeys = chunk.families, chunk.lines, chunk.sizes, chunk.dkeys
    others = chunk.others
    view = memoryview(chunk.blob)
    pos = run_start = run_rows = 0  # the block of the blob not written yet: [run_start, pos), run_rows rows
    k = o = 0
    for kind in chunk.kinds:
        if kind == COMPLEX:
            if run_rows:
                out.block(view[run_start:pos], run_rows)
                run_rows = 0
            for item in _apply((others[o],), state, name, lines_before):
                out.item(item)
            o += 1
            run_start = pos
            continue
        report.rows_in += 1
        state.checked += 1
        formats[families[kind]] += 1
        end = pos + sizes[k]
        if dups:
            dkey = dkeys[k]
            if dkey in seen:
                if run_rows:  # rows before this one are written before its verdict (it may fail the job)
                    out.block(view[run_start:pos], run_rows)
                    run_rows = 0
                item = Prepared(name, lines_before + lines[k], None, None, [], None, dkey, None, None)
                run_start = pos if state.verdict(item, state.duplicate(dkey, name)) else end
                if run_start == pos:
                    run_rows = 1
                pos, k = end, k + 1
                continue
            seen[dkey] = file_base | (lines_before + lines[k] + 1)
        run_rows += 1
        pos, k = end, k + 1
    if run_rows:
        out.block(view[run_start:pos], run_rows)


def _progress_of(progress: Progress, reader: Any, done_before: int, total: int | None) -> None:
    progress(done_before + reader.bytes_read, total, "bytes")


def write_converted(
    paths: Iterable[Path],
    writer: Writer,
    report: Report,
    options: ConvertOptions,
    to: str,
    progress: Progress = no_progress,
) -> None:
    """Convert `paths` into `writer` (a JSONL target `to`) with ``options.workers`` processes.

    Counts rows_in ... rows_out in `report` as :func:`draftdeck.convert.convert` does with one process,
    and writes the same bytes. Raises JobFailed (after writing the rows before the failing one and the
    rows held for the placeholder check, as the one-process path does) and InputError.
    """
    state = RowState(report, options)
    out = _Out(writer, report)
    files, total = input_files(paths)
    done_before = 0
    pool: Workers | None = None
    in_flight = 2 * options.workers
    grouping = groups(options.parse_options())
    chunks = 0
    try:
        for f in files:
            reader = open_reader(f, max_row_bytes=options.max_row_bytes)
            with reader:
                name = reader.name
                whole = not (
                    isinstance(reader, RowReader)
                    and reader.container == "jsonl"
                    and reader.compression is None
                    and reader.size is not None
                    and reader.size > options.chunk_bytes
                    and not (grouping and starts_grouped(f))  # a session's lines must meet in one place
                )
                if whole or options.workers == 1:  # read in this process, through the same records
                    _convert_whole(
                        group_rows(reader, options.max_row_bytes) if grouping else reader,
                        state,
                        name,
                        out,
                        to,
                        partial(_progress_of, progress, reader, done_before, total),
                        str(Path(f).resolve().parent),  # the rows' relative image paths' folder
                    )
                    done_before += reader.size or 0
                    progress(done_before, total, "bytes")
                    continue
            if pool is None:
                pool = Workers(options, to)
            pending: deque[int] = deque()  # the end offsets of the ranges sent, in order
            # Each range is sent with the number of its first line (the parent counts the newlines
            # before it, at memory speed): the provenance a worker writes into each output row
            # names the row's line in the whole file, and the output bytes are those of one process.
            first_line = 1
            with open(f, "rb", buffering=0) as counting:
                for start, end in jsonl_chunks(f, options.chunk_bytes):
                    chunks += 1
                    pool.send((str(f), name, start, end, first_line))
                    first_line += _newlines(counting, start, end)
                    pending.append(end)
                    if len(pending) >= in_flight:
                        _apply_chunk(pool.receive(), state, name, out, 0)
                        progress(done_before + pending.popleft(), total, "bytes")
            while pending:
                _apply_chunk(pool.receive(), state, name, out, 0)
                progress(done_before + pending.popleft(), total, "bytes")
            done_before += f.stat().st_size
        for item in state.drain():
            out.item(item)
    except JobFailed:
        # As read_conversations: rows still held for the placeholder check are handed over unchecked
        # (the job fails anyway), so that the failed job's report still balances.
        while state.pending:
            out.item(state.pending.popleft()[1])
        raise
    finally:
        if pool is not None:
            pool.close()
    report.extra["placeholder"] = state.placeholder_summary()
    if options.workers > 1:
        report.extra["parallel"] = {"workers": options.workers, "chunks": chunks}


def _newlines(f: Any, start: int, end: int) -> int:
    """The newlines in bytes [start, end) of the open file `f`."""
    f.seek(start)
    count, left = 0, end - start
    while left > 0:
        block = f.read(min(left, 1 << 22))
        if not block:
            break
        count += block.count(b"\n")
        left -= len(block)
    return count
