"""Tokenize as chunk tasks with real workers, on both stacks: one worker and two workers give the
dataset of `draftdeck tokenize` (same rows, order and data; same statistics and manifest)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from fastapi.testclient import TestClient
from sqlmodel import col, select

from draftdeck.chat import testing
from tests.integration.conftest import Stack, wait_for
from tests.support.chunks import JOB_LIMITS, assert_same_dataset, write_chat_input

if TYPE_CHECKING:  # for the annotations; the tests import app/ inside their functions
    from app.store.models import JobChunk

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return testing.small_bpe_tokenizer(cache=tmp_path_factory.mktemp("tokenizers"))


@pytest.fixture
def client(stack: Stack) -> Iterator[TestClient]:
    from app.web.main import create_app

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
    from app.store.db import session_scope
    from app.store.models import JobChunk

    with session_scope() as session:
        rows = session.exec(
            select(JobChunk).where(col(JobChunk.job_id) == job_id).order_by(col(JobChunk.chunk_index))
        )
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
    # shards of shard_rows output rows, cut as the CLI cuts them (not one per chunk task)
    cli_shards = sorted(p.name for p in cli_out.glob("data-*.arrow"))
    assert [Path(o["path"]).name for o in one["outputs"]] == cli_shards and len(cli_shards) < n_chunks
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


def test_a_worker_keeps_its_tokenizer_for_the_next_job(
    stack: Stack, client: TestClient, small_tokenizer: Path
) -> None:
    """The worker's pool process loads the tokenizer for its first job only: a second job, with the same
    tokenizer copied to another folder, loads nothing (counted by the loads each chunk reports)."""
    for name in ("tok-a", "tok-b"):
        shutil.copytree(small_tokenizer, stack.data / name)
    src = write_chat_input(stack.data / "chat.jsonl", 30)
    stack.start_worker()
    wait_for(lambda: _ready(stack, 1), 60, "the worker", stack)
    jobs = [
        _run(
            client,
            stack,
            {
                "inputs": [str(src)],
                "tokenizer": str(stack.data / tok),
                "on_missing": "drop",
                "chunk_rows": 10,
                "out": str(stack.data / f"out-{tok}"),
            },
        )
        for tok in ("tok-a", "tok-b")
    ]
    per_chunk = [[c.report["encoder"]["tokenizer_loads"] for c in _chunk_rows(j["id"])] for j in jobs]
    assert len(per_chunk[0]) > 2 and per_chunk == [
        [1] + [0] * (len(per_chunk[0]) - 1),
        [0] * len(per_chunk[1]),
    ]
    assert [j["result"]["encoder"]["tokenizer_loads"] for j in jobs] == [1, 0]
    assert jobs[0]["result"]["encoder"]["tokenizer_load_seconds"] > 0
    assert jobs[1]["result"]["encoder"]["tokenizer_load_seconds"] == 0


def _chunk_rows(job_id: int) -> list:
    from app.store.db import session_scope
    from app.store.models import JobChunk

    with session_scope() as session:
        return list(
            session.exec(
                select(JobChunk).where(col(JobChunk.job_id) == job_id).order_by(col(JobChunk.chunk_index))
            )
        )


def _kill_running_chunk(stack: Stack, job_id: int, losses: int) -> str:
    """kill -9 the pool process running the job's chunk (its `losses`-th run); return its worker."""
    import os
    import signal

    def running() -> JobChunk | None:
        rows = _chunk_rows(job_id)
        return next((c for c in rows if c.status == "running" and c.worker and c.losses == losses), None)

    chunk = wait_for(running, 60, f"the chunk to run (losses={losses})", stack, every=0.05)
    pid = int(chunk.worker.rsplit(":", 1)[1])
    # Stopped first, then killed only once the chunk is seen still running: on a loaded machine this
    # process can be starved between the read and the kill while the chunk ends, and the kill then hits
    # the job's final step instead (the job failed "no heartbeat", not the loss the test is about).
    os.kill(pid, signal.SIGSTOP)
    try:
        still = running()
        statuses = [c.status for c in _chunk_rows(job_id)]
        assert still is not None and still.worker == chunk.worker, (
            f"the chunk ended before the kill: {statuses}"
        )
    finally:
        os.kill(pid, signal.SIGKILL)
    return str(chunk.worker)


