"""`draftdeck ...` in-process commands (scan, convert, mix, regenerate, tokenize, inspect, vocab, export,
train, eval, sweep, export-drafter).

They run the core here, on any path the user can read. The console entry point (app/cli/main.py)
joins them with the service commands (up, web, worker, db, jobs); this package imports nothing of the
web, the queue or SQL.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

import typer
from rich.markup import escape

from draftdeck.cli.common import err
from draftdeck.errors import DraftDeckError, UsageError

HELP = "DraftDeck: data plumbing for drafters."


def register(
    app: typer.Typer,
    serving_commands: Callable[[typer.Typer], None] | None = None,
    record_eval: Callable[..., str] | None = None,
) -> None:
    """Add every in-process command to `app` (`serving_commands`: the service's, in the serving group;
    `record_eval`: the service's recording of a finished `eval`, draftdeck/cli/drafter.py)."""
    from draftdeck.cli import cache_hidden, data, drafter, mix, regenerate, serving, sweep, tokens

    data.register(app)
    mix.register(app)
    tokens.register(app)
    drafter.register(app, record_eval)
    cache_hidden.register(app)
    sweep.register(app)
    regenerate.register(app)
    serving.register(app, serving_commands)


def make_app() -> typer.Typer:
    from draftdeck.cli.options import plain_help

    # Plain click help (no Rich boxes): at 80 columns Rich's table cuts option names and wraps values
    app = typer.Typer(no_args_is_help=True, add_completion=False, help=HELP, rich_markup_mode=None)
    register(app)
    return plain_help(app)


app = make_app()


def run(app: typer.Typer) -> None:
    """Run `app` as the process's command, and end the process with its exit status."""
    try:
        try:
            app()
        except DraftDeckError as exc:  # a core error no command caught: a clear message, never a traceback
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
            sys.exit(2 if isinstance(exc, UsageError) else 1)
    except SystemExit as done:
        if isinstance(done.code, int | None):
            leave(done.code or 0)
        raise


def leave(code: int) -> NoReturn:
    """End the process without the interpreter's module teardown: with torch and transformers imported
    it frees them for ~0.7 s at exit, a third of a short command's start-up. Exit handlers still run
    (logging, temporary folders, process pools) and standard streams are flushed; with a non-daemon
    thread still running, the normal exit joins it instead."""
    if any(not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken pipe: nothing left to say
            stream.flush()
    os._exit(code)


def main() -> None:
    run(app)
