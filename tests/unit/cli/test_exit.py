"""How a command ends its process (draftdeck.cli.run): the exit status, what it printed, its exit
handlers and its threads all survive the exit that skips the interpreter's module teardown."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

APP = """
import atexit, sys, threading, time
from pathlib import Path
import typer
from draftdeck.cli import run
from draftdeck.errors import UsageError

out = Path(sys.argv[1])
app = typer.Typer(add_completion=False)

@app.command()
def main(mode: str) -> None:
    atexit.register(lambda: (out / "atexit").write_text("ran"))
    sys.stdout.write("no newline, still buffered")  # a pipe: block-buffered until flushed
    if mode == "thread":  # a non-daemon thread: the exit waits for it, as Python's own does
        threading.Thread(target=lambda: (time.sleep(0.5), (out / "thread").write_text("done"))).start()
    if mode == "status":
        raise typer.Exit(3)
    if mode == "usage":
        raise UsageError("bad option")

sys.argv = ["cmd", sys.argv[2]]
run(app)
"""


def _run(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", APP, str(tmp_path), mode],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_command_that_succeeds_exits_0_with_its_output_flushed_and_its_exit_handlers_run(
    tmp_path: Path,
) -> None:
    done = _run(tmp_path, "ok")
    assert (done.returncode, done.stdout) == (0, "no newline, still buffered"), done.stderr
    assert (tmp_path / "atexit").read_text() == "ran"


def test_a_command_keeps_its_exit_status(tmp_path: Path) -> None:
    done = _run(tmp_path, "status")
    assert (done.returncode, done.stdout) == (3, "no newline, still buffered"), done.stderr
    assert (tmp_path / "atexit").read_text() == "ran"


def test_a_core_error_is_a_message_and_status_2(tmp_path: Path) -> None:
    done = _run(tmp_path, "usage")
    assert done.returncode == 2
    assert "error: bad option" in done.stderr
    assert "Traceback" not in done.stderr
    assert (tmp_path / "atexit").read_text() == "ran"


def test_the_exit_waits_for_a_running_non_daemon_thread(tmp_path: Path) -> None:
    done = _run(tmp_path, "thread")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "atexit").read_text() == "ran"
