"""The engine and sessions, and applying migrations."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import event, make_url, pool, text
from sqlalchemy.engine import Engine
from sqlmodel import Session, create_engine

from app.settings import get_settings

if TYPE_CHECKING:
    from alembic.config import Config
# PostgreSQL advisory locks are named by a 64-bit number; this one is DraftDeck's migrations.
MIGRATION_LOCK_KEY = 0x44524146_54444B31  # "DRAFTDK1"
MIGRATION_WAIT_SECONDS = 600.0
log = logging.getLogger(__name__)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            # WAL lets the web process read while a worker writes; the busy timeout rides out
            # short write locks instead of failing.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


@lru_cache
def get_engine() -> Engine:
    settings = get_settings()
    settings.ensure_dirs()
    return make_engine(settings.db_url)


@contextmanager
def session_scope() -> Iterator[Session]:
    with Session(get_engine(), expire_on_commit=False) as session:
        yield session


def alembic_config(url: str | None = None) -> Config:
    """Alembic's configuration for `url` (default: the configured database), with the migrations found
    through the package. No alembic.ini: it sets only the `alembic` command's logging in a checkout."""
    from alembic.config import Config

    from app.resources import resource_dir

    cfg = Config()
    cfg.set_main_option("script_location", str(resource_dir("migrations")))
    cfg.set_main_option("sqlalchemy.url", (url or get_settings().db_url).replace("%", "%%"))
    return cfg


def upgrade(url: str | None = None) -> None:
    """Apply every Alembic migration to the configured database (idempotent). Web, workers and
    `draftdeck db upgrade` all call this on start, so it runs under a database-wide lock: the first
    process migrates, the others wait, then find nothing left to do."""
    from alembic import command

    url = url or get_settings().db_url
    with migration_lock(url):
        command.upgrade(alembic_config(url), "head")


@contextmanager
def migration_lock(url: str, wait_seconds: float = MIGRATION_WAIT_SECONDS) -> Iterator[None]:
    """Hold the migrations lock of the database at `url`: a PostgreSQL session advisory lock, or,
    for a SQLite file, an exclusive flock on `<file>.migrations.lock` beside it (an in-memory
    database has no other process to wait for). Raises TimeoutError after `wait_seconds`."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql":
        with _pg_advisory_lock(url, wait_seconds):
            yield
    elif parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        database = Path(str(parsed.database))
        with _file_lock(database.with_name(database.name + ".migrations.lock"), wait_seconds):
            yield
    else:
        yield


def _waited_too_long(what: str, wait_seconds: float) -> TimeoutError:
    return TimeoutError(
        f"waited {wait_seconds:.0f} s for {what}: another process is still migrating (or hung doing so)"
    )


@contextmanager
def _pg_advisory_lock(url: str, wait_seconds: float) -> Iterator[None]:
    # Its own connection, held for the whole upgrade: the lock lives as long as this session does,
    # and NullPool makes closing it a real disconnect, which releases the lock even on a crash path.
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            deadline = time.monotonic() + wait_seconds
            said = False
            while not conn.execute(
                text("SELECT pg_try_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
            ).scalar():
                conn.rollback()  # no transaction stays open while we wait
                if time.monotonic() > deadline:
                    raise _waited_too_long("the PostgreSQL migrations lock", wait_seconds)
                if not said:
                    log.info("another process is migrating the database; waiting for it")
                    said = True
                time.sleep(0.2)
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
                conn.commit()
    finally:
        engine.dispose()


@contextmanager
def _file_lock(path: Path, wait_seconds: float) -> Iterator[None]:
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise _waited_too_long(f"the migrations lock {path}", wait_seconds) from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
