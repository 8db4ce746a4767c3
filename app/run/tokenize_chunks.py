"""Tokenize as a chunked kind (app/run/chunks.py's `ChunkedKind`): the inputs read once into chunk files
(:func:`draftdeck.tokenize.chunks.plan_chunks`), each chunk tokenized into its own shard, the final step
checking the counts, merging the statistics and cutting the dataset's shards
(:func:`draftdeck.tokenize.chunks.finish_chunks`). A retry takes over the done chunks of the failed
attempt it retries (app/run/resume.py); a chunk that found the fast encoder wrong makes the chunks that
used it run again (`ChunksAgain`)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from app.run import resume
from app.run.chunks import (
    PARTS,
    ChunkDone,
    ChunksAgain,
    Progress,
    claim_final_step,
    enqueue_chunks,
    finalize,
    job_queue,
)
from app.run.context import Handoff, SqlRunContext, data_roots
from app.store import records
from app.store.db import session_scope
from app.store.models import JobChunk
from draftdeck.errors import JobFailed
from draftdeck.fileio import sha256_file
from draftdeck.quality import Report
from draftdeck.tokenize import chunks as core
from draftdeck.tokenize.job import TokenizeParams, dataset_output
from draftdeck.tokenize.options import TokenizeOptions
from draftdeck.units import count


class TokenizeChunks:
    metrics_prefix: str | None = None  # the page's rows/s and tokens/s are enough

    def plan(self, params: Any, ctx: SqlRunContext) -> Report:
        """Plan the chunks, record and enqueue them, hand the job off."""
        from draftdeck.tokenize.inputs import read_inputs

        assert isinstance(params, TokenizeParams)
        opts = _options(params)
        out = params.out_dir(ctx.out_dir)
        core.check_out_dir(out)
        parts = ctx.out_dir / PARTS
        paths = [Path(p) for p in params.inputs]
        try:
            plan = core.plan_chunks(
                # everything reading is told, as the in-process run tells it: columns, tags, tool
                # tags and preference were dropped here, so a chunked job read another dataset
                lambda report: read_inputs(paths, report, ctx.progress, **opts.reading()),
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
            if claim_final_step(ctx.job_id):
                finalize(ctx.job_id, self, params, ctx.out_dir)
            raise Handoff(f"all {len(plan.chunks)} chunks reused; final step run")
        try:
            enqueue_chunks(ctx.job_id, to_run, queue=job_queue(ctx.job_id))
        except Exception:  # the broker is down: the runner fails the job; leave no chunk files behind
            shutil.rmtree(parts, ignore_errors=True)
            raise
        raise Handoff(f"{count(len(to_run), 'chunk tasks')} enqueued, {len(reused)} reused")

    def run(self, params: Any, chunk: JobChunk, job_dir: Path, progress: Progress) -> ChunkDone:
        out = params.out_dir(job_dir)
        outcome = core.tokenize_chunk(
            Path(chunk.input_path), chunk.chunk_index, out, job_dir / PARTS, _options(params), progress
        )
        shard = outcome.shard
        return ChunkDone(
            rows_in=outcome.report.rows_in, rows_out=outcome.report.rows_out,
            report={**outcome.to_dict(), "stats_sha256": sha256_file(Path(outcome.stats_path))},
            shard_path=str(out / shard.filename) if shard else None,
            bytes=shard.bytes if shard else 0, sha256=shard.sha256 if shard else None,
        )  # fmt: skip

    def drop(self, params: Any, done: ChunkDone) -> None:
        if done.shard_path is not None:
            Path(done.shard_path).unlink(missing_ok=True)

    def finish(self, job_id: int, params: Any, job_dir: Path, rows: list[JobChunk], seconds: float) -> Report:
        out, parts = params.out_dir(job_dir), job_dir / PARTS
        outcomes = [core.ChunkOutcome.from_dict(r.report or {}) for r in rows]
        with session_scope() as session:
            job = records.get_job(session, job_id)
            retry_of = job.retry_of if job is not None else None
        reuse = resume.Reuse(retry_of, len(rows), [r.chunk_index for r in rows if r.reused_from is not None])
        try:
            plan = core.Plan.load(parts)
            report = core.finish_chunks(
                out, _options(params), plan, outcomes, seconds=seconds, inputs=list(params.inputs)
            )
        except core.RerunChunks as again:
            raise ChunksAgain(again.indexes, again.reason, "encoder_mismatch") from again
        except JobFailed:
            raise
        report.outputs.append(dataset_output(out, report))
        if reuse.from_job is not None:
            report.extra["chunks_reused"] = {**reuse.to_dict(), "summary": reuse.sentence()}
        return report


def _options(params: TokenizeParams) -> TokenizeOptions:
    # One process per chunk task: a Celery prefork child may not fork a pool; more chunks run at once
    # on more worker processes. Image files only from the data roots (SqlRunContext.file_roots): a
    # chunk task has no context, and reads the same settings.
    return params.options(workers=1, image_roots=data_roots())
