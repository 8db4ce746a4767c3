"""Retry resumes a chunked tokenize job from the chunks its failed attempt finished.

Chunks are idempotent: the same chunk input with the same tokenizer and options gives the same
shard, byte for byte. So a failed attempt does not throw its done chunks away:

1. When a chunked job fails (a chunk failed, its worker was lost, the final step failed),
   :func:`keep_done_chunks` moves each done chunk's shard and statistics into the job's own folder
   (``<jobs>/<id>/kept-chunks/``, inside the data roots) and records the new paths. Partial files
   (chunks that were not done, temporaries, chunk inputs) are still removed at once, so a retry's
   ``out`` folder is empty again. A cancelled job keeps nothing: cancelling means "stop and clean".
2. The retry plans its chunks afresh (the input is read again; it may have changed) and records
   each chunk's key (:func:`chunk_key`: sha256 over the chunk input, the tokenizer's files and the
   options). :func:`take_over` then moves in every done chunk of the failed attempt whose key is the
   same, verifying the shard's size and sha256 and the statistics' sha256 after the move; a missing
   or corrupt one runs again. Reused chunk rows are ``done`` with ``reused_from`` = the failed job.
   Only the other chunks are enqueued. What is left in the kept folder is deleted.
3. Kept chunks of a failed job that nobody retries are deleted by the sweeper
   (:func:`delete_expired`) after ``DRAFTDECK_KEEP_FAILED_CHUNKS_HOURS`` (default 24).

The old row's ``shard_path`` is the claim: a compare-and-set to NULL by whoever takes (a retry) or
deletes (the sweeper) the kept shard, so exactly one of them acts on it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from sqlalchemy import update
from sqlmodel import Session, col, select

import draftdeck
from app.settings import get_settings
from app.store import records, state
from app.store.models import ChunkStatus, Job, JobChunk, JobStatus, utcnow
from draftdeck.chat.render import tokenizer_fingerprint
from draftdeck.fileio import sha256_file
from draftdeck.tokenize.chunks import FALLBACK, shard_name, stats_name
from draftdeck.tokenize.job import TokenizeParams

log = logging.getLogger(__name__)

KEPT = "kept-chunks"  # in a failed job's own folder: its done chunks' shards and statistics


def kept_dir(job_id: int) -> Path:
    return get_settings().jobs_dir / str(job_id) / KEPT


def options_key(params: TokenizeParams) -> str:
    """sha256 of what decides every chunk's shard but its input: the tokenizer's files and chat
    template, the options, DraftDeck's version (computed once per job)."""
    h = hashlib.sha256()
    options = params.model_dump(mode="json", exclude={"out", "inputs"})
    h.update(b"options\0" + json.dumps(options, sort_keys=True).encode())
    template = ""
    if params.chat_template and Path(params.chat_template).is_file():
        template = Path(params.chat_template).read_text(encoding="utf-8", errors="replace")
    h.update(
        b"tokenizer\0" + tokenizer_fingerprint(params.tokenizer, template, params.template_kwargs).encode()
    )
    h.update(b"version\0" + draftdeck.__version__.encode())
    return h.hexdigest()


def chunk_key(input_path: Path, options: str) -> str:
    """sha256 of the chunk input and :func:`options_key`: equal keys give byte-identical shards."""
    return hashlib.sha256(f"{sha256_file(input_path)}\0{options}".encode()).hexdigest()


