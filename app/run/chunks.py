"""Jobs split into chunk tasks, for every kind that declares itself chunked (`ChunkedKind`: tokenize,
app/run/tokenize_chunks.py; cache-hidden, app/run/hidden_chunks.py). Celery-free, like app/run/job.py;
workers/tasks.py wraps :func:`run_chunk` in the ``draftdeck.run_chunk`` task. Chunk statuses change only
through app/store/state.py's chunk rules. A kind provides three things: plan the chunks, run one, finish
the whole; this module does the rest, the same for each kind.

Flow:

1. The job's own task (``draftdeck.run_job`` -> the kind's ``plan``) plans the chunks, records one
   ``job_chunks`` row per chunk (``pending``), sends one ``draftdeck.run_chunk`` message per chunk on
   the job's queue (:func:`enqueue_chunks`) and raises `Handoff`: the job stays ``running`` and no
   worker slot waits for the chunks (a single worker with concurrency 1 runs the chunks after it). It
   does not use chords: no result backend.
2. Each chunk task claims its row (``pending`` -> ``running``, compare-and-set), runs the kind's
   ``run`` for it (its own shard, or folder of shards), and marks its row ``done`` with the chunk's
   report and output (compare-and-set again). Progress of the job = chunks done / chunks. While a chunk
   runs, the job's heartbeat is kept fresh; a worker that dies in a chunk stops the chunk's beat, and
   the sweeper puts the chunk back to ``pending`` and sends it again once (app/run/sweeper.py).
3. After marking its row done, a chunk task that sees every chunk done tries to claim the final step:
   ``UPDATE job_chunks SET finalized_by = me WHERE job_id = J AND chunk_index = 0 AND finalized_by IS
   NULL``. The last chunks to finish may both see all done; only one wins the update. The winner runs
   the kind's ``finish`` (check counts, merge, final names, manifest), records outputs and the report,
   and moves the job to ``succeeded`` or ``failed``; a ``finish`` that raises `ChunksAgain` puts those
   chunks back to ``pending`` and sends them again.

Cancellation: a chunk checks the job's cancel flag before it starts and as it goes (its progress
callback); it then stops, and the job is moved to ``cancelled``. Messages of chunks whose job is no
longer running are skipped (their rows are marked ``skipped``). A failed chunk fails the job. A job that
ends without succeeding loses its chunk files, temporaries and unfinished shards at once; a failed
tokenize job keeps its done chunks for a Retry, which reuses them instead of running them again
(app/run/resume.py).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import func, update
from sqlmodel import Session, col, select

from app import queue
from app.run import leftovers, resume
from app.run.context import Heartbeat, SqlRunContext
from app.run.outcomes import record_failure, record_success, worker_name
from app.settings import get_settings
from app.store import metrics, records, state
from app.store.db import session_scope
from app.store.models import ChunkStatus, Job, JobChunk, JobStatus, utcnow
from draftdeck.errors import Cancelled, JobFailed, crash_message
from draftdeck.kinds import get_kind
from draftdeck.quality import Policy, Report

log = logging.getLogger(__name__)

PARTS = leftovers.PARTS  # chunk files and statistics, in the job's folder
CHECK_CANCEL_EVERY_SECONDS = 0.5

# a chunk's progress callback: (done, total, unit); raises Cancelled once the job is cancelled or ended
Progress = Callable[..., None]


@dataclass
class ChunkDone:
    """What one chunk made: its rows, its report (JSON, kept on its row for the final step) and its
    output (a shard file or a folder of them; None when every row was rejected)."""

    rows_in: int
    rows_out: int
    report: dict[str, Any]
    shard_path: str | None
    bytes: int
    sha256: str | None


class ChunksAgain(Exception):
    """Raised by a kind's ``finish``: these chunks must run again (the reason, an issue code)."""

    def __init__(self, indexes: list[int], reason: str, code: str):
        super().__init__(reason)
        self.indexes, self.reason, self.code = indexes, reason, code


