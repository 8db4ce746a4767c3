"""The one-process read: :func:`read_conversations` streams the kept conversations of some inputs and
counts every row (the design is in :mod:`draftdeck.convert`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from draftdeck.convert.checks import check_conversation, duplicate_key, where_prefix
from draftdeck.convert.options import PROGRESS_EVERY_ROWS, ConvertOptions
from draftdeck.convert.placeholders import placeholder_key, prompt_key
from draftdeck.convert.verdicts import RowState
from draftdeck.errors import InputError, JobFailed
from draftdeck.formats.common import ParseContext, RowRejected
from draftdeck.formats.detect import parse
from draftdeck.formats.grouping import group_rows, groups
from draftdeck.formats.model import Conversation, SourceRef
from draftdeck.formats.tables import expand_inputs, open_reader
from draftdeck.issue_codes import Action
from draftdeck.progress import Progress, no_progress
from draftdeck.quality import Report


def input_files(paths: Iterable[Path | str]) -> tuple[list[Path], int | None]:
    """The files behind `paths` (folders expanded) and their total size; InputError for a missing one."""
    files: list[Path] = []
    for p in paths:
        files.extend(expand_inputs(Path(p)))
    for f in files:
        if not f.exists():
            raise InputError(f"{f}: no such file")
    return files, sum(f.stat().st_size for f in files) or None


def read_conversations(
    paths: Sequence[Path],
    report: Report,
    options: ConvertOptions | None = None,
    progress: Progress = no_progress,
    *,
    open_file: Callable[..., Any] = open_reader,
) -> Iterator[Conversation]:
    """Yield the valid conversations of `paths`, counting every input row in `report`.

    Args:
        paths: data files (JSONL, JSON array/object, gzip/zstd, Parquet, Arrow) or ``save_to_disk``
            folders, read in order.
        report: counts rows_in, rows_expanded (extra conversations from trees/trajectories), rejected
            and warnings by code, and formats (detected family per row). The caller adds rows_out for
            each yielded conversation it keeps, then calls ``report.check_accounting()``.
        options: policy, ``allow_prompt_only`` (yield rows without an assistant turn, for
            regeneration; otherwise they are rejected as no_assistant_turn), ``tree_paths``, limits.
        progress: called with (bytes done, bytes total, "bytes") across all inputs; may raise Cancelled.
        open_file: opens one file as a row reader (:func:`draftdeck.formats.tables.open_reader`'s
            signature); `scan` passes one that also watches each raw row, to read the input once.

    Raises:
        InputError: an input is missing or unreadable as a whole.
        JobFailed: a code the policy marks ``fail`` was seen (the report says where).
    """
    opts = options or ConvertOptions()
    state = RowState(report, opts)
    files, total = input_files(paths)
    done_before = 0
    parse_row = parse
    release = state.release
    dups = opts.check_duplicates
    max_chars = opts.placeholder_max_chars
    reject = report.reject
    formats = report.formats
    grouping = groups(state.parse_options)
    try:
        for f in files:
            reader = open_file(f, max_row_bytes=opts.max_row_bytes)
            with reader:
                name = reader.name
                folder = str(Path(f).resolve().parent)  # what the rows' relative image paths are relative to
                for i, row in enumerate(group_rows(reader, opts.max_row_bytes) if grouping else reader):
                    if i % PROGRESS_EVERY_ROWS == 0:
                        progress(done_before + reader.bytes_read, total, "bytes")
                    report.rows_in += 1
                    line = row.line
                    if row.error:
                        if state.action(row.error) is Action.FAIL:
                            raise state.fail(row.error, name, line, row.reason or "")
                        reject(
                            row.error, name, line, where_prefix(line, row.index, None) + (row.reason or "")
                        )
                        continue
                    ctx = ParseContext(state.parse_options, folder)
                    try:
                        family, convs = parse_row(row.value, ctx)
                    except RowRejected as exc:
                        if state.action(exc.code) is Action.FAIL:
                            raise state.fail(exc.code, name, line, exc.reason) from None
                        reject(exc.code, name, line, where_prefix(line, row.index, None) + exc.reason)
                        continue
                    formats[family] += 1
                    if not convs:
                        reject(
                            "empty_conversation",
                            name,
                            line,
                            where_prefix(line, row.index, None) + "no conversation",
                        )
                        continue
                    if len(convs) > 1:
                        report.rows_expanded += len(convs) - 1
                    row_warnings = list(ctx.warnings.items())
                    for conv in convs:
                        src = conv.source
                        if src is None:
                            conv.source = SourceRef(name, row.line, row.index)
                        else:
                            src.file, src.line, src.index = name, row.line, row.index
                        issues = check_conversation(conv, opts.allow_prompt_only)
                        if row_warnings:
                            issues.extend(row_warnings)
                        if issues and not state.verdict(conv, issues):
                            continue
                        state.checked += 1
                        dkey = duplicate_key(conv) if dups else None
                        pkey = placeholder_key(conv, max_chars)
                        if pkey is None:
                            if release(conv, dkey):
                                yield conv
                        else:
                            yield from state.placeholder(conv, pkey, dkey, prompt_key(conv))
                done_before += reader.size or 0
                progress(done_before, total, "bytes")
        yield from state.drain()
    except JobFailed:
        # Rows still held for the placeholder check are handed over unchecked (the job fails anyway),
        # so that the failed job's report still balances.
        while state.pending:
            yield state.pending.popleft()[1]
        raise
    report.extra["placeholder"] = state.placeholder_summary()
