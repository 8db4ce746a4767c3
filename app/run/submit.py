"""What users ask of jobs: submit, retry, cancel. Validates the kind and its parameters, confines
paths to the data roots, enqueues by task name (app/queue.py) and changes status only through the
state rules (app/store/state.py).

Shared by the JSON API and the HTML form, so that both accept exactly the same jobs.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError
from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app import queue
from app.run import chunks, liveness
from app.settings import Settings
from app.store import records, state
from app.store.models import Job, JobStatus, utcnow
from app.store.state import JobStateError
from draftdeck.errors import UsageError
from draftdeck.jobs.params import describe_errors, field_errors
from draftdeck.kinds import get_kind

log = logging.getLogger(__name__)


def validate(
    kind_name: str, raw_params: dict[str, Any], settings: Settings
) -> tuple[str, dict[str, Any], str]:
    """Return (kind, confined params, queue) or raise UsageError saying what is wrong."""
    try:
        kind = get_kind(kind_name)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    try:
        params = kind.params.model_validate(raw_params)
    except ValidationError as exc:
        problems = describe_errors(kind.params, exc)
        fields = field_errors(kind.params, exc)
        raise UsageError(f"{kind_name}: invalid parameters: {problems}", fields) from None
    params = params.confined(settings.roots)
    params.check(settings.roots)
    return kind.name, params.model_dump(mode="json"), kind.queue_for(params)


def submit(session: Session, kind_name: str, raw_params: dict[str, Any], settings: Settings) -> Job:
    kind, params, queue_name = validate(kind_name, raw_params, settings)
    job = records.create_job(session, kind, params, queue_name)
    enqueue(session, job)
    return job


def retry(session: Session, job_id: int, settings: Settings) -> Job:
    """A new attempt of a failed or cancelled job, with the same parameters (re-validated). One
    retry per attempt: retrying the same job again is refused (retry the new attempt instead)."""
    old = records.get_job(session, job_id)
    if old is None:
        raise LookupError(job_id)
    if old.status not in (JobStatus.FAILED, JobStatus.CANCELLED):
        raise JobStateError(f"job {job_id} is {old.status}; only failed or cancelled jobs can be retried")
    if old.external_key is not None:  # its data and target are where it ran, not here
        raise JobStateError(
            f"job {job_id} ran outside the job system ({old.worker}): relaunch it there with the same --out"
            " and --report-to; it resumes from its last checkpoint as the next attempt of this job"
        )
    again = session.exec(select(Job.id).where(Job.retry_of == job_id)).first()
    if again is not None:
        raise JobStateError(f"job {job_id} was already retried as job {again}; retry that one")
    raw = dict(old.params)
    if get_kind(old.kind).params.resumes_in_out and not raw.get("out"):
        # A run that resumes from its output folder (train: the last checkpoint) continues where the
        # failed attempt wrote, not in the new attempt's empty folder.
        raw["out"] = str(settings.jobs_dir / str(old.id))
    kind, params, queue_name = validate(old.kind, raw, settings)
    try:
        job = records.create_job(session, kind, params, queue_name, attempt=old.attempt + 1, retry_of=old.id)
    except IntegrityError:  # a concurrent retry of the same attempt won
        session.rollback()
        raise JobStateError(f"job {job_id} was already retried") from None
    enqueue(session, job)
    return job


def enqueue(session: Session, job: Job) -> None:
    assert job.id is not None
    try:
        task_id = queue.send(queue.RUN_JOB, [job.id], job.queue)
    except Exception as exc:  # the broker is down: say so on the job, never leave it queued forever
        log.exception("could not enqueue job %s", job.id)
        state.propose(session, job.id, JobStatus.FAILED, f"could not enqueue: {exc}")
        return
    session.execute(update(Job).where(col(Job.id) == job.id).values(task_id=task_id, sent_at=utcnow()))
    session.commit()
    job.task_id = task_id


def request_cancel(session: Session, job_id: int, settings: Settings) -> Job:
    """Cancel a queued job at once; ask a running one to stop, and cancel it at once when nothing
    beats for it (app/run/liveness.py's rule: a worker may be alive, but if neither the job nor a chunk
    of it beats, nobody would read the flag; waiting chunks are skipped)."""
    job = records.get_job(session, job_id)
    if job is None:
        raise LookupError(job_id)
    if job.status == JobStatus.QUEUED:
        if state.propose(session, job_id, JobStatus.CANCELLED, "cancelled before it started").accepted:
            return _reloaded(session, job_id)
        job = _reloaded(session, job_id)  # it started meanwhile
    if job.status != JobStatus.RUNNING:
        raise JobStateError(f"job {job_id} is {job.status}; only queued or running jobs can be cancelled")
    session.execute(update(Job).where(col(Job.id) == job_id).values(cancel_requested=True))
    records.add_event(session, job_id, "info", "cancellation requested")
    live = liveness.of_job(session, job, settings.lost_after_seconds)
    if not live.beating:
        reason = f"cancelled at once: nothing runs it ({live.reason})"
        if state.propose(session, job_id, JobStatus.CANCELLED, reason).accepted:
            chunks.cleanup(session, job_id)
    return _reloaded(session, job_id)


def _reloaded(session: Session, job_id: int) -> Job:
    job = records.get_job(session, job_id)
    assert job is not None
    return job
