"""What every in-process command shares: the consoles, usage errors, the run with a progress bar and
the summary table."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from draftdeck.errors import InputError, JobFailed, UsageError
from draftdeck.issue_codes import FOLDED
from draftdeck.quality import Report, loss_alert_kind

out = Console()
err = Console(stderr=True)


def usage_exit(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(2)


def print_report(report: Report, title: str) -> None:
    """The summary table every in-process command prints at the end."""
    # The title (often a long path) is its own line: as a Table title rich wraps it to the table's width.
    out.print(f"[bold]{escape(title)}[/]", highlight=False, overflow="fold")
    table = Table(show_edge=False, header_style="bold")
    table.add_column("", style="dim")
    table.add_column("rows", justify="right")
    table.add_row("in", f"{report.rows_in:,}")
    table.add_row("out", f"{report.rows_out:,}")
    if report.rows_expanded:
        table.add_row("expanded", f"{report.rows_expanded:,}")
    if report.counts.get("ids_from_target"):  # tokenize: rows trained on the target's own token ids
        table.add_row("out: the target's own ids", f"{report.counts['ids_from_target']:,}")
    for name, n in sorted(report.rejected.items()):
        if name in FOLDED:  # part of another row's conversation: counted, not lost
            table.add_row(f"merged: {name}", f"{n:,}")
        else:
            table.add_row(f"rejected: {name}", f"{n:,}", style="yellow")
    for name, n in sorted(report.warnings.items()):
        table.add_row(f"warning: {name}", f"{n:,}", style="yellow")
    out.print(table)
    for name, examples in sorted(report.examples.items()):
        for ex in examples[: 1 if name in FOLDED else 3]:
            where = f"{ex.file}:{ex.line}" if ex.line is not None else ex.file
            out.print(f"  [yellow]{name}[/] {escape(str(where))}: {escape(ex.reason)}", highlight=False)
    for what, loss in (report.extra.get("losses") or {}).items():
        if loss.get("alert"):
            kind = loss_alert_kind(what)  # the name the job, the docs and /alerts give it
            err.print(f"[bold yellow]alert {kind}:[/] {escape(loss['alert'])}", highlight=False)


def run_in_process(
    title: str,
    label: str,
    work: Callable[[Any], Report],
    report_path: Path | None,
    *,
    details: Callable[[Report], None] | None = None,
) -> Report:
    """Run a core job here with a progress bar on stderr; print its summary; write its JSON report.

    Exit 1 (after printing the report, and `details` of it when given) when the job fails its policy,
    2 on input or usage errors.
    """
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    columns = (BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(
        "[progress.description]{task.description}",
        *columns,
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as bar:
        task = bar.add_task(escape(label), total=None)

        def progress(done: int, total: int | None = None, unit: str = "rows") -> None:
            bar.update(task, completed=done, total=total)

        try:
            result = work(progress)
        except JobFailed as exc:
            bar.stop()
            if isinstance(exc.report, Report):
                print_report(exc.report, title)
                if details is not None:
                    details(exc.report)
                if report_path:
                    exc.report.write_json(report_path)
            err.print(f"[bold red]failed:[/] {escape(str(exc))}", highlight=False)
            raise typer.Exit(1) from None
        except (InputError, UsageError) as exc:
            raise usage_exit(str(exc)) from None
    print_report(result, title)
    if report_path:
        result.write_json(report_path)
        out.print(f"report: {escape(str(report_path.resolve()))}", highlight=False, soft_wrap=True)
    return result
