"""`convert` with worker processes: large JSONL inputs are cut into byte ranges converted in parallel.

Split of the work (design):

- **Workers** (:func:`prepare_rows` over one byte range, :func:`_work_chunk`) do everything a row needs
  that depends on the row alone: parse the JSON, detect the family, build the canonical conversation,
  run :func:`draftdeck.convert.check_conversation`, encode the output line in the target format, and
  compute the duplicate hash and the placeholder key. They count nothing and decide nothing: each row
  comes back as a record (its line number, its issues, its encoded line). Plain OpenAI / ShareGPT rows
  that pass every check take a fast path (:func:`plain_row`) that gives the same line and hash
  without building the canonical model.
- **The parent** replays the records in input order through the very same state as the one-process
  path (:class:`draftdeck.convert._Reader`: policy verdicts, the placeholder buffer, the duplicate set)
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
stays on the one-process path (``convert`` decides).
"""

from __future__ import annotations

import multiprocessing
from array import array
from collections import deque
from collections.abc import Iterable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NamedTuple

from draftdeck.convert import (
    PROGRESS_EVERY_ROWS,
    ConvertOptions,
    _Reader,
    _where,
    check_conversation,
    duplicate_key,
    input_files,
    placeholder_key,
)
from draftdeck.convert_fast import plain_row
from draftdeck.errors import JobFailed
from draftdeck.formats.common import ParseContext, ParseOptions, RowRejected
from draftdeck.formats.detect import parse
from draftdeck.formats.model import SourceRef
from draftdeck.formats.readers import JsonlRange, RawRow, RowReader, jsonl_chunks
from draftdeck.formats.tables import open_reader
from draftdeck.formats.writers import (
    JSONL_ENCODERS,
    RESERVED,
    Writer,
    encode_line,
    meta_collision,
)
from draftdeck.placeholders import prompt_key, strip_answers
from draftdeck.progress import Progress, no_progress
from draftdeck.quality import Action, Report

CHUNK_BYTES = 4 << 20
# fork: workers start at once with the converter imported, and need no `if __name__ == "__main__"`
# guard in the caller's script. They run only this module's code (no lock of the caller is taken).
START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


class Prepared(NamedTuple):
    """One conversation as a worker prepared it: where it is, its issues, and its output line.

    ``data`` is None when an issue's action (reject or fail) means the row cannot be kept;
    ``collisions`` are the kept fields the target reserves (left out of ``data``), warned about as
    unrepresentable_field when the row is written, as the writer does.
    """

    file: str
    line: int | None
    idx: int | None  # the row's index (``index`` would hide tuple.index)
    path: str | None
    issues: list[tuple[str, str]]
    pkey: tuple[str, ...] | None
    dkey: int | None
    data: bytes | None
    collisions: list[str] | None
    prompt: int | None = None  # a placeholder candidate's prompt_key
    stripped: bytes | None = None  # with ``placeholders="strip"``: its output line without the answers

    def without_answers(self) -> Prepared:
        """What _Reader writes for a stripped placeholder row."""
        return self._replace(data=self.stripped)

    @property
    def source(self) -> SourceRef:  # what _Reader.verdict reads
        return SourceRef(self.file, self.line, self.idx, path=self.path)


# A row record: ("x", line, index, code, reason) for a row that failed to read or parse, or
# ("p", line, index, family, [Prepared, ...]) for a parsed row (no conversation: an empty list).
Record = tuple[Any, ...]


