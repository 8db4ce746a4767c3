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
unrepresentable_field, placeholder_response and duplicate_conversation; an empty assistant turn
(no text, reasoning or tool calls: it would train only the template's end-of-turn tokens) is
empty_assistant_turn, rejected by default, other empty messages are empty_turn (a warning).

Placeholder answers (design). Seeds in the wild padded prompt-only data with a dummy ``"OK."``
answer on every row. A row is a placeholder *candidate* when all its assistant turns are short text
(``placeholder_max_chars`` after normalising: case-folded, whitespace collapsed, trailing punctuation
dropped) with no tool calls and no reasoning; its key is the tuple of those normalised answers
(:mod:`draftdeck.placeholders`). What makes padding is the same answer to many *different* prompts,
so each key counts the distinct prompts (a hash of the non-assistant messages) it answers: the same
row repeated by duplicated data is one prompt, and the duplicate check's business. A key is a
placeholder when

- it is a known filler (``ok``, ``okay``, ``n/a``, ``todo``, ``tbd``, ``placeholder``, ``…``, empty)
  on ``placeholder_filler_rows`` (3) different prompts: a few are enough, whatever the input's size;
- or any other short answer on ``placeholder_min_rows`` (32) different prompts that are also
  ``placeholder_min_share`` (20 %) of the conversations checked so far: "Yes." to 40 different
  questions among 1,000 rows is a real answer, "I cannot help." on most rows is padding.

A flagged key's rows get ``placeholder_response``; ``placeholders`` says what then happens to them:
``reject`` (the policy's action, reject by default), ``strip`` (the answers are removed and the row
leaves as a prompt-only row, ready for regeneration, warned as ``placeholder_stripped``) or ``keep``
(kept, warned). To decide in one pass, candidate rows wait in a bounded FIFO buffer
(``placeholder_buffer`` rows) and are judged when they leave it: a filler key is flagged as soon as
it crosses its threshold; any other key is judged with the counts of the moment a row of it leaves
the buffer (overflow) or at the end of the input (then exact: the share is that of the whole input).
Buffered rows are yielded late, so the output order differs from the input order for them only.
Rows released before their key was flagged stay (counted in
``report.extra["placeholder"]["released_before_flag"]``); once flagged, a key stays flagged. A second
pass would be exact in every case but reads the input twice; the buffer is exact for inputs with
fewer candidates than it holds, and for the usual padding (one answer on most rows) at one read.
Memory: one prompt hash (~60 bytes in a set) per distinct prompt of each candidate key not flagged
yet; a flagged key drops its set.

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

from draftdeck.convert_checks import _where, check_conversation, duplicate_key
from draftdeck.errors import InputError, JobFailed, UsageError
from draftdeck.formats.common import ParseContext, ParseOptions, RowRejected
from draftdeck.formats.detect import check_format_name, parse
from draftdeck.formats.model import Conversation, SourceRef
from draftdeck.formats.readers import DEFAULT_MAX_ROW_BYTES
from draftdeck.formats.tables import expand_inputs, open_reader
from draftdeck.formats.writers import TARGETS, Writer
from draftdeck.placeholders import (
    MODES,
    PlaceholderRule,
    is_filler,
    placeholder_key,
    prompt_key,
    strip_answers,
)
from draftdeck.progress import Progress, no_progress
from draftdeck.quality import Action, Policy, Report

__all__ = [  # the checks and keys live in their own modules; importers of draftdeck.convert find them here
    "ConvertOptions",
    "check_conversation",
    "convert",
    "duplicate_key",
    "placeholder_key",
    "read_conversations",
]

PROGRESS_EVERY_ROWS = 2048


@dataclass
class ConvertOptions:
    """Options of reading and checking. Defaults suit training data (prompt-only rows rejected)."""

    policy: Policy = field(default_factory=Policy)
    allow_prompt_only: bool = False  # yield rows with no assistant turn (for regeneration)
    tree_paths: str = "all"  # "all": one conversation per leaf; "best": the best-ranked path only
    from_format: str | None = None  # one shape every row must have (draftdeck.formats.detect); None: detect
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
    placeholders: str = "reject"  # what a placeholder row becomes: reject | strip | keep
    placeholder_min_rows: int = 32
    placeholder_min_share: float = 0.2
    placeholder_filler_rows: int = 3
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
        if self.placeholder_filler_rows < 1:
            raise UsageError("placeholder_filler_rows must be at least 1")
        if not 0 <= self.placeholder_min_share <= 1:
            raise UsageError("placeholder_min_share must be between 0 and 1")
        if self.placeholders not in MODES:
            raise UsageError(f"placeholders must be one of {', '.join(MODES)}, not {self.placeholders!r}")

    @property
    def placeholder_rule(self) -> PlaceholderRule:
        return PlaceholderRule(
            self.placeholder_min_rows, self.placeholder_min_share, self.placeholder_filler_rows
        )


# -- reading --------------------------------------------------------------------------------------
class _Reader:
    """The state of one read_conversations run (policy cache, placeholder buffer, duplicate set)."""

    def __init__(self, report: Report, options: ConvertOptions):
        self.report = report
        self.options = options
        self.actions: dict[str, Action] = {}
        self.parse_options = ParseOptions(tree_paths=options.tree_paths, from_format=options.from_format)
        self.seen: set[int] = set()
        self.rule = options.placeholder_rule
        self.checked = 0  # conversations past their own checks: the placeholder share's denominator
        self.prompts: dict[tuple[str, ...], set[int]] = {}  # per candidate key: its distinct prompts
        self.flagged: dict[tuple[str, ...], int] = {}  # placeholder key -> distinct prompts when flagged
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
        kept = conv.warnings if isinstance(conv, Conversation) else None
        for code, reason in issues:
            self.report.warn(code, file, line, f"{where}{reason}")
            if kept is not None and code not in kept:
                kept.append(code)
        return True

    def release(self, conv: Any, dkey: int | None) -> bool:
        """Last check before a kept conversation leaves (duplicates: `dkey` is its :func:`duplicate_key`,
        None when duplicates are not checked); True when it leaves."""
        if dkey is not None:
            if dkey in self.seen:
                return self.verdict(conv, [("duplicate_conversation", "the same messages appeared earlier")])
            self.seen.add(dkey)
        return True

    def placeholder(self, conv: Any, key: tuple[str, ...], dkey: int | None, prompt: int) -> Iterator[Any]:
        """A candidate placeholder (all answers short) answering `prompt` (its :func:`prompt_key`): judge
        it when its key is flagged, else hold it (a known filler is flagged once it crosses its
        threshold; other keys are judged when their rows leave the buffer)."""
        if key in self.flagged:
            out = self._judge(conv, key, dkey)
            if out is not None:
                yield out
            return
        prompts = self.prompts.setdefault(key, set())
        prompts.add(prompt)
        self.pending.append((key, conv, dkey))
        if is_filler(key) and self.rule.passes(key, len(prompts), self.checked):
            yield from self._flag(key)
        elif len(self.pending) > self.options.placeholder_buffer:
            yield from self._leave()

    def _flag(self, key: tuple[str, ...]) -> Iterator[Any]:
        """Make `key` a placeholder and judge its held rows, in order."""
        self.flagged[key] = len(self.prompts.pop(key, ()))
        self.released_before_flag += self.released_keys.pop(key, 0)
        held = [(c, d) for k, c, d in self.pending if k == key]
        self.pending = deque(p for p in self.pending if p[0] != key)
        for c, d in held:
            out = self._judge(c, key, d)
            if out is not None:
                yield out

    def _leave(self) -> Iterator[Any]:
        """The oldest held row must leave: flag its key if the counts of now make it a placeholder."""
        key, conv, dkey = self.pending[0]
        if self.rule.passes(key, len(self.prompts.get(key, ())), self.checked):
            yield from self._flag(key)
            return
        self.pending.popleft()
        self.released_keys[key] = self.released_keys.get(key, 0) + 1
        if self.release(conv, dkey):
            yield conv

    def _judge(self, conv: Any, key: tuple[str, ...], dkey: int | None) -> Any | None:
        """A row of a placeholder key, as ``placeholders`` says: the row to yield, or None."""
        shown = " / ".join(repr(k) for k in key[:3])
        n, rule = self.flagged[key], self.rule.describe(key)
        reason = f"assistant answer {shown} answers {n}+ different prompts ({rule})"
        mode = self.options.placeholders
        if mode == "reject":
            if not self.verdict(conv, [("placeholder_response", reason)]):
                return None
        else:
            src = conv.source
            where = _where(src.line, src.index, src.path)
            if mode == "keep":
                self.report.warn("placeholder_response", src.file, src.line, f"{where}{reason}; kept")
                if isinstance(conv, Conversation):
                    conv.warnings.append("placeholder_response")
            else:
                self.report.warn(
                    "placeholder_stripped", src.file, src.line, f"{where}{reason}; answers removed"
                )
                conv = strip_answers(conv) if isinstance(conv, Conversation) else conv.without_answers()
        return conv if self.release(conv, dkey) else None

    def drain(self) -> Iterator[Any]:
        """The end of the input: every held row leaves, judged with the whole input's counts."""
        while self.pending:
            yield from self._leave()

    def placeholder_summary(self) -> dict[str, Any]:
        return {
            "answers": [" / ".join(k) for k in sorted(self.flagged)][:20],
            "mode": self.options.placeholders,
            "min_rows": self.rule.min_rows,
            "min_share": self.rule.min_share,
            "filler_rows": self.rule.filler_rows,
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
        report.extra["losses"] = pol.losses(report)
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
