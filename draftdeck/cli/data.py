"""`draftdeck scan` and `draftdeck convert`: options derived from the kinds' parameter models.

    draftdeck scan INPUT... [--from FORMAT] [--max-row-bytes N] [--report FILE]
    draftdeck convert INPUT... --out PATH [--to sharegpt|openai|parquet] [--from FORMAT] [--report FILE]
        [--strict] [--max-rejected F] [--policy-file FILE] [--tree-paths all|best] [--allow-prompt-only]
        [--workers N]

Exit codes: 0 success, 1 the policy failed the job (an empty output always does), 2 usage errors
(bad options, missing or unreadable inputs, an output that would replace an input, bad policy files).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from draftdeck.cli.common import out, run_in_process, usage_exit
from draftdeck.cli.options import job_command, option
from draftdeck.convert.job import ConvertParams, convert_files
from draftdeck.convert.scan_job import ScanParams, scan_files
from draftdeck.errors import UsageError
from draftdeck.issue_codes import FOLDED
from draftdeck.quality import Report
from draftdeck.units import binary_size, count

REPORT = option("report", Path | None, None, help="write the JSON report here")


def default_workers() -> int:
    """2 worker processes where this process may use 3 CPUs or more, else 1 (one process). The parent
    reads back, judges and writes every row the workers convert: on 2 CPUs the three processes share
    them, and one process converts faster (benchmarks/convert.py, 200 MB: 1.12 s against 1.20 s)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(2, cpus - 1))


def scan(params: ScanParams, *, report: Path | None) -> None:
    paths = [Path(p) for p in params.inputs]
    names = ", ".join(p.name for p in paths)
    result = run_in_process(
        f"scan {' '.join(params.inputs)}",
        f"scan {names}",
        lambda progress: scan_files(
            paths, progress=progress, max_row_bytes=params.max_row_bytes, display_names=params.inputs,
            from_format=params.from_format, tool_tags=params.tool_tags, preference=params.preference,
            columns=params.columns, tags=params.tags,
        ),
        report,
        details=print_scan,  # a scan that would keep nothing fails: its shapes and rejections say why
    )  # fmt: skip
    print_scan(result)


def _table(*columns: str) -> Table:
    table = Table(show_edge=False, header_style="bold")
    for i, name in enumerate(columns):
        # a path is folded onto more lines, never cut with an ellipsis: a user copies it
        table.add_column(name, justify="left" if i == 0 or name in ("example", "file") else "right",
                         overflow="fold" if name == "file" else "ellipsis")  # fmt: skip
    return table


def print_scan(result: Report) -> None:
    print_scan_figures(result.to_dict(), out)


