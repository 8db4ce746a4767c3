"""`scan`: a pre-flight look at data files before anything is converted or tokenized.

The input is read once, through :func:`draftdeck.convert.read_conversations` with convert's default
checks (and the same ``--from``), so the scan says what a convert would do, row by row:

- ``rows_in``; ``rows_out``: the rows convert would keep; ``rejected`` (and ``examples``): what it
  would reject and why, per code (reader errors such as json_error included); ``warnings``;
  ``formats``: the detected shape of each row, counted as convert counts it.
- ``extra``: the file, bytes, container and compression; ``keysets`` (top-level key sets and their
  row counts, the raw view); ``prompt_only`` (rows with a user turn and no answer: convert rejects
  them as no_assistant_turn unless ``--allow-prompt-only``, for regeneration); ``placeholder`` (short
  answers, as convert's placeholder check normalises them, on two rows or more: candidates among
  the kept rows, and the answers over the threshold that convert rejects as placeholder_response);
  ``would_keep``, ``would_reject`` and ``would_merge`` (per code: rows and one example with file, row
  and reason; ``would_merge``: the FOLDED codes, lines merged into another row's conversation or its
  metadata, counted and not lost, as the report's ``merged``);
  ``suggested_mapping`` where rows of no known shape were seen: a ``--columns`` / ``--tags`` proposal
  for the most common such key set (:mod:`draftdeck.formats.suggest`), or None when none reads it
  (``why``: ``unknown_format``). Also where rows were read but the long text their reader left
  (``unused_text_field``) is :data:`UNREAD_RATIO` times the text it took, as a short
  ``question`` / ``answer`` pair beside a long ``Question`` / ``Complex_CoT`` / ``Response``: the
  reader took the wrong fields, and a proposal that reads the left ones is made (``why``:
  ``unread_text``, with ``read_chars``, ``unread_chars``, ``unread_rows`` and ``unread_fields``).

Rows balance as in convert: ``rows_in + rows_expanded = rows_out + rejected``. An empty input, one
where no row parses as a JSON object, and one of which convert would keep no row (all prompt-only,
say) fail: a pre-flight that would give an empty output is an error, as the empty output is, and its
message names the top codes, an example and what to fix. The report still comes with the failure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from draftdeck.convert.checks import unused_fields
from draftdeck.convert.options import ConvertOptions
from draftdeck.convert.placeholders import placeholder_key
from draftdeck.convert.reading import read_conversations
from draftdeck.errors import JobFailed
from draftdeck.formats.columns import mapping_text
from draftdeck.formats.common import RowRejected
from draftdeck.formats.detect import detect
from draftdeck.formats.grouping import kind_of
from draftdeck.formats.model import Conversation
from draftdeck.formats.readers import DEFAULT_MAX_ROW_BYTES, RawRow
from draftdeck.formats.suggest import option_text, suggest_mapping
from draftdeck.formats.tables import open_reader, skipped_in
from draftdeck.issue_codes import FOLDED
from draftdeck.progress import Progress, no_progress
from draftdeck.quality import Report

MAX_KEYSETS = 50
MAX_PLACEHOLDER_CANDIDATES = 10
# Long text no reader used, this many times the text the reader took: it read the wrong fields (a short
# question / answer pair beside the long Question / Complex_CoT / Response) rather than left a side note
UNREAD_RATIO = 3


class _WatchedReader:
    """A row reader whose rows are also seen by the scan (key sets, JSON objects) as convert reads them."""

    def __init__(self, reader: Any, scan: _Watch):
        self.reader = reader
        self.scan = scan

    def __enter__(self) -> _WatchedReader:
        self.reader.__enter__()
        return self

    def __exit__(self, *exc: object) -> Any:
        return self.reader.__exit__(*exc)

    def __iter__(self) -> Iterator[RawRow]:
        keysets = self.scan.keysets
        samples = self.scan.samples
        for row in self.reader:
            value = row.value
            if row.error is None and isinstance(value, dict):
                self.scan.objects += 1
                keys = tuple(sorted(value))
                keysets[keys] += 1
                if keys not in samples and len(samples) < MAX_KEYSETS:
                    samples[keys] = value
            yield row

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)


class _Watch:
    """What the scan sees of the raw rows while read_conversations reads them."""

    def __init__(self, names: dict[Path, str], report: Report):
        self.names = names
        self.report = report
        self.keysets: Counter[tuple[str, ...]] = Counter()
        self.samples: dict[tuple[str, ...], dict[str, Any]] = {}  # the first row of each key set
        self.objects = 0
        self.readers: list[Any] = []
        self._marks: list[Counter[str]] = []  # the shapes counted when each file was opened

    def open(self, path: Path, **kwargs: Any) -> _WatchedReader:
        reader = open_reader(path, display_name=self.names.get(path), **kwargs)
        self.readers.append(reader)
        self._marks.append(Counter(self.report.formats))
        return _WatchedReader(reader, self)

    def shapes_per_file(self) -> list[dict[str, int]]:
        """Each file's shapes (rows per detected shape): files are read one after another, so a file's
        are the counts between its opening and the next one's."""
        ends = [*self._marks[1:], Counter(self.report.formats)]
        return [dict((end - start).most_common()) for start, end in zip(self._marks, ends, strict=True)]


