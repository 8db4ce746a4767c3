"""`SqlRunContext`: the RunContext (draftdeck/jobs/context.py) of a job run by a worker, over SQL.

Progress is written at most every PROGRESS_EVERY_SECONDS and reads the job's cancel flag with it;
events, metric points and alerts go to their tables at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sqlmodel import select

from app.settings import get_settings
from app.store import metrics, records
from app.store.db import session_scope
from app.store.models import Job
from draftdeck.errors import Cancelled

PROGRESS_EVERY_SECONDS = 0.5


class Handoff(Exception):
    """Raised by a run when the job continues in other tasks (chunk tasks): the runner leaves the
    job `running` and records nothing; the task that finishes the job records it."""


def data_roots() -> tuple[str, ...]:
    """The service's data roots, as a job's `file_roots`."""
    return tuple(str(r) for r in get_settings().roots)


@dataclass
class SqlRunContext:
    job_id: int
    out_dir: Path
    # What a job may read that its data names (images): only the data roots, as for every path a user
    # gives the service (draftdeck.jobs.context.file_roots)
    file_roots: tuple[str, ...] = field(default_factory=data_roots)
    _last_write: float = field(default=0.0, repr=False)

    def progress(self, done: int, total: int | None = None, unit: str = "rows") -> None:
        now = time.monotonic()
        if now - self._last_write < PROGRESS_EVERY_SECONDS and (total is None or done < total):
            return
        self._last_write = now
        with session_scope() as session:
            if records.record_progress(session, self.job_id, done, total, unit):
                raise Cancelled(f"job {self.job_id} was cancelled")

    def check_cancelled(self) -> None:
        with session_scope() as session:
            flag = session.execute(
                select(Job.cancel_requested).where(Job.id == self.job_id)
            ).scalar_one_or_none()
        if flag:
            raise Cancelled(f"job {self.job_id} was cancelled")

    def event(self, level: str, message: str, *, code: str | None = None, count: int = 1) -> None:
        with session_scope() as session:
            records.add_event(session, self.job_id, level, message, code=code, count=count)

    def metrics(self, step: int, values: Mapping[str, float], *, tokens: int | None = None) -> None:
        with session_scope() as session:
            metrics.record_metrics(session, self.job_id, step, values, tokens)

    def alert(self, kind: str, message: str) -> None:
        with session_scope() as session:
            records.raise_alert(session, kind, message, job_id=self.job_id)


class Heartbeat:
    """Refreshes the job's heartbeat from a thread while the job runs, so the sweeper can tell a slow
    job from a dead worker; with `chunk`, the chunk's beat too (another worker may keep the job's
    beat fresh while this one is dead)."""

    def __init__(self, job_id: int, every: float, chunk: int | None = None):
        self._job_id = job_id
        self._chunk = chunk
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{job_id}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                with session_scope() as session:
                    records.heartbeat(session, self._job_id)
                    if self._chunk is not None:
                        records.heartbeat_chunk(session, self._job_id, self._chunk)
            except Exception:  # a missed beat is retried on the next tick
                continue

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self._every + 1)