def _submit_big(
    client: TestClient, stack: Stack, small_tokenizer: Path, *, heavy_tail: bool = False, **extra: object
) -> int:
    """A tokenize job on ~6,000 rows. `heavy_tail`: long rows fill the last chunk of 2,000, so that it
    runs for seconds, long after the others are done (a test can catch it running and kill it)."""
    tok = stack.data / "tok"
    shutil.copytree(small_tokenizer, tok)
    src = write_chat_input(stack.data / "big.jsonl", 6000)
    if heavy_tail:
        rows = len(src.read_text(encoding="utf-8").splitlines())
        answer = " ".join(f"Step {k}: add the next digit and carry the rest." for k in range(60))
        with src.open("a", encoding="utf-8") as f:
            for i in range(2000 - rows % 2000):
                prompt = f"Long question {i}: explain the whole sum."
                msgs = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
                f.write(json.dumps({"messages": msgs}) + "\n")
    params = {
        "inputs": [str(src)],
        "tokenizer": str(tok),
        "on_missing": "drop",
        "chunk_rows": 100_000,
        **extra,
    }
    r = client.post("/api/jobs", json={"kind": "tokenize", "params": params})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _wait_for_cleanup(stack: Stack, job_id: int) -> None:
    """The failure is committed first, then whoever failed the job (the sweeper of the web or of a
    worker) removes its partial files: the chunk folder goes away just after the status changes."""
    parts = stack.home / "jobs" / str(job_id) / "chunks"
    wait_for(lambda: not parts.exists(), 10, "the failed job's chunk files to be removed", stack)


def _ended(client: TestClient, job_id: int):
    return lambda: (
        (j := client.get(f"/api/jobs/{job_id}").json())["status"] not in ("queued", "running") and j
    )


def test_a_chunk_whose_worker_died_runs_again_once(
    stack: Stack, client: TestClient, small_tokenizer: Path
) -> None:
    """kill -9 of the process running a chunk: the sweeper finds the chunk by its own stale beat and
    runs it again once, on the live worker (its pool restarted the process); the job succeeds."""
    stack.start_worker()
    job_id = _submit_big(client, stack, small_tokenizer)
    dead = _kill_running_chunk(stack, job_id, 0)
    job = wait_for(_ended(client, job_id), 90, "the job to end", stack)
    assert job["status"] == "succeeded", (job["error"], stack.worker_logs())
    [chunk] = _chunk_rows(job_id)
    assert (chunk.status, chunk.losses) == ("done", 1) and chunk.worker != dead
    from app.store import state
    from app.store.db import session_scope

    with session_scope() as session:
        moves = [(h.from_status, h.to_status) for h in state.history(session, job_id) if h.chunk_index == 0]
    claim, lost_once, done = ("pending", "running"), ("running", "pending"), ("running", "done")
    assert moves == [claim, lost_once, claim, done]


def test_a_chunk_lost_twice_fails_the_job_and_retry_with_out_works(
    stack: Stack, client: TestClient, small_tokenizer: Path
) -> None:
    """Killed in the same chunk twice: the job fails "worker lost", naming the chunk; the chunk row
    is `lost`, never left `running`; no chunk input, shard or temporary is left; Retry (with `out`
    set) runs and succeeds."""
    stack.start_worker()
    out = stack.data / "out"
    # the long rows keep the chunk running for seconds: the second kill finds it running
    job_id = _submit_big(client, stack, small_tokenizer, out=str(out), heavy_tail=True)
    _kill_running_chunk(stack, job_id, 0)
    _kill_running_chunk(stack, job_id, 1)
    job = wait_for(_ended(client, job_id), 60, "the job to be marked lost", stack)
    assert job["status"] == "failed" and job["error"].startswith("worker lost: chunk 0 lost twice"), job
    assert job["outputs"] == []
    assert [c.status for c in _chunk_rows(job_id)] == ["lost"]
    _wait_for_cleanup(stack, job_id)
    assert not out.exists() or list(out.iterdir()) == [], "no chunk shard or .tmp- file left"
    r = client.post(f"/api/jobs/{job_id}/retry", json={})
    assert r.status_code == 201, r.text
    again = wait_for(_ended(client, r.json()["id"]), 90, "the retry to end", stack)
    assert again["status"] == "succeeded", again["error"]
    assert (out / "manifest.json").is_file()


