"""`draftdeck jobs submit|list|show|cancel|retry`: a client of a server's JSON API.

The server is `--server URL`, else DRAFTDECK_SERVER, else the one `draftdeck up` recorded under the
home (``server.json``, while it runs), else http://127.0.0.1:8000; when the user named none, every
command says on stderr which one it talks to. DRAFTDECK_TOKEN, when set, goes as a bearer token. Paths in
parameters are the server's to resolve (inside its data roots), exactly as if they came from the form.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from draftdeck.cli.common import err, out, usage_exit
from draftdeck.cli.data import print_scan_figures
from draftdeck.kinds import KINDS
from draftdeck.units import binary_size, count

DEFAULT_SERVER = "http://127.0.0.1:8000"
TERMINAL = ("succeeded", "failed", "cancelled")

jobs_app = typer.Typer(
    no_args_is_help=True,
    help="Submit and inspect jobs on a DraftDeck server (its JSON API).",
    rich_markup_mode=None,
)
ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server",
        help="server URL (default: $DRAFTDECK_SERVER, else the one draftdeck up runs here, else"
        f" {DEFAULT_SERVER})",
    ),
]


def resolve_server(server: str | None) -> tuple[str, str | None]:
    """(URL, how it was chosen: None when the user named it, by --server or DRAFTDECK_SERVER)."""
    named = server or os.environ.get("DRAFTDECK_SERVER")
    if named:
        return named, None
    from app.cli.address import RECORD, recorded
    from app.settings import get_settings

    home = get_settings().home_dir
    found = recorded(home)
    if found:
        return found, f"the server draftdeck up runs ({home / RECORD})"
    return DEFAULT_SERVER, "the default: no draftdeck up is running here"


class Client:
    def __init__(self, server: str | None):
        import httpx

        chosen, how = resolve_server(server)
        base = chosen.rstrip("/")
        if how is not None:
            err.print(f"server {base}, {how}", highlight=False, soft_wrap=True)
        token = os.environ.get("DRAFTDECK_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.base = base
        self.http = httpx.Client(base_url=base, headers=headers, timeout=30.0)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, **query: Any) -> Any:
        import httpx

        try:
            # Writes are JSON requests (the server refuses other content types as CSRF protection).
            payload = body if body is not None or method == "GET" else {}
            r = self.http.request(
                method, path, json=payload, params={k: v for k, v in query.items() if v is not None}
            )
        except httpx.HTTPError as exc:
            raise usage_exit(f"cannot reach the DraftDeck server at {self.base}: {exc}") from None
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text
            raise usage_exit(f"{self.base} answered {r.status_code}: {_detail(detail)}")
        return r.json() if r.content else None


def _detail(detail: Any) -> str:
    if isinstance(detail, list):  # FastAPI's validation errors
        return "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail)
    return str(detail)


def parse_params(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs; a key given twice holds a list (`-p inputs=a -p inputs=b`)."""
    params: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise usage_exit(f"--param takes KEY=VALUE, got {pair!r}")
        key, value = (part.strip() for part in pair.split("=", 1))
        if key in params:
            params[key] = [*(params[key] if isinstance(params[key], list) else [params[key]]), value]
        else:
            params[key] = value
    return params


def _job_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    for col in ("id", "kind", "status", "progress", "created", "error"):
        table.add_column(col, overflow="fold")
    for j in rows:
        total = j.get("progress_total")
        prog = f"{j['progress_done']:,}/{total:,} {j['progress_unit']}" if total else "-"
        created = datetime.fromisoformat(j["created_at"]).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(
            str(j["id"]), j["kind"], j["status"], prog, created, escape((j.get("error") or "")[:80])
        )
    return table


@jobs_app.command("submit")
def jobs_submit(
    kind: Annotated[str, typer.Argument(help=f"the job kind: {', '.join(KINDS)}", show_default=False)],
    param: Annotated[
        list[str] | None, typer.Option("--param", "-p", help="KEY=VALUE (repeat a key for a list)")
    ] = None,
    wait: Annotated[bool, typer.Option(help="wait until the job ends")] = False,
    server: ServerOpt = None,
) -> None:
    """Queue a job; print its id (on stderr: its parameters as the server resolved them; with --wait,
    where its outputs went)."""
    client = Client(server)
    job = client.call("POST", "/api/jobs", {"kind": kind, "params": parse_params(param or [])})
    job_id = job["id"]
    out.print(job_id)
    # The server's parameters, paths resolved by its one rule: where it will read and write.
    err.print(
        f"job {job_id} queued: {escape(json.dumps(job.get('params', {})))}", highlight=False, soft_wrap=True
    )
    if wait:
        _wait(client, job_id)


