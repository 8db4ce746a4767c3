"""A real `draftdeck up` in a subprocess and a headless Debian Chromium, for browser tests and screenshots.

Nothing here fakes DraftDeck: the server is the same command a user runs (web app + Celery worker +
SQLite + filesystem broker), started in its own process group with a fresh DRAFTDECK_HOME.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED = REPO_ROOT.parent / "shared"
REAL_DATA = SHARED / "datasets" / "real"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TERMINAL = ("succeeded", "failed", "cancelled")
# A row convert keeps: a scan of a file holding none fails (it would keep nothing), so a file a test
# means to pass holds at least this one.
GOOD_ROW = (
    '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}'
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc), so the worker `draftdeck up` starts in its own session is
    found and stopped even if `up` itself has to be killed."""
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                kids.extend(int(p) for p in f.read().split())
    return kids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); read its state.
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    return False


@dataclass
class Server:
    """One `draftdeck up` process group with its own home; data files go under `data_dir`."""

    home: Path
    port: int = field(default_factory=free_port)
    extra_env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"  # what `up --host` binds; the tests still talk to it over 127.0.0.1
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)
    _groups: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.log_path = self.home / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("DATABASE_URL", "REDIS_URL", "DRAFTDECK_TOKEN", "DRAFTDECK_HOST", "DRAFTDECK_PORT")
        }
        roots = [str(self.home)] + ([str(SHARED)] if SHARED.exists() else [])
        env.update(DRAFTDECK_HOME=str(self.home), DRAFTDECK_DATA_ROOTS=":".join(roots), PYTHONUNBUFFERED="1")
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 60.0) -> Server:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # The console entry point's module, run from this checkout (an installed `draftdeck` script may
        # predate the entry point's move to app/cli/main.py until the venv is reinstalled).
        argv = [sys.executable, "-m", "app.cli.main"]
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child holds it; closed when we stop
        self.proc = subprocess.Popen(
            [*argv, "up", "--host", self.host, "--port", str(self.port)],
            cwd=self.home,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self._groups.add(self.proc.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for kid in _children(self.proc.pid):
                self._groups.add(kid)  # the Celery worker: its own session, hence its own group
            if self.proc.poll() is not None:
                raise RuntimeError(f"draftdeck up exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"draftdeck up did not answer /healthz within {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM every process group we started (web + worker), then SIGKILL what is left.

        An idle Celery worker takes ~6 s for its warm shutdown; a test home is thrown away, so after
        2 s the rest is killed."""
        if self.proc is None:
            return
        for kid in _children(self.proc.pid):
            self._groups.add(kid)
        for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            for pgid in self._groups:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                self.proc.poll()
                if not any(_alive(p) for p in self._groups):
                    break
                time.sleep(0.1)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=1)
        self.proc = None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    # -- the JSON API, for setting up state and cross-checking what pages show --------------------
    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
        headers = {"content-type": "application/json"}
        if "DRAFTDECK_TOKEN" in self.extra_env:
            headers["authorization"] = f"Bearer {self.extra_env['DRAFTDECK_TOKEN']}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read() or b"null")

    def submit(self, kind: str, **params: Any) -> int:
        return int(self.api("POST", "/api/jobs", {"kind": kind, "params": params})["id"])

    def job(self, job_id: int) -> dict[str, Any]:
        return dict(self.api("GET", f"/api/jobs/{job_id}"))

    def wait_status(
        self, job_id: int, statuses: tuple[str, ...] = TERMINAL, timeout: float = 20.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["status"] in statuses:
                return job
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"job {job_id} is {job['status']} after {timeout:.0f} s, wanted {statuses}"
                )
            time.sleep(0.1)

    def open_alerts(self) -> list[dict[str, Any]]:
        return list(self.api("GET", "/api/alerts?acknowledged=false"))


class SlowFile:
    """A named pipe in the data dir that a test writes row by row: a scan of it blocks on the pipe, so
    the job stays `running` exactly as long as the test wants. Always closed at the end, so the worker
    is never left blocked."""

    def __init__(self, path: Path):
        self.path = path
        os.mkfifo(path)
        self._fd: int | None = None
        self._opened = threading.Event()

    def open(self, timeout: float = 20.0) -> None:
        """Open for writing; blocks until the scan opens the other end."""
        result: dict[str, int] = {}

        def opener() -> None:
            result["fd"] = os.open(self.path, os.O_WRONLY)
            self._opened.set()

        t = threading.Thread(target=opener, daemon=True)
        t.start()
        if not self._opened.wait(timeout):
            # Unblock our own opener by opening the read end ourselves, then give up.
            with contextlib.suppress(OSError):
                os.close(os.open(self.path, os.O_RDONLY | os.O_NONBLOCK))
            t.join(1)
            if "fd" in result:
                os.close(result["fd"])
            raise AssertionError(f"no reader opened {self.path} within {timeout:.0f} s")
        self._fd = result["fd"]

    def write_rows(self, rows: list[Any]) -> None:
        assert self._fd is not None, "open() first"
        os.write(self._fd, b"".join(json.dumps(r).encode() + b"\n" for r in rows))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            return
        # Never opened by us: if a reader is blocked in open(), let it through with an empty pipe.
        with contextlib.suppress(OSError):
            os.close(os.open(self.path, os.O_WRONLY | os.O_NONBLOCK))


@contextlib.contextmanager
def running_server(home: Path) -> Iterator[Server]:
    server = Server(home).start()
    try:
        yield server
    finally:
        server.stop()


def launch_browser(playwright: Any) -> Any:
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
