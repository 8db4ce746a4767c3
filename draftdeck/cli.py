"""`draftdeck ...`: every job can be run from the shell, with the same parameters as the UI.

Exit codes: 0 success, 1 the job ran but failed its policy (or failed), 2 usage errors (bad
arguments, paths outside the data roots, missing files).

The service commands (`up`, `web`, `worker`, `db`, `jobs`) import the web app and the workers
lazily: the core library itself never depends on them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from draftdeck.errors import DraftDeckError, InputError, JobFailed, UsageError
from draftdeck.quality import Report

app = typer.Typer(no_args_is_help=True, add_completion=False, help="DraftDeck: data plumbing for drafters.")
db_app = typer.Typer(no_args_is_help=True, help="Database migrations.")
jobs_app = typer.Typer(
    no_args_is_help=True, help="Submit and inspect jobs (the same jobs as the UI and API)."
)
app.add_typer(db_app, name="db")
app.add_typer(jobs_app, name="jobs")

out = Console()
err = Console(stderr=True)


def _usage_exit(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(2)


def _roots() -> list[Path]:
    from app.settings import get_settings

    return get_settings().roots


def _confine(path: Path) -> Path:
    from draftdeck.paths import resolve_in_roots

    try:
        return resolve_in_roots(path.absolute(), _roots())
    except UsageError as exc:
        raise _usage_exit(str(exc)) from None


# -- services -----------------------------------------------------------------------------------
def _serve(host: str, port: int) -> None:
    import uvicorn

    from app.settings import get_settings

    get_settings().check_listen(host)
    # Open event streams (the jobs list keeps one) must not hold a Ctrl-C for ever: 3 s, then close them.
    uvicorn.run(
        "app.main:app",
        host=host,
        port=port,
        log_level="info",
        proxy_headers=False,
        timeout_graceful_shutdown=3,
    )


def _prepare(host: str | None = None, port: int | None = None) -> None:
    """Export the listen address so settings (token checks) see it, then migrate."""
    if host is not None:
        os.environ["DRAFTDECK_HOST"] = host
    if port is not None:
        os.environ["DRAFTDECK_PORT"] = str(port)
    from app.db import upgrade
    from app.settings import get_settings

    get_settings.cache_clear()
    settings = get_settings()
    settings.ensure_dirs()
    if host is not None:
        settings.check_listen(host)
    upgrade()


def worker_argv(queues: str, concurrency: int, name: str | None = None) -> list[str]:
    """The command line of a Celery worker for `queues` (also what the integration tests start)."""
    node = name or f"draftdeck-{queues.replace(',', '-')}"
    return [sys.executable, "-m", "celery", "-A", "workers.celery_app:celery_app", "worker", "-Q", queues,
            "-c", str(concurrency), "--loglevel", "INFO", "-n", f"{node}@%h",
            "--without-mingle", "--without-gossip"]  # fmt: skip


def _die_with_parent() -> None:
    """In the worker child: ask Linux to SIGTERM it when `draftdeck up` dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except OSError:  # not Linux: `up` still stops the worker on every normal exit
        pass


@app.command()
def up(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
) -> None:
    """Run DraftDeck on embedded defaults: web app + one worker, SQLite and a file broker under ./var."""
    _prepare(host, port)
    from app.settings import get_settings

    settings = get_settings()
    worker = subprocess.Popen(worker_argv("cpu,gpu", 1), start_new_session=True, preexec_fn=_die_with_parent)
    mode = "embedded (SQLite + filesystem broker)" if settings.embedded else "Redis"
    out.print(
        f"DraftDeck on [bold]http://{host}:{port}[/]  ·  {mode}  ·  data roots: "
        f"{', '.join(map(str, settings.roots))}",
        highlight=False,
    )
    try:
        _serve(host, port)
    finally:
        try:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(worker.pid, signal.SIGKILL)


@app.command()
def web(
    host: Annotated[str, typer.Option()] = "127.0.0.1", port: Annotated[int, typer.Option()] = 8000
) -> None:
    """Run only the web app (pair it with `draftdeck worker` processes on any machines)."""
    _prepare(host, port)
    _serve(host, port)