# -- 1. a failed attempt keeps its done chunks ---------------------------------------------------
def keep_done_chunks(session: Session, job_id: int, parts: Path) -> int:
    """Move the done chunks' shards and statistics of failed job `job_id` into its kept folder;
    return how many were kept. A chunk with no shard (every row rejected) or no statistics file is
    not kept (it runs again on retry)."""
    kept = kept_dir(job_id)
    rows = session.exec(
        select(JobChunk).where(
            JobChunk.job_id == job_id,
            JobChunk.status == ChunkStatus.DONE,
            col(JobChunk.shard_path).is_not(None),
        )
    ).all()
    n = 0
    for row in rows:
        shard = Path(row.shard_path or "")
        stats = Path(str((row.report or {}).get("stats_path") or ""))
        if shard.parent == kept or not shard.is_file() or not stats.is_file():
            continue
        kept.mkdir(parents=True, exist_ok=True)
        shutil.move(shard, kept / shard.name)
        shutil.move(stats, kept / stats.name)
        _move_images(shard.parent, kept)  # the pictures the chunks' rows name (a dataset with images)
        row.shard_path = str(kept / shard.name)
        row.report = {**(row.report or {}), "stats_path": str(kept / stats.name)}
        session.add(row)
        n += 1
    if n and (parts / FALLBACK).is_file():  # chunks of the retry must use the encoder these used
        shutil.copy(parts / FALLBACK, kept / FALLBACK)
    session.commit()
    if n:
        hours = get_settings().keep_failed_chunks_hours
        records.add_event(
            session, job_id, "info",
            f"kept {n} done chunks in {kept} for a retry (Retry reuses them; deleted after {hours:g} h)",
        )  # fmt: skip
    return n


def _move_images(src: Path, dest: Path) -> None:
    """Move the image files of `src`/images/ into `dest`/images/ (a name already there is the same
    picture: its name is its sha256). Chunks of a dataset with images put their pictures there."""
    from draftdeck.shards.store import IMAGES_DIR

    folder = src / IMAGES_DIR
    if not folder.is_dir():
        return
    (dest / IMAGES_DIR).mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        if f.is_file() and not f.name.startswith(".") and not (dest / IMAGES_DIR / f.name).exists():
            shutil.move(f, dest / IMAGES_DIR / f.name)
    shutil.rmtree(folder, ignore_errors=True)


# -- 2. the retry takes them over -----------------------------------------------------------------
@dataclass
class Reuse:
    from_job: int | None
    total: int
    indexes: list[int] = field(default_factory=list)

    def sentence(self) -> str:
        return f"{len(self.indexes)} of {self.total} chunks reused from job {self.from_job}"

    def to_dict(self) -> dict[str, object]:
        return {"from_job": self.from_job, "reused": len(self.indexes), "chunks": self.total,
                "indexes": self.indexes}  # fmt: skip


def take_over(session: Session, job_id: int, out: Path, parts: Path) -> Reuse:
    """Reuse the done chunks of the attempt job `job_id` retries (see the module's docstring)."""
    job = records.get_job(session, job_id)
    assert job is not None
    new_rows = session.exec(
        select(JobChunk).where(JobChunk.job_id == job_id).order_by(col(JobChunk.chunk_index))
    ).all()
    reuse = Reuse(job.retry_of, len(new_rows))
    if job.retry_of is None:
        return reuse
    old_id = job.retry_of
    kept = kept_dir(old_id)
    old_rows = {
        r.chunk_index: r
        for r in session.exec(
            select(JobChunk).where(JobChunk.job_id == old_id, JobChunk.status == ChunkStatus.DONE)
        ).all()
    }
    if (kept / FALLBACK).is_file():
        parts.mkdir(parents=True, exist_ok=True)
        shutil.copy(kept / FALLBACK, parts / FALLBACK)
    _move_images(kept, out)  # the reused chunks' pictures; the final step drops those no row names
    problems: list[str] = []
    for new in new_rows:
        index = new.chunk_index
        old = old_rows.get(index)
        if old is None:
            continue  # not done in the failed attempt: it runs
        why = _reuse_one(session, old, new, kept, out, parts)
        if why is None:
            reuse.indexes.append(index)
        else:
            problems.append(f"chunk {index}: {why}")
    # Whatever was not taken is of no use to anyone now (one retry per attempt).
    session.execute(update(JobChunk).where(col(JobChunk.job_id) == old_id).values(shard_path=None))
    session.commit()
    shutil.rmtree(kept, ignore_errors=True)
    if problems:
        message = f"{len(problems)} done chunks of job {old_id} run again: " + "; ".join(problems[:20])
        records.add_event(session, job_id, "warning", message, code="chunk_not_reused")
    if reuse.indexes or problems:
        records.add_event(session, job_id, "info", reuse.sentence() + " (sha256 verified)")
    return reuse


