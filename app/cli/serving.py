"""`draftdeck serving add|list|remove`: serving endpoints on a DraftDeck server (its JSON API), beside the
in-process `draftdeck serving watch` (draftdeck/cli/serving.py), which needs no server."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from app.cli.jobs import Client, ServerOpt
from draftdeck.cli.common import out
from draftdeck.cli.serving import Kind


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def add(
    name: Annotated[str, typer.Argument(help="a name for the endpoint")],
    metrics_url: Annotated[str, typer.Argument(metavar="METRICS_URL", help="the server's /metrics URL")],
    kind: Annotated[Kind, typer.Option("--kind", help="the server's kind")] = Kind.vllm,
    run: Annotated[int | None, typer.Option("--run", help="the train run (job id) it serves")] = None,
    drafter: Annotated[str | None, typer.Option("--drafter", help="the drafter folder it serves")] = None,
    token_env: Annotated[
        str | None, typer.Option("--token-env", help="environment variable holding its bearer token")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="the served model_name that is this drafter's")
    ] = None,
    interval: Annotated[float, typer.Option("--interval", help="seconds between scrapes")] = 15.0,
    server: ServerOpt = None,
) -> None:
    """Register a served drafter: the server scrapes it on its interval and compares it with the run."""
    body = {"name": name, "kind": kind.value, "metrics_url": metrics_url, "run_job_id": run,
            "drafter": drafter, "token_env": token_env, "model_name": model,
            "interval_s": interval}  # fmt: skip
    ep = Client(server).call("POST", "/api/serving", body)
    out.print(ep["id"])


def list_(server: ServerOpt = None) -> None:
    """The serving endpoints with their health and served tau incl. bonus (newest drafts)."""
    rows = Client(server).call("GET", "/api/serving")
    table = Table(show_edge=False, header_style="bold")
    for column in ("id", "name", "kind", "health", "served tau", "drafts", "eval tau", "run"):
        table.add_column(column, overflow="fold")
    for e in rows:
        w = e["window"]
        tau = (e.get("gauges") or {}).get("accept_length") if e["kind"] == "sglang" else w["tau_incl_bonus"]
        health = e["health"] if e["health"] == "ok" else e["health_text"]
        table.add_row(
            str(e["id"]), escape(e["name"]), e["kind"], escape(health),
            _fmt(tau, ".3f"), f"{w['drafts']:,}", _fmt(e["eval_tau"], ".3f"), str(e["run_job_id"] or "-"),
        )  # fmt: skip
    out.print(table)
    out.print("tau incl. bonus: 1 + accepted / drafts, as vLLM counts (SGLang: its gauge, last interval)")


def remove(endpoint_id: int, server: ServerOpt = None) -> None:
    """Forget an endpoint and its windows (its alerts stay)."""
    Client(server).call("DELETE", f"/api/serving/{endpoint_id}")
    out.print(f"removed endpoint {endpoint_id}")


def register(serving_app: typer.Typer) -> None:
    serving_app.command("add")(add)
    serving_app.command("list")(list_)
    serving_app.command("remove")(remove)
