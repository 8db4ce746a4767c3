"""The engine and sessions, and applying migrations."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import Session, create_engine

from app.settings import get_settings

if TYPE_CHECKING:
    from alembic.config import Config


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
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
    """Apply every Alembic migration to the configured database (idempotent)."""
    from alembic import command

    command.upgrade(alembic_config(url), "head")