def print_scan_figures(figures: dict[str, Any], console: Console) -> None:
    """The pre-flight figures after the summary, from a scan report's dict (a job's result too): shapes
    (per file when there are several), what convert would keep and reject, prompt-only rows,
    placeholder candidates, key sets and each file's container. User text is never read as markup."""
    files = figures.get("files", [figures])
    console.print("[bold]shapes[/]", highlight=False)
    several = len(files) > 1
    shapes = _table("shape", "rows", *(["file"] if several else []))
    for f in files if several else [{"formats": figures["formats"], "file": ""}]:
        for name, n in sorted(f.get("formats", {}).items(), key=lambda kv: -kv[1]):
            shapes.add_row(escape(name), f"{n:,}", *([escape(f["file"])] if several else []))
    console.print(shapes)
    # a result of before would_merge counted the FOLDED codes in would_reject: either way, they are merged
    items = [*figures["would_reject"], *figures.get("would_merge", [])]
    merged = sum(item["rows"] for item in items if item["code"] in FOLDED)
    console.print(
        f"convert would keep {figures['would_keep']:,} of {figures['rows_in']:,} rows"
        + (f" (+{figures['rows_expanded']:,} expanded)" if figures.get("rows_expanded") else "")
        + (f"; {merged:,} lines or events merged into them or metadata, not lost" if merged else ""),
        highlight=False,
    )
    rejected = [item for item in items if item["code"] not in FOLDED]
    if rejected:
        console.print("[bold]convert would reject[/]", highlight=False)
        rejects = _table("code", "rows", "example")
        for item in rejected:
            ex = item["example"]
            where = "" if ex is None else f"{ex['file']}" + (f":{ex['row']}" if ex["row"] is not None else "")
            text = "" if ex is None else f"{where}: {ex['reason']}"
            rejects.add_row(escape(item["code"]), f"{item['rows']:,}", escape(text))
        console.print(rejects)
    proposal = figures.get("suggested_mapping")
    if proposal:  # the flags on a line of their own, never folded: a user copies them
        if proposal.get("why") == "unread_text":  # read, but by the wrong fields
            console.print(
                f"[bold]read by the wrong fields[/]: the reader took {proposal['read_chars']:,} characters"
                f" of {proposal['unread_rows']:,} rows and left {proposal['unread_chars']:,} in"
                f" {escape(', '.join(proposal['unread_fields']))}; convert them with (a proposal: check each"
                " field before you pass it):",
                highlight=False,
            )
        else:
            console.print(
                f"rows of no known shape ({escape(', '.join(proposal['keys']))}: {proposal['rows']:,} rows)"
                " would read with (a proposal: check each field before you pass it):",
                highlight=False,
            )
        console.print(f"  {proposal['options']}", highlight=False, markup=False, soft_wrap=True)
    prompt_only = figures["prompt_only"]
    if prompt_only:
        console.print(
            f"prompt-only rows: {prompt_only:,} (no answer yet: `regenerate` answers them, or convert"
            " --allow-prompt-only keeps them)",
            highlight=False,
            markup=False,
        )
    ph = figures["placeholder"]
    if ph["flagged"]["rows"] or ph["candidates"]:
        console.print(
            f"[bold]placeholder candidates[/] (answers of at most {ph['max_chars']} characters; on"
            f" {ph['min_rows']}+ rows they are rejected as placeholder_response)",
            highlight=False,
        )
        cands = _table("answer", "rows", "verdict")
        for answer in ph["flagged"]["answers"]:
            cands.add_row(escape(repr(answer)), "", "rejected")
        if ph["flagged"]["rows"]:
            cands.add_row("(all rejected answers)", f"{ph['flagged']['rows']:,}", "rejected")
        for c in ph["candidates"]:
            cands.add_row(escape(repr(c["answer"])), f"{c['rows']:,}", "kept")
        console.print(cands)
    console.print("[bold]key sets[/]", highlight=False)
    keys = _table("top-level keys", "rows")
    for ks in figures["keysets"]:
        keys.add_row(escape(", ".join(ks["keys"])) or "(none)", f"{ks['rows']:,}")
    console.print(keys)
    for skip in figures.get("skipped", []):
        console.print(f"skipped {skip['file']}: {skip['why']}", highlight=False, markup=False)
    for f in files:
        console.print(
            f"{binary_size(f['bytes'])} · {f['container']}"
            + (f" · {f['compression']}" if f["compression"] else "")
            + (f" · {f['file']}" if several else ""),
            highlight=False, markup=False,
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
        f"convert {count(n, 'input')}",
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
            soft_wrap=True,
        )


WORKERS = option(
    "workers", int | None, None, min=1,
    help="processes converting large JSONL inputs in parallel (default: 2 with 3 CPUs or more, else 1);"
    " the output and the report are the same for any number",
)  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("scan")(
        job_command(ScanParams, scan, extra=[REPORT],
                    doc="Pre-flight data files in-process: shapes, what convert would keep and reject (with"
                    " examples), prompt-only rows, placeholder candidates and key sets.")
    )  # fmt: skip
    app.command("convert")(
        job_command(ConvertParams, convert, required=("out",), extra=[REPORT, WORKERS],
                    doc="Convert chat data of any known shape (detected per row) to OpenAI, ShareGPT"
                    " or Parquet.")
    )  # fmt: skip