class _Unread:
    """The kept rows with unused long text (``unused_text_field``): the text their reader took, and
    the text it left, by field."""

    def __init__(self) -> None:
        self.rows = 0
        self.read_chars = 0
        self.fields: Counter[str] = Counter()  # field -> its characters left, over the rows

    def add(self, conv: Conversation) -> None:
        left = unused_fields(conv)
        if not left:
            return
        self.rows += 1
        self.read_chars += sum(len(m.content) + len(m.reasoning or "") for m in conv.messages)
        self.fields.update({k: len(conv.meta[k]) for k in left})

    @property
    def unread_chars(self) -> int:
        return sum(self.fields.values())

    def misread(self) -> bool:
        """Whether the text left is so much longer than the text taken that the reader took the wrong
        fields."""
        return self.rows > 0 and self.unread_chars >= UNREAD_RATIO * max(self.read_chars, 1)


def _file_facts(reader: Any) -> dict[str, Any]:
    return {
        "file": reader.name,
        "bytes": reader.bytes_read,
        "container": reader.container,
        "compression": reader.compression,
    }


def _placeholder_figures(
    report: Report, candidates: Counter[tuple[str, ...]], options: ConvertOptions
) -> dict[str, Any]:
    flagged = report.extra.get("placeholder", {})
    # an answer on one row is just a short answer; a candidate is one that repeats
    repeated = Counter({key: n for key, n in candidates.items() if n >= 2})
    return {
        "min_rows": options.placeholder_min_rows,
        "max_chars": options.placeholder_max_chars,
        "flagged": {
            "answers": flagged.get("answers", []),
            "rows": report.rejected.get("placeholder_response", 0)
            + report.warnings.get("placeholder_response", 0),
        },
        "candidate_rows": sum(repeated.values()),
        "candidates": [
            {"answer": " / ".join(key), "rows": n}
            for key, n in repeated.most_common(MAX_PLACEHOLDER_CANDIDATES)
        ],
    }


def _suggestion(watch: _Watch) -> dict[str, Any] | None:
    """A proposed mapping for the most common key set no reader recognises (None: there is none, or
    no proposal reads it)."""
    for keys, rows in watch.keysets.most_common(MAX_KEYSETS):
        sample = watch.samples.get(keys)
        if sample is None or kind_of(sample) is not None:
            continue
        try:
            detect(sample)
            continue
        except RowRejected:
            pass
        found = suggest_mapping(sample)
        if found is not None:
            return _proposal(keys, rows, *found, why="unknown_format")
    return None


def _unread_suggestion(watch: _Watch, unread: _Unread) -> dict[str, Any] | None:
    """A proposed mapping for rows whose reader left most of their text (None: it took the most, or no
    proposal reads every field it left), for the most common key set holding those fields."""
    if not unread.misread():
        return None
    left = set(unread.fields)
    for keys, rows in watch.keysets.most_common(MAX_KEYSETS):
        sample = watch.samples.get(keys)
        if sample is None or not left <= set(keys):
            continue
        found = suggest_mapping(sample)
        if found is not None and left <= set(found[0].values()):
            return _proposal(
                keys, rows, *found, why="unread_text", read_chars=unread.read_chars,
                unread_chars=unread.unread_chars, unread_rows=unread.rows, unread_fields=sorted(left),
            )  # fmt: skip
    return None


def _proposal(
    keys: tuple[str, ...], rows: int, columns: dict[str, str], tags: dict[str, str], **more: Any
) -> dict[str, Any]:
    mapping, options = mapping_text(columns, tags), option_text(columns, tags)
    return {"keys": list(keys), "rows": rows, "columns": columns, "tags": tags,
            "mapping": mapping, "options": options, **more}  # fmt: skip


def _would_reject(report: Report, folded: bool = False) -> list[dict[str, Any]]:
    """Per code, the rows convert would reject (`folded`: merge into another row's conversation)."""
    out = []
    for code, n in report.rejected.most_common():
        if (code in FOLDED) != folded:
            continue
        examples = report.examples.get(code) or []
        ex = examples[0] if examples else None
        example = {"file": ex.file, "row": ex.line, "reason": ex.reason} if ex is not None else None
        out.append({"code": code, "rows": n, "example": example})
    return out


