"""The sweeper: a periodic, bounded query for running jobs whose worker stopped beating; each one
found is failed through the state rules (app/state.py)."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from sqlalchemy import exists
from sqlmodel import Session, col, select

from app import state
from app.db import session_scope
from app.models import ChunkStatus, Job, JobChunk, JobStatus, utcnow
from app.settings import Settings

log = logging.getLogger(__name__)


def mark_lost_jobs(session: Session, lost_after_seconds: float, *, limit: int = 100) -> list[int]:
    """Fail running jobs whose heartbeat is older than `lost_after_seconds`: their worker vanished.

    A job split into chunk tasks beats only while one of its chunks runs; while some of its chunks
    still wait in the queue (``pending`` and enqueued, e.g. behind other jobs' work) it is waiting,
    not lost. A chunk recorded but never enqueued (the planning worker died) keeps nothing alive."""
    cutoff = utcnow() - timedelta(seconds=lost_after_seconds)
    waiting = exists().where(
        col(JobChunk.job_id) == Job.id,
        col(JobChunk.status) == ChunkStatus.PENDING,
        col(JobChunk.task_id).is_not(None),
    )
    stale = session.exec(
        select(Job.id)
        .where(Job.status == JobStatus.RUNNING, col(Job.heartbeat_at) < cutoff, ~waiting)
        .limit(limit)
    ).all()
    lost: list[int] = []
    for job_id in stale:
        assert job_id is not None
        if state.fail_lost(session, job_id, f"no heartbeat for {lost_after_seconds:.0f} s").accepted:
            lost.append(job_id)
    return lost


def start_sweeper(settings: Settings) -> threading.Event:
    """Start the sweeper thread; set the returned event to stop it."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(settings.sweep_seconds):
            try:
                with session_scope() as session:
                    mark_lost_jobs(session, settings.lost_after_seconds)
            except Exception:  # the database may be restarting; try again next round
                log.exception("sweeper round failed")

    threading.Thread(target=loop, name="draftdeck-sweeper", daemon=True).start()
    return stop
