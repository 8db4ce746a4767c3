"""cache-hidden as a chunked kind (app/run/chunks.py's `ChunkedKind`): the rows of the datasets cut into
slices of `chunk_rows`, each slice a chunk task that builds a cache of its own rows under the job's
folder (draftdeck/drafter/train/cache/slices.py: any worker, on any machine that sees the job's folder,
the datasets and the target), and the final step merging the slices into the one cache (the counts
checked, each shard's sha256 checked as it moves, the manifest written, the whole read back). A slice
run again after its worker was lost starts clean. Taking in speculators' files (`import_from`) reads no
target forward and is not split: the job's own task runs it whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.run.chunks import PARTS, ChunkDone, Progress, enqueue_chunks, job_queue
from app.run.context import Handoff, SqlRunContext
from app.store import records
from app.store.db import session_scope
from app.store.models import JobChunk
from draftdeck.drafter.train.cache.params import CacheParams
from draftdeck.quality import Report
from draftdeck.tokenize.report_state import report_from_state, report_state
from draftdeck.units import count


def _slice(job_dir: Path, index: int) -> Path:
    return job_dir / PARTS / f"slice-{index:05d}"


class _ChunkContext:
    """The RunContext a slice's build sees: its progress is the chunk's cancel check; its per-row
    metrics are not recorded (the chunks' throughput is, as each is done); its log lines are the job's."""

    def __init__(self, ctx: SqlRunContext, progress: Progress):
        self.ctx, self.out_dir, self._progress = ctx, ctx.out_dir, progress

    def progress(self, done: int, total: int | None = None, unit: str = "rows") -> None:
        self._progress(done, total, unit)

    def check_cancelled(self) -> None:
        self._progress()

    def event(self, level: str, message: str, *, code: str | None = None, count: int = 1) -> None:
        self.ctx.event(level, message, code=code, count=count)

    def metrics(self, step: int, values: Any, *, tokens: int | None = None) -> None:
        return None

    def alert(self, kind: str, message: str) -> None:
        self.ctx.alert(kind, message)


class HiddenChunks:
    metrics_prefix: str | None = "cache"

    def plan(self, params: Any, ctx: SqlRunContext) -> Report:
        from draftdeck.drafter.train.cache.build import announce, project
        from draftdeck.drafter.train.cache.job import run_cache_hidden
        from draftdeck.drafter.train.cache.slices import slice_rows

        assert isinstance(params, CacheParams)
        if params.import_from is not None:
            return run_cache_hidden(params, ctx)
        projection = project(params)
        announce(ctx, Path(params.out), projection)  # said, and refused, before any worker loads the target
        slices = slice_rows(projection.rows, params.chunk_rows)
        with session_scope() as session:
            for k, rows in enumerate(slices):
                where = f"rows {rows.start}..{rows.stop}"  # the slice, read back by `_rows`
                session.add(
                    JobChunk(job_id=ctx.job_id, chunk_index=k, input_path=where, conversations=len(rows))
                )
            session.commit()
            records.add_event(
                session, ctx.job_id, "info",
                f"{count(projection.rows, 'rows')} in {count(len(slices), 'chunk tasks')} of at most"
                f" {params.chunk_rows:,} rows; stored layers (HF hidden_states indices) {projection.layers}",
            )  # fmt: skip
            records.record_progress(session, ctx.job_id, 0, len(slices), "chunks")
        enqueue_chunks(ctx.job_id, list(range(len(slices))), queue=job_queue(ctx.job_id))
        raise Handoff(f"{count(len(slices), 'chunk tasks')} enqueued")

    def run(self, params: Any, chunk: JobChunk, job_dir: Path, progress: Progress) -> ChunkDone:
        from draftdeck.drafter.train.cache.slices import build_slice

        rows = _rows(params, chunk)
        folder = _slice(job_dir, chunk.chunk_index)
        ctx = _ChunkContext(SqlRunContext(chunk.job_id, job_dir), progress)
        progress()  # cancelled before the target loads: nothing to undo
        report = build_slice(params, rows, folder, ctx)
        x = report.extra
        state = report_state(report)
        state["extra"] = {k: v for k, v in x.items() if k != "cache"}
        return ChunkDone(
            rows_in=report.rows_in, rows_out=report.rows_out,
            report={"rows": [rows.start, rows.stop], "tokens": int(x.get("tokens") or 0),
                    "bytes_written": int(x.get("bytes") or 0), "report": state},  # the page's rates
            shard_path=str(folder), bytes=int(x.get("bytes") or 0), sha256=None,
        )  # fmt: skip

    def drop(self, params: Any, done: ChunkDone) -> None:
        import shutil

        if done.shard_path is not None:
            shutil.rmtree(done.shard_path, ignore_errors=True)

    def finish(self, job_id: int, params: Any, job_dir: Path, rows: list[JobChunk], seconds: float) -> Report:
        from draftdeck.drafter.train.cache.slices import merge_slices

        report = Report()
        for r in rows:
            report.merge(report_from_state((r.report or {})["report"]))
        report.extra = {}
        # a slice whose every row the policy left out wrote no folder (its rows are counted)
        folders = [_slice(job_dir, r.chunk_index) for r in rows if r.rows_out]
        report = merge_slices(params, folders, report, seconds=seconds)
        report.extra["chunks"] = len(rows)
        return report


def _rows(params: CacheParams, chunk: JobChunk) -> range:
    """The chunk's slice, as the plan cut it (its rows' indexes over all datasets' rows)."""
    start, stop = (int(v) for v in chunk.input_path.removeprefix("rows ").split(".."))
    return range(start, stop)
