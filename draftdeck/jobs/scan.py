"""The `scan` kind: a pre-flight look at data files (rows, bytes, parse errors, key sets)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

from draftdeck.fileio import atomic_output, sha256_file
from draftdeck.jobs.context import RunContext
from draftdeck.jobs.params import JobParams, inputs_field, max_row_bytes_field
from draftdeck.progress import Progress, no_progress
from draftdeck.quality import Output, Report
from draftdeck.scan import MAX_KEYSETS, scan_file

REPORT_NAME = "scan-report.json"


class ScanParams(JobParams):
    inputs: list[str] = inputs_field("data files to scan (JSONL, JSON array or object; gzip/zstd too)")
    max_row_bytes: int = max_row_bytes_field()
    input_paths: ClassVar[tuple[str, ...]] = ("inputs",)


def scan_files(
    paths: list[Path],
    *,
    progress: Progress = no_progress,
    max_row_bytes: int,
    display_names: list[str] | None = None,
) -> Report:
    """Scan each file; one file's report as :func:`draftdeck.scan.scan_file` makes it, several merged
    (key sets summed, `files` listing each file's own figures)."""
    names = display_names or [str(p) for p in paths]
    reports = [
        scan_file(path, progress=progress, max_row_bytes=max_row_bytes, display_name=name)
        for path, name in zip(paths, names, strict=True)
    ]
    if len(reports) == 1:
        return reports[0]
    merged = Report()
    keysets: Counter[tuple[str, ...]] = Counter()
    for r in reports:
        merged.merge(r)
        keysets.update({tuple(ks["keys"]): ks["rows"] for ks in r.extra["keysets"]})
    merged.formats = Counter({"+".join(k) or "(no keys)": n for k, n in keysets.most_common(MAX_KEYSETS)})
    merged.extra.update(
        {
            "files": [{k: v for k, v in r.extra.items() if k != "keysets"} for r in reports],
            "bytes": sum(r.extra["bytes"] for r in reports),
            "keysets": [{"keys": list(k), "rows": n} for k, n in keysets.most_common(MAX_KEYSETS)],
            "keysets_total": len(keysets),
        }
    )
    merged.check_accounting()
    return merged


def write_report(path: Path, data: dict[str, Any], *, rows: int) -> Output:
    with atomic_output(path, "w") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
    return Output(str(path), rows, path.stat().st_size, sha256_file(path))


def run(params: ScanParams, ctx: RunContext) -> Report:
    report = scan_files(
        [Path(p) for p in params.inputs], progress=ctx.progress, max_row_bytes=params.max_row_bytes
    )
    report.outputs.append(write_report(ctx.out_dir / REPORT_NAME, report.to_dict(), rows=report.rows_out))
    return report
