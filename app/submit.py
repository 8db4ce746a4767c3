"""Submitting and retrying jobs: validate the kind and its parameters, confine paths, enqueue.

Shared by the JSON API, the HTML form and the CLI so that all three accept exactly the same jobs.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError
from sqlmodel import Session

from app import jobs
from app.models import Job, JobStatus
from app.settings import Settings
from draftdeck.errors import UsageError
from workers.kinds import get_kind

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
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'params'}: {e['msg']}" for e in exc.errors())
        raise UsageError(f"{kind_name}: invalid parameters: {problems}") from None
    params = params.confined(settings.roots)
    return kind.name, params.model_dump(mode="json"), kind.queue


def submit(session: Session, kind_name: str, raw_params: dict[str, Any], settings: Settings) -> Job:
    kind, params, queue = validate(kind_name, raw_params, settings)
    job = jobs.create_job(session, kind, params, queue)
    enqueue(session, job)
    return job


def retry(session: Session, job_id: int, settings: Settings) -> Job:
    """A new attempt of a failed or cancelled job, with the same parameters (re-validated)."""
    old = jobs.get_job(session, job_id)
    if old is None:
        raise LookupError(job_id)
    if old.status not in (JobStatus.FAILED, JobStatus.CANCELLED):
        raise jobs.JobStateError(
            f"job {job_id} is {old.status}; only failed or cancelled jobs can be retried"
        )
    kind, params, queue = validate(old.kind, old.params, settings)
    job = jobs.create_job(session, kind, params, queue, attempt=old.attempt + 1, retry_of=old.id)
    enqueue(session, job)
    return job


def enqueue(session: Session, job: Job) -> None:
    from workers.celery_app import RUN_JOB, get_celery

    assert job.id is not None
    try:
        result = get_celery().send_task(RUN_JOB, args=[job.id], queue=job.queue)
    except Exception as exc:  # the broker is down: say so on the job, never leave it queued forever
        log.exception("could not enqueue job %s", job.id)
        jobs.transition(session, job.id, JobStatus.FAILED, error=f"could not enqueue: {exc}")
        return
    job.task_id = result.id
    session.add(job)
    session.commit()
