"""Tokenize as chunk tasks with real workers, on both stacks: one worker and two workers give the
dataset of `draftdeck tokenize` (same rows, order and data; same statistics and manifest)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import select

from draftdeck.chat import testing
from tests.chunk_helpers import assert_same_dataset, write_chat_input
from tests.integration.conftest import Stack, wait_for

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return testing.small_bpe_tokenizer(cache=tmp_path_factory.mktemp("tokenizers"))


@pytest.fixture
def client(stack: Stack) -> Iterator[TestClient]:
    from app.main import create_app

    with TestClient(create_app()) as c:
        yield c


def _ready(stack: Stack, n: int) -> bool:
    logs = sorted(stack.home.glob("worker-*.log"))
    return len(logs) >= n and all(b"ready." in p.read_bytes() for p in logs[:n])


def _run(client: TestClient, stack: Stack, params: dict) -> dict:
    r = client.post("/api/jobs", json={"kind": "tokenize", "params": params})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]

    def ended() -> dict | None:
        job = client.get(f"/api/jobs/{job_id}").json()
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    job = wait_for(ended, 60, f"tokenize job {job_id} to end", stack)
    assert job["status"] == "succeeded", (job.get("error"), stack.worker_logs())
    return job


def _chunk_workers(job_id: int) -> list[str]:
    from app.db import session_scope
    from app.models import JobChunk

    with session_scope() as session:
        rows = session.exec(select(JobChunk).where(JobChunk.job_id == job_id).order_by(JobChunk.chunk_index))
        chunks = list(rows)
    assert chunks and all(c.status == "done" for c in chunks)
    return [c.worker or "" for c in chunks]


def test_one_and_two_workers_give_the_cli_dataset(
    stack: Stack, client: TestClient, small_tokenizer: Path
) -> None:
    from typer.testing import CliRunner

    from draftdeck.cli import app

    started = time.monotonic()
    tok = stack.data / "tok"
    shutil.copytree(small_tokenizer, tok)
    src = write_chat_input(stack.data / "chat.jsonl", 90)
    params = {"inputs": [str(src)], "tokenizer": str(tok), "on_missing": "drop", "seq_length": 96,
              "shard_rows": 40, "chunk_rows": 6}  # fmt: skip

    cli_out = stack.home / "cli-ds"
    args = ["tokenize", str(src), "--tokenizer", str(tok), "--out", str(cli_out), "--on-missing", "drop",
            "--seq-length", "96", "--shard-rows", "40"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output

    stack.start_worker()
    wait_for(lambda: _ready(stack, 1), 60, "the first worker", stack)
    one = _run(client, stack, {**params, "out": str(stack.data / "one")})
    n_chunks = len(_chunk_workers(one["id"]))
    assert n_chunks > 10
    assert len(set(_chunk_workers(one["id"]))) == 1
    assert [Path(o["path"]).name for o in one["outputs"]] == [
        f"data-{i:05d}-of-{n_chunks:05d}.arrow" for i in range(n_chunks)
    ]
    assert one["result"]["rows_out"] == sum(o["rows"] for o in one["outputs"])
    # the dataset is registered by the success transition: no GET needed
    assert [d["path"] for d in one["datasets"]] == [str((stack.data / "one").resolve())]
    assert (one["progress_done"], one["progress_total"]) == (one["result"]["rows_in"],) * 2

    stack.start_worker()
    wait_for(lambda: _ready(stack, 2), 60, "the second worker", stack)
    two = _run(client, stack, {**params, "out": str(stack.data / "two")})
    workers = _chunk_workers(two["id"])
    assert len(set(workers)) == 2, f"one worker ran every chunk: {workers}"

    assert_same_dataset(cli_out, stack.data / "one")
    assert_same_dataset(cli_out, stack.data / "two")
    assert [o["sha256"] for o in one["outputs"]] == [o["sha256"] for o in two["outputs"]]
    assert one["result"]["rejected"] == two["result"]["rejected"]
    assert time.monotonic() - started < 90


def test_a_worker_killed_in_a_chunk_marks_the_job_lost(
    stack: Stack, client: TestClient, small_tokenizer: Path
) -> None:
    """kill -9 of the process running a chunk: the beat stops, the sweeper marks the job lost (never
    left running), the redelivered chunk message does not run the chunk twice, no output is recorded."""
    import os
    import signal

    from app.db import session_scope
    from app.models import JobChunk

    tok = stack.data / "tok"
    shutil.copytree(small_tokenizer, tok)
    src = write_chat_input(stack.data / "big.jsonl", 6000)
    stack.start_worker()
    params = {"inputs": [str(src)], "tokenizer": str(tok), "on_missing": "drop", "chunk_rows": 100_000}
    r = client.post("/api/jobs", json={"kind": "tokenize", "params": params})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]

    def running_chunk() -> JobChunk | None:
        with session_scope() as session:
            rows = list(session.exec(select(JobChunk).where(JobChunk.job_id == job_id)))
        return next((c for c in rows if c.status == "running" and c.worker), None)

    chunk = wait_for(running_chunk, 60, "the chunk to run", stack, every=0.05)
    os.kill(int(chunk.worker.rsplit(":", 1)[1]), signal.SIGKILL)
    job = wait_for(
        lambda: (j := client.get(f"/api/jobs/{job_id}").json())["status"] != "running" and j,
        60,
        "the job to be marked lost",
        stack,
    )
    assert job["status"] == "failed" and job["error"].startswith("worker lost"), job
    assert job["outputs"] == []
    with session_scope() as session:
        [after] = list(session.exec(select(JobChunk).where(JobChunk.job_id == job_id)))
    assert after.status == "running" and after.worker == chunk.worker, "the chunk ran once"
    assert not (stack.home / "jobs" / str(job_id) / "dataset" / "manifest.json").exists()
