"""Running one job: claim it, call the core, record the outcome. Celery-free, so tests and the CLI
can call it directly; workers/tasks.py wraps it in a task."""

from __future__ import annotations

import logging
import os
import socket
import traceback

from app import jobs
from app.db import session_scope
from app.models import JobStatus, utcnow
from app.settings import get_settings
from draftdeck.errors import Cancelled, DraftDeckError, JobFailed
from draftdeck.quality import Policy, Report
from workers.context import Handoff, Heartbeat, JobContext
from workers.kinds import get_kind

log = logging.getLogger(__name__)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def run_job(job_id: int, *, task_id: str | None = None) -> str:
    """Run job `job_id` if it is still queued; return the status it ended in (or why it was skipped)."""
    settings = get_settings()
    with session_scope() as session:
        job = jobs.get_job(session, job_id)
        if job is None:
            log.error("job %s: no such job; message dropped", job_id)
            return "missing"
        if not jobs.transition(session, job_id, JobStatus.RUNNING, worker=worker_name(), task_id=task_id):
            job = jobs.get_job(session, job_id)
            assert job is not None
            # A message for a job that is already running means its first worker died and the broker
            # redelivered it, or a second copy arrived while the first still runs. The heartbeat tells which.
            if job.status == JobStatus.RUNNING and job.heartbeat_at is not None:
                age = (utcnow() - job.heartbeat_at).total_seconds()
                if age > settings.lost_after_seconds:
                    jobs.fail_lost(session, job_id, f"redelivered after {age:.0f} s without heartbeat")
            log.info("job %s is %s; not running it again", job_id, job.status)
            return f"skipped:{job.status}"
        kind = get_kind(job.kind)
        jobs.add_event(session, job_id, "info", f"started on {worker_name()}")

    ctx = JobContext(job_id, settings.jobs_dir / str(job_id))
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    params = kind.params.model_validate(job.params)
    policy = params.policy()
    with Heartbeat(job_id, settings.heartbeat_seconds):
        try:
            report = kind.run(params, ctx)
        except Handoff as handoff:
            log.info("job %s continues in other tasks: %s", job_id, handoff)
            return "handed-off"
        except Cancelled:
            with session_scope() as session:
                jobs.transition(session, job_id, JobStatus.CANCELLED, error="cancelled while running")
                jobs.add_event(session, job_id, "info", "cancelled while running")
            return JobStatus.CANCELLED
        except JobFailed as exc:
            _fail(job_id, str(exc), exc.report if isinstance(exc.report, Report) else None, policy)
            return JobStatus.FAILED
        except DraftDeckError as exc:
            _fail(job_id, str(exc), None, policy)
            return JobStatus.FAILED
        except Exception as exc:
            log.exception("job %s crashed", job_id)
            _fail(
                job_id,
                f"internal error: {type(exc).__name__}: {exc}",
                None,
                policy,
                detail=traceback.format_exc(limit=8),
            )
            return JobStatus.FAILED

    return record_success(job_id, report, policy)


def record_success(job_id: int, report: Report, policy: Policy) -> str:
    """Record the report and outputs of a job that ran to its end and move it to `succeeded`."""
    with session_scope() as session:
        jobs.record_report(session, job_id, report, policy)
        ok = jobs.transition(
            session,
            job_id,
            JobStatus.SUCCEEDED,
            result=report.to_dict(),
            progress_done=report.rows_in,
            progress_total=report.rows_in,
            progress_unit="rows",
        )
        if ok:
            jobs.add_event(
                session,
                job_id,
                "info",
                f"succeeded: {report.rows_in:,} rows in, {report.rows_out:,} out, "
                f"{report.rows_rejected:,} rejected",
            )
            return JobStatus.SUCCEEDED
        jobs.add_event(session, job_id, "warning", "finished, but the job had already left 'running'")
        return "lost-race"


def _fail(
    job_id: int, message: str, report: Report | None, policy: object, *, detail: str | None = None
) -> None:
    with session_scope() as session:
        if report is not None:
            jobs.record_report(session, job_id, report, policy)  # type: ignore[arg-type]
        jobs.transition(
            session,
            job_id,
            JobStatus.FAILED,
            error=message[:2000],
            result=report.to_dict() if report is not None else None,
        )
        jobs.add_event(session, job_id, "error", message if not detail else f"{message}\n{detail}")
        if report is not None and report.rows_out == 0:
            jobs.raise_alert(session, "empty_output", f"job {job_id}: {message}", job_id=job_id)
