"""Job state: the one place that moves jobs between statuses and records what they did.

Every change of status goes through :func:`transition`, an atomic compare-and-set in SQL, so the
web process, the workers and the sweeper can race without corrupting a job: whoever loses the race
sees `False` and backs off.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from sqlalchemy import exists, update
from sqlmodel import Session, col, select

from app.models import TERMINAL, Alert, Job, JobChunk, JobEvent, JobOutput, JobStatus, Metric, utcnow
from draftdeck.quality import Output, Policy, Report

log = logging.getLogger(__name__)

# to-status -> the statuses a job may be in to move there.
ALLOWED_FROM: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.RUNNING: frozenset({JobStatus.QUEUED}),
    JobStatus.SUCCEEDED: frozenset({JobStatus.RUNNING}),
    JobStatus.FAILED: frozenset({JobStatus.QUEUED, JobStatus.RUNNING}),
    JobStatus.CANCELLED: frozenset({JobStatus.QUEUED, JobStatus.RUNNING}),
}


class JobStateError(Exception):
    """A request that the job's current status does not allow (HTTP 409)."""


def transition(session: Session, job_id: int, to: JobStatus, **fields: Any) -> bool:
    """Move job `job_id` to `to` if its current status allows it; set `fields` with it. Commits."""
    now = utcnow()
    values: dict[str, Any] = {"status": to, **fields}
    if to is JobStatus.RUNNING:
        values.setdefault("started_at", now)
        values.setdefault("heartbeat_at", now)
    if to in TERMINAL:
        values.setdefault("finished_at", now)
    stmt = (
        update(Job)
        .where(col(Job.id) == job_id, col(Job.status).in_([s.value for s in ALLOWED_FROM[to]]))
        .values(**values)
    )
    result = session.execute(stmt)  # type: ignore[call-overload]
    session.commit()
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def get_job(session: Session, job_id: int) -> Job | None:
    job = session.get(Job, job_id)
    if job is not None:
        session.refresh(job)
    return job


def create_job(
    session: Session,
    kind: str,
    params: dict[str, Any],
    queue: str,
    *,
    attempt: int = 1,
    retry_of: int | None = None,
) -> Job:
    job = Job(kind=kind, params=params, queue=queue, attempt=attempt, retry_of=retry_of)
    session.add(job)
    session.commit()
    session.refresh(job)
    add_event(
        session,
        job.id or 0,
        "info",
        f"queued on {queue}" + (f" (retry of job {retry_of})" if retry_of else ""),
    )
    return job


def add_event(
    session: Session,
    job_id: int,
    level: str,
    message: str,
    *,
    code: str | None = None,
    count: int = 1,
    examples: list[dict[str, Any]] | None = None,
) -> None:
    session.add(
        JobEvent(job_id=job_id, level=level, message=message, code=code, count=count, examples=examples or [])
    )
    session.commit()


def raise_alert(
    session: Session, kind: str, message: str, *, job_id: int | None = None, dataset: str | None = None
) -> Alert:
    alert = Alert(kind=kind, message=message, job_id=job_id, dataset=dataset)
    session.add(alert)
    session.commit()
    session.refresh(alert)
    return alert


def acknowledge_alert(session: Session, alert_id: int) -> bool:
    result = session.execute(  # type: ignore[call-overload]
        update(Alert).where(col(Alert.id) == alert_id).values(acknowledged=True, acknowledged_at=utcnow())
    )
    session.commit()
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def heartbeat(session: Session, job_id: int) -> None:
    session.execute(  # type: ignore[call-overload]
        update(Job)
        .where(col(Job.id) == job_id, col(Job.status) == JobStatus.RUNNING)
        .values(heartbeat_at=utcnow())
    )
    session.commit()


