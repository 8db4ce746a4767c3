"""What jobs leave behind in SQL: the rows themselves, events, alerts, progress, metrics, outputs and
the datasets a job made. Status changes are not here: they go through app/store/state.py.

Functions commit unless called with ``commit=False`` (app/store/state.py writes a transition, its event,
its outputs and its datasets in one transaction).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.store.dataset_records import add_datasets, found_at
from app.store.models import (
    Alert,
    ChunkStatus,
    Dataset,
    Job,
    JobChunk,
    JobEvent,
    JobOutput,
    JobStatus,
    utcnow,
)
from draftdeck.quality import Output, Policy, Report

log = logging.getLogger(__name__)


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
    """Insert a queued job and its first event (raises IntegrityError when `retry_of` already has
    its retry: one retry per attempt)."""
    job = Job(kind=kind, params=params, queue=queue, attempt=attempt, retry_of=retry_of)
    session.add(job)
    session.flush()
    assert job.id is not None
    add_event(
        session,
        job.id,
        "info",
        f"queued on {queue}" + (f" (retry of job {retry_of})" if retry_of else ""),
        commit=False,
    )
    session.commit()
    session.refresh(job)
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
    commit: bool = True,
) -> None:
    session.add(
        JobEvent(job_id=job_id, level=level, message=message, code=code, count=count, examples=examples or [])
    )
    if commit:
        session.commit()


def raise_alert(
    session: Session,
    kind: str,
    message: str,
    *,
    job_id: int | None = None,
    dataset: str | None = None,
    endpoint_id: int | None = None,
    commit: bool = True,
) -> Alert:
    alert = Alert(kind=kind, message=message, job_id=job_id, dataset=dataset, endpoint_id=endpoint_id)
    session.add(alert)
    if commit:
        session.commit()
        session.refresh(alert)
    return alert


def acknowledge_alert(session: Session, alert_id: int) -> bool:
    result = session.execute(
        update(Alert).where(col(Alert.id) == alert_id).values(acknowledged=True, acknowledged_at=utcnow())
    )
    session.commit()
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def heartbeat(session: Session, job_id: int) -> None:
    session.execute(
        update(Job)
        .where(col(Job.id) == job_id, col(Job.status) == JobStatus.RUNNING)
        .values(heartbeat_at=utcnow())
    )
    session.commit()


def heartbeat_chunk(session: Session, job_id: int, index: int) -> None:
    session.execute(
        update(JobChunk)
        .where(
            col(JobChunk.job_id) == job_id,
            col(JobChunk.chunk_index) == index,
            col(JobChunk.status) == ChunkStatus.RUNNING,
        )
        .values(heartbeat_at=utcnow())
    )
    session.commit()


def record_progress(session: Session, job_id: int, done: int, total: int | None, unit: str) -> bool:
    """Store progress and refresh the heartbeat; return True when cancellation was requested."""
    session.execute(
        update(Job)
        .where(col(Job.id) == job_id, col(Job.status) == JobStatus.RUNNING)
        .values(progress_done=done, progress_total=total, progress_unit=unit, heartbeat_at=utcnow())
    )
    session.commit()
    cancel = session.execute(select(Job.cancel_requested).where(Job.id == job_id)).scalar_one_or_none()
    return bool(cancel)


def record_outputs(session: Session, job_id: int, outputs: list[Output], *, commit: bool = True) -> None:
    """Record each file output (of rows, or a model's file with none) once (a second record of the
    same path for the same job is ignored); dataset outputs become datasets through
    :func:`record_datasets`."""
    known = set(session.exec(select(JobOutput.path).where(JobOutput.job_id == job_id)).all())
    for out in outputs:
        if out.kind != "dataset" and out.path not in known:
            session.add(
                JobOutput(job_id=job_id, path=out.path, rows=out.rows, bytes=out.bytes, sha256=out.sha256)
            )
            known.add(out.path)
    if commit:
        session.commit()


def record_datasets(session: Session, job_id: int, outputs: list[Output]) -> list[Dataset]:
    """A Dataset row (and its alerts) for every dataset folder the job made; no commit: the success
    transition's. Each insert runs in a savepoint so that a concurrent registration of the same
    folder cannot undo the job's success."""
    made: list[Dataset] = []
    for out in outputs:
        if out.kind != "dataset":
            continue
        found = found_at(Path(out.path))
        try:
            with session.begin_nested():
                made.extend(add_datasets(session, [found], job_id=job_id))
        except IntegrityError:
            log.info("dataset %s was registered meanwhile", found.path)
            made.extend(session.exec(select(Dataset).where(Dataset.path == str(found.path))).all())
    return made


def record_report(
    session: Session, job_id: int, report: Report, policy: Policy, *, commit: bool = True
) -> None:
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
            commit=False,
        )
    record_outputs(session, job_id, report.outputs, commit=False)
    if commit:
        session.commit()


def datasets_of(session: Session, job_id: int) -> list[Dataset]:
    return list(session.exec(select(Dataset).where(Dataset.job_id == job_id).order_by(col(Dataset.id))).all())
