"""Real services for integration tests: a fresh PostgreSQL database, Redis, and real Celery worker
processes. `stack` is parametrized over the two ways DraftDeck runs: embedded (SQLite + kombu's
filesystem broker) and services (PostgreSQL + Redis)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.queue import worker_argv
from tests.conftest import REPO_ROOT, SHARED

PG_ADMIN = os.environ.get("DRAFTDECK_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("DRAFTDECK_TEST_REDIS", "redis://127.0.0.1:6379")


def _require_services() -> None:
    import psycopg
    import redis

    try:
        psycopg.connect(PG_ADMIN, connect_timeout=3).close()
        redis.Redis.from_url(REDIS, socket_connect_timeout=3).ping()
    except Exception as exc:  # fail loudly: CI starts both (scripts/services.sh)
        pytest.fail(
            f"PostgreSQL ({PG_ADMIN}) and Redis ({REDIS}) must run: `make services` starts them ({exc})"
        )


@pytest.fixture
def pg_url() -> Iterator[str]:
    import psycopg

    _require_services()
    name = f"draftdeck_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN.rsplit("/", 1)[0]
    yield f"postgresql+psycopg://{base.split('://', 1)[1]}/{name}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_engine(pg_url: str) -> Iterator[Any]:
    """A migrated PostgreSQL database of the test's own."""
    from app.store.db import make_engine, upgrade

    upgrade(pg_url)
    made = make_engine(pg_url)
    yield made
    made.dispose()


@pytest.fixture
def redis_url() -> Iterator[str]:
    import redis

    _require_services()
    # One Redis database per test process keeps queues of parallel runs apart: each pytest-xdist
    # worker (gw0, gw1, ...) its own, a run without workers one by its process id
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    db = 8 + (int(worker[2:]) if worker.startswith("gw") else os.getpid()) % 8
    url = f"{REDIS}/{db}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()


def _dies_with_this_process(argv: list[str]) -> list[str]:
    """`argv` killed when this test process dies, where Linux's setpriv can ask it: a test process killed
    by a timeout left its Celery worker consuming the shared Redis database, and the next run's
    services tests lost their messages to it."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv] if setpriv and sys.platform == "linux" else argv


@dataclass
class Stack:
    """A DraftDeck deployment under test: its environment, data folder and worker processes."""

    mode: str
    home: Path
    env: dict[str, str]
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def data(self) -> Path:
        return self.home / "data"

    def start_worker(self, queues: str = "cpu,gpu") -> subprocess.Popen[bytes]:
        log = open(self.home / f"worker-{len(self.workers)}.log", "wb")  # noqa: SIM115 - kept for the process's life
        proc = subprocess.Popen(
            _dies_with_this_process(worker_argv(queues, 1, name=f"test-{uuid.uuid4().hex[:6]}")),
            cwd=REPO_ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.workers:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    def worker_logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-3000:] for p in sorted(self.home.glob("worker-*.log"))
        )


@pytest.fixture(params=["embedded", "services"])
def stack(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    from app.settings import get_settings
    from app.store.db import get_engine, upgrade

    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DRAFTDECK_TOKEN")}
    env.update(
        {
            "DRAFTDECK_HOME": str(home),
            "DRAFTDECK_DATA_ROOTS": ":".join([str(home)] + ([str(SHARED)] if SHARED.exists() else [])),
            "DRAFTDECK_HEARTBEAT_SECONDS": "2",
            "DRAFTDECK_LOST_AFTER_SECONDS": "12",
            "DRAFTDECK_SWEEP_SECONDS": "2",
            "PYTHONPATH": str(REPO_ROOT),
        }
    )
    if request.param == "services":
        env["DATABASE_URL"] = request.getfixturevalue("pg_url")
        env["REDIS_URL"] = request.getfixturevalue("redis_url")
    for key in ("DATABASE_URL", "REDIS_URL"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        if key.startswith(("DRAFTDECK_", "DATABASE_URL", "REDIS_URL")):
            monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    get_engine.cache_clear()
    from app.queue import get_celery

    get_celery.cache_clear()
    upgrade()
    s = Stack(request.param, home, env)
    yield s
    s.stop()
    get_engine().dispose()
    get_settings.cache_clear()
    get_engine.cache_clear()
    get_celery.cache_clear()


def wait_for(predicate, timeout: float, what: str, stack: Stack | None = None, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    logs = stack.worker_logs() if stack else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n--- worker logs ---\n{logs}")
