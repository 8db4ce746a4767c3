"""Job state: the one module that moves jobs, and the chunks of a job, between statuses.

Every change is a proposal (:func:`propose`, :func:`propose_chunk`). The rule for the pair (current
status -> proposed status) decides; without a rule the proposal is rejected. An accepted change is
written in ONE transaction with its history row, its event and, for a job that succeeded, its
report's events, its outputs and the datasets it made: a job that loses a race records nothing.
The update is a compare-and-set on the status read under a row lock (PostgreSQL; SQLite serialises
writers), so the web process, the workers and the sweeper can race: whoever loses is told so, with
the status the job is in now.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sqlalchemy import update
from sqlmodel import Session, col, select

from app.store import records
from app.store.models import ChunkStatus, Job, JobChunk, JobStateHistory, JobStatus, utcnow
from draftdeck.quality import Policy, Report

log = logging.getLogger(__name__)

REASON_CHARS = 2000


class JobStateError(Exception):
    """A request that the job's current status does not allow (HTTP 409)."""


@dataclass(frozen=True)
class Decision:
    accepted: bool
    status: str  # the status now: the new one when accepted, the one that stood when rejected
    reason: str


@dataclass
class Proposal:
    to: JobStatus
    reason: str
    fields: dict[str, Any] = field(default_factory=dict)
    report: Report | None = None
    policy: Policy | None = None
    detail: str | None = None
    code: str | None = None
    alert: str | None = None


# -- job rules ------------------------------------------------------------------------------------
class JobRule:
    FROM: ClassVar[frozenset[JobStatus]]
    TO: ClassVar[JobStatus]
    LEVEL: ClassVar[str] = "info"

    def check(self, job: Job, p: Proposal) -> str | None:
        """Why the proposal is rejected, or None to accept it."""
        return None

    def values(self, p: Proposal) -> dict[str, Any]:
        return {}

    def after(self, session: Session, job: Job, p: Proposal) -> None:
        """Writes that belong to the same transaction as the change."""


class StartRun(JobRule):
    """queued -> running: a worker claims the job. Only a queued job can be claimed, so a message
    delivered twice (a broker redelivery, a sweeper re-send) never runs the job twice."""

    FROM = frozenset({JobStatus.QUEUED})
    TO = JobStatus.RUNNING

    def values(self, p: Proposal) -> dict[str, Any]:
        now = utcnow()
        return {"started_at": now, "heartbeat_at": now}


class FinishRun(JobRule):
    """running -> succeeded: the run ended and its policy passed. Its issue events, outputs and
    datasets are recorded with the change, so a job that already left `running` (cancelled, marked
    lost) keeps no outputs it never delivered."""

    FROM = frozenset({JobStatus.RUNNING})
    TO = JobStatus.SUCCEEDED

    def values(self, p: Proposal) -> dict[str, Any]:
        return {"finished_at": utcnow()}

    def after(self, session: Session, job: Job, p: Proposal) -> None:
        assert job.id is not None
        if p.report is not None:
            records.record_report(session, job.id, p.report, p.policy or Policy(), commit=False)
            records.record_datasets(session, job.id, p.report.outputs)


class FailRun(JobRule):
    """queued|running -> failed: the run failed (its reason kept on the job), could not be enqueued,
    or its worker vanished. A report that came with the failure keeps its issue events; an empty
    output raises an alert."""

    FROM = frozenset({JobStatus.QUEUED, JobStatus.RUNNING})
    TO = JobStatus.FAILED
    LEVEL = "error"

    def values(self, p: Proposal) -> dict[str, Any]:
        return {"finished_at": utcnow(), "error": p.reason[:REASON_CHARS]}

    def after(self, session: Session, job: Job, p: Proposal) -> None:
        assert job.id is not None
        if p.report is not None:
            records.record_report(session, job.id, p.report, p.policy or Policy(), commit=False)
            if p.report.rows_out == 0:
                records.raise_alert(
                    session, "empty_output", f"job {job.id}: {p.reason}", job_id=job.id, commit=False
                )


class CancelQueued(JobRule):
    """queued -> cancelled: nothing ran yet, so the job ends at once; a message still in the broker
    finds it cancelled and is dropped."""

    FROM = frozenset({JobStatus.QUEUED})
    TO = JobStatus.CANCELLED

    def values(self, p: Proposal) -> dict[str, Any]:
        return {"finished_at": utcnow(), "error": p.reason[:REASON_CHARS]}