def _wait(client: Client, job_id: int) -> None:
    while True:
        job = client.call("GET", f"/api/jobs/{job_id}")
        if job["status"] in TERMINAL:
            err.print(
                f"job {job_id} {job['status']}" + (f": {escape(job['error'])}" if job.get("error") else ""),
                highlight=False,
            )
            if job["kind"] == "scan" and (job.get("result") or {}).get("would_reject") is not None:
                print_scan_figures(job["result"], err)  # the findings, as `draftdeck scan` prints them
            _print_outputs(job, err)
            _print_alerts(client, job_id, err)
            raise typer.Exit(0 if job["status"] == "succeeded" else 1)
        time.sleep(0.5)


@jobs_app.command("list")
def jobs_list(
    status: Annotated[str | None, typer.Option()] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 20,
    server: ServerOpt = None,
) -> None:
    """The most recent jobs."""
    rows = Client(server).call("GET", "/api/jobs", status=status, limit=limit)
    if not rows:
        err.print("no jobs")
        return
    out.print(_job_table(rows))


@jobs_app.command("show")
def jobs_show(
    job_id: int, as_json: Annotated[bool, typer.Option("--json")] = False, server: ServerOpt = None
) -> None:
    """One job: parameters, status, issues, outputs, the datasets it made and its alerts."""
    client = Client(server)
    job = client.call("GET", f"/api/jobs/{job_id}")
    if as_json:
        print(json.dumps(job, indent=2))
        return
    total = job.get("progress_total")
    progress = f", {job['progress_done']:,}/{total:,} {job['progress_unit']}" if total else ""
    created = datetime.fromisoformat(job["created_at"]).strftime("%Y-%m-%d %H:%M:%S")
    out.print(
        f"job {job['id']} {escape(job['kind'])}: {job['status']}{progress} (created {created})",
        highlight=False,
    )
    if job.get("error"):
        out.print(f"error: {escape(job['error'])}", highlight=False)
    out.print(f"params: {escape(json.dumps(job['params']))}", highlight=False)
    for e in job["events"]:
        at = datetime.fromisoformat(e["at"]).strftime("%H:%M:%S")
        out.print(f"  {at} {e['level']:<8} {escape(e['message'])}", highlight=False)
    _print_outputs(job, out)
    _print_alerts(client, job_id, out)


def _print_alerts(client: Client, job_id: int, console: Console) -> None:
    """The alerts the job raised, oldest first (a job can succeed and still say its data is wrong)."""
    for a in reversed(client.call("GET", "/api/alerts", job=job_id)):
        console.print(f"  [bold yellow]alert {escape(a['kind'])}:[/] {escape(a['message'])}", highlight=False)


def _print_outputs(job: dict[str, Any], console: Console) -> None:
    """Where a job wrote: each output file and dataset, with its absolute path on the server."""
    for o in job.get("outputs", []):
        console.print(
            f"  output {escape(o['path'])}  "
            + (f"{count(o['rows'], 'rows')}, " if o["rows"] else "")
            + f"{binary_size(o['bytes'])}"
            f" sha256={o['sha256'][:12]}",
            highlight=False,
            soft_wrap=True,  # a path stays one line, to copy
        )
    for d in job.get("datasets", []):
        console.print(f"  dataset {d['id']}: {escape(d['path'])}", highlight=False, soft_wrap=True)


@jobs_app.command("cancel")
def jobs_cancel(job_id: int, server: ServerOpt = None) -> None:
    """Cancel a queued or running job."""
    job = Client(server).call("POST", f"/api/jobs/{job_id}/cancel")
    requested = job["status"] == "running"
    out.print(f"job {job_id}: {job['status']}" + (" (cancellation requested)" if requested else ""))


@jobs_app.command("retry")
def jobs_retry(job_id: int, server: ServerOpt = None) -> None:
    """Run a failed or cancelled job again as a new attempt; print the new id."""
    out.print(Client(server).call("POST", f"/api/jobs/{job_id}/retry")["id"])
