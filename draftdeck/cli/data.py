"""`draftdeck scan` and `draftdeck convert`: options derived from the kinds' parameter models.

    draftdeck scan INPUT... [--max-row-bytes N] [--report FILE]
    draftdeck convert INPUT... --to openai|sharegpt|parquet --out PATH [--report FILE] [--strict]
        [--max-rejected F] [--policy-file FILE] [--tree-paths all|best] [--allow-prompt-only] [--workers N]

Exit codes: 0 success, 1 the policy failed the job (an empty output always does), 2 usage errors
(bad options, missing or unreadable inputs, an output that would replace an input, bad policy files).
"""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.table import Table

from draftdeck.cli.common import out, run_in_process, usage_exit
from draftdeck.cli.options import job_command, option
from draftdeck.errors import UsageError
from draftdeck.jobs.convert import ConvertParams, convert_files
from draftdeck.jobs.scan import ScanParams, scan_files
from draftdeck.units import binary_size, count

REPORT = option("report", Path | None, None, help="write the JSON report here")


def default_workers() -> int:
    """min(2, the CPUs this process may use)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(2, cpus))


def scan(params: ScanParams, *, report: Path | None) -> None:
    paths = [Path(p) for p in params.inputs]
    names = ", ".join(p.name for p in paths)
    result = run_in_process(
        f"scan {' '.join(params.inputs)}",
        f"scan {names}",
        lambda progress: scan_files(
            paths, progress=progress, max_row_bytes=params.max_row_bytes, display_names=params.inputs
        ),
        report,
    )
    out.print("[bold]key sets[/]", highlight=False)
    keys = Table(show_edge=False, header_style="bold")
    keys.add_column("top-level keys")
    keys.add_column("rows", justify="right")
    for ks in result.extra["keysets"]:
        keys.add_row(", ".join(ks["keys"]) or "(none)", f"{ks['rows']:,}")
    out.print(keys)
    files = result.extra.get("files", [result.extra])
    for f in files:
        out.print(
            f"{binary_size(f['bytes'])} · {f['container']}"
            + (f" · {f['compression']}" if f["compression"] else "")
            + (f" · {f['file']}" if len(files) > 1 else ""),
            highlight=False,
        )  # fmt: skip


def convert(params: ConvertParams, *, report: Path | None, workers: int | None) -> None:
    assert params.out is not None  # required on the command line
    out_path = Path(params.out)
    try:
        params.check([])
        params.options(workers=workers or default_workers())  # a bad policy file: a usage error now
    except UsageError as exc:
        raise usage_exit(str(exc)) from None
    n = len(params.inputs)
    result = run_in_process(
        f"convert -> {params.to} {out_path}",
        f"convert {n} input{'s' if n != 1 else ''}",
        lambda progress: convert_files(
            params, out_path, progress=progress, workers=workers or default_workers()
        ),
        report,
    )
    formats = ", ".join(f"{name} {k:,}" for name, k in result.formats.most_common())
    out.print(f"formats: {formats or '-'}", highlight=False)
    for o in result.outputs:
        out.print(
            f"wrote {o.path}: {count(o.rows, 'rows')}, {binary_size(o.bytes)}, sha256 {o.sha256[:16]}",
            highlight=False,
        )


WORKERS = option(
    "workers", int | None, None, min=1,
    help="processes converting large JSONL inputs in parallel (default: min(2, CPUs); 1: one process);"
    " the output and the report are the same for any number",
)  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("scan")(
        job_command(ScanParams, scan, extra=[REPORT],
                    doc="Pre-flight data files in-process: rows, bytes, parse errors and key sets.")
    )  # fmt: skip
    app.command("convert")(
        job_command(ConvertParams, convert, required=("to", "out"), extra=[REPORT, WORKERS],
                    doc="Convert chat data of any known shape (detected per row) to OpenAI, ShareGPT"
                    " or Parquet.")
    )  # fmt: skip