class ChunkedKind(Protocol):
    """What a job kind split into chunk tasks provides; the rest is this module's."""

    # with a prefix, each chunk done records the job's throughput so far as metric points
    # (`<prefix>/rows_per_s`, `tokens_per_s`, `mb_per_s`); None: none
    metrics_prefix: str | None

    def plan(self, params: Any, ctx: SqlRunContext) -> Report:
        """The job's own task: record the chunks (``job_chunks`` rows), `enqueue_chunks` them and raise
        `Handoff`; or run the job whole and return its report (a case the kind does not split)."""

    def run(self, params: Any, chunk: JobChunk, job_dir: Path, progress: Progress) -> ChunkDone:
        """Run one chunk; may be called again for the same chunk (its worker was lost): idempotent."""

    def drop(self, params: Any, done: ChunkDone) -> None:
        """A chunk that finished after its job ended: remove what it wrote."""

    def finish(self, job_id: int, params: Any, job_dir: Path, rows: list[JobChunk], seconds: float) -> Report:
        """Every chunk done (`rows`, in order): check, merge and deliver; raise JobFailed (with the
        report) or `ChunksAgain`."""


def chunked_kind(name: str) -> ChunkedKind | None:
    """The chunked kind of job kind `name`, or None when its jobs run whole."""
    from app.run.hidden_chunks import HiddenChunks
    from app.run.tokenize_chunks import TokenizeChunks

    kinds: dict[str, ChunkedKind] = {"tokenize": TokenizeChunks(), "cache-hidden": HiddenChunks()}
    return kinds.get(name)


def service_run(name: str) -> Callable[[Any, SqlRunContext], Report] | None:
    """How the service runs job kind `name` when it is chunked: its plan (app/run/job.py)."""
    kind = chunked_kind(name)
    return kind.plan if kind is not None else None


def job_queue(job_id: int) -> str:
    with session_scope() as session:
        job = records.get_job(session, job_id)
        return job.queue if job is not None else "cpu"


def enqueue_chunks(job_id: int, indexes: list[int], *, queue: str) -> None:
    for index in indexes:
        task_id = _send(job_id, index, queue)
        with session_scope() as session:
            session.execute(
                update(JobChunk)
                .where(col(JobChunk.job_id) == job_id, col(JobChunk.chunk_index) == index)
                .values(task_id=task_id, sent_at=utcnow())
            )
            session.commit()


def _send(job_id: int, index: int, queue_name: str) -> str:
    return queue.send(queue.RUN_CHUNK, [job_id, index], queue_name)


# -- one chunk ------------------------------------------------------------------------------------
class _CancelCheck:
    """Progress callback for a chunk: raises Cancelled once the job is cancelled or has ended."""

    def __init__(self, job_id: int):
        self.job_id = job_id
        self._last = 0.0

    def __call__(self, done: int = 0, total: int | None = None, unit: str = "rows") -> None:
        now = time.monotonic()
        if now - self._last < CHECK_CANCEL_EVERY_SECONDS:
            return
        self._last = now
        with session_scope() as session:
            row = session.execute(
                select(Job.status, Job.cancel_requested).where(col(Job.id) == self.job_id)
            ).one_or_none()
        if row is None or row[0] != JobStatus.RUNNING or row[1]:
            raise Cancelled(f"job {self.job_id} was cancelled or has ended")


