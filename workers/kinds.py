"""Job kinds: for each, its queue, its parameters and the core function it runs.

This is the routing table: a kind's queue decides which workers may take it (`gpu` for training,
evaluation and local generation; `cpu` for everything else).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from draftdeck.formats.readers import DEFAULT_MAX_ROW_BYTES
from draftdeck.paths import resolve_in_roots
from draftdeck.quality import Policy, Report
from workers.context import JobContext


class JobParams(BaseModel):
    """Base of every kind's parameters: unknown keys are refused, paths are confined to the roots."""

    model_config = ConfigDict(extra="forbid")
    input_paths: ClassVar[tuple[str, ...]] = ()

    def confined(self, roots: list[Path]) -> JobParams:
        """Return a copy whose input paths are resolved inside `roots` (raises PathNotAllowedError)."""
        updates = {name: str(resolve_in_roots(getattr(self, name), roots)) for name in self.input_paths}
        return self.model_copy(update=updates)

    def policy(self) -> Policy:
        return Policy()


class ScanParams(JobParams):
    path: str = Field(description="data file to scan (JSONL, JSON array or object; gzip/zstd too)")
    max_row_bytes: int = Field(default=DEFAULT_MAX_ROW_BYTES, gt=0, description="rows above this size are rejected")
    input_paths: ClassVar[tuple[str, ...]] = ("path",)


def run_scan(params: ScanParams, ctx: JobContext) -> Report:
    from draftdeck.scan import scan_file

    report = scan_file(Path(params.path), progress=ctx.progress, max_row_bytes=params.max_row_bytes)
    report.outputs.append(ctx.write_json_output("scan-report.json", report.to_dict(), rows=report.rows_out))
    return report


@dataclass(frozen=True)
class JobKind:
    name: str
    queue: str
    params: type[JobParams]
    run: Callable[[Any, JobContext], Report]
    summary: str


KINDS: dict[str, JobKind] = {
    k.name: k
    for k in (
        JobKind("scan", "cpu", ScanParams, run_scan, "Pre-flight: rows, bytes, parse errors and key sets of one file"),
    )
}


def get_kind(name: str) -> JobKind:
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown job kind {name!r}; known kinds: {', '.join(sorted(KINDS))}") from None
