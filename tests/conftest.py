"""Shared fixtures. Every test runs with its own DraftDeck home (SQLite + file broker) unless it asks
for the services (Redis + PostgreSQL) through the fixtures in tests/integration/."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "tests" / "fixtures"  # the project's own files: formats, quality cases, vendors
# scripts some tests run in another interpreter (z-lab's dflash venv): a folder of their own, so that
# running one puts no helper module (tests/support/tokenize.py, ...) ahead of the standard library
PROBES = REPO_ROOT / "tests" / "probes"
SHARED = REPO_ROOT.parent / "shared"
REAL_DATA = SHARED / "datasets" / "real"


# Starlette's test client names its server "testserver": a name the web app answers to only when told
# (app/web/auth.py refuses other hosts, DNS rebinding); servers started by tests are reached on 127.0.0.1
os.environ["DRAFTDECK_ALLOWED_HOSTS"] = "testserver"

# Every real-data skip says this, so the run's summary can count them (pytest_terminal_summary).
NO_SHARED = "../shared/datasets/real/ is not beside this checkout"


def real_file(name: str) -> Path:
    """A file from ../shared/datasets/real/, or skip the test saying why."""
    path = REAL_DATA / name
    if not path.exists():
        pytest.skip(f"{path} is absent: {NO_SHARED}")
    return path


@pytest.fixture
def dd_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh DraftDeck home with embedded defaults; data roots = the home and ../shared."""
    from app.settings import get_settings
    from app.store.db import get_engine

    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    monkeypatch.setenv("DRAFTDECK_HOME", str(home))
    roots = [str(home)] + ([str(SHARED)] if SHARED.exists() else [])
    monkeypatch.setenv("DRAFTDECK_DATA_ROOTS", ":".join(roots))
    for var in ("DATABASE_URL", "REDIS_URL", "DRAFTDECK_TOKEN", "DRAFTDECK_HOST"):
        monkeypatch.delenv(var, raising=False)
    from app.queue import get_celery

    get_settings.cache_clear()
    get_engine.cache_clear()
    get_celery.cache_clear()
    yield home
    get_engine().dispose()
    get_settings.cache_clear()
    get_engine.cache_clear()
    get_celery.cache_clear()


@pytest.fixture
def migrated(dd_home: Path) -> Path:
    from app.store.db import upgrade

    upgrade()
    return dd_home


def pytest_report_header(config: pytest.Config) -> str:
    return f"shared data: {'present' if REAL_DATA.exists() else 'absent'} ({REAL_DATA}); cwd={os.getcwd()}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say once how many tests skipped for want of ../shared (the project's own fixtures cover the
    same behaviour), so that a green run without it is not mistaken for one with it."""
    skipped = terminalreporter.stats.get("skipped", [])
    n = sum(1 for r in skipped if NO_SHARED in str(getattr(r, "longrepr", "")))
    if n:
        terminalreporter.write_line(
            f"{n} tests skipped: {NO_SHARED} (the project's own fixtures cover the same behaviour)"
        )
