"""`draftdeck ...` in-process commands (scan, convert, regenerate, tokenize, inspect, vocab, export,
train, eval, export-drafter).

They run the core here, on any path the user can read. The console entry point (app/cli_service.py)
joins them with the service commands (up, web, worker, db, jobs); this package imports nothing of the
web, the queue or SQL.
"""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

from draftdeck.cli.common import err
from draftdeck.errors import DraftDeckError, UsageError

HELP = "DraftDeck: data plumbing for drafters."


def register(app: typer.Typer) -> None:
    """Add every in-process command to `app`."""
    from draftdeck.cli import data, drafter, regenerate, tokens

    data.register(app)
    tokens.register(app)
    drafter.register(app)
    regenerate.register(app)


def make_app() -> typer.Typer:
    from draftdeck.cli.options import plain_help

    # Plain click help (no Rich boxes): at 80 columns Rich's table cuts option names and wraps values
    app = typer.Typer(no_args_is_help=True, add_completion=False, help=HELP, rich_markup_mode=None)
    register(app)
    return plain_help(app)


app = make_app()


def run(app: typer.Typer) -> None:
    try:
        app()
    except DraftDeckError as exc:  # a core error no command caught: still a clear message, never a traceback
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(2 if isinstance(exc, UsageError) else 1)


def main() -> None:
    run(app)
