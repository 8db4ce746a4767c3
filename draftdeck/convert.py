"""`convert`: chat data in any known shape -> OpenAI messages JSONL, ShareGPT JSONL or Parquet.

Two entry points:

- :func:`read_conversations` streams the valid conversations of some input files and counts every
  row in a :class:`Report` (rows_in, rows_expanded, rejected by code, warnings, formats). Conversion
  and tokenization both consume it. **The consumer counts rows_out** for each conversation it keeps
  (or rejects it under its own code), so that ``rows_in + rows_expanded == rows_out + rejected``.
- :func:`convert` writes them with a :class:`draftdeck.formats.writers.Writer` and applies the policy.

Checks per conversation (the code's action comes from the :class:`Policy`: reject, warn or fail):
empty_conversation, empty_turn, no_user_turn, no_assistant_turn (unless prompt-only rows are
allowed), trailing_user_turn, non_alternating, orphan_tool_result, invalid_tool_arguments,
unrepresentable_field, placeholder_response and duplicate_conversation.

Placeholder answers (design). Seeds in the wild padded prompt-only data with a dummy ``"OK."``
answer on every row. A row is a placeholder candidate when all its assistant turns are short
(``placeholder_max_chars`` after normalisation: case-folded, whitespace collapsed, trailing
punctuation dropped) and carry no tool calls; its key is the tuple of those normalised answers.
When one key has been seen on ``placeholder_min_rows`` rows, it is a placeholder: those rows and
every later row with the key get ``placeholder_response``. To decide in one pass, candidate rows
wait in a bounded buffer (``placeholder_buffer`` rows, FIFO) until their key crosses the threshold
or the buffer overflows; buffered rows are yielded late, so the output order differs from the input
order for them only. A key that first crosses the threshold after its earliest rows left the buffer
flags only the rows still held and the rows after (those already written are counted in
``report.extra["placeholder"]["released_before_flag"]``). A second pass would be exact but reads the
input twice; the buffer makes the usual case (a dummy answer on most rows) exact at one read.

Duplicates: a 64-bit hash of the normalised messages (role, stripped content, reasoning, tool calls)
per kept row, in a set: memory grows by ~60 bytes per distinct kept conversation, not with row size.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from xxhash import xxh3_64_intdigest

from draftdeck.errors import InputError, JobFailed, UsageError
from draftdeck.formats.common import ParseContext, ParseOptions, RowRejected
from draftdeck.formats.detect import check_format_name, parse
from draftdeck.formats.model import Conversation, SourceRef
from draftdeck.formats.readers import DEFAULT_MAX_ROW_BYTES
from draftdeck.formats.tables import expand_inputs, open_reader
from draftdeck.formats.writers import TARGETS, Writer
from draftdeck.progress import Progress, no_progress
from draftdeck.quality import Action, Policy, Report

PROGRESS_EVERY_ROWS = 2048


@dataclass
class ConvertOptions:
    """Options of reading and checking. Defaults suit training data (prompt-only rows rejected)."""

    policy: Policy = field(default_factory=Policy)
    allow_prompt_only: bool = False  # yield rows with no assistant turn (for regeneration)
    tree_paths: str = "all"  # "all": one conversation per leaf; "best": the best-ranked path only
    from_format: str | None = None  # one shape every row must have (draftdeck.formats.detect); None: detect
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
    placeholder_min_rows: int = 32
    placeholder_max_chars: int = 24
    placeholder_buffer: int = 4096
    check_duplicates: bool = True
    # convert only: worker processes for JSONL inputs larger than one chunk (1: all in this process);
    # see draftdeck.convert_parallel. Output and report are the same for any number of workers.
    workers: int = 1
    chunk_bytes: int = 4 << 20

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise UsageError(f"workers must be at least 1, not {self.workers}")
        if self.chunk_bytes < 1:
            raise UsageError("chunk_bytes must be positive")
        if self.tree_paths not in ("all", "best"):
            raise UsageError(f"tree paths must be 'all' or 'best', not {self.tree_paths!r}")
        try:
            check_format_name(self.from_format)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if self.placeholder_min_rows < 2:
            raise UsageError("placeholder_min_rows must be at least 2")


# -- per-conversation checks -------------------------------------------------------------------------
def check_conversation(conv: Conversation, allow_prompt_only: bool) -> list[tuple[str, str]]:
    """The issues of one conversation, as (code, reason), rejection-worthy codes first."""
    messages = conv.messages
    if not messages:
        return [("empty_conversation", "the conversation has no messages")]
    issues: list[tuple[str, str]] = []
    has_user = has_assistant = False
    empty_at: list[int] = []
    for i, m in enumerate(messages):
        if m.role == "user":
            has_user = True
        elif m.role == "assistant":
            has_assistant = True
        content = m.content
        if (
            (not content or content.isspace())
            and not m.tool_calls
            and (not m.reasoning or m.reasoning.isspace())
        ):
            empty_at.append(i)
    if len(empty_at) == len(messages):
        return [("empty_conversation", f"all {len(messages)} messages are empty")]
    if not has_user:
        issues.append(("no_user_turn", f"roles: {', '.join(m.role for m in messages[:8])}"))
    if not has_assistant and not allow_prompt_only:
        issues.append(("no_assistant_turn", "no assistant message (prompt-only row; allow it to regenerate)"))
    if empty_at:
        issues.append(
            (
                "empty_turn",
                f"message {empty_at[0]} ({messages[empty_at[0]].role}) is empty"
                + (f" and {len(empty_at) - 1} more" if len(empty_at) > 1 else ""),
            )
        )
    if not has_assistant:
        return issues  # prompt-only: consecutive user turns and a final user turn are expected
    last = messages[-1]
    if last.role == "user":
        issues.append(("trailing_user_turn", f"the last of {len(messages)} messages is a user message"))
    prev: str | None = None
    prev_at = 0
    prev_calls = False
    pending_ids: set[str] = set()
    pending_anon = 0
    orphan: str | None = None
    non_alt: str | None = None
    for i, m in enumerate(messages):
        role = m.role
        if role == "system":
            continue
        if role == "tool":
            cid = m.tool_call_id
            if cid is not None and cid in pending_ids:
                pending_ids.discard(cid)
            elif pending_anon > 0 and (cid is None or not pending_ids):
                pending_anon -= 1
            elif cid is None and pending_ids:
                pending_ids.pop()
            elif orphan is None:
                orphan = f"message {i} (tool) answers no earlier tool call" + (
                    f" (tool_call_id {cid!r})" if cid else ""
                )
        elif role == prev and non_alt is None and not (role == "assistant" and prev_calls):
            non_alt = f"messages {prev_at} and {i} are both {role}"
        if role == "assistant" and m.tool_calls:
            pending_ids = {c.id for c in m.tool_calls if c.id}
            pending_anon = sum(1 for c in m.tool_calls if not c.id)
        elif role == "assistant" and "<tool_call>" in m.content:  # Hermes-style calls kept as text
            pending_ids, pending_anon = set(), m.content.count("<tool_call>")
        elif role == "user":
            pending_ids, pending_anon = set(), 0
        if role != "tool":
            prev, prev_at = role, i
            prev_calls = bool(m.tool_calls) or (role == "assistant" and pending_anon > 0)
    if non_alt:
        issues.append(("non_alternating", non_alt))
    if orphan:
        issues.append(("orphan_tool_result", orphan))
    return issues


def _norm(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(".!?\u3002\uff01 ")


def placeholder_key(conv: Conversation, max_chars: int) -> tuple[str, ...] | None:
    key = []
    for m in conv.messages:
        if m.role == "assistant":
            if m.tool_calls or len(m.content) > max_chars * 4:
                return None
            n = _norm(m.content)
            if len(n) > max_chars:
                return None
            key.append(n)
    return tuple(key) if key else None


def duplicate_key(conv: Conversation) -> int:
    """A 64-bit hash of the normalised messages, the same in every process (xxh3 of their JSON text):
    worker processes compute it for the parent's duplicate set."""
    parts: list[object] = []
    append = parts.append
    for m in conv.messages:
        c = m.content
        append(m.role)
        append(c.strip() if c and (c[0].isspace() or c[-1].isspace()) else c)  # strip without copying
        append(m.reasoning)
        if m.tool_calls:
            parts.append([(c.name, c.raw_arguments or repr(c.arguments)) for c in m.tool_calls])
    return xxh3_64_intdigest(orjson.dumps(parts))