def prepare_rows(rows: Iterable[RawRow], name: str, options: ConvertOptions, to: str) -> Iterator[Record]:
    """The per-row work of :func:`draftdeck.convert.read_conversations`, without its global state."""
    encoder = JSONL_ENCODERS[to]
    parse_options = ParseOptions(tree_paths=options.tree_paths, from_format=options.from_format)
    policy = options.policy
    drops: dict[str, bool] = {}
    allow_prompt_only = options.allow_prompt_only
    max_chars = options.placeholder_max_chars
    dups = options.check_duplicates
    strip = options.placeholders == "strip"
    for row in rows:
        line, index = row.line, row.index
        if row.error:
            yield ("x", line, index, row.error, row.reason or "")
            continue
        # a forced shape is checked by the general path (a plain row may not be of that shape)
        fast = (
            plain_row(row.value, to, max_chars, dups, (name, line if line is not None else index))
            if parse_options.from_format is None
            else None
        )
        if fast is not None:
            yield ("s", line, index, fast[0], (fast[1], fast[2]))
            continue
        ctx = ParseContext(parse_options)
        try:
            family, convs = parse(row.value, ctx)
        except RowRejected as exc:
            yield ("x", line, index, exc.code, exc.reason)
            continue
        row_warnings = list(ctx.warnings.items())
        if len(convs) == 1 and not row_warnings:  # the usual row: one conversation, maybe no issue
            conv = convs[0]
            src = conv.source
            if src is None and (not conv.meta or RESERVED.isdisjoint(conv.meta)):
                conv.source = SourceRef(name, line, index)
                issues = check_conversation(conv, allow_prompt_only)
                if not issues:
                    pkey = placeholder_key(conv, max_chars)
                    if pkey is None:
                        data = encode_line(encoder(conv, None))
                        yield ("s", line, index, family, (data, duplicate_key(conv) if dups else None))
                        continue
        preps = []
        for conv in convs:
            src = conv.source
            if src is None:
                conv.source = SourceRef(name, line, index)
                path = None
            else:
                src.file, src.line, src.index = name, line, index
                path = src.path
            issues = check_conversation(conv, allow_prompt_only)
            if row_warnings:
                issues.extend(row_warnings)
            dropped = False
            for code, _ in issues:
                d = drops.get(code)
                if d is None:
                    d = drops[code] = policy.action(code) is not Action.WARN
                dropped = dropped or d
            if dropped:
                preps.append(Prepared(name, line, index, path, issues, None, None, None, None))
                continue
            data = encode_line(encoder(conv, None))
            pkey = placeholder_key(conv, max_chars)
            prompt = stripped = None
            if pkey is not None:
                prompt = prompt_key(conv)
                if strip:
                    stripped = encode_line(encoder(strip_answers(conv), None))
            preps.append(
                Prepared(
                    name,
                    line,
                    index,
                    path,
                    issues,
                    pkey,
                    duplicate_key(conv) if dups else None,
                    data,
                    [k for k in conv.meta if k in RESERVED] or None if conv.meta else None,
                    prompt,
                    stripped,
                )
            )
        yield ("p", line, index, family, preps)


# -- worker processes -----------------------------------------------------------------------------------
_COMPLEX = 255


class Chunk(NamedTuple):
    """A worker's result for one byte range, packed to cost the parent little to receive and walk.

    Line numbers count from 1 at the range's first line (the parent adds the lines before it: it
    learns them from the ``newlines`` of the earlier ranges). One byte per input row in ``kinds``:
    an index into ``families`` for a usual row (one conversation, no issue, not a placeholder
    candidate: its line number, output size and duplicate hash are the next items of ``lines``,
    ``sizes`` and ``dkeys``, its output the next bytes of ``blob``), or 255 for any other row (its
    record is the next of ``others``).
    """

    kinds: bytes
    families: list[str]
    lines: array[int]
    sizes: array[int]
    dkeys: array[int]
    blob: bytes
    others: list[Record]
    newlines: int


def _work_chunk(
    opts: ConvertOptions, to: str, path: str, name: str, start: int, end: int, first_line: int = 1
) -> Chunk:
    rows = JsonlRange(Path(path), start, end, first_line, display_name=name, max_row_bytes=opts.max_row_bytes)
    kinds = bytearray()
    families: list[str] = []
    fam_index: dict[str, int] = {}
    lines, sizes, dkeys = array("Q"), array("Q"), array("Q")
    blob: list[bytes] = []
    others: list[Record] = []
    for rec in prepare_rows(rows, name, opts, to):
        if rec[0] != "s":
            kinds.append(_COMPLEX)
            others.append(rec)
            continue
        family = rec[3]
        k = fam_index.get(family)
        if k is None:
            k = fam_index[family] = len(families)
            families.append(family)
        kinds.append(k)
        data, dkey = rec[4]
        lines.append(rec[1])
        sizes.append(len(data))
        dkeys.append(dkey or 0)
        blob.append(data)
    return Chunk(bytes(kinds), families, lines, sizes, dkeys, b"".join(blob), others, rows.newlines)


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