@app.command()
def worker(
    queues: Annotated[str, typer.Option(help="comma-separated queues: cpu, gpu")] = "cpu,gpu",
    concurrency: Annotated[int, typer.Option(min=1)] = 1,
) -> None:
    """Run a Celery worker for the given queues."""
    _prepare()
    from workers.celery_app import QUEUES

    unknown = set(queues.split(",")) - set(QUEUES)
    if unknown:
        raise _usage_exit(f"unknown queues: {', '.join(sorted(unknown))}; known: {', '.join(QUEUES)}")
    os.execv(sys.executable, worker_argv(queues, concurrency))


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply every migration to the configured database."""
    _prepare()
    out.print("database is up to date")


# -- jobs ---------------------------------------------------------------------------------------
def _parse_params(pairs: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise _usage_exit(f"--param takes KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        params[key.strip()] = value
    return params


def _job_table(rows: list[Any]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    for col in ("id", "kind", "status", "progress", "created", "error"):
        table.add_column(col, overflow="fold")
    for j in rows:
        prog = f"{j.progress_done:,}/{j.progress_total:,} {j.progress_unit}" if j.progress_total else "-"
        table.add_row(
            str(j.id),
            j.kind,
            j.status,
            prog,
            j.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            (j.error or "")[:80],
        )
    return table


@jobs_app.command("submit")
def jobs_submit(
    kind: str,
    param: Annotated[list[str] | None, typer.Option("--param", "-p", help="KEY=VALUE")] = None,
    wait: Annotated[bool, typer.Option(help="wait until the job ends")] = False,
) -> None:
    """Queue a job; print its id."""
    _prepare()
    from app import submit
    from app.db import session_scope
    from app.settings import get_settings

    with session_scope() as session:
        try:
            job = submit.submit(session, kind, _parse_params(param or []), get_settings())
        except UsageError as exc:
            raise _usage_exit(str(exc)) from None
    out.print(job.id)
    if wait:
        _wait(job.id or 0)


def _wait(job_id: int) -> None:
    from app import jobs
    from app.db import session_scope

    while True:
        with session_scope() as session:
            job = jobs.get_job(session, job_id)
        assert job is not None
        if job.status in ("succeeded", "failed", "cancelled"):
            err.print(f"job {job_id} {job.status}" + (f": {job.error}" if job.error else ""), highlight=False)
            raise typer.Exit(0 if job.status == "succeeded" else 1)
        time.sleep(0.5)


@jobs_app.command("list")
def jobs_list(
    status: Annotated[str | None, typer.Option()] = None, limit: Annotated[int, typer.Option(min=1)] = 20
) -> None:
    """The most recent jobs."""
    _prepare()
    from sqlmodel import col, select

    from app.db import session_scope
    from app.models import Job

    with session_scope() as session:
        query = select(Job).order_by(col(Job.id).desc()).limit(limit)
        if status:
            query = query.where(Job.status == status)
        rows = list(session.exec(query).all())
    if not rows:
        err.print("no jobs")
        return
    out.print(_job_table(rows))


@jobs_app.command("show")
def jobs_show(job_id: int, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """One job: parameters, status, issues and outputs."""
    _prepare()
    from sqlmodel import col, select

    from app import jobs
    from app.db import session_scope
    from app.models import JobEvent, JobOutput

    with session_scope() as session:
        job = jobs.get_job(session, job_id)
        if job is None:
            raise _usage_exit(f"no job {job_id}")
        events = list(
            session.exec(select(JobEvent).where(JobEvent.job_id == job_id).order_by(col(JobEvent.id)))
        )
        outputs = list(session.exec(select(JobOutput).where(JobOutput.job_id == job_id)))
    if as_json:
        print(
            json.dumps(
                {
                    **job.model_dump(mode="json"),
                    "events": [e.model_dump(mode="json") for e in events],
                    "outputs": [o.model_dump(mode="json") for o in outputs],
                },
                indent=2,
            )
        )
        return
    out.print(_job_table([job]))
    out.print(f"params: {json.dumps(job.params)}", highlight=False)
    for e in events:
        out.print(f"  {e.at:%H:%M:%S} {e.level:<8} {e.message}", highlight=False)
    for o in outputs:
        out.print(
            f"  output {o.path}  rows={o.rows:,} bytes={o.bytes:,} sha256={o.sha256[:12]}", highlight=False
        )


@jobs_app.command("cancel")
def jobs_cancel(job_id: int) -> None:
    """Cancel a queued or running job."""
    _prepare()
    from app import jobs
    from app.db import session_scope

    with session_scope() as session:
        try:
            job = jobs.request_cancel(session, job_id)
        except LookupError:
            raise _usage_exit(f"no job {job_id}") from None
        except jobs.JobStateError as exc:
            raise _usage_exit(str(exc)) from None
    out.print(f"job {job_id}: {job.status}" + (" (cancellation requested)" if job.cancel_requested else ""))


@jobs_app.command("retry")
def jobs_retry(job_id: int) -> None:
    """Run a failed or cancelled job again as a new attempt; print the new id."""
    _prepare()
    from app import jobs, submit
    from app.db import session_scope
    from app.settings import get_settings

    with session_scope() as session:
        try:
            job = submit.retry(session, job_id, get_settings())
        except LookupError:
            raise _usage_exit(f"no job {job_id}") from None
        except (jobs.JobStateError, UsageError) as exc:
            raise _usage_exit(str(exc)) from None
    out.print(job.id)


# -- in-process jobs ----------------------------------------------------------------------------
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
    for name, n in sorted(report.rejected.items()):
        table.add_row(f"rejected: {name}", f"{n:,}", style="yellow")
    for name, n in sorted(report.warnings.items()):
        table.add_row(f"warning: {name}", f"{n:,}", style="yellow")
    out.print(table)
    for name, examples in sorted(report.examples.items()):
        for ex in examples[:3]:
            where = f"{ex.file}:{ex.line}" if ex.line is not None else ex.file
            out.print(f"  [yellow]{name}[/] {escape(str(where))}: {escape(ex.reason)}", highlight=False)


def run_in_process(title: str, label: str, work: Callable[[Any], Report], report_path: Path | None) -> Report:
    """Run a core job here with a progress bar on stderr; print its summary; write its JSON report.

    Exit 1 (after printing the report) when the job fails its policy, 2 on input or usage errors.
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
                if report_path:
                    exc.report.write_json(report_path)
            err.print(f"[bold red]failed:[/] {escape(str(exc))}", highlight=False)
            raise typer.Exit(1) from None
        except (InputError, UsageError) as exc:
            raise _usage_exit(str(exc)) from None
    print_report(result, title)
    if report_path:
        result.write_json(report_path)
    return result


@app.command()
def scan(
    file: Path,
    report: Annotated[Path | None, typer.Option("--report", help="write the JSON report here")] = None,
    max_row_bytes: Annotated[int, typer.Option(min=1)] = 64 * 1024 * 1024,
) -> None:
    """Pre-flight one data file in-process: rows, bytes, parse errors and key sets."""
    from draftdeck.scan import scan_file

    path = _confine(file)
    result = run_in_process(
        f"scan {file}",
        f"scan {file.name}",
        lambda progress: scan_file(
            path, progress=progress, max_row_bytes=max_row_bytes, display_name=str(file)
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
    out.print(
        f"{result.extra['bytes']:,} bytes · {result.extra['container']}"
        + (f" · {result.extra['compression']}" if result.extra["compression"] else ""),
        highlight=False,
    )


def _register_areas() -> None:
    from draftdeck import cli_convert, cli_tokenize

    cli_convert.register(app)
    cli_tokenize.register(app)


_register_areas()


def main() -> None:
    try:
        app()
    except DraftDeckError as exc:  # a core error no command caught: still a clear message, never a traceback
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(2 if isinstance(exc, UsageError) else 1)


if __name__ == "__main__":
    main()
