"""`draftdeck convert` (registered into draftdeck.cli).

    draftdeck convert INPUT... --to openai|sharegpt|parquet --out PATH [--report FILE] [--strict]
        [--max-rejected F] [--policy FILE] [--tree-paths all|best] [--allow-prompt-only] [--workers N]

Exit codes: 0 success, 1 the policy failed the job (an empty output always does), 2 usage errors
(bad options, inputs outside the data roots, missing or unreadable inputs, invalid policy files).
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from draftdeck.errors import UsageError
from draftdeck.quality import Policy


class Target(StrEnum):
    openai = "openai"
    sharegpt = "sharegpt"
    parquet = "parquet"


class TreePaths(StrEnum):
    all = "all"
    best = "best"


def default_workers() -> int:
    """min(2, the CPUs this process may use)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(2, cpus))


def convert_command(
    inputs: Annotated[
        list[Path],
        typer.Argument(
            help="data files (JSONL, JSON, gzip/zstd, Parquet, Arrow) or datasets save_to_disk folders"
        ),
    ],
    to: Annotated[Target, typer.Option("--to", help="output format")],
    out: Annotated[Path, typer.Option("--out", help="output file (written atomically)")],
    report: Annotated[Path | None, typer.Option("--report", help="write the JSON report here")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="every warning fails the job")] = False,
    max_rejected: Annotated[
        float | None,
        typer.Option(
            "--max-rejected", min=0.0, max=1.0, help="fail when more than this fraction of rows is rejected"
        ),
    ] = None,
    policy: Annotated[
        Path | None, typer.Option("--policy", help="JSON policy file: {strict, max_rejected, codes}")
    ] = None,
    tree_paths: Annotated[
        TreePaths, typer.Option("--tree-paths", help="message trees: every leaf or the best-ranked path")
    ] = TreePaths.all,
    allow_prompt_only: Annotated[
        bool,
        typer.Option(
            "--allow-prompt-only", help="keep rows without an assistant turn (to regenerate answers)"
        ),
    ] = False,
    max_row_bytes: Annotated[
        int, typer.Option("--max-row-bytes", min=1, help="rows above this size are rejected as oversize_row")
    ] = 64 * 1024 * 1024,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=1,
            help="processes converting large JSONL inputs in parallel (default: min(2, CPUs); 1: one"
            " process); the output and the report are the same for any number",
        ),
    ] = None,
) -> None:
    """Convert chat data of any known shape (detected per row) to OpenAI, ShareGPT or Parquet."""
    from draftdeck.cli import _confine, _usage_exit, run_in_process
    from draftdeck.cli import out as console
    from draftdeck.convert import ConvertOptions, convert

    paths = [_confine(p) for p in inputs]
    try:
        pol = Policy.build(policy, strict, max_rejected)
        options = ConvertOptions(
            policy=pol,
            allow_prompt_only=allow_prompt_only,
            tree_paths=tree_paths.value,
            max_row_bytes=max_row_bytes,
            workers=workers if workers is not None else default_workers(),
        )
    except UsageError as exc:
        raise _usage_exit(str(exc)) from None
    result = run_in_process(
        f"convert -> {to.value} {out}",
        f"convert {len(paths)} input{'s' if len(paths) != 1 else ''}",
        lambda progress: convert(paths, out, to.value, options=options, progress=progress),
        report,
    )
    formats = ", ".join(f"{name} {n:,}" for name, n in result.formats.most_common())
    console.print(f"formats: {formats or '-'}", highlight=False)
    for o in result.outputs:
        console.print(
            f"wrote {o.path}: {o.rows:,} rows, {o.bytes:,} bytes, sha256 {o.sha256[:16]}", highlight=False
        )


def register(app: typer.Typer) -> None:
    """Add the conversion commands to `app`."""
    app.command("convert")(convert_command)
