"""Running one job: claim it, call its kind's run, record the outcome. Celery-free: workers/tasks.py
wraps it in a task, and tests call it directly."""

from __future__ import annotations

import logging
import traceback

from app.run import chunks, liveness, sweeper
from app.run.context import Handoff, Heartbeat, SqlRunContext
from app.run.outcomes import record_failure, record_success, worker_name
from app.settings import get_settings
from app.store import records, state
from app.store.db import session_scope
from app.store.models import JobStatus, utcnow
from draftdeck.errors import Cancelled, DraftDeckError, JobFailed, crash_message
from draftdeck.kinds import get_kind
from draftdeck.quality import Report

log = logging.getLogger(__name__)


def run_job(job_id: int, *, task_id: str | None = None, in_process: bool = False) -> str:
    """Run job `job_id` if it is still queued; return the status it ended in (or why it was skipped).

    `in_process` runs every kind's own `run` here (`draftdeck demo`), with no chunk tasks to hand to."""
    settings = get_settings()
    with session_scope() as session:
        job = records.get_job(session, job_id)
        if job is None:
            log.error("job %s: no such job; message dropped", job_id)
            return "missing"
        me = worker_name()
        decision = state.propose(
            session, job_id, JobStatus.RUNNING, f"started on {me}", worker=me, task_id=task_id
        )
        if not decision.accepted:
            job = records.get_job(session, job_id)
            assert job is not None
            # A message for a job that is already running means its first worker died and the broker
            # redelivered it, or a second copy arrived while the first still runs. The heartbeat tells which.
            # (A chunked job whose chunks wait in a served queue is waiting, not lost: the one rule.)
            if job.status == JobStatus.RUNNING and job.heartbeat_at is not None:
                age = (utcnow() - job.heartbeat_at).total_seconds()
                if liveness.of_job(session, job, settings.lost_after_seconds).stranded:
                    sweeper.fail_lost(session, job_id, f"redelivered after {age:.0f} s without heartbeat")
            log.info("job %s is %s; not running it again", job_id, job.status)
            return f"skipped:{job.status}"
        kind = get_kind(job.kind)

    ctx = SqlRunContext(job_id, settings.jobs_dir / str(job_id))
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    params = kind.params.model_validate(job.params)
    policy = params.policy()
    # a chunked kind (tokenize, cache-hidden) plans its chunk tasks here: app/run/chunks.py
    run = kind.run if in_process else (chunks.service_run(kind.name) or kind.run)
    with Heartbeat(job_id, settings.heartbeat_seconds):
        try:
            report = run(params, ctx)
        except Handoff as handoff:
            log.info("job %s continues in other tasks: %s", job_id, handoff)
            return "handed-off"
        except Cancelled:
            with session_scope() as session:
                state.propose(session, job_id, JobStatus.CANCELLED, "cancelled while running")
            return JobStatus.CANCELLED
        except JobFailed as exc:
            record_failure(job_id, str(exc), exc.report if isinstance(exc.report, Report) else None, policy)
            return JobStatus.FAILED
        except DraftDeckError as exc:
            record_failure(job_id, str(exc), None, policy)
            return JobStatus.FAILED
        except Exception as exc:
            log.exception("job %s crashed", job_id)
            record_failure(
                job_id,
                crash_message(exc),
                None,
                policy,
                detail=traceback.format_exc(limit=8),
            )
            return JobStatus.FAILED

    return record_success(job_id, report, policy)