def _where(line: int | None, index: int | None, path: str | None) -> str:
    """A reason's prefix locating the record when the line number does not (JSON arrays, tables, trees)."""
    pre = f"record {index}" if line is None and index is not None else ""
    if path:
        pre += f"{' ' if pre else ''}branch {path}"
    return f"{pre}: " if pre else ""


# -- reading --------------------------------------------------------------------------------------
class _Reader:
    """The state of one read_conversations run (policy cache, placeholder buffer, duplicate set)."""

    def __init__(self, report: Report, options: ConvertOptions):
        self.report = report
        self.options = options
        self.actions: dict[str, Action] = {}
        self.parse_options = ParseOptions(tree_paths=options.tree_paths, from_format=options.from_format)
        self.seen: set[int] = set()
        self.counts: dict[tuple[str, ...], int] = {}
        self.flagged: set[tuple[str, ...]] = set()
        # (placeholder key, item, duplicate key): items are Conversations, or a worker's prepared rows
        self.pending: deque[tuple[tuple[str, ...], Any, int | None]] = deque()
        self.released_before_flag = 0
        self.released_keys: dict[tuple[str, ...], int] = {}

    def action(self, code: str) -> Action:
        act = self.actions.get(code)
        if act is None:
            act = self.actions[code] = self.options.policy.action(code)
        return act

    def fail(self, code: str, file: str, line: int | None, reason: str) -> JobFailed:
        self.report.reject(code, file, line, reason)
        return JobFailed(
            f"{code} at {file}{':' + str(line) if line is not None else ''}: {reason}"
            " (the policy makes this code an error)",
            self.report,
        )

    def verdict(self, conv: Any, issues: list[tuple[str, str]]) -> bool:
        """Count `issues` for a parsed conversation; True when it is kept. Raises JobFailed on a fail code.

        `conv` is anything with a ``source`` (file, line, index, path): a Conversation or a prepared row.
        """
        src = conv.source
        assert src is not None
        file, line, where = src.file, src.line, _where(src.line, src.index, src.path)
        for code, reason in issues:
            act = self.action(code)
            if act is Action.FAIL:
                raise self.fail(code, file, line, f"{where}{reason}")
        for code, reason in issues:
            if self.action(code) is Action.REJECT:
                self.report.reject(code, file, line, f"{where}{reason}")
                return False
        for code, reason in issues:
            self.report.warn(code, file, line, f"{where}{reason}")
        return True

    def release(self, conv: Any, dkey: int | None) -> bool:
        """Last check before a kept conversation leaves (duplicates: `dkey` is its :func:`duplicate_key`,
        None when duplicates are not checked); True when it leaves."""
        if dkey is not None:
            if dkey in self.seen:
                return self.verdict(conv, [("duplicate_conversation", "the same messages appeared earlier")])
            self.seen.add(dkey)
        return True

    def placeholder(self, conv: Any, key: tuple[str, ...], dkey: int | None) -> Iterator[Any]:
        """A candidate placeholder (all answers short): hold it, or flag its key and judge the held rows."""
        opts = self.options
        n = self.counts[key] = self.counts.get(key, 0) + 1
        if key in self.flagged or n >= opts.placeholder_min_rows:
            if key not in self.flagged:
                self.flagged.add(key)
                self.released_before_flag += self.released_keys.pop(key, 0)
                held = [(c, d) for k, c, d in self.pending if k == key]
                if held:
                    self.pending = deque(p for p in self.pending if p[0] != key)
                for c, d in held:
                    if self._placeholder_verdict(c, key, n, d):
                        yield c
            if self._placeholder_verdict(conv, key, n, dkey):
                yield conv
            return
        self.pending.append((key, conv, dkey))
        if len(self.pending) > opts.placeholder_buffer:
            k, c, d = self.pending.popleft()
            self.released_keys[k] = self.released_keys.get(k, 0) + 1
            if self.release(c, d):
                yield c

    def _placeholder_verdict(self, conv: Any, key: tuple[str, ...], n: int, dkey: int | None) -> bool:
        shown = " / ".join(repr(k) for k in key[:3])
        limit = self.options.placeholder_min_rows
        reason = f"assistant answer {shown} is on {n}+ rows (placeholder threshold {limit})"
        return self.verdict(conv, [("placeholder_response", reason)]) and self.release(conv, dkey)

    def drain(self) -> Iterator[Any]:
        while self.pending:
            _, c, d = self.pending.popleft()
            if self.release(c, d):
                yield c

    def placeholder_summary(self) -> dict[str, Any]:
        return {
            "answers": [" / ".join(k) for k in sorted(self.flagged)][:20],
            "min_rows": self.options.placeholder_min_rows,
            "released_before_flag": self.released_before_flag,
        }


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
    state = _Reader(report, opts)
    files, total = input_files(paths)
    done_before = 0
    parse_row = parse
    release = state.release
    dups = opts.check_duplicates
    max_chars = opts.placeholder_max_chars
    reject = report.reject
    formats = report.formats
    try:
        for f in files:
            reader = open_file(f, max_row_bytes=opts.max_row_bytes)
            with reader:
                name = reader.name
                for i, row in enumerate(reader):
                    if i % PROGRESS_EVERY_ROWS == 0:
                        progress(done_before + reader.bytes_read, total, "bytes")
                    report.rows_in += 1
                    line = row.line
                    if row.error:
                        if state.action(row.error) is Action.FAIL:
                            raise state.fail(row.error, name, line, row.reason or "")
                        reject(row.error, name, line, _where(line, row.index, None) + (row.reason or ""))
                        continue
                    ctx = ParseContext(state.parse_options)
                    try:
                        family, convs = parse_row(row.value, ctx)
                    except RowRejected as exc:
                        if state.action(exc.code) is Action.FAIL:
                            raise state.fail(exc.code, name, line, exc.reason) from None
                        reject(exc.code, name, line, _where(line, row.index, None) + exc.reason)
                        continue
                    formats[family] += 1
                    if not convs:
                        reject(
                            "empty_conversation",
                            name,
                            line,
                            _where(line, row.index, None) + "no conversation",
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
                        dkey = duplicate_key(conv) if dups else None
                        pkey = placeholder_key(conv, max_chars)
                        if pkey is None:
                            if release(conv, dkey):
                                yield conv
                        else:
                            yield from state.placeholder(conv, pkey, dkey)
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


# -- converting -----------------------------------------------------------------------------------
def check_out(inputs: Sequence[Path], out: Path, roots: Sequence[Path] = ()) -> None:
    """Refuse an output that would replace an input, a data root or a folder, before anything runs:
    a convert writing over its own input would destroy the rows it rejected."""
    target = out.expanduser().resolve()
    for path in inputs:
        source = path.expanduser().resolve()
        if target == source or (source.is_dir() and target.is_relative_to(source)):
            raise UsageError(f"{out}: the output is the input {path}; choose a new file")
    if any(target == Path(r).resolve() for r in roots):
        raise UsageError(f"{out}: the output is a data root; choose a file inside it")
    if target.is_dir():
        raise UsageError(f"{out}: the output is an existing folder; give a file name")


def convert(
    inputs: Sequence[Path],
    out: Path,
    to: str,
    policy: Policy | None = None,
    options: ConvertOptions | None = None,
    progress: Progress = no_progress,
    *,
    display_out: str | None = None,
) -> Report:
    """Convert `inputs` into one file `out` of format `to` ("openai", "sharegpt" or "parquet").

    ``options.workers`` > 1 converts large JSONL inputs in that many worker processes (not for
    Parquet output); the output bytes and the report are those of one worker.

    Returns the report when the policy passes. Raises :class:`JobFailed` (carrying the report) when it
    does not, and always when no row was written: then no output file is left behind.
    """
    if to not in TARGETS:
        raise UsageError(f"unknown target format {to!r}; choose one of {', '.join(TARGETS)}")
    if not inputs:
        raise UsageError("no input files given")
    check_out(inputs, out)
    opts = options or ConvertOptions()
    if policy is not None:
        opts.policy = policy
    pol = opts.policy
    report = Report()
    started = time.monotonic()
    report.extra.update({"to": to, "inputs": [str(p) for p in inputs]})
    writer = Writer(out, to, report)
    parallel = opts.workers > 1 and to != "parquet"
    with writer:
        if parallel:
            from draftdeck.convert_parallel import write_converted

            write_converted(inputs, writer, report, opts, to, progress)
        else:
            for conv in read_conversations(inputs, report, opts, progress):
                writer.write(conv)
                report.rows_out += 1
        report.check_accounting()
        failures = pol.failures(report)
        if failures:
            report.extra["elapsed_s"] = round(time.monotonic() - started, 3)
            raise JobFailed(_failure_message(report, failures, inputs), report)
    assert writer.output is not None
    if display_out:
        writer.output.path = display_out
    report.outputs.append(writer.output)
    report.extra["elapsed_s"] = round(time.monotonic() - started, 3)
    report.check_accounting()
    return report


def _failure_message(report: Report, failures: list, inputs: Sequence[Path]) -> str:
    reasons = "; ".join(f.reason for f in failures[:5])
    if report.rows_out == 0:
        top = ", ".join(f"{n:,} {c}" for c, n in report.rejected.most_common(3)) or "no rows"
        where = ", ".join(str(p) for p in inputs[:3])
        head = (
            f"empty output: no conversation was written from {report.rows_in:,} input rows of {where} ({top})"
        )
        if report.rejected.get("unknown_format"):
            ex = report.examples.get("unknown_format", [])
            if ex:
                head += f"; e.g. {ex[0].reason}"
        return head + "; no output file was written"
    return f"policy failed: {reasons}; no output file was written"