def record_progress(session: Session, job_id: int, done: int, total: int | None, unit: str) -> bool:
    """Store progress and refresh the heartbeat; return True when cancellation was requested."""
    session.execute(  # type: ignore[call-overload]
        update(Job)
        .where(col(Job.id) == job_id, col(Job.status) == JobStatus.RUNNING)
        .values(progress_done=done, progress_total=total, progress_unit=unit, heartbeat_at=utcnow())
    )
    session.commit()
    cancel = session.execute(select(Job.cancel_requested).where(Job.id == job_id)).scalar_one_or_none()
    return bool(cancel)


def record_metric(session: Session, job_id: int, step: int, name: str, value: float) -> None:
    session.add(Metric(job_id=job_id, step=step, name=name, value=value))
    session.commit()


def record_outputs(session: Session, job_id: int, outputs: list[Output]) -> None:
    """Record each output once: a second record of the same path for the same job is ignored."""
    known = set(session.exec(select(JobOutput.path).where(JobOutput.job_id == job_id)).all())
    for out in outputs:
        if out.path not in known:
            session.add(
                JobOutput(job_id=job_id, path=out.path, rows=out.rows, bytes=out.bytes, sha256=out.sha256)
            )
            known.add(out.path)
    session.commit()


def record_report(session: Session, job_id: int, report: Report, policy: Policy) -> None:
    """One event per issue code, with its count, severity and examples; then the outputs."""
    for name, n in sorted((report.rejected + report.warnings).items()):
        examples = [e.to_dict() for e in report.examples.get(name, [])]
        add_event(
            session,
            job_id,
            policy.severity(name),
            f"{n:,} {'row' if n == 1 else 'rows'}: {name}",
            code=name,
            count=n,
            examples=examples,
        )
    record_outputs(session, job_id, report.outputs)


def request_cancel(session: Session, job_id: int) -> Job:
    job = get_job(session, job_id)
    if job is None:
        raise LookupError(job_id)
    if job.status == JobStatus.QUEUED and transition(session, job_id, JobStatus.CANCELLED, error="cancelled"):
        add_event(session, job_id, "info", "cancelled before it started")
    elif job.status == JobStatus.RUNNING:
        session.execute(update(Job).where(col(Job.id) == job_id).values(cancel_requested=True))  # type: ignore[call-overload]
        session.commit()
        add_event(session, job_id, "info", "cancellation requested")
    else:
        raise JobStateError(f"job {job_id} is {job.status}; only queued or running jobs can be cancelled")
    return get_job(session, job_id)  # type: ignore[return-value]


def mark_lost_jobs(session: Session, lost_after_seconds: float, *, limit: int = 100) -> list[int]:
    """Fail running jobs whose heartbeat is older than `lost_after_seconds`: their worker vanished.

    A job split into chunk tasks beats only while one of its chunks runs; while some of its chunks
    still wait in the queue (``pending`` and enqueued, e.g. behind other jobs' work) it is waiting,
    not lost. A chunk recorded but never enqueued (the planning worker died) keeps nothing alive."""
    cutoff = utcnow() - timedelta(seconds=lost_after_seconds)
    waiting = exists().where(
        col(JobChunk.job_id) == Job.id, col(JobChunk.status) == "pending", col(JobChunk.task_id).is_not(None)
    )
    stale = session.exec(
        select(Job.id)
        .where(Job.status == JobStatus.RUNNING, col(Job.heartbeat_at) < cutoff, ~waiting)
        .limit(limit)
    ).all()
    lost: list[int] = []
    for job_id in stale:
        assert job_id is not None
        if fail_lost(session, job_id, f"no heartbeat for {lost_after_seconds:.0f} s"):
            lost.append(job_id)
    return lost


def fail_lost(session: Session, job_id: int, detail: str) -> bool:
    reason = f"worker lost: {detail}"
    if not transition(session, job_id, JobStatus.FAILED, error=reason):
        return False
    add_event(session, job_id, "error", reason, code="worker_lost")
    raise_alert(
        session, "worker_lost", f"job {job_id}: {reason}; retry it to run a new attempt", job_id=job_id
    )
    log.warning("job %s: %s", job_id, reason)
    return True