def scan_paths(
    paths: Sequence[Path],
    *,
    progress: Progress = no_progress,
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
    display_names: Sequence[str] | None = None,
    from_format: str | None = None,
    tool_tags: str = "parse",
    preference: str = "chosen",
    columns: dict[str, str] | None = None,
    tags: dict[str, str] | None = None,
    image_roots: tuple[str, ...] | None = None,
) -> Report:
    """Scan `paths` (files or ``save_to_disk`` folders, read in order as one convert would) and return
    the report. Raises :class:`JobFailed` (carrying the report) when no row parsed, InputError for a
    missing or unreadable input."""
    names = dict(zip(paths, display_names, strict=True)) if display_names else {}
    options = ConvertOptions(
        max_row_bytes=max_row_bytes, from_format=from_format, tool_tags=tool_tags, preference=preference,
        columns=dict(columns or {}), tags=dict(tags or {}), image_roots=image_roots,
    )  # fmt: skip
    report = Report()
    watch = _Watch(names, report)
    candidates: Counter[tuple[str, ...]] = Counter()
    unread = _Unread()
    max_chars = options.placeholder_max_chars
    for conv in read_conversations(list(paths), report, options, progress, open_file=watch.open):
        report.rows_out += 1
        if conv.meta and "unused_text_field" in conv.warnings:
            unread.add(conv)
        key = placeholder_key(conv, max_chars)
        if key is not None:
            candidates[key] += 1
    report.check_accounting()
    files = [
        {**_file_facts(r), "formats": shapes}
        for r, shapes in zip(watch.readers, watch.shapes_per_file(), strict=True)
    ]
    shown = ", ".join(names.get(p, str(p)) for p in paths)
    keysets = watch.keysets.most_common(MAX_KEYSETS)
    # one file: its facts at the top (its shapes are the report's); several: each with its own shapes
    extra = {k: v for k, v in files[0].items() if k != "formats"} if len(files) == 1 else {"files": files}
    report.extra.update(extra)
    report.extra.update(
        {
            "bytes": sum(f["bytes"] for f in files),
            "keysets": [{"keys": list(k), "rows": n} for k, n in keysets],
            "keysets_total": len(watch.keysets),
            "prompt_only": report.rejected.get("no_assistant_turn", 0)
            + report.warnings.get("no_assistant_turn", 0),
            "placeholder": _placeholder_figures(report, candidates, options),
            "would_keep": report.rows_out,
            "would_reject": _would_reject(report),
            "would_merge": _would_reject(report, folded=True),
            # what a folder given as input holds that is not read, and why: a skip is said, never silent
            "skipped": [
                {"file": names.get(f, str(f)), "why": why} for p in paths for f, why in skipped_in(Path(p))
            ],
        }
    )
    if from_format is not None:
        report.extra["from_format"] = from_format
    if columns:
        report.extra["columns"] = mapping_text(columns, tags or {})
    else:
        proposal = _suggestion(watch) if report.rejected.get("unknown_format") else None
        proposal = proposal or _unread_suggestion(watch, unread)
        if proposal is not None or report.rejected.get("unknown_format"):
            report.extra["suggested_mapping"] = proposal
    if report.rows_in == 0:
        raise JobFailed(f"{shown}: empty input ({report.extra['bytes']} bytes, no rows)", report)
    top = ", ".join(f"{n:,} {c}" for c, n in report.rejected.most_common(3))
    if watch.objects == 0:
        raise JobFailed(f"{shown}: no row parsed out of {report.rows_in} ({top})", report)
    if report.rows_out == 0:  # a pre-flight that would keep nothing is a failed one, as an empty output is
        code = report.rejected.most_common(1)[0][0]
        ex = report.examples[code][0]
        where = f"{ex.file}:{ex.line}" if ex.line is not None else ex.file
        proposal = report.extra.get("suggested_mapping")
        fix = (
            f"declare their fields with --columns: {proposal['mapping']}, say"
            if proposal
            else "read them as another shape with --from"
        )
        raise JobFailed(
            f"{shown}: convert would keep none of the {report.rows_in:,} rows ({top}); e.g. {where}: "
            f"{ex.reason}. Fix those rows, or {fix}",
            report,
        )
    return report


def scan_file(
    path: Path,
    *,
    progress: Progress = no_progress,
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
    display_name: str | None = None,
    from_format: str | None = None,
) -> Report:
    """Scan one file (see :func:`scan_paths`)."""
    return scan_paths(
        [path],
        progress=progress,
        max_row_bytes=max_row_bytes,
        display_names=[display_name] if display_name else None,
        from_format=from_format,
    )
