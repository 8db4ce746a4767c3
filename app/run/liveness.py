"""Worker liveness, kept in SQL: each worker process beats its row in `workers` with the queues it
serves; a worker whose beat is older than the lost-worker limit is gone. The sweeper asks before
running a lost chunk again, and the job page says when no live worker serves a job's queue.

:func:`of_job` is THE rule for "does anyone run this job", used by Cancel (a running job nobody
runs is cancelled at once: nobody would read its flag), the job page's "no live worker" notice, and
the sweeper (a running job nobody runs and nobody will run is lost)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, exists, update
from sqlmodel import Session, col, select

from app.store.db import session_scope
from app.store.models import ChunkStatus, Job, JobChunk, JobStatus, Worker, utcnow

log = logging.getLogger(__name__)

FORGET_AFTER_SECONDS = 24 * 3600


def beat(session: Session, name: str, queues: list[str]) -> None:
    now = utcnow()
    result = session.execute(
        update(Worker).where(col(Worker.name) == name).values(heartbeat_at=now, queues=",".join(queues))
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        session.add(Worker(name=name, queues=",".join(queues), started_at=now, heartbeat_at=now))
    session.commit()


def forget(session: Session, name: str) -> None:
    session.execute(delete(Worker).where(col(Worker.name) == name))
    session.commit()


def prune(session: Session, older_than_seconds: float = FORGET_AFTER_SECONDS) -> int:
    """Forget workers silent for a day (killed without their shutdown); return how many."""
    cutoff = utcnow() - timedelta(seconds=older_than_seconds)
    result = session.execute(delete(Worker).where(col(Worker.heartbeat_at) < cutoff))
    session.commit()
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def live_workers(session: Session, lost_after_seconds: float) -> list[Worker]:
    cutoff = utcnow() - timedelta(seconds=lost_after_seconds)
    return list(session.exec(select(Worker).where(col(Worker.heartbeat_at) >= cutoff)).all())


def serves(session: Session, queue: str, lost_after_seconds: float) -> bool:
    """Whether a live worker consumes `queue`."""
    return any(queue in w.queues.split(",") for w in live_workers(session, lost_after_seconds))


@dataclass(frozen=True)
class JobLiveness:
    beating: bool  # a process beats for the job now (its own beat, or a running chunk's): it reads the flag
    served: bool  # a live worker consumes the job's queue: queued work of it will be picked up
    waiting: bool  # chunks of it wait in the queue (pending, their message sent)
    reason: str  # the state in words, for the job page, a cancel and a "worker lost" failure

    @property
    def stranded(self) -> bool:
        """Nobody runs it and nobody will: no beat, and no queued work that a live worker will take."""
        return not self.beating and not (self.served and self.waiting)


def of_job(session: Session, job: Job, lost_after_seconds: float) -> JobLiveness:
    """Who runs job `job` (queued or running), by the job's and its chunks' beats and the workers
    table; see the module's docstring for who asks."""
    now = utcnow()
    cutoff = now - timedelta(seconds=lost_after_seconds)
    served = serves(session, job.queue, lost_after_seconds)
    queue_words = (
        f"a live worker serves queue {job.queue}" if served else f"no live worker serves queue {job.queue}"
    )
    if job.status == JobStatus.QUEUED:
        return JobLiveness(False, served, served, queue_words)
    own = job.heartbeat_at is not None and job.heartbeat_at >= cutoff
    chunk_beats, waiting = _chunk_facts(session, job, cutoff)
    beating = own or chunk_beats
    if job.heartbeat_at is None:
        beat = "no heartbeat"
    else:
        beat = f"heartbeat {(now - job.heartbeat_at).total_seconds():.0f} s old"
    if beating:
        reason = f"it runs ({'a chunk beats' if chunk_beats and not own else beat}); {queue_words}"
    elif waiting:
        reason = f"its chunks wait in the queue and {queue_words} ({beat})"
    elif served:
        reason = f"{queue_words}, but none runs this job ({beat})"
    else:
        reason = f"{queue_words} ({beat})"
    return JobLiveness(beating, served, waiting, reason)


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


def _chunk_facts(session: Session, job: Job, cutoff: datetime) -> tuple[bool, bool]:
    """(a running chunk of `job` beats since `cutoff`, a pending chunk of it was sent), read in ONE
    statement: one snapshot even under PostgreSQL's read committed. Two queries let a worker's claim
    land between them (pending → running: the first saw no running chunk, the second no pending one)
    and the sweeper failed a job whose chunk had just started. Waiting counts sent_at, not task_id: a
    chunk run again is marked sent in the same update that makes it pending, while its new task id is
    written just after the send."""

    def chunk(*where: Any) -> Any:
        return exists().where(col(JobChunk.job_id) == job.id, *where)

    beats = chunk(col(JobChunk.status) == ChunkStatus.RUNNING, col(JobChunk.heartbeat_at) >= cutoff)
    sent = chunk(col(JobChunk.status) == ChunkStatus.PENDING, col(JobChunk.sent_at).is_not(None))
    got = session.execute(select(beats, sent)).one()
    return bool(got[0]), bool(got[1])
