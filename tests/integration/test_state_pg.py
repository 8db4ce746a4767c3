"""Job state on PostgreSQL: counts above 2^31 fit after migration 0004 (a 2.2 GB input's bytes),
history is written, and the liveness check reads one snapshot under read committed."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.services


def _running_job(session: Any, kind: str, inputs: list[str]) -> Any:
    from app.store import records, state
    from app.store.models import JobStatus

    job = records.create_job(session, kind, {"inputs": inputs}, "cpu")
    assert job.id is not None
    assert state.propose(session, job.id, JobStatus.RUNNING, "started").accepted
    return job


BIG = 2_202_034_233  # the progress_total that overflowed INTEGER on a 2.2 GB input


def test_counts_above_2_31_fit_after_the_migrations(pg_engine: Any) -> None:
    from sqlmodel import Session, select

    from app.store import records, state
    from app.store.models import Job, JobChunk, JobOutput

    with Session(pg_engine, expire_on_commit=False) as session:
        job = _running_job(session, "scan", ["big.jsonl"])
        assert records.record_progress(session, job.id, BIG - 1, BIG, "bytes") is False
        session.add(JobChunk(job_id=job.id, chunk_index=0, conversations=BIG, rows_in=BIG, bytes=BIG))
        session.add(JobOutput(job_id=job.id, path="/x", rows=BIG, bytes=4 * BIG, sha256="0" * 64))
        session.commit()
        row = session.exec(select(Job).where(Job.id == job.id)).one()
        session.refresh(row)
        assert (row.progress_done, row.progress_total) == (BIG - 1, BIG)
        assert session.exec(select(JobOutput.bytes)).one() == 4 * BIG
        assert session.exec(select(JobChunk.bytes)).one() == BIG
        assert [(h.from_status, h.to_status) for h in state.history(session, job.id)] == [
            ("queued", "running")
        ]


def test_a_claim_landing_mid_check_does_not_strand_the_job(pg_engine: Any) -> None:
    """Under read committed, a worker's claim (pending → running) landed between the two chunk queries
    of the liveness check: the first saw no running chunk, the second no pending one, and the sweeper
    failed a job whose chunk had just started (seen under CI load). The claim is made to land right
    after the check's first statement on the chunks; the job must not read as stranded."""
    from datetime import timedelta

    from sqlalchemy import event, update
    from sqlmodel import Session

    from app.run import liveness
    from app.store import records
    from app.store.models import ChunkStatus, JobChunk, utcnow

    with Session(pg_engine, expire_on_commit=False) as session:
        job = _running_job(session, "tokenize", ["a.jsonl"])
        job.heartbeat_at = utcnow() - timedelta(hours=1)  # its chunk's worker died: the job's beat is stale
        session.add(job)
        session.add(JobChunk(job_id=job.id, chunk_index=0, status=ChunkStatus.PENDING, sent_at=utcnow()))
        session.commit()
        liveness.beat(session, "celery@live", ["cpu"])
    claims: list[str] = []

    def claim_after_first_chunk_query(conn: object, cursor: object, statement: str, *rest: object) -> None:
        if "job_chunks" in statement and not claims:
            claims.append(statement)
            with pg_engine.connect() as other:  # the worker, committing its claim
                now = utcnow()
                other.execute(
                    update(JobChunk)
                    .where(JobChunk.job_id == job.id)
                    .values(
                        status=ChunkStatus.RUNNING, worker="celery@live:1", started_at=now, heartbeat_at=now
                    )
                )
                other.commit()

    event.listen(pg_engine, "after_cursor_execute", claim_after_first_chunk_query)
    try:
        with Session(pg_engine, expire_on_commit=False) as session:
            live = liveness.of_job(session, records.get_job(session, job.id), 30.0)  # type: ignore[arg-type]
    finally:
        event.remove(pg_engine, "after_cursor_execute", claim_after_first_chunk_query)
    assert claims, "the claim landed during the check"
    assert not live.stranded, live.reason
