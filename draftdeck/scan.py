"""`scan`: a pre-flight look at one data file before anything is converted or tokenized.

It streams the file and reports rows, bytes, parse errors (file, line, reason) and the top-level
key sets with their counts. Zero parsed rows fails: an empty or unreadable file is never a success.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from draftdeck.errors import JobFailed
from draftdeck.formats.readers import DEFAULT_MAX_ROW_BYTES, RowReader
from draftdeck.progress import Progress, no_progress
from draftdeck.quality import Policy, Report

MAX_KEYSETS = 50


def scan_file(
    path: Path,
    *,
    progress: Progress = no_progress,
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
    display_name: str | None = None,
) -> Report:
    """Scan `path` and return its report.

    Raises :class:`JobFailed` (carrying the report) when no row parsed.
    """
    report = Report()
    keysets: Counter[tuple[str, ...]] = Counter()
    with RowReader(path, display_name=display_name, max_row_bytes=max_row_bytes) as reader:
        for i, row in enumerate(reader):
            report.rows_in += 1
            if row.error:
                report.reject(
                    row.error, row.file, row.line if row.line is not None else row.index, row.reason or ""
                )
            elif not isinstance(row.value, dict):
                report.reject(
                    "not_an_object", row.file, row.line, f"a JSON {type(row.value).__name__}, not an object"
                )
            else:
                report.rows_out += 1
                keysets[tuple(sorted(row.value))] += 1
            if i % 2048 == 0:
                progress(reader.bytes_read, reader.size, "bytes")
        progress(reader.bytes_read, reader.size, "bytes")
        report.extra.update(
            {
                "file": reader.name,
                "bytes": reader.bytes_read,
                "container": reader.container,
                "compression": reader.compression,
                "keysets": [{"keys": list(k), "rows": n} for k, n in keysets.most_common(MAX_KEYSETS)],
                "keysets_total": len(keysets),
            }
        )
    report.formats.update({"+".join(k) or "(no keys)": n for k, n in keysets.most_common(MAX_KEYSETS)})
    report.check_accounting()
    failures = Policy().failures(report)
    if report.rows_in == 0:
        raise JobFailed(
            f"{report.extra['file']}: empty input ({report.extra['bytes']} bytes, no rows)", report
        )
    if failures and report.rows_out == 0:
        top = ", ".join(f"{n} {c}" for c, n in report.rejected.most_common(3))
        raise JobFailed(f"{report.extra['file']}: no row parsed out of {report.rows_in} ({top})", report)
    return report
