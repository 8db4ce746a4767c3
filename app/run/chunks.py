"""Jobs split into chunk tasks (tokenize). Celery-free, like app/run/job.py; workers/tasks.py wraps
:func:`run_chunk` in the ``draftdeck.run_chunk`` task. Chunk statuses change only through
app/store/state.py's chunk rules.

Flow:

1. The job's own task (``draftdeck.run_job`` -> :func:`plan_tokenize`) reads the inputs once and
   writes chunk files (:func:`draftdeck.tokenize.chunks.plan_chunks`), records one ``job_chunks``
   row per chunk (``pending``), sends one ``draftdeck.run_chunk`` message per chunk on the job's queue
   and returns: the job stays ``running`` and no worker slot waits for the chunks (a single worker
   with concurrency 1 runs the chunks after it). It does not use chords: no result backend.
2. Each chunk task claims its row (``pending`` -> ``running``, compare-and-set), tokenizes its chunk
   into its own shard, and marks its row ``done`` with the chunk's report and shard (compare-and-set
   again). Progress of the job = chunks done / chunks. While a chunk runs, the job's heartbeat is kept
   fresh; a worker that dies in a chunk stops the beat and the sweeper marks the job lost.
3. After marking its row done, a chunk task that sees every chunk done tries to claim the final step:
   ``UPDATE job_chunks SET finalized_by = me WHERE job_id = J AND chunk_index = 0 AND finalized_by IS
   NULL``. The last chunks to finish may both see all done; only one wins the update. The winner runs
   :func:`draftdeck.tokenize.chunks.finish_chunks` (check counts, merge, final shard names, manifest),
   records outputs and the report, and moves the job to ``succeeded`` or ``failed``.

Cancellation: a chunk checks the job's cancel flag before it starts and after every batch; it then
stops, and the job is moved to ``cancelled``. Messages of chunks whose job is no longer running are
skipped (their rows are marked ``skipped``). A failed chunk fails the job. A job that ends without
succeeding loses its chunk files, temporaries and unfinished shards at once; a failed one keeps its
done chunks for a Retry, which reuses them instead of running them again (app/run/resume.py).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
import traceback
from pathlib import Path

from sqlalchemy import func, update
from sqlmodel import Session, col, select

from app import queue
from app.run import leftovers, resume
from app.run.context import Handoff, Heartbeat, SqlRunContext
from app.run.outcomes import record_failure, record_success, worker_name
from app.settings import get_settings
from app.store import records, state
from app.store.db import session_scope
from app.store.models import ChunkStatus, Job, JobChunk, JobStatus, utcnow
from draftdeck.errors import Cancelled, JobFailed, crash_message
from draftdeck.fileio import sha256_file
from draftdeck.kinds import get_kind
from draftdeck.quality import Policy, Report
from draftdeck.tokenize import chunks as core
from draftdeck.tokenize.job import TokenizeParams, dataset_output
from draftdeck.tokenize.options import TokenizeOptions
from draftdeck.units import count

log = logging.getLogger(__name__)

PARTS = leftovers.PARTS  # chunk files and statistics, in the job's folder
CHECK_CANCEL_EVERY_SECONDS = 0.5


# -- the job's own task: plan and enqueue ----------------------------------------------------------
def plan_tokenize(params: TokenizeParams, ctx: SqlRunContext) -> Report:
    """The ``tokenize`` kind's run in the service: plan the chunks, record and enqueue them, hand
    the job off."""
    from draftdeck.tokenize.inputs import read_inputs

    opts = _options(params)
    out = params.out_dir(ctx.out_dir)
    core.check_out_dir(out)
    parts = ctx.out_dir / PARTS
    paths = [Path(p) for p in params.inputs]
    try:
        plan = core.plan_chunks(
            lambda report: read_inputs(
                paths, report, ctx.progress, strict=opts.strict, from_format=opts.from_format
            ),
            parts,
            params.chunk_rows or opts.shard_rows,
        )
    except BaseException:
        shutil.rmtree(parts, ignore_errors=True)
        raise
    options = resume.options_key(params)
    with session_scope() as session:
        for c in plan.chunks:
            session.add(JobChunk(job_id=ctx.job_id, chunk_index=c.index, input_path=c.path,
                                 conversations=c.conversations,
                                 input_sha256=resume.chunk_key(Path(c.path), options)))  # fmt: skip
        session.commit()
        records.add_event(
            session,
            ctx.job_id,
            "info",
            f"read {count(plan.read_report.rows_in, 'rows')}; "
            f"{count(sum(c.conversations for c in plan.chunks), 'conversations')} in "
            f"{count(len(plan.chunks), 'chunk tasks')}",
        )
        reused = resume.take_over(session, ctx.job_id, out, parts).indexes
        records.record_progress(session, ctx.job_id, len(reused), len(plan.chunks), "chunks")
    to_run = [c.index for c in plan.chunks if c.index not in set(reused)]
    if not to_run:  # every chunk was reused: only the final step is left, and it is ours
        if _claim_final_step(ctx.job_id, worker_name()):
            _finalize(ctx.job_id, params, opts, out, parts)
        raise Handoff(f"all {len(plan.chunks)} chunks reused; final step run")
    try:
        enqueue_chunks(ctx.job_id, to_run, queue=_queue(ctx.job_id))
    except Exception:  # the broker is down: the runner fails the job; leave no chunk files behind
        shutil.rmtree(parts, ignore_errors=True)
        raise
    raise Handoff(f"{count(len(to_run), 'chunk tasks')} enqueued, {len(reused)} reused")


def _options(params: TokenizeParams) -> TokenizeOptions:
    # One process per chunk task: a Celery prefork child may not fork a pool; more chunks run at once
    # on more worker processes.
    return params.options(workers=1)


def _queue(job_id: int) -> str:
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

    def __call__(self, done: int, total: int | None = None, unit: str = "rows") -> None:
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
    assert isinstance(params, TokenizeParams)
    job_dir = settings.jobs_dir / str(job_id)
    opts = _options(params)
    out = params.out_dir(job_dir)
    parts = job_dir / PARTS
    with Heartbeat(job_id, settings.heartbeat_seconds, chunk=index):
        try:
            outcome = core.tokenize_chunk(
                Path(chunk.input_path), index, out, parts, opts, _CancelCheck(job_id)
            )
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

        shard = outcome.shard
        with session_scope() as session:
            done = state.propose_chunk(
                session, job_id, index, ChunkStatus.DONE, f"{outcome.report.rows_out:,} rows out",
                finished_at=utcnow(), rows_in=outcome.report.rows_in, rows_out=outcome.report.rows_out,
                report={**outcome.to_dict(), "stats_sha256": sha256_file(Path(outcome.stats_path))},
                shard_path=str(out / shard.filename) if shard else None,
                bytes=shard.bytes if shard else 0, sha256=shard.sha256 if shard else None,
            ).accepted  # fmt: skip
            job = records.get_job(session, job_id)
            if not done or job is None or job.status != JobStatus.RUNNING:
                if shard is not None:  # the job ended meanwhile: leave nothing behind
                    (out / shard.filename).unlink(missing_ok=True)
                return "skipped:job-ended"
            n_done, n_all = _counts(session, job_id)
            records.record_progress(session, job_id, n_done, n_all, "chunks")
            if n_done < n_all:
                return "done"
        if not _claim_final_step(job_id, me):
            return "done"
        return _finalize(job_id, params, opts, out, parts)


def _claim_final_step(job_id: int, me: str) -> bool:
    """Of the tasks that saw every chunk done, exactly one wins the final step."""
    with session_scope() as session:
        claimed = session.execute(
            update(JobChunk)
            .where(
                col(JobChunk.job_id) == job_id,
                col(JobChunk.chunk_index) == 0,
                col(JobChunk.finalized_by).is_(None),
            )
            .values(finalized_by=me)
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


def _finalize(job_id: int, params: TokenizeParams, opts: TokenizeOptions, out: Path, parts: Path) -> str:
    policy = params.policy()
    with session_scope() as session:
        job = records.get_job(session, job_id)
        assert job is not None
        rows = session.exec(
            select(JobChunk).where(JobChunk.job_id == job_id).order_by(col(JobChunk.chunk_index))
        ).all()
        outcomes = [core.ChunkOutcome.from_dict(r.report or {}) for r in rows]
        started = job.started_at
        reuse = resume.Reuse(
            job.retry_of, len(rows), [r.chunk_index for r in rows if r.reused_from is not None]
        )
    seconds = (utcnow() - started).total_seconds() if started is not None else 0.0
    try:
        plan = core.Plan.load(parts)
        report = core.finish_chunks(out, opts, plan, outcomes, seconds=seconds, inputs=list(params.inputs))
    except core.RerunChunks as again:
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
    shutil.rmtree(parts, ignore_errors=True)
    report.outputs.append(dataset_output(out, report))
    if reuse.from_job is not None:
        report.extra["chunks_reused"] = {**reuse.to_dict(), "summary": reuse.sentence()}
    return record_success(job_id, report, policy)


def _rerun(job_id: int, again: core.RerunChunks) -> None:
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
                          code="encoder_mismatch")  # fmt: skip
        queue_name = _queue(job_id)
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
