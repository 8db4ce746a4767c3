"""The console entry point (`draftdeck`): the core's in-process commands (draftdeck/cli/) joined with
the service commands: `up`, `web`, `worker`, `db` run the service here; `jobs` talks to a server's
JSON API (`--server URL` or DRAFTDECK_SERVER; the token from DRAFTDECK_TOKEN), so it works from
any machine that reaches the server.

Exit codes: 0 success, 1 the job ran but failed (or failed its policy), 2 usage errors (bad
arguments, refused by the server, server unreachable).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from app.cli import demo_figures
from app.cli import serving as cli_serving
from app.cli.evals import record_cli_eval
from app.cli.jobs import jobs_app
from draftdeck import cli as core
from draftdeck.cli.common import out, usage_exit
from draftdeck.cli.options import plain_help
from draftdeck.drafter.kinds import NAMES as DRAFTER_KINDS

service_app = typer.Typer(no_args_is_help=True, add_completion=False, help=core.HELP, rich_markup_mode=None)
db_app = typer.Typer(no_args_is_help=True, help="Database migrations.", rich_markup_mode=None)


def _serve(host: str, port: int) -> None:
    import uvicorn

    from app.cli import address
    from app.settings import get_settings

    settings = get_settings()
    settings.check_listen(host)
    address.record(settings.home_dir, host, port)  # `draftdeck jobs` finds this server
    # An open SSE stream (the jobs list) must not hold Ctrl-C: give connections 3 s to close.
    config = uvicorn.Config(
        "app.web.main:app", host=host, port=port, log_level="info", proxy_headers=False,
        timeout_graceful_shutdown=3,
    )  # fmt: skip
    server = uvicorn.Server(config)

    def on_sigint(sig: int, frame: Any) -> None:
        # uvicorn raises the Ctrl-C it handled once more after its shutdown, while the app's lifespan
        # is still closing: a traceback for a normal stop. The server has stopped by then.
        if not server.should_exit:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGINT, previous)
        address.forget(settings.home_dir)


ALLOWED_HOSTS_HELP = (
    "comma-separated host names the web app answers to beyond localhost, 127.0.0.1 and the bind address"
    " (the name in your browser's address bar when you reach this machine by name; .example.com: its"
    " subdomains too)"
)


def _prepare(host: str | None = None, port: int | None = None, allowed_hosts: str | None = None) -> None:
    """Export the listen address and host names so settings (token and host checks) see them, then
    migrate."""
    if host is not None:
        os.environ["DRAFTDECK_HOST"] = host
    if port is not None:
        os.environ["DRAFTDECK_PORT"] = str(port)
    if allowed_hosts is not None:
        os.environ["DRAFTDECK_ALLOWED_HOSTS"] = allowed_hosts
    from app.settings import get_settings
    from app.store.db import upgrade

    get_settings.cache_clear()
    settings = get_settings()
    settings.ensure_dirs()
    if host is not None:
        settings.check_listen(host)
    upgrade()


def _die_with_parent() -> None:
    """In the worker child: ask Linux to SIGTERM it when `draftdeck up` dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except OSError:  # not Linux: `up` still stops the worker on every normal exit
        pass


@service_app.command()
def up(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    allowed_hosts: Annotated[str | None, typer.Option(help=ALLOWED_HOSTS_HELP)] = None,
) -> None:
    """Run DraftDeck on embedded defaults: web app + one worker, SQLite and a file broker under ./var."""
    _prepare(host, port, allowed_hosts)
    from app.settings import get_settings

    settings = get_settings()
    from app.queue import worker_argv

    # running as root is this machine's choice: Celery's warning about it would be every start's first lines
    quiet = {**os.environ, "PYTHONWARNINGS": "ignore:You're running the worker with superuser privileges"}
    worker = subprocess.Popen(
        worker_argv("cpu,gpu", 1, quiet=True), start_new_session=True, preexec_fn=_die_with_parent, env=quiet
    )
    mode = "embedded: SQLite and a filesystem broker" if settings.embedded else "Redis"
    roots = ", ".join(map(str, settings.roots))
    out.print(
        f"DraftDeck on [bold]http://{host}:{port}[/] · {mode} · one worker · data roots: {roots}\n"
        f"  open http://{host}:{port} in a browser; the guide is at /guide\n"
        "  to see the whole path on this CPU, run `draftdeck demo --quick` in another terminal\n"
        "  Ctrl-C stops the server and the worker",
        highlight=False,
    )
    try:
        _serve(host, port)
    finally:
        try:  # the worker's own warm shutdown ends its pool processes; the group is killed only if it hangs
            worker.terminate()
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)


