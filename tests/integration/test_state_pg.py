"""Migration 0004 on PostgreSQL: counts above 2^31 fit (a 2.2 GB input's bytes), history is written."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.services

BIG = 2_202_034_233  # the progress_total that overflowed INTEGER on a 2.2 GB input


def test_counts_above_2_31_fit_after_the_migrations(pg_url: str) -> None:
    from sqlmodel import Session, select

    from app import records, state
    from app.db import make_engine, upgrade
    from app.models import Job, JobChunk, JobOutput, JobStatus

    upgrade(pg_url)
    engine = make_engine(pg_url)
    try:
        with Session(engine, expire_on_commit=False) as session:
            job = records.create_job(session, "scan", {"inputs": ["big.jsonl"]}, "cpu")
            assert job.id is not None
            assert state.propose(session, job.id, JobStatus.RUNNING, "started").accepted
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
    finally:
        engine.dispose()
