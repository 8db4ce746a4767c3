"""The sweeper: periodic, bounded queries that keep SQL, the source of truth, and the world in step.
Each round, in this order:

1. Lost chunks: a chunk `running` whose own beat is older than the lost-worker limit (its worker
   died in it; another worker may keep its job's beat fresh). The first time, while a live worker
   serves its queue, it goes back to `pending` and its message is sent again (chunks are
   idempotent); lost twice, or with no live worker left, it becomes `lost` and its job fails
   "worker lost", naming the chunk.
2. Lost jobs: a job `running` whose beat is older than the limit, unless it waits for chunks still
   queued on a queue that a live worker serves.
3. Lost messages: the broker only delivers. A queued job or a pending chunk whose message was sent
   longer ago than the limit, is still not claimed, and is no longer in the broker (Redis restarted
   without its data, a deleted message file) is sent again; the claim's compare-and-set keeps a
   double delivery from running twice.
4. Kept chunks: a failed chunked job keeps its done chunks for a Retry (app/run/resume.py); those of a
   job failed longer ago than ``keep_failed_chunks_hours`` that nobody retried are deleted.

Every status change goes through the state rules (app/store/state.py); a failed job's partial files are
removed (app/run/leftovers.py). Several sweepers (the web's, each worker's) may race: the rules'
compare-and-sets, and the one on `sent_at` for re-sends, let exactly one of them act.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import exists, or_, update
from sqlmodel import Session, col, select

from app import queue
from app.run import chunks, liveness, resume
from app.settings import Settings, get_settings
from app.store import state
from app.store.db import session_scope
from app.store.models import ChunkStatus, Job, JobChunk, JobStatus, utcnow

log = logging.getLogger(__name__)


@dataclass
class Swept:
    rerun_chunks: list[tuple[int, int]] = field(default_factory=list)
    lost_chunks: list[tuple[int, int]] = field(default_factory=list)
    lost_jobs: list[int] = field(default_factory=list)
    resent_jobs: list[int] = field(default_factory=list)
    resent_chunks: list[tuple[int, int]] = field(default_factory=list)
    expired_kept: list[int] = field(default_factory=list)  # jobs whose kept chunks were deleted


def sweep(
    session: Session,
    lost_after_seconds: float,
    *,
    limit: int = 100,
    keep_failed_chunks_hours: float | None = None,
) -> Swept:
    keep_hours = (
        get_settings().keep_failed_chunks_hours
        if keep_failed_chunks_hours is None
        else keep_failed_chunks_hours
    )
    swept = Swept()
    swept.rerun_chunks, swept.lost_chunks = mark_lost_chunks(session, lost_after_seconds, limit=limit)
    swept.lost_jobs = mark_lost_jobs(session, lost_after_seconds, limit=limit)
    swept.resent_jobs, swept.resent_chunks = resend_lost_messages(session, lost_after_seconds, limit=limit)
    swept.expired_kept = resume.delete_expired(session, keep_hours, limit=limit)
    liveness.prune(session)
    return swept


def fail_lost(session: Session, job_id: int, detail: str) -> state.Decision:
    """Fail a job whose worker vanished: its running chunks become `lost` (nobody finishes them),
    its pending chunks `skipped`, and its partial files are removed."""
    decision = state.fail_lost(session, job_id, detail)
    if decision.accepted:
        for index in session.exec(
            select(JobChunk.chunk_index).where(
                JobChunk.job_id == job_id, JobChunk.status == ChunkStatus.RUNNING
            )
        ).all():
            reason = f"its job was marked lost: {detail}"
            state.propose_chunk(session, job_id, index, ChunkStatus.LOST, reason, commit=False,
                                finished_at=utcnow())  # fmt: skip
        session.commit()
        chunks.cleanup(session, job_id)
    return decision


def mark_lost_chunks(
    session: Session, lost_after_seconds: float, *, limit: int = 100
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Chunks whose worker died in them: (run again, lost)."""
    cutoff = utcnow() - timedelta(seconds=lost_after_seconds)
    rows = session.exec(
        select(JobChunk, Job.queue)
        .join(Job, col(Job.id) == col(JobChunk.job_id))
        .where(
            JobChunk.status == ChunkStatus.RUNNING,
            Job.status == JobStatus.RUNNING,
            or_(
                col(JobChunk.heartbeat_at) < cutoff,
                col(JobChunk.heartbeat_at).is_(None) & (col(JobChunk.started_at) < cutoff),
            ),
        )
        .limit(limit)
    ).all()
    again: list[tuple[int, int]] = []
    lost: list[tuple[int, int]] = []
    for chunk, queue_name in rows:
        job_id, index = chunk.job_id, chunk.chunk_index
        beat = chunk.heartbeat_at or chunk.started_at
        age = f"no heartbeat for {(utcnow() - beat).total_seconds():.0f} s" if beat else "no heartbeat"
        live = liveness.serves(session, queue_name, lost_after_seconds)
        # Only the claim this sweeper judged: another sweeper may have run the chunk again meanwhile.
        same_claim = (
            col(JobChunk.losses) == chunk.losses,
            col(JobChunk.started_at).is_(None) if chunk.started_at is None
            else col(JobChunk.started_at) == chunk.started_at,
        )  # fmt: skip
        if chunk.losses == 0 and live:
            if state.propose_chunk(
                session, job_id, index, ChunkStatus.PENDING,
                f"worker {chunk.worker} lost in it ({age}); it runs again once",
                losses=chunk.losses + 1, worker=None, started_at=None, heartbeat_at=None,
                sent_at=utcnow(), only_if=same_claim,
            ).accepted:  # fmt: skip
                again.append((job_id, index))
                _send_chunk(session, job_id, index, queue_name)
            continue
        why = "lost twice" if chunk.losses else f"lost, and no live worker serves queue {queue_name}"
        reason = f"chunk {index} {why} (worker {chunk.worker}, {age})"
        if state.propose_chunk(
            session, job_id, index, ChunkStatus.LOST, reason, finished_at=utcnow(), error=reason,
            only_if=same_claim,
        ).accepted:  # fmt: skip
            lost.append((job_id, index))
            fail_lost(session, job_id, reason)
    return again, lost