def run_chunk(job_id: int, index: int, *, task_id: str | None = None) -> str:
    """Run chunk `index` of job `job_id` if both are still waiting for it; return what happened."""
    settings = get_settings()
    me = worker_name()
    with session_scope() as session:
        job = records.get_job(session, job_id)
        if job is None:
            return "missing"
        if job.status != JobStatus.RUNNING:
            state.propose_chunk(session, job_id, index, ChunkStatus.SKIPPED, f"the job is {job.status}",
                                finished_at=utcnow())  # fmt: skip
            return f"skipped:job-{job.status}"
        claim = state.propose_chunk(session, job_id, index, ChunkStatus.RUNNING, f"claimed by {me}",
                                    worker=me, task_id=task_id, started_at=utcnow(),
                                    heartbeat_at=utcnow())  # fmt: skip
        if not claim.accepted:
            # A redelivered message: the chunk is done, or runs (or died) elsewhere; the job's
            # heartbeat decides whether it is lost.
            return "skipped:not-pending"
        if job.cancel_requested:
            _cancel(session, job_id, index)
            return JobStatus.CANCELLED
        chunk = session.exec(
            select(JobChunk).where(JobChunk.job_id == job_id, JobChunk.chunk_index == index)
        ).one()
        params_raw = job.params
        kind_name = job.kind

    params = get_kind(kind_name).params.model_validate(params_raw)
    kind = chunked_kind(kind_name)
    assert kind is not None, f"job kind {kind_name} is not chunked"
    job_dir = settings.jobs_dir / str(job_id)
    with Heartbeat(job_id, settings.heartbeat_seconds, chunk=index):
        try:
            done = kind.run(params, chunk, job_dir, _CancelCheck(job_id))
        except Cancelled:
            with session_scope() as session:
                _cancel(session, job_id, index)
            return JobStatus.CANCELLED
        except Exception as exc:
            log.exception("job %s chunk %s crashed", job_id, index)
            message = crash_message(exc)
            with session_scope() as session:
                state.propose_chunk(session, job_id, index, ChunkStatus.FAILED, message,
                                    error=message[:2000], finished_at=utcnow())  # fmt: skip
            _end_failed(
                job_id, f"chunk {index}: {message}", None, params.policy(), traceback.format_exc(limit=8)
            )
            return JobStatus.FAILED

        with session_scope() as session:
            accepted = state.propose_chunk(
                session, job_id, index, ChunkStatus.DONE, f"{done.rows_out:,} rows out",
                finished_at=utcnow(), rows_in=done.rows_in, rows_out=done.rows_out, report=done.report,
                shard_path=done.shard_path, bytes=done.bytes, sha256=done.sha256,
            ).accepted  # fmt: skip
            job = records.get_job(session, job_id)
            if not accepted or job is None or job.status != JobStatus.RUNNING:
                kind.drop(params, done)  # the job ended meanwhile: leave nothing behind
                return "skipped:job-ended"
            n_done, n_all = _counts(session, job_id)
            records.record_progress(session, job_id, n_done, n_all, "chunks")
            if kind.metrics_prefix is not None:
                _record_throughput(session, job, kind.metrics_prefix, n_done)
            if n_done < n_all:
                return "done"
        if not claim_final_step(job_id, me):
            return "done"
        return finalize(job_id, kind, params, job_dir)


def _record_throughput(session: Session, job: Job, prefix: str, step: int) -> None:
    """The job's rows/s, tokens/s and MB/s so far: its done chunks over the time since it started."""
    if job.started_at is None or job.id is None:
        return
    seconds = max((utcnow() - job.started_at).total_seconds(), 1e-9)
    done = session.exec(
        select(JobChunk.rows_out, JobChunk.bytes, JobChunk.report).where(
            JobChunk.job_id == job.id, JobChunk.status == ChunkStatus.DONE
        )
    ).all()
    rows = sum(r or 0 for r, _, _ in done)
    tokens = sum(int((rep or {}).get("tokens") or 0) for _, _, rep in done)
    written = sum(b or 0 for _, b, _ in done)
    values = {"rows_per_s": rows / seconds, "tokens_per_s": tokens / seconds,
              "mb_per_s": written / seconds / 1e6}  # fmt: skip
    metrics.record_metrics(session, job.id, step, {f"{prefix}/{k}": v for k, v in values.items()}, tokens)


def claim_final_step(job_id: int, me: str | None = None) -> bool:
    """Of the tasks that saw every chunk done, exactly one wins the final step."""
    with session_scope() as session:
        claimed = session.execute(
            update(JobChunk)
            .where(
                col(JobChunk.job_id) == job_id,
                col(JobChunk.chunk_index) == 0,
                col(JobChunk.finalized_by).is_(None),
            )
            .values(finalized_by=me or worker_name())
        )
        session.commit()
        return bool(claimed.rowcount == 1)  # type: ignore[attr-defined]


