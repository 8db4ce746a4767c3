"""The event streams of the live pages (app/web/sse.py) on a real SQLite home: what they send, that they
end at a terminal status, and that a reconnect with Last-Event-ID resumes without duplicates."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.store import records as jobs
from app.store import state
from app.store.db import get_engine
from app.store.models import JobStatus
from app.web import sse


@pytest.fixture
def client(migrated: Path) -> Iterator[TestClient]:
    from app.web.main import create_app

    with TestClient(create_app()) as c:
        yield c


def parse(text: str) -> list[dict[str, Any]]:
    """SSE text -> [{"event", "id", "data"}], comments and the retry line left out."""
    out = []
    for block in text.split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.splitlines():
            name, _, value = line.partition(": ")
            if name in ("event", "id"):
                fields[name] = value
            elif name == "data":
                fields["data"] = json.loads(value)
        if "event" in fields:
            out.append(fields)
    return out


def new_job(session: Session) -> int:
    job = jobs.create_job(session, "scan", {"inputs": ["x.jsonl"]}, "cpu")
    assert job.id is not None
    return job.id


def finish(session: Session, job_id: int, status: JobStatus = JobStatus.SUCCEEDED) -> None:
    # each accepted change writes its reason as the job's event, in the same transaction
    assert state.propose(session, job_id, JobStatus.RUNNING, "started on w1", worker="w1").accepted
    assert state.propose(session, job_id, status, f"{status}: done").accepted


def test_a_finished_job_streams_its_state_and_log_then_ends(client: TestClient) -> None:
    with Session(get_engine()) as session:
        job_id = new_job(session)
        finish(session, job_id)
    r = client.get(f"/jobs/{job_id}/events")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    msgs = parse(r.text)
    assert [m["event"] for m in msgs] == ["job", "alerts", "log", "end"]
    assert msgs[0]["data"]["status"] == "succeeded" and msgs[0]["data"]["terminal"] is True
    assert msgs[1]["data"] == {"open": 0}
    assert [e["message"] for e in msgs[2]["data"]] == ["queued on cpu", "started on w1", "succeeded: done"]
    assert msgs[3]["data"] == {"status": "succeeded"}
    last = msgs[2]["data"][-1]["id"]
    assert msgs[2]["id"] == msgs[3]["id"] == f"log={last}"


def test_reconnect_with_last_event_id_resumes_without_duplicates(client: TestClient) -> None:
    with Session(get_engine()) as session:
        job_id = new_job(session)
        finish(session, job_id)
    first = parse(client.get(f"/jobs/{job_id}/events").text)
    ids = [e["id"] for e in first[2]["data"]]
    resumed = parse(client.get(f"/jobs/{job_id}/events", headers={"Last-Event-ID": f"log={ids[0]}"}).text)
    logs = [m for m in resumed if m["event"] == "log"]
    assert [e["id"] for m in logs for e in m["data"]] == ids[1:]
    # The header wins over the page's starting cursor, and a cursor past the end sends no log at all.
    caught_up = client.get(f"/jobs/{job_id}/events?log=0", headers={"Last-Event-ID": f"log={ids[-1]}"})
    assert [m["event"] for m in parse(caught_up.text)] == ["job", "alerts", "end"]
    from_page = parse(client.get(f"/jobs/{job_id}/events?log={ids[1]}").text)
    assert [e["id"] for m in from_page if m["event"] == "log" for e in m["data"]] == ids[2:]


def test_a_running_job_streams_progress_and_its_last_events_before_end(migrated: Path) -> None:
    """Driven by the stream's own messages, not a clock: each change is made once the stream has sent
    the state before it, while the stream waits. (Fixed sleeps in a worker thread needed the client to
    connect within 1.5 s, which a loaded machine missed; the route's wiring is the finished-job test's.)"""
    with Session(get_engine()) as session:
        job_id = new_job(session)
        assert state.propose(session, job_id, JobStatus.RUNNING, "test").accepted

    def change_after(shown: dict[str, Any]) -> None:
        label = shown["progress"]["label"]
        with Session(get_engine()) as session:
            if shown["status"] == "running" and label == "":
                jobs.record_progress(session, job_id, 10, 40, "rows")
            elif label == "25% of 40 rows":
                jobs.record_progress(session, job_id, 20, 40, "rows")
            elif label == "50% of 40 rows":
                assert state.propose(
                    session, job_id, JobStatus.FAILED, "boom"
                ).accepted  # event in the same transaction
                jobs.raise_alert(session, "job_failed", "boom", job_id=job_id)

    async def run() -> list[dict[str, Any]]:
        msgs: list[dict[str, Any]] = []
        with anyio.fail_after(60):  # a bound for a broken stream only; no timing is checked
            async for chunk in sse.events(sse.job_stream(job_id), poll_seconds=0.02):
                for m in parse(chunk):
                    msgs.append(m)
                    if m["event"] == "job":
                        change_after(m["data"])
        return msgs

    msgs = anyio.run(run)
    states = [m["data"] for m in msgs if m["event"] == "job"]
    # The job's state carries its alert count, so a poll between the FAILED commit and the alert's
    # commit sends "failed" twice (0 alerts, then 1): consecutive repeats are one step here.
    progress = [(s["status"], s["progress"]["label"]) for s in states]
    progress = [p for i, p in enumerate(progress) if i == 0 or p != progress[i - 1]]
    assert states[-1]["alerts"] == 1
    assert progress == [
        ("running", ""),
        ("running", "25% of 40 rows"),
        ("running", "50% of 40 rows"),
        ("failed", "40 rows"),
    ]
    assert states[-1]["error"] == "boom"
    assert [m["data"] for m in msgs if m["event"] == "alerts"] == [{"open": 0}, {"open": 1}]
    logged = [e["message"] for m in msgs if m["event"] == "log" for e in m["data"]]
    assert logged == ["queued on cpu", "test", "boom"]
    assert msgs[-1]["event"] == "end" and msgs[-1]["data"] == {"status": "failed"}


def test_bad_requests_say_what_is_wrong(client: TestClient) -> None:
    assert client.get("/jobs/999/events").json() == {"detail": "no job 999"}
    with Session(get_engine()) as session:
        job_id = new_job(session)
    r = client.get(f"/jobs/{job_id}/events", headers={"Last-Event-ID": "log=abc"})
    assert r.status_code == 400 and "expected name=integer pairs like log=12, got 'log=abc'" in r.text
    r = client.get("/jobs/events?active=1,x")
    assert r.status_code == 400 and "active: expected comma-separated job ids" in r.text


def take(stream: sse.Stream, seconds: float, poll_seconds: float = 0.05) -> list[dict[str, Any]]:
    """Everything a never-ending stream sends in `seconds`."""

    async def run() -> str:
        text = ""
        with anyio.move_on_after(seconds):
            async for chunk in sse.events(stream, poll_seconds=poll_seconds):
                text += chunk
        return text

    return parse(anyio.run(run))


def test_jobs_list_stream_sends_new_jobs_and_how_active_ones_end(migrated: Path) -> None:
    """Driven by the stream's own messages, not a clock: each change is made after the message that
    shows the state before it, while the stream waits, so every poll sees one known state."""
    with Session(get_engine()) as session:
        old = new_job(session)
        finish(session, old)
        running = new_job(session)
        assert state.propose(session, running, JobStatus.RUNNING, "test").accepted
    list_state = sse.jobs_list_state(active={running}, after=running)
    newer = running + 1

    def change_after(n_seen: int) -> None:
        with Session(get_engine()) as session:
            if n_seen == 1:  # the page shows the running job: a new job arrives
                assert new_job(session) == newer
            elif n_seen == 2:  # both end between two polls
                assert state.propose(session, running, JobStatus.SUCCEEDED, "test").accepted
                assert state.propose(session, newer, JobStatus.CANCELLED, "test").accepted

    async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        seen: list[dict[str, Any]] = []
        after: list[dict[str, Any]] = []
        stream = sse.events(sse.Stream(states=[list_state]), poll_seconds=0.02)
        with anyio.fail_after(60):  # a bound for a broken stream only; no timing is checked
            async for chunk in stream:
                seen += parse(chunk)
                change_after(len(seen))
                if len(seen) == 4:
                    break
        # nothing more comes once nothing is watched (a bounded look: it can only miss, never invent)
        with anyio.move_on_after(0.3):
            async for chunk in stream:
                after += parse(chunk)
        return seen, after

    msgs, more = anyio.run(run)
    seen = [[(j["id"], j["status"]) for j in m["data"]] for m in msgs]
    assert seen == [
        [(running, "running")],
        [(newer, "queued"), (running, "running")],
        [(newer, "cancelled"), (running, "succeeded")],
        [],  # both ended and were sent: nothing is watched any more
    ]
    assert more == []
    assert all((old, "succeeded") not in s for s in seen)


def test_an_idle_stream_sends_nothing_new_and_polls_at_its_pace(migrated: Path) -> None:
    with Session(get_engine()) as session:
        job_id = new_job(session)
    polls: list[float] = []

    def poll(session: Session, cursor: int) -> tuple[list[Any], int]:
        polls.append(time.monotonic())
        return [], cursor

    held: list[tuple[float, int]] = []  # (when, connections checked out)
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.01):
            held.append((time.monotonic(), get_engine().pool.checkedout()))  # type: ignore[attr-defined]

    sampler = threading.Thread(target=sample)
    sampler.start()
    stream = sse.job_stream(job_id, [sse.Feed("metrics", poll)])
    msgs = take(stream, 1.0, poll_seconds=0.25)
    stop.set()
    sampler.join()
    assert [m["event"] for m in msgs] == ["job", "alerts", "log"]
    # One poll per 0.25 s at most, never a busy loop: the pace is a floor on each gap, which a loaded
    # machine can only widen (a count of polls in the second, once checked here, it could cut).
    gaps = [b - a for a, b in pairwise(polls)]
    assert 2 <= len(polls) <= 5 and min(gaps) >= 0.25 - 0.01, polls
    # A connection is checked out only during a poll: between polls the stream holds none (the sampler
    # looks 25 times a gap; one look in each is enough).
    assert max(n for _, n in held) <= 1, held
    for a, b in pairwise(polls):
        assert any(a < t < b and n == 0 for t, n in held), (a, b, held)


def test_an_added_feed_shares_the_cursor_and_resumes_after_it(migrated: Path) -> None:
    with Session(get_engine()) as session:
        job_id = new_job(session)
        finish(session, job_id)
    points: list[dict[str, Any]] = [
        {"id": i, "step": i, "name": "loss", "value": 1.0 / i} for i in range(1, 9)
    ]

    def poll(session: Session, cursor: int) -> tuple[list[Any], int]:
        rows = [p for p in points if p["id"] > cursor][:2]
        return rows, rows[-1]["id"] if rows else cursor

    stream = sse.job_stream(job_id, [sse.Feed("metrics", poll)], cursor={"metrics": 1})
    msgs = take(stream, 2.0)
    got = [p["id"] for m in msgs if m["event"] == "metrics" for p in m["data"]]
    assert got == [2, 3, 4, 5, 6, 7, 8]  # two a poll: the job had ended, yet all of it came before `end`
    assert msgs[-1]["event"] == "end"
    assert sse.parse_cursor(msgs[-1]["id"]) == {"log": 3, "metrics": 8}
