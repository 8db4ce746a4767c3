"""Worker liveness, kept in SQL: each worker process beats its row in `workers` with the queues it
serves; a worker whose beat is older than the lost-worker limit is gone. The sweeper asks before
running a lost chunk again, and the job page says when no live worker serves a job's queue."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from sqlalchemy import delete, update
from sqlmodel import Session, col, select

from app.db import session_scope
from app.models import Worker, utcnow

log = logging.getLogger(__name__)

FORGET_AFTER_SECONDS = 24 * 3600


def beat(session: Session, name: str, queues: list[str]) -> None:
    now = utcnow()
    result = session.execute(  # type: ignore[call-overload]
        update(Worker).where(col(Worker.name) == name).values(heartbeat_at=now, queues=",".join(queues))
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        session.add(Worker(name=name, queues=",".join(queues), started_at=now, heartbeat_at=now))
    session.commit()


def forget(session: Session, name: str) -> None:
    session.execute(delete(Worker).where(col(Worker.name) == name))  # type: ignore[call-overload]
    session.commit()


def prune(session: Session, older_than_seconds: float = FORGET_AFTER_SECONDS) -> int:
    """Forget workers silent for a day (killed without their shutdown); return how many."""
    cutoff = utcnow() - timedelta(seconds=older_than_seconds)
    result = session.execute(delete(Worker).where(col(Worker.heartbeat_at) < cutoff))  # type: ignore[call-overload]
    session.commit()
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def live_workers(session: Session, lost_after_seconds: float) -> list[Worker]:
    cutoff = utcnow() - timedelta(seconds=lost_after_seconds)
    return list(session.exec(select(Worker).where(col(Worker.heartbeat_at) >= cutoff)).all())


def serves(session: Session, queue: str, lost_after_seconds: float) -> bool:
    """Whether a live worker consumes `queue`."""
    return any(queue in w.queues.split(",") for w in live_workers(session, lost_after_seconds))


def start_beat(name: str, queues: list[str], every: float) -> threading.Event:
    """Beat worker `name` from a thread until the returned event is set (then forget it)."""
    stop = threading.Event()

    def loop() -> None:
        while True:
            try:
                with session_scope() as session:
                    beat(session, name, queues)
            except Exception:  # the database may be restarting; beat again next tick
                log.exception("worker heartbeat failed")
            if stop.wait(every):
                break
        try:
            with session_scope() as session:
                forget(session, name)
        except Exception:
            log.warning("could not remove worker %s from the workers table", name)

    threading.Thread(target=loop, name="draftdeck-worker-beat", daemon=True).start()
    return stop
