"""The `scan` kind: a pre-flight of data files (shapes, what convert would keep and reject, key sets)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from draftdeck.convert.scan import scan_paths
from draftdeck.fileio import atomic_output, sha256_file
from draftdeck.formats.detect import FormatName
from draftdeck.jobs.context import RunContext, file_roots
from draftdeck.jobs.params import (
    JobParams,
    columns_field,
    from_format_field,
    inputs_field,
    max_row_bytes_field,
    preference_field,
    tags_field,
    tool_tags_field,
)
from draftdeck.progress import Progress, no_progress
from draftdeck.quality import Output, Report

REPORT_NAME = "scan-report.json"


class ScanParams(JobParams):
    inputs: list[str] = inputs_field(
        "data files to scan (JSONL, JSON, gzip/zstd, Parquet, Arrow), datasets save_to_disk"
        " folders, or folders of such files"
    )
    from_format: FormatName | None = from_format_field()
    columns: dict[str, str] = columns_field()
    tags: dict[str, str] = tags_field()
    tool_tags: Literal["parse", "keep"] = tool_tags_field()
    preference: Literal["chosen", "reject"] = preference_field()
    max_row_bytes: int = max_row_bytes_field()
    input_paths: ClassVar[tuple[str, ...]] = ("inputs",)
    essentials: ClassVar[tuple[str, ...]] = ("from_format",)


def scan_files(
    paths: list[Path],
    *,
    progress: Progress = no_progress,
    max_row_bytes: int,
    display_names: list[str] | None = None,
    from_format: str | None = None,
    tool_tags: str = "parse",
    preference: str = "chosen",
    columns: dict[str, str] | None = None,
    tags: dict[str, str] | None = None,
    image_roots: tuple[str, ...] | None = None,
) -> Report:
    """Scan the files as one convert would read them (see :func:`draftdeck.convert.scan.scan_paths`); with
    several, `files` in the report lists each file's own container figures."""
    return scan_paths(
        paths,
        progress=progress,
        max_row_bytes=max_row_bytes,
        display_names=display_names,
        from_format=from_format,
        tool_tags=tool_tags,
        preference=preference,
        columns=columns,
        tags=tags,
        image_roots=image_roots,
    )


def write_report(path: Path, data: dict[str, Any]) -> Output:
    """The scan's findings as JSON: an artifact (it describes rows, it holds none)."""
    with atomic_output(path, "w") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
    return Output(str(path), 0, path.stat().st_size, sha256_file(path), kind="artifact")


def run(params: ScanParams, ctx: RunContext) -> Report:
    report = scan_files(
        [Path(p) for p in params.inputs],
        progress=ctx.progress,
        max_row_bytes=params.max_row_bytes,
        from_format=params.from_format,
        columns=params.columns,
        tags=params.tags,
        tool_tags=params.tool_tags,
        preference=params.preference,
        image_roots=file_roots(ctx),
    )
    report.outputs.append(write_report(ctx.out_dir / REPORT_NAME, report.to_dict()))
    return report