def mark_lost_jobs(session: Session, lost_after_seconds: float, *, limit: int = 100) -> list[int]:
    """Fail running jobs whose heartbeat is older than `lost_after_seconds`: their worker vanished.

    A job split into chunk tasks beats only while one of its chunks runs. While a chunk of it is
    `running`, the chunk's own beat decides (:func:`mark_lost_chunks`). While some of its chunks wait
    in the queue (``pending`` and sent) it is waiting, not lost, as long as a live worker serves its
    queue. A chunk recorded but never sent (the planning worker died) keeps nothing alive."""
    cutoff = utcnow() - timedelta(seconds=lost_after_seconds)
    running_chunk = exists().where(
        col(JobChunk.job_id) == Job.id, col(JobChunk.status) == ChunkStatus.RUNNING
    )
    stale = session.exec(
        select(Job)
        .where(Job.status == JobStatus.RUNNING, col(Job.heartbeat_at) < cutoff, ~running_chunk)
        .limit(limit)
    ).all()
    lost: list[int] = []
    for job in stale:
        assert job.id is not None
        live = liveness.of_job(session, job, lost_after_seconds)  # the rule Cancel and the page use
        if not live.stranded:
            continue
        lost_chunk = _lost_chunk_error(session, job.id)
        if lost_chunk is not None:
            # another sweeper marked a chunk lost and is about to fail the job for it (two commits):
            # the job fails for that reason, whichever sweeper gets there first
            detail = lost_chunk
        elif live.waiting:
            detail = f"no live worker serves queue {job.queue} (chunks {_pending(session, job.id)} wait)"
        elif job.external_key is not None:  # a run launched elsewhere: its reporter went silent
            detail = f"its reporter ({job.worker}) sent nothing for {lost_after_seconds:.0f} s"
        else:
            detail = f"no heartbeat for {lost_after_seconds:.0f} s"
        if fail_lost(session, job.id, detail).accepted:
            lost.append(job.id)
    return lost


def _lost_chunk_error(session: Session, job_id: int) -> str | None:
    """The reason the first chunk of `job_id` marked lost was lost, if one was."""
    return session.exec(
        select(JobChunk.error)
        .where(
            JobChunk.job_id == job_id, JobChunk.status == ChunkStatus.LOST, col(JobChunk.error).is_not(None)
        )
        .order_by(col(JobChunk.chunk_index))
    ).first()