def test_a_chunk_lost_with_no_live_worker_fails_the_job(
    stack: Stack, client: TestClient, small_tokenizer: Path
) -> None:
    """The whole worker killed mid-chunk (kill -9 of its process group): nobody serves the queue, so
    the job fails "worker lost" naming the chunk, within the lost-worker limit; the page says so."""
    import os
    import signal

    worker = stack.start_worker()
    job_id = _submit_big(client, stack, small_tokenizer)
    wait_for(lambda: any(c.status == "running" for c in _chunk_rows(job_id)), 60, "the chunk to run", stack)
    os.killpg(worker.pid, signal.SIGKILL)
    job = wait_for(_ended(client, job_id), 40, "the job to be marked lost", stack)
    assert job["status"] == "failed", job
    assert job["error"].startswith("worker lost: chunk 0 lost, and no live worker serves queue cpu"), job
    assert [c.status for c in _chunk_rows(job_id)] == ["lost"]
    _wait_for_cleanup(stack, job_id)


def test_retry_after_a_chunk_lost_twice_reuses_the_chunks_already_done(
    stack: Stack, client: TestClient, small_tokenizer: Path
) -> None:
    """A few chunks; the worker is killed twice in the last one after the others are done: the job
    fails "worker lost". Its Retry (with `out` set) takes over the done chunks, byte-identical, runs
    only the lost one, and says so."""
    import os
    import signal

    from sqlalchemy import func

    from app.store.db import session_scope
    from app.store.models import JobChunk

    stack.start_worker()
    out = stack.data / "out"
    job_id = _submit_big(client, stack, small_tokenizer, out=str(out), chunk_rows=2000, heavy_tail=True)
    shards: dict[int, bytes] = {}

    def last_running(losses: int) -> object:
        """The chunk that runs while all others are done (chunks run one at a time here)."""
        rows = _chunk_rows(job_id)
        if not rows:
            return None  # not planned yet
        assert len(rows) >= 3
        job = client.get(f"/api/jobs/{job_id}").json()
        assert job["status"] == "running", (job["status"], job["error"], [(c.status, c.losses) for c in rows])
        running = [c for c in rows if c.status == "running" and c.worker and c.losses == losses]
        done = [c for c in rows if c.status == "done"]
        return running[0] if len(running) == 1 and len(done) == len(rows) - 1 else None

    for losses in (0, 1):
        chunk = wait_for(
            lambda n=losses: last_running(n), 90, f"the last chunk to run ({losses})", stack, every=0.05
        )
        if not shards:
            shards = {
                c.chunk_index: Path(c.shard_path).read_bytes()
                for c in _chunk_rows(job_id)
                if c.status == "done"
            }
        os.kill(int(chunk.worker.rsplit(":", 1)[1]), signal.SIGKILL)
    n = len(_chunk_rows(job_id))
    lost = next(i for i in range(n) if i not in shards)
    job = wait_for(_ended(client, job_id), 60, "the job to be marked lost", stack)
    assert job["status"] == "failed" and job["error"].startswith(f"worker lost: chunk {lost} lost twice"), job
    _wait_for_cleanup(stack, job_id)
    assert list(out.iterdir()) == [], "out is empty: the done chunks wait in the job's own folder"

    r = client.post(f"/api/jobs/{job_id}/retry", json={})
    assert r.status_code == 201, r.text
    new_id = r.json()["id"]
    again = wait_for(_ended(client, new_id), 90, "the retry to end", stack)
    assert again["status"] == "succeeded", (again["error"], stack.worker_logs())
    with session_scope() as session:
        reused = session.exec(
            select(func.count()).where(JobChunk.job_id == new_id, JobChunk.reused_from == job_id)
        ).one()
    assert reused == n - 1
    rows = _chunk_rows(new_id)
    assert [c.worker is None for c in rows] == [i != lost for i in range(n)], "only the lost chunk ran"
    assert again["result"]["chunks_reused"]["summary"] == f"{n - 1} of {n} chunks reused from job {job_id}"
    # the reused shards make the same dataset as one clean run of the same input
    from draftdeck.tokenize.pipeline import TokenizeOptions, tokenize_files

    clean = stack.data / "clean"
    opts = TokenizeOptions(stack.data / "tok", workers=1, on_missing="drop", **JOB_LIMITS)
    tokenize_files([stack.data / "big.jsonl"], clean, opts)
    assert_same_dataset(clean, out)
