"""The job system end to end with real worker processes, on both stacks (embedded and services)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.integration.conftest import Stack, wait_for

pytestmark = [pytest.mark.services, pytest.mark.slow]


@pytest.fixture
def client(stack: Stack) -> Iterator[TestClient]:
    from app.web.main import create_app

    with TestClient(create_app()) as c:
        yield c


def _job(client: TestClient, job_id: int) -> dict:
    r = client.get(f"/api/jobs/{job_id}")
    assert r.status_code == 200, r.text
    return r.json()


def _submit(client: TestClient, path: str) -> int:
    r = client.post("/api/jobs", json={"kind": "scan", "params": {"inputs": [path]}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _ended(client: TestClient, job_id: int):
    def check() -> dict | None:
        job = _job(client, job_id)
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    return check


def test_scan_job_succeeds_through_a_real_worker(stack: Stack, client: TestClient) -> None:
    (stack.data / "chat.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'
        '\n{"conversations": []}\nnot json\n',
        encoding="utf-8",
    )
    stack.start_worker()
    job_id = _submit(client, "data/chat.jsonl")
    job = wait_for(_ended(client, job_id), 60, "the scan to end", stack)
    assert job["status"] == "succeeded", job
    result = job["result"]
    # rows_out: the rows convert would keep (an empty conversation it would not)
    assert (result["rows_in"], result["rows_out"]) == (3, 1)
    assert result["rejected"] == {"json_error": 1, "empty_conversation": 1}
    examples = {item["code"]: item["example"] for item in result["would_reject"]}
    assert (examples["empty_conversation"]["row"], examples["json_error"]["row"]) == (3, 4)
    assert {tuple(k["keys"]) for k in result["keysets"]} == {("messages",), ("conversations",)}
    assert result["examples"]["json_error"][0]["line"] == 4
    assert job["worker"] and job["started_at"] and job["finished_at"]
    [output] = job["outputs"]
    assert output["rows"] == 0 and Path(output["path"]).is_file()  # a report: it holds no rows
    issues = [e for e in job["events"] if e["code"] == "json_error"]
    assert issues and issues[0]["count"] == 1 and issues[0]["level"] == "rejected"


def test_empty_file_fails_and_raises_an_alert(stack: Stack, client: TestClient) -> None:
    (stack.data / "empty.jsonl").write_bytes(b"")
    stack.start_worker()
    job_id = _submit(client, "data/empty.jsonl")
    job = wait_for(_ended(client, job_id), 60, "the scan to end", stack)
    assert job["status"] == "failed"
    assert "empty input" in job["error"]
    alerts = client.get("/api/alerts", params={"acknowledged": False}).json()
    assert [a["kind"] for a in alerts if a["job_id"] == job_id] == ["empty_output"]
    ack = client.post(f"/api/alerts/{alerts[0]['id']}/ack", json={})
    assert ack.status_code == 200 and ack.json()["acknowledged"] is True


def test_cancel_a_running_job(stack: Stack, client: TestClient) -> None:
    fifo = stack.data / "slow.jsonl"
    os.mkfifo(fifo)
    release = threading.Event()

    def writer() -> None:
        try:
            with open(fifo, "wb") as f:
                f.write(b'{"a": 1}\n' * 1000)
                f.flush()
                release.wait(60)
                for _ in range(2000):  # slowly, so the scan reports progress (and sees the cancel) again
                    f.write(b'{"a": 1}\n' * 20)
                    f.flush()
                    time.sleep(0.01)
        except BrokenPipeError:
            pass

    threading.Thread(target=writer, daemon=True).start()
    stack.start_worker()
    job_id = _submit(client, "data/slow.jsonl")
    wait_for(lambda: _job(client, job_id)["status"] == "running", 60, "the job to start", stack)
    r = client.post(f"/api/jobs/{job_id}/cancel", json={})
    assert r.status_code == 200 and r.json()["status"] == "running"
    release.set()
    job = wait_for(_ended(client, job_id), 60, "the cancellation", stack)
    assert job["status"] == "cancelled"
    assert client.post(f"/api/jobs/{job_id}/cancel", json={}).status_code == 409


def test_killed_worker_is_detected_and_retry_succeeds(stack: Stack, client: TestClient) -> None:
    """kill -9 of the process running a long scan: the job is marked lost within 60 s, never left
    running; a retry is a new attempt that succeeds; no output is recorded twice."""
    fifo = stack.data / "long.jsonl"
    os.mkfifo(fifo)
    stop = threading.Event()

    def writer() -> None:  # a scan that never ends until its reader dies
        try:
            with open(fifo, "wb") as f:
                while not stop.is_set():
                    f.write(b'{"messages": []}\n' * 100)
                    f.flush()
                    stop.wait(0.05)
        except (BrokenPipeError, OSError):
            pass

    threading.Thread(target=writer, daemon=True).start()
    stack.start_worker()
    job_id = _submit(client, "data/long.jsonl")
    job = wait_for(
        lambda: (j := _job(client, job_id))["status"] == "running" and j["worker"] and j,
        60,
        "the job to run",
        stack,
    )
    pid = int(job["worker"].rsplit(":", 1)[1])
    os.kill(pid, signal.SIGKILL)
    killed_at = _job(client, job_id)
    assert killed_at["status"] == "running"

    lost = wait_for(
        lambda: (j := _job(client, job_id))["status"] != "running" and j,
        60,
        "the job to be marked lost",
        stack,
    )
    stop.set()
    assert lost["status"] == "failed" and lost["error"].startswith("worker lost"), lost
    assert lost["outputs"] == []
    assert sum("started on" in e["message"] for e in lost["events"]) == 1, "the lost job must not run twice"
    alerts = client.get("/api/alerts").json()
    assert any(a["kind"] == "worker_lost" and a["job_id"] == job_id for a in alerts)

    fifo.unlink()
    fifo.write_bytes(
        b"".join(
            b'{"messages": [{"role": "user", "content": "q%d"}, {"role": "assistant", "content": "a%d"}]}\n'
            % (i, i)
            for i in range(10)
        )
    )  # ten rows convert would keep (the scan's rows out)
    r = client.post(f"/api/jobs/{job_id}/retry", json={})
    assert r.status_code == 201, r.text
    retry_id = r.json()["id"]
    assert retry_id != job_id
    retried = wait_for(_ended(client, retry_id), 60, "the retry to end", stack)
    assert retried["status"] == "succeeded", retried
    assert retried["attempt"] == 2 and retried["retry_of"] == job_id
    assert len(retried["outputs"]) == 1 and retried["result"]["rows_out"] == 10
    assert _job(client, job_id)["outputs"] == [], "the lost attempt gained no output later"


def test_a_job_whose_message_the_broker_lost_is_sent_again(stack: Stack, client: TestClient) -> None:
    """SQL is the source of truth: the broker loses the queued job's message (Redis restarted without
    its data: FLUSHDB, bindings included; the file broker's message file deleted); the sweeper sends
    it again once it is older than the lost-worker limit, and the job runs exactly once."""
    (stack.data / "chat.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'
    )  # a row convert keeps: the scan passes
    job_id = _submit(client, "data/chat.jsonl")
    if stack.mode == "services":
        import redis

        client_ = redis.Redis.from_url(stack.env["REDIS_URL"])
        assert client_.llen("cpu") == 1
        client_.flushdb()
    else:
        [message] = list((stack.home / "broker" / "queue").iterdir())
        message.unlink()
    stack.start_worker()
    job = wait_for(_ended(client, job_id), 60, "the re-sent job to end", stack)
    assert job["status"] == "succeeded", job
    assert sum("started on" in e["message"] for e in job["events"]) == 1