def _counts(session: Session, job_id: int) -> tuple[int, int]:
    rows = session.execute(
        select(JobChunk.status, func.count())
        .where(col(JobChunk.job_id) == job_id)
        .group_by(col(JobChunk.status))
    ).all()
    by = {status: n for status, n in rows}
    return by.get(ChunkStatus.DONE, 0), sum(by.values())


def finalize(job_id: int, kind: ChunkedKind, params: Any, job_dir: Path) -> str:
    """The final step, won by `claim_final_step`: the kind's ``finish``, its outcome recorded."""
    policy = params.policy()
    with session_scope() as session:
        job = records.get_job(session, job_id)
        assert job is not None
        rows = list(
            session.exec(
                select(JobChunk).where(JobChunk.job_id == job_id).order_by(col(JobChunk.chunk_index))
            ).all()
        )
        started = job.started_at
    seconds = (utcnow() - started).total_seconds() if started is not None else 0.0
    try:
        report = kind.finish(job_id, params, job_dir, rows, seconds)
    except ChunksAgain as again:
        _rerun(job_id, again)
        return "rerun"
    except JobFailed as exc:
        _end_failed(job_id, str(exc), exc.report if isinstance(exc.report, Report) else None, policy, None)
        return JobStatus.FAILED
    except Exception as exc:
        log.exception("job %s: final step crashed", job_id)
        message = crash_message(exc)
        _end_failed(job_id, f"final step: {message}", None, policy, traceback.format_exc(limit=8))
        return JobStatus.FAILED
    shutil.rmtree(job_dir / PARTS, ignore_errors=True)
    return record_success(job_id, report, policy)


def _rerun(job_id: int, again: ChunksAgain) -> None:
    """Put chunks back to `pending`, release the final step, and enqueue them again."""
    with session_scope() as session:
        for index in again.indexes:
            state.propose_chunk(session, job_id, index, ChunkStatus.PENDING, again.reason, commit=False,
                                worker=None, started_at=None, finished_at=None,
                                reused_from=None)  # fmt: skip
        session.execute(
            update(JobChunk)
            .where(col(JobChunk.job_id) == job_id, col(JobChunk.chunk_index) == 0)
            .values(finalized_by=None)
        )
        session.commit()
        n_done, n_all = _counts(session, job_id)
        records.record_progress(session, job_id, n_done, n_all, "chunks")
        records.add_event(session, job_id, "warning",
                          f"{len(again.indexes)} chunks run again: {again.reason}",
                          code=again.code)  # fmt: skip
        queue_name = job_queue(job_id)
    enqueue_chunks(job_id, again.indexes, queue=queue_name)


def _cancel(session: Session, job_id: int, index: int) -> None:
    state.propose_chunk(
        session, job_id, index, ChunkStatus.CANCELLED, "the job was cancelled", finished_at=utcnow()
    )
    if state.propose(
        session, job_id, JobStatus.CANCELLED, f"cancelled while running (chunk {index})"
    ).accepted:
        cleanup(session, job_id)


def _end_failed(job_id: int, message: str, report: Report | None, policy: Policy, detail: str | None) -> None:
    record_failure(job_id, message, report, policy, detail=detail)
    with session_scope() as session:
        cleanup(session, job_id)


def cleanup(session: Session, job_id: int) -> None:
    """A job that ended without succeeding: chunks not started are skipped; a failed job's done
    chunks are kept in its own folder for a Retry (app/run/resume.py); every other chunk shard, the chunk
    files and temporaries are removed (a chunk still running removes its own shard when it finds the
    job ended)."""
    state.skip_pending_chunks(session, job_id, "the job ended")
    job = records.get_job(session, job_id)
    parts = get_settings().jobs_dir / str(job_id) / PARTS
    if job is not None and job.status == JobStatus.FAILED:
        resume.keep_done_chunks(session, job_id, parts)
    kept = resume.kept_dir(job_id)
    for path in session.exec(
        select(JobChunk.shard_path).where(JobChunk.job_id == job_id, col(JobChunk.shard_path).is_not(None))
    ).all():
        if path and Path(path).name.startswith("chunk-") and Path(path).parent != kept:
            Path(path).unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # the dataset folder, if that shard was all it held
                Path(path).parent.rmdir()
    leftovers.remove_partial_files(session, job_id)