class CancelRunning(JobRule):
    """running -> cancelled: only once cancellation was requested, when the run stops on the flag
    or when no live worker runs the job (nobody would read the flag)."""

    FROM = frozenset({JobStatus.RUNNING})
    TO = JobStatus.CANCELLED

    def check(self, job: Job, p: Proposal) -> str | None:
        return None if job.cancel_requested else "no cancellation was requested"

    def values(self, p: Proposal) -> dict[str, Any]:
        return {"finished_at": utcnow(), "error": p.reason[:REASON_CHARS]}

    def after(self, session: Session, job: Job, p: Proposal) -> None:
        assert job.id is not None
        skip_pending_chunks(session, job.id, "the job was cancelled", commit=False)


JOB_RULES: tuple[type[JobRule], ...] = (StartRun, FinishRun, FailRun, CancelQueued, CancelRunning)
_BY_PAIR: dict[tuple[str, str], JobRule] = {(f, r.TO): r() for r in JOB_RULES for f in r.FROM}


def propose(
    session: Session,
    job_id: int,
    to: JobStatus,
    reason: str,
    *,
    report: Report | None = None,
    policy: Policy | None = None,
    detail: str | None = None,
    code: str | None = None,
    alert: str | None = None,
    **fields: Any,
) -> Decision:
    """Propose moving job `job_id` to `to` because of `reason`; `fields` are set with the change.

    Commits (an accepted change with its history, event and side effects; a rejection writes nothing).
    """
    p = Proposal(JobStatus(to), reason, fields, report, policy, detail, code, alert)
    job = session.exec(
        select(Job).where(Job.id == job_id).with_for_update().execution_options(populate_existing=True)
    ).first()
    if job is None:
        session.commit()
        return Decision(False, "missing", f"no job {job_id}")
    current = job.status
    rule = _BY_PAIR.get((current, p.to))
    why_not = f"job {job_id} is {current}; it cannot become {p.to}" if rule is None else rule.check(job, p)
    if rule is None or why_not is not None:
        session.commit()
        return Decision(False, current, why_not or "")
    result = session.execute(
        update(Job)
        .where(col(Job.id) == job_id, col(Job.status) == current)
        .values(status=p.to, **rule.values(p), **fields)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]  # SQLite: another writer moved it between the read and the update
        session.rollback()
        now = records.get_job(session, job_id)
        return Decision(False, now.status if now else "missing", f"job {job_id} changed meanwhile")
    session.add(
        JobStateHistory(job_id=job_id, from_status=current, to_status=p.to, reason=reason[:REASON_CHARS])
    )
    records.add_event(
        session, job_id, rule.LEVEL, reason if not detail else f"{reason}\n{detail}", code=code, commit=False
    )
    rule.after(session, job, p)
    if alert:
        records.raise_alert(session, alert, f"job {job_id}: {reason}", job_id=job_id, commit=False)
    session.commit()
    return Decision(True, p.to, reason)


def fail_lost(session: Session, job_id: int, detail: str) -> Decision:
    """Fail a job whose worker vanished, with an alert (Retry runs a new attempt)."""
    decision = propose(
        session, job_id, JobStatus.FAILED, f"worker lost: {detail}", code="worker_lost", alert="worker_lost"
    )
    if decision.accepted:
        log.warning("job %s: worker lost: %s", job_id, detail)
    return decision


# -- chunk rules ----------------------------------------------------------------------------------
class ChunkRule:
    FROM: ClassVar[frozenset[ChunkStatus]]
    TO: ClassVar[ChunkStatus]
    REQUIRES: ClassVar[frozenset[str]] = frozenset()  # fields the proposal must set


class ClaimChunk(ChunkRule):
    """pending -> running: a worker takes the chunk; a second delivery of its message finds it
    taken and does nothing."""

    FROM = frozenset({ChunkStatus.PENDING})
    TO = ChunkStatus.RUNNING


class FinishChunk(ChunkRule):
    """running -> done: the chunk's shard is written; only the worker that claimed it gets here."""

    FROM = frozenset({ChunkStatus.RUNNING})
    TO = ChunkStatus.DONE


class FailChunk(ChunkRule):
    """running -> failed: the chunk's run raised; its job fails with it."""

    FROM = frozenset({ChunkStatus.RUNNING})
    TO = ChunkStatus.FAILED


class CancelChunk(ChunkRule):
    """pending|running -> cancelled: the chunk stopped on its job's cancel flag."""

    FROM = frozenset({ChunkStatus.PENDING, ChunkStatus.RUNNING})
    TO = ChunkStatus.CANCELLED


