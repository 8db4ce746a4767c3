"""`draftdeck eval` in a terminal, recorded where the dashboard reads evals: when the eval has written its
eval.json, it becomes a succeeded `eval` job in this home's database (DRAFTDECK_HOME's SQLite file, or
DATABASE_URL), the rows a worker's eval leaves (its parameters, its report as the result, its events,
metric points and alerts), so the leaderboard (/evals) and its run's page list it beside the evals that
ran as jobs. The core's own CLI (`python -m draftdeck.cli eval`, under a launcher) knows nothing of the
service and records nothing.

A database it cannot reach does not undo the eval: eval.json stays, and the reason is printed.
"""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the SQL side is imported when an eval is recorded: every other command starts without it
    from sqlmodel import Session

    from draftdeck.drafter.eval.params import EvalParams
    from draftdeck.jobs.context import LocalContext
    from draftdeck.quality import Report

QUEUE = "cli"  # no worker consumes it: the job ran before it was recorded


def record_cli_eval(params: EvalParams, report: Report, ctx: LocalContext, started: float) -> str:
    """Record a finished eval run in this process as a job; return the line that says where it shows
    (or, when the database cannot be reached, why it is not recorded)."""
    from sqlalchemy.exc import SQLAlchemyError

    from app.cli import address
    from app.run.outcomes import record_success
    from app.settings import get_settings
    from app.store.db import session_scope, upgrade

    settings = get_settings()
    where = (
        f"the database of {settings.home_dir}" if settings.database_url is None else "DATABASE_URL's database"
    )
    try:
        settings.ensure_dirs()
        upgrade()  # as `draftdeck up` and the workers do on start: the home may be new
        with session_scope() as session:
            job_id = _record(session, params, ctx, started)
        status = record_success(job_id, report, params.policy())
    except (SQLAlchemyError, OSError) as exc:
        why = (str(exc).splitlines() or [""])[0]  # SQLAlchemy's next line is a link to its error pages
        return f"not recorded on the dashboard ({where}): {type(exc).__name__}: {why}; eval.json stands"
    server = address.recorded(settings.home_dir) or ""  # the address of a dashboard serving this home
    return f"recorded as eval job {job_id} ({status}) in {where}: {server}/evals, {server}/jobs/{job_id}"


def _record(session: Session, params: EvalParams, ctx: LocalContext, started: float) -> int:
    """The job, running since `started`, with what the eval said on the way; success is recorded after,
    through the worker's own path (app/run/outcomes.py: the report's events, outputs, loss alerts)."""
    from sqlalchemy import update
    from sqlmodel import col

    from app.store import metrics, records, state
    from app.store.models import Job, JobStatus

    host = socket.gethostname()
    job = records.create_job(session, "eval", params.model_dump(mode="json"), QUEUE)
    assert job.id is not None
    state.propose(
        session, job.id, JobStatus.RUNNING, f"ran by `draftdeck eval` on {host}, outside the job system",
        worker=f"cli:{host}",
    )  # fmt: skip
    began = datetime.fromtimestamp(started, UTC)  # the eval's own start, not the moment it was recorded
    session.execute(update(Job).where(col(Job.id) == job.id).values(started_at=began))
    for level, message, code, n in ctx.events:
        records.add_event(session, job.id, level, message, code=code, count=n, commit=False)
    for kind, message in ctx.alerts:
        records.raise_alert(session, kind, f"job {job.id}: {message}", job_id=job.id, commit=False)
    session.commit()
    metrics.record_points(session, job.id, ctx.points)
    return job.id