def _pending(session: Session, job_id: int) -> str:
    indexes = session.exec(
        select(JobChunk.chunk_index)
        .where(JobChunk.job_id == job_id, JobChunk.status == ChunkStatus.PENDING)
        .order_by(col(JobChunk.chunk_index))
    ).all()
    return ", ".join(map(str, indexes[:10])) + (f" and {len(indexes) - 10} more" if len(indexes) > 10 else "")


# -- lost messages ----------------------------------------------------------------------------------
def resend_lost_messages(
    session: Session, lost_after_seconds: float, *, limit: int = 100
) -> tuple[list[int], list[tuple[int, int]]]:
    cutoff = utcnow() - timedelta(seconds=lost_after_seconds)
    jobs = session.exec(
        select(Job.id, Job.queue, Job.task_id, Job.sent_at)
        .where(
            Job.status == JobStatus.QUEUED,
            or_(col(Job.sent_at) < cutoff, col(Job.sent_at).is_(None) & (col(Job.created_at) < cutoff)),
        )
        .limit(limit)
    ).all()
    resent_jobs: list[int] = []
    for job_id, queue_name, task_id, sent_at in jobs:
        assert job_id is not None
        if task_id and queue.holds_message(queue_name, task_id):
            continue
        if not _claim_resend(session, Job, (col(Job.id) == job_id,), sent_at):
            continue
        try:
            new_id = queue.send_again(queue.RUN_JOB, [job_id], queue_name)
        except Exception:  # the broker is still down: the next round tries again
            log.warning("job %s: could not re-send its message", job_id, exc_info=True)
            continue
        session.execute(update(Job).where(col(Job.id) == job_id).values(task_id=new_id))
        session.commit()
        log.warning("job %s: its message was lost; sent again", job_id)
        resent_jobs.append(job_id)

    pending = session.exec(
        select(JobChunk.job_id, JobChunk.chunk_index, JobChunk.task_id, JobChunk.sent_at, Job.queue)  # type: ignore[call-overload]
        .join(Job, col(Job.id) == col(JobChunk.job_id))
        .where(
            JobChunk.status == ChunkStatus.PENDING,
            Job.status == JobStatus.RUNNING,
            col(JobChunk.task_id).is_not(None),
            col(JobChunk.sent_at) < cutoff,
        )
        .limit(limit)
    ).all()
    resent_chunks: list[tuple[int, int]] = []
    for job_id, index, task_id, sent_at, queue_name in pending:
        if task_id and queue.holds_message(queue_name, task_id):
            continue
        where = (col(JobChunk.job_id) == job_id, col(JobChunk.chunk_index) == index)
        if not _claim_resend(session, JobChunk, where, sent_at):
            continue
        if _send_chunk(session, job_id, index, queue_name):
            log.warning("job %s chunk %s: its message was lost; sent again", job_id, index)
            resent_chunks.append((job_id, index))
    return resent_jobs, resent_chunks


def _claim_resend(session: Session, table: type, where: tuple[object, ...], sent_at: datetime | None) -> bool:
    """Compare-and-set on `sent_at`: of several sweepers, one re-sends."""
    same = col(table.sent_at).is_(None) if sent_at is None else col(table.sent_at) == sent_at  # type: ignore[attr-defined]
    result = session.execute(update(table).where(*where, same).values(sent_at=utcnow()))  # type: ignore[arg-type]
    session.commit()
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def _send_chunk(session: Session, job_id: int, index: int, queue_name: str) -> bool:
    try:
        task_id = queue.send_again(queue.RUN_CHUNK, [job_id, index], queue_name)
    except Exception:  # the broker is down: the chunk stays pending and is re-sent next round
        log.warning("job %s chunk %s: could not send its message", job_id, index, exc_info=True)
        return False
    session.execute(
        update(JobChunk)
        .where(col(JobChunk.job_id) == job_id, col(JobChunk.chunk_index) == index)
        .values(task_id=task_id)
    )
    session.commit()
    return True


def start_sweeper(settings: Settings) -> threading.Event:
    """Start the sweeper thread; set the returned event to stop it."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(settings.sweep_seconds):
            try:
                with session_scope() as session:
                    sweep(session, settings.lost_after_seconds,
                          keep_failed_chunks_hours=settings.keep_failed_chunks_hours)  # fmt: skip
            except Exception:  # the database may be restarting; try again next round
                log.exception("sweeper round failed")

    threading.Thread(target=loop, name="draftdeck-sweeper", daemon=True).start()
    return stop
