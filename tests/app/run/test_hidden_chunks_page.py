"""A chunked cache-hidden job's page: chunks done of all, and the finished chunks' rows, tokens and hidden
state bytes per second (tokenize's shows no bytes: tests/app/run/test_next_steps.py)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient


@pytest.fixture
def client(migrated: Path) -> Iterator[TestClient]:
    from app.web.main import create_app

    with TestClient(create_app()) as c:
        yield c


def test_a_chunked_cache_build_shows_rows_tokens_and_bytes_per_second(
    client: TestClient, migrated: Path
) -> None:
    from sqlmodel import col, update

    from app.store import records, state
    from app.store.db import session_scope
    from app.store.models import ChunkStatus, Job, JobChunk, JobStatus

    params = {"inputs": ["x"], "target": "t", "out": "c"}
    with session_scope() as s:
        job = records.create_job(s, "cache-hidden", params, "gpu")
        assert job.id is not None
        assert state.propose(s, job.id, JobStatus.RUNNING, "test", worker="w:1").accepted
        got = records.get_job(s, job.id)
        assert got is not None and got.started_at is not None
        s.execute(update(Job).where(col(Job.id) == job.id).values(
            progress_done=2, progress_total=4, progress_unit="chunks",
            heartbeat_at=got.started_at + timedelta(seconds=10)))  # fmt: skip
        for k in range(2):
            s.add(JobChunk(job_id=job.id, chunk_index=k, status=ChunkStatus.DONE, rows_out=15,
                           report={"tokens": 300, "bytes_written": 5 << 20}))  # fmt: skip
        s.add(JobChunk(job_id=job.id, chunk_index=2, status=ChunkStatus.RUNNING))
        s.commit()
    page = client.get(f"/jobs/{job.id}").text
    assert "3.0 rows/s · 60.0 tokens/s · 1.0 MiB/s · about 10.0 s left" in page
