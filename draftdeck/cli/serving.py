"""`draftdeck serving watch METRICS_URL --kind vllm|sglang`: a served drafter's acceptance, read from
the server's Prometheus text beside the server, with nothing else running.

vLLM: scrapes twice `--interval` seconds apart (or on every interval until stopped) and prints each
window's figures from the counter deltas; SGLang: its gauges, which are already figures of its last
log interval. `--json` prints one line per window and model. Exit codes: 0, or 2 for a URL that
cannot be read or text that is not a Prometheus exposition with the server's spec-decode series.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from draftdeck.cli.common import out, usage_exit
from draftdeck.errors import InputError

if TYPE_CHECKING:
    from draftdeck.serving.exposition import Scrape


class Kind(StrEnum):
    vllm = "vllm"
    sglang = "sglang"


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _print_window(window: dict[str, Any], as_json: bool) -> None:
    if as_json:
        out.print(json.dumps(window), highlight=False, soft_wrap=True)
        return
    if "gauges" in window:
        g = window["gauges"]
        out.print(
            f"{escape(window['model_name'] or '(no model_name)')}: accept length "
            f"{_fmt(g.get('accept_length'))}, accept rate {_fmt(g.get('accept_rate'))} (SGLang's last "
            "interval, as it reports them)",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
        return
    restarted = f", {window['restarted']} engine(s) restarted" if window["restarted"] else ""
    per = " ".join(_fmt(p, ".2f") for p in window["per_position"]) or "-"
    out.print(
        f"{escape(window['model_name'] or '(no model_name)')}, {window['seconds']:.0f} s, "
        f"{window['engines']} engine(s){restarted}: {window['drafts']:,} drafts, "
        f"{window['draft_tokens']:,} draft tokens, {window['accepted']:,} accepted",
        highlight=False, soft_wrap=True,
    )  # fmt: skip
    out.print(
        f"  acceptance rate {_fmt(window['acceptance_rate'])}, tau incl. bonus "
        f"{_fmt(window['tau_incl_bonus'], '.2f')} (1 + accepted / drafts, as vLLM counts); "
        f"per position {per}",
        highlight=False, soft_wrap=True,
    )  # fmt: skip


def watch(
    metrics_url: Annotated[str, typer.Argument(metavar="METRICS_URL", help="the server's /metrics URL")],
    kind: Annotated[Kind, typer.Option("--kind", help="the server's kind")] = Kind.vllm,
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="seconds per window")] = 10.0,
    once: Annotated[bool, typer.Option("--once", help="one window, then exit")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON line per window and model")] = False,
    token_env: Annotated[
        str | None, typer.Option("--token-env", help="environment variable holding a bearer token")
    ] = None,
) -> None:
    """Scrape a vLLM or SGLang /metrics and print acceptance per window: rate, tau incl. bonus, p_i."""
    import os

    from draftdeck.serving.exposition import parse
    from draftdeck.serving.fetch import fetch_text
    from draftdeck.serving.window import windows

    token = os.environ.get(token_env) if token_env else None
    if token_env and not token:
        raise usage_exit(f"--token-env {token_env}: the variable is not set")

    def scrape() -> Scrape:
        return parse(fetch_text(metrics_url, token=token), kind.value, time.time(), source=metrics_url)

    try:
        before = scrape()
        while True:
            if kind == Kind.vllm:
                time.sleep(interval)
                now = scrape()
                for w in windows(before, now):
                    _print_window(w.to_json(), as_json)
                before = now
            else:
                for model, gauges in sorted(before.gauges.items()):
                    view = {"model_name": model, "gauges": gauges, "convention": "last interval"}
                    _print_window(view, as_json)
                if once:
                    return
                time.sleep(interval)
                before = scrape()
            if once:
                return
    except InputError as e:
        raise usage_exit(str(e)) from None
    except KeyboardInterrupt:
        return


def register(app: typer.Typer, more: Callable[[typer.Typer], None] | None = None) -> None:
    """Add the `serving` group with `watch`; `more` adds the service's commands (app/cli/serving.py)."""
    group = typer.Typer(
        no_args_is_help=True,
        help="Watch a served drafter (vLLM, SGLang): acceptance from the server's /metrics.",
        rich_markup_mode=None,
    )
    group.command("watch")(watch)
    if more is not None:
        more(group)
    app.add_typer(group, name="serving")
