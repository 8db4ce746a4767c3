"""Web and workers started together on a fresh database (as `docker compose up` starts them) all
migrate on start: under the migrations lock exactly one does the work, and every one succeeds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

STARTERS = 4
# Each process imports everything first, then waits for the same instant to call upgrade(): the
# race the lock must win is between upgrades, not between interpreter start-ups.
RACE = """
import sys, time
from app.store.db import upgrade
start = float(sys.argv[1])
time.sleep(max(0.0, start - time.time()))
upgrade()
"""


def _race(database_url: str, home: Path) -> list[subprocess.CompletedProcess[str]]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(PYTHONPATH=str(REPO_ROOT), DRAFTDECK_HOME=str(home), DATABASE_URL=database_url)
    start = time.time() + 8  # time for every interpreter to import alembic, sqlmodel, the models
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, str(start)],
            env=env,
            cwd=home,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(STARTERS)
    ]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def _head() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config(str(REPO_ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(REPO_ROOT / "migrations"))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head


def _versions(url: str) -> list[str]:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [row[0] for row in conn.execute(text("SELECT version_num FROM alembic_version"))]
    finally:
        engine.dispose()


@pytest.mark.services
@pytest.mark.slow
def test_concurrent_upgrades_of_a_fresh_postgresql_database_all_succeed(pg_url: str, tmp_path: Path) -> None:
    results = _race(pg_url, tmp_path)
    failures = [r.stderr[-2000:] for r in results if r.returncode != 0]
    assert not failures, "\n---\n".join(failures)
    assert _versions(pg_url) == [_head()]


@pytest.mark.slow
def test_concurrent_upgrades_of_a_fresh_sqlite_file_all_succeed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    results = _race(url, tmp_path)
    failures = [r.stderr[-2000:] for r in results if r.returncode != 0]
    assert not failures, "\n---\n".join(failures)
    assert _versions(url) == [_head()]
    assert (tmp_path / "fresh.db.migrations.lock").exists()


def test_a_held_lock_makes_the_next_upgrade_wait(tmp_path: Path) -> None:
    from app.store.db import migration_lock

    url = f"sqlite:///{tmp_path / 'x.db'}"
    # flock is per open file: a second open in this process contends like another process would
    with (
        migration_lock(url),
        pytest.raises(TimeoutError, match="another process is still migrating"),
        migration_lock(url, wait_seconds=0.3),
    ):
        pass
    with migration_lock(url, wait_seconds=0.3):  # released: free again
        pass
