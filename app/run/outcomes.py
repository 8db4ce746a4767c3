"""How a run's end is recorded: success or failure, through the state rules (app/store/state.py). Shared
by the job runner (app/run/job.py) and the chunk tasks' final step (app/run/chunks.py)."""

from __future__ import annotations

import os
import re
import socket
from typing import Any

from sqlmodel import select

from app.store import records, state
from app.store.db import session_scope
from app.store.models import Alert, Job, JobStatus
from draftdeck.quality import Policy, Report
from draftdeck.units import count

# What a failure says when the code or the machine failed, not the data or the parameters: only these
# may end differently on a retry (a chunked job's own words come after "chunk N: " or "final step: ").
_MAY_CHANGE = re.compile(r"^(?:chunk \d+: |final step: )?(?:internal error|worker lost|could not enqueue):")


def retry_may_help(status: str, error: str | None) -> bool:
    """Whether a new attempt with the same parameters can end differently: a cancelled job, a crash,
    a lost worker or a broker that was down, yes; a failure decided by the inputs and parameters
    (a policy, an empty output, a bad file) comes back the same unless something is changed first."""
    return status == JobStatus.CANCELLED or bool(_MAY_CHANGE.match(error or ""))


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# Work not counted in rows: a job that reported its progress so (a train job's steps, an eval's prompts or
# turns) keeps its own figures when it ends, where the rest show the rows they read.
OWN_UNITS = ("steps", "prompts", "turns")


def record_success(job_id: int, report: Report, policy: Policy) -> str:
    """Move the job to `succeeded` with its report, outputs and datasets, in one transaction."""
    with session_scope() as session:
        unit = session.exec(select(Job.progress_unit).where(Job.id == job_id)).first()
        progress: dict[str, Any] = (
            {} if unit in OWN_UNITS
            else {"progress_done": report.rows_in, "progress_total": report.rows_in, "progress_unit": "rows"}
        )  # fmt: skip
        decision = state.propose(
            session,
            job_id,
            JobStatus.SUCCEEDED,
            f"succeeded: {count(report.rows_in, 'rows')} in, {report.rows_out:,} out,"
            f" {report.rows_rejected - report.rows_folded:,} rejected"
            + (f", {report.rows_folded:,} merged" if report.rows_folded else ""),
            report=report,
            policy=policy,
            result=report.to_dict(),
            **progress,
        )
        if decision.accepted:
            # heavy losses do not finish quiet: the core's figures past the job's thresholds, once per
            # kind (a dataset the job made may have raised high_truncation already)
            raised = set(session.exec(select(Alert.kind).where(Alert.job_id == job_id)).all())
            for kind, message in policy.loss_alerts(report):
                if kind not in raised:
                    records.raise_alert(session, kind, f"job {job_id}: {message}", job_id=job_id)
            return JobStatus.SUCCEEDED
        records.add_event(
            session,
            job_id,
            "warning",
            f"finished, but the job had already left 'running' ({decision.status})",
        )
        return "lost-race"


def record_failure(
    job_id: int, message: str, report: Report | None, policy: Policy | None, *, detail: str | None = None
) -> bool:
    """Move the job to `failed` with the reason (and the report that came with the failure)."""
    with session_scope() as session:
        return state.propose(
            session,
            job_id,
            JobStatus.FAILED,
            message,
            report=report,
            policy=policy,
            detail=detail,
            result=report.to_dict() if report is not None else None,
        ).accepted