def _reuse_one(
    session: Session, old: JobChunk, new: JobChunk, kept: Path, out: Path, parts: Path
) -> str | None:
    """Move done chunk `old` in as `new`; None when reused, else why not."""
    # plain values first: the claim's commit expires the ORM objects
    i, old_job, new_job, key = new.chunk_index, old.job_id, new.job_id, new.input_sha256
    shard_path, size_was, sha_was = old.shard_path, old.bytes, old.sha256
    rows_in, rows_out, old_report = old.rows_in, old.rows_out, dict(old.report or {})
    if not shard_path or Path(shard_path).parent != kept:
        return "its shard was not kept (it had no rows, or was deleted after the retention time)"
    if old.input_sha256 is None or old.input_sha256 != key:
        return "its input, the tokenizer or the options changed"
    claimed = session.execute(
        update(JobChunk)
        .where(col(JobChunk.id) == old.id, col(JobChunk.shard_path) == shard_path)
        .values(shard_path=None)
    )
    session.commit()
    if claimed.rowcount != 1:  # type: ignore[attr-defined]
        return "its kept shard was deleted meanwhile"
    src, stats_src = Path(shard_path), Path(str(old_report.get("stats_path") or ""))
    if not src.is_file() or not stats_src.is_file():
        return f"its kept shard or statistics file is missing ({src.name}, {stats_src.name})"
    dest, stats_dest = out / shard_name(i), parts / stats_name(i)
    out.mkdir(parents=True, exist_ok=True)
    parts.mkdir(parents=True, exist_ok=True)
    shutil.move(src, dest)
    shutil.move(stats_src, stats_dest)
    size, digest = dest.stat().st_size, sha256_file(dest)
    why = None
    if size != size_was or digest != sha_was:
        why = (
            f"its kept shard is corrupt ({size} bytes, sha256 {digest[:12]}; "
            f"recorded {size_was} bytes, {str(sha_was)[:12]})"
        )
    elif sha256_file(stats_dest) != old_report.get("stats_sha256"):
        why = "its kept statistics file is corrupt (sha256 differs from the recorded one)"
    if why is not None:
        dest.unlink(missing_ok=True)
        stats_dest.unlink(missing_ok=True)
        return why
    report = {**old_report, "stats_path": str(stats_dest)}
    decision = state.propose_chunk(
        session, new_job, i, ChunkStatus.DONE, f"reused from job {old_job} (sha256 {digest[:12]} verified)",
        reused_from=old_job, rows_in=rows_in, rows_out=rows_out, report=report,
        shard_path=str(dest), bytes=size_was, sha256=sha_was, worker=None, finished_at=utcnow(),
    )  # fmt: skip
    if not decision.accepted:  # the new job ended meanwhile (cancelled): leave nothing behind
        dest.unlink(missing_ok=True)
        stats_dest.unlink(missing_ok=True)
        return decision.reason
    return None


# -- 3. nobody retried: the sweeper deletes them ----------------------------------------------------
def delete_expired(session: Session, keep_hours: float, *, limit: int = 100) -> list[int]:
    """Delete the kept chunks of jobs failed more than `keep_hours` ago; return those jobs."""
    cutoff = utcnow() - timedelta(hours=keep_hours)
    jobs = session.exec(
        select(JobChunk.job_id)
        .join(Job, col(Job.id) == col(JobChunk.job_id))
        .where(
            Job.status == JobStatus.FAILED,
            col(Job.finished_at) < cutoff,
            JobChunk.status == ChunkStatus.DONE,
            col(JobChunk.shard_path).is_not(None),
        )
        .distinct()
        .limit(limit)
    ).all()
    for job_id in jobs:
        session.execute(
            update(JobChunk)
            .where(col(JobChunk.job_id) == job_id, col(JobChunk.shard_path).is_not(None))
            .values(shard_path=None)
        )
        session.commit()
        if kept_dir(job_id).is_dir():
            shutil.rmtree(kept_dir(job_id), ignore_errors=True)
            message = f"kept chunks deleted: nobody retried the job within {keep_hours:g} h"
            records.add_event(session, job_id, "info", message)
            log.info("job %s: kept chunks deleted after %g h", job_id, keep_hours)
    return list(jobs)
