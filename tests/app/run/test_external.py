"""A run launched outside the job system reports to a job (app/run/external.py) over the JSON API:
items apply once and in order, the run page's files are mirrored, its end is recorded, a relaunch
continues or starts the next attempt, Cancel reaches it, and a silent reporter is marked lost."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from app.run.sweeper import mark_lost_jobs
from app.store.db import session_scope
from app.store.models import Job, utcnow

PARAMS = {
    "inputs": ["/cluster/ds"],
    "target": "/cluster/Qwen3.6-27B",
    "out": "/cluster/runs/r1",
    "sharding": "fsdp",
}


@pytest.fixture
def client(migrated: Path) -> Iterator[TestClient]:
    from app.web.main import create_app

    with TestClient(create_app()) as c:
        yield c


def _register(client: TestClient, key: str = "k1") -> int:
    r = client.post(
        "/api/runs",
        json={"key": key, "params": PARAMS, "host": "node7", "run_folder": "/cluster/runs/r1", "world": 16},
    )
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _report(client: TestClient, job_id: int, *items: dict[str, Any]) -> dict[str, Any]:
    r = client.post(f"/api/jobs/{job_id}/report", json={"items": list(items)})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _points(job_id: int, name: str) -> list[tuple[int, float | None]]:
    from sqlmodel import select

    from app.store.models import MetricValue

    with session_scope() as session:
        rows = session.exec(
            select(MetricValue.step, MetricValue.value).where(
                MetricValue.job_id == job_id, MetricValue.name == name
            )
        ).all()
    return [(int(step), value) for step, value in rows]


def test_items_apply_once_in_order_and_the_end_is_recorded(client: TestClient, migrated: Path) -> None:
    job_id = _register(client)
    job = client.get(f"/api/jobs/{job_id}").json()
    assert (job["status"], job["queue"], job["worker"]) == ("running", "external", "external:node7")
    assert job["params"]["out"] == str(migrated / "jobs" / str(job_id))  # the run page reads the mirror
    assert "node7 (16 ranks); its run folder there: /cluster/runs/r1" in job["events"][-1]["message"]
    loss = {
        "seq": 1,
        "kind": "metrics",
        "step": 10,
        "values": {"train/loss": 2.5, "train/lr": None},
        "tokens": 640,
        "at": 1.7e9,
    }
    event = {
        "seq": 2,
        "kind": "event",
        "level": "warning",
        "message": "12 rows truncated",
        "code": "truncated",
        "count": 12,
    }
    gap = {"seq": 4, "kind": "progress", "done": 20, "total": 100, "unit": "steps"}
    ack = _report(client, job_id, loss, event, gap)
    assert ack == {"acked": 2, "status": "running", "cancel": False}  # item 4 waits for item 3
    run_json = {"seq": 3, "kind": "file", "name": "run.json", "text": '{"world_size": 16}'}
    ack = _report(client, job_id, loss, event, run_json, gap)  # the first two again: applied once
    assert ack["acked"] == 4
    assert _points(job_id, "train/loss") == [(10, 2.5)] and _points(job_id, "train/lr") == [(10, None)]
    job = client.get(f"/api/jobs/{job_id}").json()
    assert [e["message"] for e in job["events"]].count("12 rows truncated") == 1
    assert (job["progress_done"], job["progress_total"], job["progress_unit"]) == (20, 100, "steps")
    assert (migrated / "jobs" / str(job_id) / "run.json").read_text() == '{"world_size": 16}'
    end = {"seq": 5, "kind": "end", "status": "succeeded", "message": "100 steps", "result": {"steps": 100}}
    assert _report(client, job_id, end)["status"] == "succeeded"
    job = client.get(f"/api/jobs/{job_id}").json()
    assert job["result"] == {"steps": 100} and job["events"][-1]["message"] == "succeeded: 100 steps"
    # relaunched after it ended: the next attempt; relaunched while that runs: the same job
    again = _register(client)
    assert again != job_id and client.get(f"/api/jobs/{again}").json()["retry_of"] == job_id
    assert _register(client) == again


def test_cancel_reaches_the_run_and_its_end_says_cancelled(client: TestClient) -> None:
    job_id = _register(client)
    assert client.post(f"/api/jobs/{job_id}/cancel", json={}).json()["status"] == "running"  # it beats
    assert _report(client, job_id)["cancel"] is True  # the next heartbeat tells the run
    _report(
        client, job_id, {"seq": 1, "kind": "end", "status": "cancelled", "message": "cancelled at step 7"}
    )
    job = client.get(f"/api/jobs/{job_id}").json()
    assert job["status"] == "cancelled"
    retry = client.post(f"/api/jobs/{job_id}/retry", json={})
    assert retry.status_code == 409 and "relaunch it there" in retry.json()["detail"]


def test_refusals_name_the_reason(client: TestClient) -> None:
    job_id = _register(client)
    bad = client.post(
        f"/api/jobs/{job_id}/report",
        json={"items": [{"seq": 1, "kind": "file", "name": "../../etc/x", "text": ""}]},
    )
    assert bad.status_code == 400 and "mirrors only run.json" in bad.json()["detail"]
    assert _report(client, job_id)["acked"] == 0  # nothing applied
    r = client.post("/api/runs", json={"key": "k2", "params": {**PARAMS, "block_size": 1}})
    assert r.status_code == 400 and "block_size" in r.json()["detail"]
    scan = client.post("/api/jobs", json={"kind": "scan", "params": {"inputs": []}})
    other = scan.json().get("id", 10_000)
    assert client.post(f"/api/jobs/{other}/report", json={"items": []}).status_code == 404


def test_a_silent_reporter_is_marked_lost(client: TestClient) -> None:
    job_id = _register(client)
    with session_scope() as session:
        old = utcnow() - timedelta(hours=1)
        session.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=old))  # type: ignore[arg-type]
        session.commit()
        assert mark_lost_jobs(session, 60) == [job_id]
    job = client.get(f"/api/jobs/{job_id}").json()
    assert job["status"] == "failed" and "its reporter (external:node7) sent nothing for 60 s" in job["error"]
    assert (
        _report(client, job_id, {"seq": 1, "kind": "progress", "done": 1})["acked"] == 0
    )  # ended: not applied