def _apply(records: Iterable[Record], state: _Reader, name: str, lines_before: int = 0) -> Iterator[Prepared]:
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
            report.reject(what, name, line, _where(line, index, None) + rest)
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
            report.reject("empty_conversation", name, line, _where(line, index, None) + "no conversation")
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


_DUPLICATE = [("duplicate_conversation", "the same messages appeared earlier")]


def _apply_chunk(chunk: Chunk, state: _Reader, name: str, out: _Out, lines_before: int) -> None:
    """:func:`_apply` for a worker's packed chunk: usual rows are written in blocks of the blob."""
    report = state.report
    formats = report.formats
    seen = state.seen
    dups = state.options.check_duplicates
    families, lines, sizes, dkeys = chunk.families, chunk.lines, chunk.sizes, chunk.dkeys
    others = chunk.others
    view = memoryview(chunk.blob)
    pos = run_start = run_rows = 0  # the block of the blob not written yet: [run_start, pos), run_rows rows
    k = o = 0
    for kind in chunk.kinds:
        if kind == _COMPLEX:
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
                run_start = pos if state.verdict(item, _DUPLICATE) else end
                if run_start == pos:
                    run_rows = 1
                pos, k = end, k + 1
                continue
            seen.add(dkey)
        run_rows += 1
        pos, k = end, k + 1
    if run_rows:
        out.block(view[run_start:pos], run_rows)


def _with_progress(
    records: Iterator[Record], reader: Any, done_before: int, total: int | None, progress: Progress
) -> Iterator[Record]:
    for i, rec in enumerate(records):
        if i % PROGRESS_EVERY_ROWS == 0:
            progress(done_before + reader.bytes_read, total, "bytes")
        yield rec


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
    state = _Reader(report, options)
    out = _Out(writer, report)
    files, total = input_files(paths)
    done_before = 0
    pool: _Workers | None = None
    in_flight = 2 * options.workers
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
                )
                if whole:  # read in the parent, through the same records
                    records = _with_progress(
                        prepare_rows(reader, name, options, to), reader, done_before, total, progress
                    )
                    for item in _apply(records, state, name):
                        out.item(item)
                    done_before += reader.size or 0
                    progress(done_before, total, "bytes")
                    continue
            if pool is None:
                pool = _Workers(options, to)
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


class WorkerError(RuntimeError):
    """A worker process failed (a bug, or it was killed): the conversion cannot go on."""


def _worker_main(conn: Connection, options: ConvertOptions, to: str) -> None:
    """A worker: convert the ranges it is sent, one at a time, and send back each :class:`Chunk`.

    The blob of encoded lines goes as raw bytes (no pickling copy), the rest pickled.
    """
    try:
        while True:
            task = conn.recv()
            if task is None:
                return
            try:
                chunk = _work_chunk(options, to, *task)
            except Exception as exc:  # handed to the parent, which raises it
                conn.send(("error", f"{type(exc).__name__}: {exc}", task))
                continue
            conn.send(("ok", chunk._replace(blob=b""), None))
            conn.send_bytes(chunk.blob)
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return


class _Workers:
    """Worker processes fed in turn over one pipe each, in the parent's thread (no helper threads).

    Range i goes to worker i mod N and each worker answers in order, so results come back in input
    order by reading the workers in the same turn.
    """

    def __init__(self, options: ConvertOptions, to: str):
        ctx: Any = multiprocessing.get_context(START_METHOD)
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        self.sent = self.received = 0
        for _ in range(options.workers):
            mine, theirs = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=_worker_main, args=(theirs, options, to), daemon=True)
            proc.start()
            theirs.close()
            self.conns.append(mine)
            self.procs.append(proc)

    def send(self, task: tuple[str, str, int, int, int]) -> None:
        self.conns[self.sent % len(self.conns)].send(task)
        self.sent += 1

    def receive(self) -> Chunk:
        conn = self.conns[self.received % len(self.conns)]
        self.received += 1
        try:
            status, chunk, task = conn.recv()
            if status != "ok":
                raise WorkerError(f"a convert worker failed on {task}: {chunk}")
            return chunk._replace(blob=conn.recv_bytes())  # type: ignore[no-any-return]
        except EOFError:
            raise WorkerError("a convert worker process ended unexpectedly") from None

    def close(self) -> None:
        """Stop the workers now (they hold nothing but open input files and their pipes)."""
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.join()
        for conn in self.conns:
            conn.close()