@service_app.command()
def web(
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8000,
    allowed_hosts: Annotated[str | None, typer.Option(help=ALLOWED_HOSTS_HELP)] = None,
) -> None:
    """Run only the web app (pair it with `draftdeck worker` processes on any machines)."""
    _prepare(host, port, allowed_hosts)
    _serve(host, port)


@service_app.command()
def worker(
    queues: Annotated[str, typer.Option(help="comma-separated queues: cpu, gpu")] = "cpu,gpu",
    concurrency: Annotated[int, typer.Option(min=1)] = 1,
) -> None:
    """Run a Celery worker for the given queues."""
    _prepare()
    from app.queue import QUEUES, worker_argv

    unknown = set(queues.split(",")) - set(QUEUES)
    if unknown:
        raise usage_exit(f"unknown queues: {', '.join(sorted(unknown))}; known: {', '.join(QUEUES)}")
    os.execv(sys.executable, worker_argv(queues, concurrency))


class DemoArch(StrEnum):
    qwen3 = "qwen3"
    qwen3_5 = "qwen3_5"


DemoDrafter = StrEnum("DemoDrafter", {name: name for name in DRAFTER_KINDS})  # type: ignore[misc]


@service_app.command("demo")
def demo_command(
    workdir: Annotated[
        Path | None,
        typer.Option(
            help="folder for the data and the run (default: the home's demo/, or demo-2/, ... when taken)"
        ),
    ] = None,
    quick: Annotated[bool, typer.Option(help=demo_figures.help_line())] = False,
    seed: Annotated[int, typer.Option(min=0, help="seed of the world, the data and the run")] = 0,
    target_arch: Annotated[
        DemoArch, typer.Option(help="the tiny target: Qwen3, or the Qwen3.5/3.6 hybrid (Gated DeltaNet)")
    ] = DemoArch.qwen3,
    rebuild_world: Annotated[
        bool, typer.Option(help="build the tiny world again (else one built earlier on this home is reused)")
    ] = False,
    drafter: Annotated[
        DemoDrafter,
        typer.Option(help="the drafter kind trained, drafting 7 tokens a step (DFlash blocks of 8)"),
    ] = DemoDrafter("dflash"),
    threads: Annotated[
        int, typer.Option(min=0, help="torch threads (0: as many as there are idle cores at the start)")
    ] = 0,
    multimodal: Annotated[
        bool,
        typer.Option(
            help="a tiny random vision-language target (Qwen3.5-style) and pictures instead: tokenize,"
            " train and eval with images in the prompts; tau on image and text prompts"
        ),
    ] = False,
) -> None:
    """The whole path on the CPU in minutes (tiny target -> regenerate -> tokenize -> train -> eval),
    as jobs the dashboard shows; the last line is a JSON summary (every tau incl. bonus)."""
    from app.cli.demo import demo, free_workdir

    _prepare()
    if multimodal:
        from app.cli.demo_multimodal import demo_multimodal
        from app.settings import get_settings

        where = free_workdir(get_settings().home_dir) if workdir is None else workdir.resolve()
        demo_multimodal(where, quick=quick, seed=seed, threads=threads)
        return
    demo(
        workdir, quick=quick, seed=seed, target_arch=target_arch.value, rebuild_world=rebuild_world,
        drafter=drafter.value, threads=threads,
    )  # fmt: skip


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply every migration to the configured database."""
    _prepare()
    out.print("database is up to date")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"draftdeck {version('draftdeck')}")
        raise typer.Exit()


def make_app() -> typer.Typer:
    app = typer.Typer(no_args_is_help=True, add_completion=False, help=core.HELP, rich_markup_mode=None)

    @app.callback()
    def root(
        version: Annotated[
            bool, typer.Option("--version", callback=_print_version, is_eager=True, help="print the version")
        ] = False,
    ) -> None:
        pass

    core.register(app, serving_commands=cli_serving.register, record_eval=record_cli_eval)
    app.registered_commands.extend(service_app.registered_commands)
    app.add_typer(db_app, name="db")
    app.add_typer(jobs_app, name="jobs")
    return plain_help(app)


app = make_app()


def main() -> None:
    core.run(app)


if __name__ == "__main__":
    main()
