# ruff: noqa: F811 - pytest fixtures imported from tokenize_helpers
"""Retry of a failed chunked tokenize job resumes from the chunks already done (app/run/resume.py): the
done chunks are kept (out of `out`, in the failed job's folder), verified by sha256 and taken over;
only the rest run. Chunk tasks are called inline, as in tests/app/run/test_tokenize_chunks.py."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import func, update
from sqlmodel import col, select

from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files
from tests.app.run.test_tokenize_chunks import _chunks, _submit
from tests.support.chunks import JOB_LIMITS, assert_same_dataset
from tests.support.tokenize import small_dir  # noqa: F401


def _fail_in_chunk(job_id: int, index: int) -> None:
    """Chunk `index`: its worker died in it a second time (stale beat, losses=1); the sweeper fails
    the job "worker lost" as it does for a real kill -9 (tests/integration covers the real one)."""
    from app.run import liveness
    from app.run.sweeper import sweep
    from app.store.db import session_scope
    from app.store.models import Job, JobChunk, utcnow

    old = utcnow() - timedelta(hours=1)
    with session_scope() as session:
        liveness.beat(session, "celery@test", ["cpu"])
        session.execute(update(JobChunk)
                        .where(col(JobChunk.job_id) == job_id, col(JobChunk.chunk_index) == index)
                        .values(status="running", losses=1, started_at=old, heartbeat_at=old))  # fmt: skip
        session.execute(update(Job).where(col(Job.id) == job_id).values(heartbeat_at=old))
        session.commit()
        assert sweep(session, 30).lost_chunks == [(job_id, index)]


def _job(job_id: int):
    from app.store import records
    from app.store.db import session_scope

    with session_scope() as session:
        return records.get_job(session, job_id)


def _retry(job_id: int) -> int:
    from app.run.submit import retry
    from app.settings import get_settings
    from app.store.db import session_scope

    with session_scope() as session:
        job = retry(session, job_id, get_settings())
    assert job.id is not None
    return job.id


def _events(job_id: int) -> list[str]:
    from app.store.db import session_scope
    from app.store.models import JobEvent

    with session_scope() as session:
        return [e.message for e in session.exec(select(JobEvent).where(JobEvent.job_id == job_id))]


def _failed_with_three_done(migrated: Path, small_dir: Path) -> tuple[int, Path, Path, dict[int, bytes]]:
    """A job with `out` set, 4 chunks: 0, 1, 2 done, then chunk 3 lost twice: the job fails."""
    from app.run.chunks import run_chunk
    from app.run.job import run_job

    out = migrated / "data" / "out"
    job_id, src, tok = _submit(migrated, small_dir, 30, chunk_rows=10, out=str(out))
    assert run_job(job_id) == "handed-off"
    assert len(_chunks(job_id)) == 4
    assert [run_chunk(job_id, i) for i in (0, 1, 2)] == ["done"] * 3
    shards = {i: (out / f"chunk-{i:05d}.arrow").read_bytes() for i in (0, 1, 2)}
    _fail_in_chunk(job_id, 3)
    job = _job(job_id)
    assert job.status == "failed" and job.error.startswith("worker lost: chunk 3 lost twice"), job.error
    return job_id, src, tok, shards


def test_retry_reuses_the_done_chunks_and_runs_only_the_rest(
    migrated: Path, small_dir: Path, tmp_path: Path
) -> None:
    from app.run.chunks import run_chunk
    from app.run.job import run_job
    from app.run.resume import kept_dir
    from app.store import state
    from app.store.db import session_scope
    from app.store.models import JobChunk

    job_id, src, tok, shards = _failed_with_three_done(migrated, small_dir)
    out = migrated / "data" / "out"
    assert list(out.iterdir()) == [], "out is empty again: the retry with `out` set can start"
    kept = kept_dir(job_id)
    assert sorted(p.name for p in kept.glob("chunk-*.arrow")) == [f"chunk-{i:05d}.arrow" for i in (0, 1, 2)]
    assert not (migrated / "jobs" / str(job_id) / "chunks").exists(), "chunk inputs are removed at once"

    new_id = _retry(job_id)
    assert run_job(new_id) == "handed-off"
    with session_scope() as session:
        reused = session.exec(
            select(func.count()).where(JobChunk.job_id == new_id, JobChunk.reused_from == job_id)
        ).one()
    assert reused == 3, "the done chunks of the failed attempt are marked reused, in SQL"
    assert [c.status for c in _chunks(new_id)] == ["done", "done", "done", "pending"]
    for i, data in shards.items():
        assert (out / f"chunk-{i:05d}.arrow").read_bytes() == data, f"chunk {i}: not the same bytes"
    assert not kept.exists(), "the kept folder is emptied by the take-over"
    assert run_chunk(new_id, 0) == "skipped:not-pending", "a reused chunk never runs"
    assert f"3 of 4 chunks reused from job {job_id} (sha256 verified)" in _events(new_id)

    assert run_chunk(new_id, 3) == "succeeded"
    job = _job(new_id)
    assert job.result["chunks_reused"]["summary"] == f"3 of 4 chunks reused from job {job_id}"
    from fastapi.testclient import TestClient

    from app.web.main import create_app

    with TestClient(create_app()) as client:  # the new attempt's page says it
        assert f"3 of 4 chunks reused from job {job_id}" in client.get(f"/jobs/{new_id}").text
    with session_scope() as session:  # reused chunks were never claimed by a worker
        moves = [(h.chunk_index, h.from_status, h.to_status) for h in state.history(session, new_id)
                 if h.chunk_index is not None]  # fmt: skip
    assert [m for m in moves if m[0] != 3] == [(i, "pending", "done") for i in (0, 1, 2)]
    cli = tmp_path / "cli"
    tokenize_files([src], cli, TokenizeOptions(tok, workers=1, on_missing="drop", **JOB_LIMITS))
    assert_same_dataset(cli, out)


def test_a_corrupt_or_missing_kept_chunk_runs_again(migrated: Path, small_dir: Path, tmp_path: Path) -> None:
    from app.run.chunks import run_chunk
    from app.run.job import run_job
    from app.run.resume import kept_dir

    job_id, src, tok, _ = _failed_with_three_done(migrated, small_dir)
    kept = kept_dir(job_id)
    corrupt = kept / "chunk-00001.arrow"
    data = bytearray(corrupt.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped: only the checksum can tell
    corrupt.write_bytes(bytes(data))
    (kept / "stats-00002.npz").unlink()

    new_id = _retry(job_id)
    assert run_job(new_id) == "handed-off"
    rows = _chunks(new_id)
    assert [(c.status, c.reused_from) for c in rows] == [
        ("done", job_id), ("pending", None), ("pending", None), ("pending", None)
    ]  # fmt: skip
    warning = next(m for m in _events(new_id) if m.startswith("2 done chunks of job"))
    assert (
        "chunk 1: its kept shard is corrupt" in warning and "chunk 2: its kept shard or statistics" in warning
    )
    assert [run_chunk(new_id, i) for i in (1, 2, 3)][-1] == "succeeded"
    cli = tmp_path / "cli"
    tokenize_files([src], cli, TokenizeOptions(tok, workers=1, on_missing="drop", **JOB_LIMITS))
    assert_same_dataset(cli, migrated / "data" / "out")


def test_changed_input_is_not_reused(migrated: Path, small_dir: Path) -> None:
    from app.run.job import run_job

    job_id, src, _, _ = _failed_with_three_done(migrated, small_dir)
    lines = src.read_text().splitlines()
    src.write_text("\n".join(lines[1:]) + "\n")  # every chunk's input shifts by one conversation
    new_id = _retry(job_id)
    assert run_job(new_id) == "handed-off"
    assert all(c.status == "pending" and c.reused_from is None for c in _chunks(new_id))
    assert any("its input, the tokenizer or the options changed" in m for m in _events(new_id))


def test_kept_chunks_are_deleted_after_the_retention_time(migrated: Path, small_dir: Path) -> None:
    from app.run.job import run_job
    from app.run.resume import kept_dir
    from app.run.sweeper import sweep
    from app.store.db import session_scope
    from app.store.models import Job

    job_id, _, _, _ = _failed_with_three_done(migrated, small_dir)
    with session_scope() as session:
        assert sweep(session, 30, keep_failed_chunks_hours=24).expired_kept == []
        assert kept_dir(job_id).is_dir()
        failed_at = _job(job_id).finished_at
        session.execute(
            update(Job).where(Job.id == job_id).values(finished_at=failed_at - timedelta(hours=25))  # type: ignore[arg-type]
        )
        session.commit()
        assert sweep(session, 30, keep_failed_chunks_hours=24).expired_kept == [job_id]
        assert sweep(session, 30, keep_failed_chunks_hours=24).expired_kept == []
    assert not kept_dir(job_id).exists()
    assert all(c.shard_path is None for c in _chunks(job_id))
    new_id = _retry(job_id)
    assert run_job(new_id) == "handed-off"
    assert [c.status for c in _chunks(new_id)] == ["pending"] * 4, "nothing left to reuse: all run"


def test_a_retry_with_every_chunk_reused_runs_the_final_step_at_once(
    migrated: Path, small_dir: Path, tmp_path: Path
) -> None:
    """The worker that claimed the final step died before it: every chunk is done, the job is lost.
    Its retry reuses every chunk and runs only the final step, in the job's own task."""
    from app.run.chunks import run_chunk
    from app.run.job import run_job
    from app.run.sweeper import sweep
    from app.store.db import session_scope
    from app.store.models import Job, JobChunk, utcnow

    out = migrated / "data" / "out"
    job_id, src, tok = _submit(migrated, small_dir, 30, chunk_rows=10, out=str(out))
    assert run_job(job_id) == "handed-off"
    with session_scope() as session:  # a dead worker holds the final step
        session.execute(update(JobChunk).where(col(JobChunk.job_id) == job_id, col(JobChunk.chunk_index) == 0)
                        .values(finalized_by="celery@dead"))  # fmt: skip
        session.commit()
    assert [run_chunk(job_id, c.chunk_index) for c in _chunks(job_id)] == ["done"] * 4
    with session_scope() as session:
        old = utcnow() - timedelta(hours=1)
        session.execute(update(Job).where(col(Job.id) == job_id).values(heartbeat_at=old))
        session.commit()
        assert sweep(session, 30).lost_jobs == [job_id]
    new_id = _retry(job_id)
    assert run_job(new_id) == "handed-off"
    assert all(c.reused_from == job_id for c in _chunks(new_id))
    job = _job(new_id)
    assert job.status == "succeeded", job.error
    assert f"4 of 4 chunks reused from job {job_id} (sha256 verified)" in _events(new_id)
    cli = tmp_path / "cli"
    tokenize_files([src], cli, TokenizeOptions(tok, workers=1, on_missing="drop", **JOB_LIMITS))
    assert_same_dataset(cli, out)