class SkipChunk(ChunkRule):
    """pending -> skipped: its job ended before the chunk ran; the chunk never will."""

    FROM = frozenset({ChunkStatus.PENDING})
    TO = ChunkStatus.SKIPPED


class RerunChunk(ChunkRule):
    """done -> pending: the final step found the fast encoder disagreeing with HF in this chunk;
    it runs again on the HF tokenizer (chunks are idempotent: same shard name)."""

    FROM = frozenset({ChunkStatus.DONE})
    TO = ChunkStatus.PENDING


class ReuseChunk(ChunkRule):
    """pending -> done: a retry took over this chunk's shard from the failed attempt it retries, the
    chunk's key and the shard's sha256 verified (app/run/resume.py); it does not run. Only a proposal
    naming the job it reuses from (``reused_from``) is accepted: no chunk is done unrun otherwise."""

    FROM = frozenset({ChunkStatus.PENDING})
    TO = ChunkStatus.DONE
    REQUIRES = frozenset({"reused_from"})


class LoseChunkOnce(ChunkRule):
    """running -> pending: the chunk's worker died in it (its beat is stale) for the first time and a
    live worker serves its queue; it runs again there (chunks are idempotent: same shard, same
    checksum)."""

    FROM = frozenset({ChunkStatus.RUNNING})
    TO = ChunkStatus.PENDING


class LoseChunk(ChunkRule):
    """running -> lost: the chunk's worker died in it a second time, no live worker is left to run
    it again, or its job was marked lost; the job fails "worker lost", naming the chunk."""

    FROM = frozenset({ChunkStatus.RUNNING})
    TO = ChunkStatus.LOST


CHUNK_RULES: tuple[type[ChunkRule], ...] = (
    ClaimChunk,
    FinishChunk,
    FailChunk,
    CancelChunk,
    SkipChunk,
    RerunChunk,
    ReuseChunk,
    LoseChunkOnce,
    LoseChunk,
)
_CHUNK_PAIRS: dict[tuple[str, str], type[ChunkRule]] = {(f, r.TO): r for r in CHUNK_RULES for f in r.FROM}


def propose_chunk(
    session: Session,
    job_id: int,
    index: int,
    to: ChunkStatus,
    reason: str,
    *,
    commit: bool = True,
    only_if: Sequence[Any] = (),
    **fields: Any,
) -> Decision:
    """Propose moving chunk `index` of job `job_id` to `to`; `fields` are set with the change.

    `only_if`: more conditions on the row, for a caller that acts on what it read earlier (the
    sweeper): the move is refused when the chunk changed since, even back to the same status (a
    lost chunk run again and claimed anew is no longer the one it judged)."""
    to = ChunkStatus(to)
    current = session.execute(
        select(JobChunk.status).where(col(JobChunk.job_id) == job_id, col(JobChunk.chunk_index) == index)
    ).scalar_one_or_none()
    if current is None:
        return Decision(False, "missing", f"job {job_id} has no chunk {index}")
    rule = _CHUNK_PAIRS.get((current, to))
    if rule is None or any(fields.get(name) is None for name in rule.REQUIRES):
        return Decision(False, current, f"chunk {index} is {current}; it cannot become {to}")
    result = session.execute(
        update(JobChunk)
        .where(
            col(JobChunk.job_id) == job_id,
            col(JobChunk.chunk_index) == index,
            col(JobChunk.status) == current,
            *only_if,
        )
        .values(status=to, **fields)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        if commit:
            session.commit()
        return Decision(False, "changed", f"chunk {index} changed meanwhile")
    session.add(
        JobStateHistory(
            job_id=job_id, chunk_index=index, from_status=current, to_status=to, reason=reason[:REASON_CHARS]
        )
    )
    if commit:
        session.commit()
    return Decision(True, to, reason)


def skip_pending_chunks(session: Session, job_id: int, reason: str, *, commit: bool = True) -> int:
    """Every chunk still pending is skipped (its job ended); returns how many."""
    pending = session.exec(
        select(JobChunk.chunk_index).where(JobChunk.job_id == job_id, JobChunk.status == ChunkStatus.PENDING)
    ).all()
    n = sum(
        propose_chunk(
            session, job_id, i, ChunkStatus.SKIPPED, reason, commit=False, finished_at=utcnow()
        ).accepted
        for i in pending
    )
    if commit:
        session.commit()
    return n


def history(session: Session, job_id: int) -> list[JobStateHistory]:
    return list(
        session.exec(
            select(JobStateHistory).where(JobStateHistory.job_id == job_id).order_by(col(JobStateHistory.id))
        ).all()
    )
