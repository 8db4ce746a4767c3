"""The worker side of `convert` with worker processes (see :mod:`draftdeck.convert.parallel`, the parent).

A worker does everything a row needs that depends on the row alone (:func:`prepare_rows`): parse the
JSON, detect the family, build the canonical conversation, run
:func:`draftdeck.convert.check_conversation`, encode the output line in the target format, and compute
the duplicate hash and the placeholder key. It counts nothing and decides nothing: each row comes back
as a record, and the usual rows of a byte range come back packed (:class:`Chunk`). The parent also runs
:func:`preparer` itself for inputs it reads whole.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from draftdeck.convert.checks import check_conversation, duplicate_key
from draftdeck.convert.fast import plain_row
from draftdeck.convert.options import ConvertOptions
from draftdeck.convert.placeholders import placeholder_key, prompt_key, strip_answers
from draftdeck.formats.common import ParseContext, RowRejected
from draftdeck.formats.detect import parse
from draftdeck.formats.model import SourceRef
from draftdeck.formats.readers import JsonlRange, RawRow
from draftdeck.formats.writers import JSONL_ENCODERS, RESERVED, encode_line
from draftdeck.issue_codes import Action

if TYPE_CHECKING:
    from multiprocessing.connection import Connection


def start_method() -> str:
    """fork: workers start at once with the converter imported, and need no `if __name__ ==
    "__main__"` guard in the caller's script. They run only this module's code (no lock of the caller
    is taken). (multiprocessing is imported here, not with the module: a one-process convert never
    needs it, and it is a good part of the package's import time.)"""
    import multiprocessing

    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


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
        """What RowState writes for a stripped placeholder row."""
        return self._replace(data=self.stripped)

    @property
    def source(self) -> SourceRef:  # what RowState.verdict reads
        return SourceRef(self.file, self.line, self.idx, path=self.path)


# A row record: ("x", line, index, code, reason) for a row that failed to read or parse, or
# ("p", line, index, family, [Prepared, ...]) for a parsed row (no conversation: an empty list).
Record = tuple[Any, ...]


def prepare_rows(
    rows: Iterable[RawRow],
    name: str,
    options: ConvertOptions,
    to: str,
    *,
    fast: bool = True,
    folder: str | None = None,
) -> Iterator[Record]:
    """The per-row work of :func:`draftdeck.convert.read_conversations`, without its global state: a
    record per row (see :func:`preparer`)."""
    prepare = preparer(name, options, to, fast=fast, folder=folder)
    for row in rows:
        yield prepare(row)


def preparer(
    name: str, options: ConvertOptions, to: str, *, fast: bool = True, folder: str | None = None
) -> Callable[[RawRow], Record]:
    """The record of one row of file `name`, made by a function set up once per file (the one-process
    convert calls it for each row the fast path left). `fast`: try the fast path first (False: a
    caller that tried it already); `folder`: the input file's, which the rows' relative image paths
    are relative to."""
    encoder = JSONL_ENCODERS[to]
    parse_options = options.parse_options()
    policy = options.policy
    drops: dict[str, bool] = {}
    allow_prompt_only = options.allow_prompt_only
    max_chars = options.placeholder_max_chars
    dups = options.check_duplicates
    strip = options.placeholders == "strip"
    # a forced shape or a declared mapping is the general path's (a plain row may not be of it)
    fast = fast and parse_options.from_format is None and not parse_options.columns

    def prepare(row: RawRow) -> Record:
        line, index = row.line, row.index
        if row.error:
            return ("x", line, index, row.error, row.reason or "")
        took = (
            plain_row(row.value, to, max_chars, dups, (name, line if line is not None else index))
            if fast
            else None
        )
        if took is not None:
            return ("s", line, index, took[0], (took[1], took[2]))
        ctx = ParseContext(parse_options, folder)
        try:
            family, convs = parse(row.value, ctx)
        except RowRejected as exc:
            return ("x", line, index, exc.code, exc.reason)
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
                        return ("s", line, index, family, (data, duplicate_key(conv, to) if dups else None))

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
                    duplicate_key(conv, to) if dups else None,
                    data,
                    [k for k in conv.meta if k in RESERVED] or None if conv.meta else None,
                    prompt,
                    stripped,
                )
            )
        return ("p", line, index, family, preps)

    return prepare


COMPLEX = 255


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


def work_chunk(
    opts: ConvertOptions, to: str, path: str, name: str, start: int, end: int, first_line: int = 1
) -> Chunk:
    rows = JsonlRange(Path(path), start, end, first_line, display_name=name, max_row_bytes=opts.max_row_bytes)
    kinds = bytearray()
    families: list[str] = []
    fam_index: dict[str, int] = {}
    lines, sizes, dkeys = array("Q"), array("Q"), array("Q")
    blob: list[bytes] = []
    others: list[Record] = []
    for rec in prepare_rows(rows, name, opts, to, folder=str(Path(path).resolve().parent)):
        if rec[0] != "s":
            kinds.append(COMPLEX)
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
                chunk = work_chunk(options, to, *task)
            except Exception as exc:  # handed to the parent, which raises it
                conn.send(("error", f"{type(exc).__name__}: {exc}", task))
                continue
            conn.send(("ok", chunk._replace(blob=b""), None))
            conn.send_bytes(chunk.blob)
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return


class Workers:
    """Worker processes fed in turn over one pipe each, in the parent's thread (no helper threads).

    Range i goes to worker i mod N and each worker answers in order, so results come back in input
    order by reading the workers in the same turn.
    """

    def __init__(self, options: ConvertOptions, to: str):
        import multiprocessing

        ctx: Any = multiprocessing.get_context(start_method())
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
            return chunk._replace(blob=conn.recv_bytes())
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
