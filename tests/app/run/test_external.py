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
from app.settings import get_settings
from app.store.db import session_scope
from app.store.models import Job, utcnow

PARAMS = {
    "inputs": ["/cluster/ds"],
    "target": "/cluster/Qwen3.6-27B",
    "out": "/cluster/runs/r1",
    "sharding": "fsdp",
}


@pytest.fixture
def client(migrated: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    from app.web.main import create_app

    # the cluster's shared filesystem is among the server's data roots: the run's paths lie within them
    monkeypatch.setenv("DRAFTDECK_DATA_ROOTS", f"{migrated}:/cluster")
    get_settings.cache_clear()
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
    result = {"rows_in": 80, "rows_out": 80, "steps": 100}
    end = {"seq": 5, "kind": "end", "status": "succeeded", "message": "100 steps", "result": result}
    assert _report(client, job_id, end)["status"] == "succeeded"
    job = client.get(f"/api/jobs/{job_id}").json()
    assert job["result"] == result and job["events"][-1]["message"] == "succeeded: 100 steps"
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
        json={"items": [{"seq": 1, "kind": "file", "name": "../../etc/x", "text": "{}"}]},
    )
    assert bad.status_code == 422 and "'run.json' or 'checkpoints/index.json'" in bad.text
    assert _report(client, job_id)["acked"] == 0  # nothing applied
    r = client.post("/api/runs", json={"key": "k2", "params": {**PARAMS, "block_size": 1}})
    assert r.status_code == 400 and "block_size" in r.json()["detail"]
    # a run's paths lie within the data roots, as every path that arrives over HTTP
    r = client.post("/api/runs", json={"key": "k3", "params": {**PARAMS, "target": "/etc/Qwen3"}})
    assert r.status_code == 400 and "/etc/Qwen3: outside the data roots" in r.json()["detail"]
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


# Each a report item a reporter of another version (or a hand) could send: refused naming the field,
# before anything is stored, so no page can break on it (issue 48).
MISTYPED = {
    "progress total 'many'": ({"kind": "progress", "done": 5, "total": "many"}, "total"),
    "progress done past 2^53": ({"kind": "progress", "done": 2**63}, "done"),
    "a string at": ({"kind": "metrics", "step": 1, "values": {"loss": 1.0}, "at": "x" * 100_000}, "at"),
    "at 1e300": ({"kind": "metrics", "step": 1, "values": {"loss": 1.0}, "at": 1e300}, "at"),
    "tokens 'lots'": ({"kind": "metrics", "step": 1, "values": {"loss": 1.0}, "tokens": "lots"}, "tokens"),
    "step past 2^63": ({"kind": "metrics", "step": 2**64, "values": {}}, "step"),
    "a value that is text": ({"kind": "metrics", "step": 1, "values": {"loss": "low"}}, "values"),
    "a result's rejected as a list": (
        {"kind": "end", "status": "succeeded", "result": {"rows_in": 1, "rows_out": 1, "rejected": [1, 2]}},
        "rejected",
    ),
    "a result the page would read as an eval's": (
        {
            "kind": "end",
            "status": "succeeded",
            "result": {"rows_in": 1, "rows_out": 1, "eval": {"methods": 1}},
        },
        "eval",
    ),
    "an unknown level": ({"kind": "event", "level": "loud", "message": "x"}, "level"),
    "a mirrored file that is not JSON": ({"kind": "file", "name": "run.json", "text": "nope"}, "text"),
    "an unknown kind": ({"kind": "shell", "command": "rm"}, "kind"),
    "a seq of 0": ({"kind": "progress", "done": 1, "seq": 0}, "seq"),
}


@pytest.mark.parametrize("item,field", MISTYPED.values(), ids=MISTYPED.keys())
def test_a_mistyped_item_is_refused_naming_its_field_and_every_page_still_answers(
    client: TestClient, item: dict[str, Any], field: str
) -> None:
    job_id = _register(client)
    r = client.post(f"/api/jobs/{job_id}/report", json={"items": [{"seq": 1, **item}]})
    assert r.status_code == 422, r.text
    assert any(field in ".".join(map(str, e["loc"])) + e["msg"] for e in r.json()["detail"]), r.text
    assert _report(client, job_id)["acked"] == 0
    for page in ("/", "/jobs", "/jobs/table", "/api/jobs", f"/api/jobs/{job_id}", f"/jobs/{job_id}", "/runs"):
        assert client.get(page).status_code in (200, 303), page
    data = client.get(f"/runs/data?jobs={job_id}&names=loss")
    assert data.status_code == 200


def test_registration_is_bounded(client: TestClient) -> None:
    for body, field in (
        ({"key": "k", "params": PARAMS, "world": -5}, "world"),
        ({"key": "", "params": PARAMS}, "key"),
        ({"key": "k", "params": PARAMS, "host": "h" * 300}, "host"),
    ):
        r = client.post("/api/runs", json=body)
        assert r.status_code == 422 and field in r.text, r.text


def test_rows_stored_by_an_older_version_show_as_such(client: TestClient, migrated: Path) -> None:
    """Before reports were checked, SQLite kept text in an integer column and any JSON as a result: the
    pages still answer, and the job page says the result is not one it can show."""
    from alembic import command
    from sqlalchemy import text

    from app.store.db import alembic_config, upgrade

    job_id = _register(client)
    _report(client, job_id, {"seq": 1, "kind": "metrics", "step": 3, "values": {"train/loss": 2.0}})
    command.downgrade(alembic_config(get_settings().db_url), "0010")  # the version that kept them
    with session_scope() as session:
        session.execute(
            text("UPDATE jobs SET progress_done = 5, progress_total = 'many', result = :r WHERE id = :id"),
            {"r": '{"rows_in": 1, "rows_out": 1, "rejected": [1, 2], "eval": {"methods": 3}}', "id": job_id},
        )
        session.execute(text("UPDATE metric_points SET tokens = 'lots', wall_ms = 'xx' WHERE job_id = :id"),
                        {"id": job_id})  # fmt: skip
        session.commit()
    upgrade()
    for page in ("/", "/jobs", "/jobs/table", "/api/jobs", f"/api/jobs/{job_id}", "/runs", f"/runs/{job_id}"):
        assert client.get(page).status_code in (200, 303), page
    assert client.get(f"/runs/data?jobs={job_id}&names=train/loss&x=tokens").status_code == 200
    job_page = client.get(f"/jobs/{job_id}")
    assert job_page.status_code == 200
    assert "its reported result is not one this page can show" in job_page.text
