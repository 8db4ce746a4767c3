"""Server-sent events: ONE stream per page (browsers allow six HTTP/1.1 connections per host).

Streams
- ``GET /jobs/{id}/events``: the job page. Sends ``job``, ``log`` and ``alerts``; when the job reaches a
  terminal status it sends what is left, then ``end``, and closes.
- ``GET /jobs/events?active=3,5&after=12``: the jobs list. Sends ``jobs`` and ``alerts``; stays open until
  the client leaves (``active``: the running or queued jobs the page shows, ``after``: the newest job id
  it shows; both optional).

Events (``data`` is JSON)
- ``job``: ``{"id", "status", "terminal", "cancel_requested", "error", "progress"}``, on connect and
  whenever any of it changes. ``progress`` is ``{"done", "total", "unit", "percent", "label"}``:
  counts, and the label the page shows (``"42% of 1.2 MB"``), formatted here once for the template too.
- ``log``: ``[{"id", "time", "level", "code", "message", "count"}, ...]``: the job's new events in id
  order, after the ``log`` cursor.
- ``alerts``: ``{"open": n}``: open alerts, for the nav badge; on connect and when it changes.
- ``jobs``: ``[{"id", "status", "progress"}, ...]``: the jobs list's watched jobs (active now, active on
  the last poll, or newer than ``after``), whenever any of them changes.
- ``end``: ``{"status"}``: the job ended (``"gone"`` if it was deleted). The server closes the stream and
  the client must close its ``EventSource`` (which would otherwise reconnect).
- a page may add feeds; any feed's items arrive as one JSON list per message. The training run page adds
  ``metrics`` (metric points after a cursor) with a route of its own::

      @router.get("/runs/{job_id}/events")
      def run_events(request: Request, job_id: int) -> StreamingResponse:
          return sse.job_events_response(request, job_id, [sse.Feed("metrics", metric_points_after)])

  where ``metric_points_after(session, cursor) -> (points with id > cursor, the last id)``, and names
  the extra event on its page: ``data-sse-events="metrics"`` (static/live.js then re-dispatches each
  message as a ``dd:sse`` CustomEvent on ``document`` for the chart script).

Resuming: every message carries ``id: log=12,metrics=40``, the cursor of every feed after it. A
reconnecting ``EventSource`` sends the last one back as ``Last-Event-ID`` and each feed resumes after
its cursor, so nothing is sent twice; a first connection may give the cursors as query parameters
(``?log=12``: the page already shows events up to 12). States (``job``, ``alerts``, ``jobs``) are sent
again on every connect: they are values, not a history.

Each poll opens a short session in a worker thread and closes it (no session is held while the stream
waits); polls run every :data:`POLL_SECONDS`, and a comment line every :data:`KEEPALIVE_SECONDS` finds
clients that left without a word.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import object_session
from sqlmodel import Session, col, func, select
from starlette.concurrency import run_in_threadpool

from app.store import records
from app.store.db import get_engine
from app.store.models import TERMINAL, Alert, ChunkStatus, Job, JobChunk, JobEvent, JobStatus
from draftdeck.units import binary_size, count, duration, rate

router = APIRouter(include_in_schema=False)

POLL_SECONDS = 0.25
KEEPALIVE_SECONDS = 15.0
RETRY_MS = 1000  # how soon a browser reconnects after a dropped connection
FEED_BATCH = 500  # rows a feed sends per poll at most; the rest follow on the next
LIST_LIMIT = 100  # jobs the list stream watches at most (the page shows 100)

Cursor = dict[str, int]
Poll = Callable[[Session, int], tuple[list[Any], int]]


@dataclass(frozen=True)
class Feed:
    """Append-only rows after a cursor: ``poll(session, cursor) -> (items, cursor after them)``."""

    event: str
    poll: Poll


@dataclass(frozen=True)
class State:
    """A value sent on connect and whenever it changes: ``read(session) -> JSON-able value``."""

    event: str
    read: Callable[[Session], Any]


@dataclass
class Stream:
    """What one page listens to. ``ended(values)`` gets the latest state values by event name and
    returns the ``end`` payload once the stream should stop, else None."""

    states: Sequence[State]
    feeds: Sequence[Feed] = ()
    ended: Callable[[Mapping[str, Any]], dict[str, Any] | None] = lambda _values: None
    cursor: Cursor = field(default_factory=dict)


# -- the wire format -----------------------------------------------------------------------------
def format_cursor(cursor: Mapping[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(cursor.items()))


def parse_cursor(text: str) -> Cursor:
    """``log=12,metrics=40`` -> {"log": 12, "metrics": 40}; anything else is a 400 naming what came."""
    cursor: Cursor = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep or not name or not value.isdigit():
            raise HTTPException(400, f"Last-Event-ID: expected name=integer pairs like log=12, got {text!r}")
        cursor[name] = int(value)
    return cursor


def message(event: str, data: Any, cursor: Mapping[str, int] | None = None) -> str:
    lines = [f"event: {event}"]
    if cursor:
        lines.append(f"id: {format_cursor(cursor)}")
    # json.dumps escapes newlines inside strings, so one data line always holds the whole payload.
    lines.append("data: " + json.dumps(data, separators=(",", ":"), default=str))
    return "\n".join(lines) + "\n\n"


# -- the loop ------------------------------------------------------------------------------------
def _poll(stream: Stream) -> tuple[dict[str, Any], list[tuple[str, list[Any], int]]]:
    """One look at SQL in one short session: every state's value, then every feed's new rows (with
    the feed's cursor after them)."""
    with Session(get_engine(), expire_on_commit=False) as session:
        values = {s.event: s.read(session) for s in stream.states}
        batches: list[tuple[str, list[Any], int]] = []
        for feed in stream.feeds:
            items, after = feed.poll(session, stream.cursor.get(feed.event, 0))
            if items:
                batches.append((feed.event, items, after))
    return values, batches


async def events(stream: Stream, *, poll_seconds: float = POLL_SECONDS) -> AsyncIterator[str]:
    """The text of the stream: states when they change, feed rows as they come, ``end`` at the end.

    Once ``ended`` says so, the feeds are polled until they have nothing left (a worker commits a job's
    last events just after its status, so at least once more), then ``end`` goes out and it stops."""
    yield f"retry: {RETRY_MS}\n\n"
    sent: dict[str, Any] = {}
    quiet = 0.0
    finish: dict[str, Any] | None = None
    while True:
        values, batches = await run_in_threadpool(_poll, stream)
        out: list[str] = []
        for event, value in values.items():
            if event not in sent or sent[event] != value:
                sent[event] = value
                out.append(message(event, value, stream.cursor))
        # Each batch's id moves only its own feed's cursor: a connection that drops between two
        # messages resumes exactly after the last one the client got.
        for event, items, after in batches:
            stream.cursor[event] = after
            out.append(message(event, items, stream.cursor))
        if finish is not None and not batches:
            out.append(message("end", finish, stream.cursor))
        for text in out:
            yield text
        if finish is not None and not batches:
            return
        finish = finish or stream.ended(values)
        if out:
            quiet = 0.0
        elif quiet >= KEEPALIVE_SECONDS:
            quiet = 0.0
            yield ": keepalive\n\n"
        await anyio.sleep(poll_seconds)
        quiet += poll_seconds


def response(stream: Stream) -> StreamingResponse:
    return StreamingResponse(
        events(stream),
        media_type="text/event-stream",
        # no-transform and X-Accel-Buffering: proxies must pass each message on as it comes.
        headers={"Cache-Control": "no-cache, no-transform", "X-Accel-Buffering": "no"},
    )


def start_cursor(request: Request, feeds: Sequence[Feed]) -> Cursor:
    """Where each feed starts: the Last-Event-ID of a reconnect, else the page's query parameters."""
    names = {f.event for f in feeds}
    header = request.headers.get("last-event-id")
    if header is not None:
        return {k: v for k, v in parse_cursor(header).items() if k in names}
    query = ",".join(f"{k}={request.query_params[k]}" for k in sorted(names) if k in request.query_params)
    return parse_cursor(query)


# -- what pages show -----------------------------------------------------------------------------
def _amount(n: int, unit: str) -> str:
    return binary_size(n) if unit == "bytes" else count(n, unit)


def progress_view(job: Job) -> dict[str, Any]:
    """A job's progress as counts plus the one label both the template and the stream show, and while it
    runs its rate and time left: ratios of the stored counts and timestamps, never stored themselves."""
    done, total, unit = job.progress_done, job.progress_total, job.progress_unit
    percent: int | None = None
    if job.status in TERMINAL:
        label = _amount(total or done, unit) if (total or done) else ""
    elif total:
        percent = int(100 * done // total)
        label = f"{percent}% of {_amount(total, unit)}"
    elif job.status == JobStatus.RUNNING:
        label = _amount(done, unit) if done else ""
    else:
        label = "waiting for a worker"
    speed, eta = _speed(job)
    return {"done": done, "total": total, "unit": unit, "percent": percent, "label": label,
            "rate": speed, "eta": eta}  # fmt: skip


def _speed(job: Job) -> tuple[str | None, str | None]:
    """(rate, time left) of a running job: what it has done over the time from its start to its last
    progress or heartbeat (both refresh `heartbeat_at`), so the value holds still between writes."""
    if job.status != JobStatus.RUNNING or not job.progress_done or job.started_at is None:
        return None, None
    seen = job.heartbeat_at or job.started_at
    seconds = (seen - job.started_at).total_seconds()
    if seconds <= 0:
        return None, None
    per_second = job.progress_done / seconds
    left = None
    if job.progress_total and job.progress_total > job.progress_done:
        left = f"about {duration((job.progress_total - job.progress_done) / per_second)} left"
    done = _chunks_done(job)
    if done is not None:  # chunks are the unit of work; rows and tokens are what people compare
        rows, tokens, written = done
        said = f"{rate(rows / seconds, 'rows')} · {rate(tokens / seconds, 'tokens')}"
        if written:  # a chunked kind that says the bytes it wrote (cache-hidden: its hidden states)
            said += f" · {rate(written / seconds, 'bytes')}"
        return said, left
    return rate(per_second, job.progress_unit), left


def _chunks_done(job: Job) -> tuple[int, int, int] | None:
    """(rows, tokens, bytes written: 0 unless the kind says it) of a chunked job's finished chunks, read in
    the session the job was loaded in (the page's or the stream's poll); None for other jobs or a job
    outside a session."""
    session = object_session(job)
    if job.progress_unit != "chunks" or not isinstance(session, Session):
        return None
    reports = session.exec(
        select(JobChunk.rows_out, JobChunk.report).where(
            JobChunk.job_id == job.id, JobChunk.status == ChunkStatus.DONE
        )
    ).all()
    rows = sum(r or 0 for r, _ in reports)
    tokens = sum(int((report or {}).get("tokens") or 0) for _, report in reports)
    written = sum(int((report or {}).get("bytes_written") or 0) for _, report in reports)
    return rows, tokens, written


def job_view(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "status": job.status,
        "terminal": job.status in TERMINAL,
        "cancel_requested": job.cancel_requested,
        "error": job.error,
        "progress": progress_view(job),
    }


def open_alerts(session: Session) -> dict[str, int]:
    n = session.exec(select(func.count()).select_from(Alert).where(col(Alert.acknowledged).is_(False))).one()
    return {"open": int(n)}


def log_feed(job_id: int) -> Feed:
    def poll(session: Session, cursor: int) -> tuple[list[Any], int]:
        rows = session.exec(
            select(JobEvent)
            .where(JobEvent.job_id == job_id, col(JobEvent.id) > cursor)
            .order_by(col(JobEvent.id))
            .limit(FEED_BATCH)
        ).all()
        items = [
            {
                "id": e.id,
                "time": e.at.strftime("%H:%M:%S"),
                "level": e.level,
                "code": e.code,
                "message": e.message,
                "count": e.count,
            }
            for e in rows
        ]
        return items, (rows[-1].id or cursor) if rows else cursor

    return Feed("log", poll)


def job_stream(job_id: int, feeds: Sequence[Feed] = (), cursor: Cursor | None = None) -> Stream:
    """A job page's stream: its state (with the number of its own alerts, so that the page redraws
    when one is raised while it runs), its log, the alert count, and any `feeds` a page adds."""

    def read(session: Session) -> dict[str, Any] | None:
        job = records.get_job(session, job_id)
        if job is None:
            return None
        raised = session.exec(select(func.count()).select_from(Alert).where(Alert.job_id == job_id)).one()
        return {**job_view(job), "alerts": int(raised)}

    def ended(values: Mapping[str, Any]) -> dict[str, Any] | None:
        job = values["job"]
        if job is None:
            return {"status": "gone"}
        return {"status": job["status"]} if job["terminal"] else None

    return Stream(
        states=[State("job", read), State("alerts", open_alerts)],
        feeds=[log_feed(job_id), *feeds],
        ended=ended,
        cursor=dict(cursor or {}),
    )


@dataclass
class _Watched:
    active: set[int]
    after: int


def jobs_list_state(active: set[int], after: int) -> State:
    """The jobs list's watched jobs: active now, active on the last poll (to send how they ended) or
    newer than the newest job the page showed (to send that they exist)."""
    live = [JobStatus.QUEUED.value, JobStatus.RUNNING.value]
    watched = _Watched(set(active), after)

    def read(session: Session) -> list[dict[str, Any]]:
        rows = session.exec(
            select(Job)
            .where(
                col(Job.status).in_(live)
                | col(Job.id).in_(sorted(watched.active))
                | (col(Job.id) > watched.after)
            )
            .order_by(col(Job.id).desc())
            .limit(LIST_LIMIT)
        ).all()
        watched.active = {j.id for j in rows if j.status in live and j.id is not None}
        watched.after = max([watched.after, *(j.id or 0 for j in rows)])
        return [{"id": j.id, "status": j.status, "progress": progress_view(j)} for j in rows]

    return State("jobs", read)


def _int_list(text: str, name: str) -> set[int]:
    try:
        return {int(p) for p in text.split(",") if p.strip()}
    except ValueError:
        raise HTTPException(400, f"{name}: expected comma-separated job ids, got {text!r}") from None


# -- routes --------------------------------------------------------------------------------------
@router.get("/jobs/events")
def jobs_list_events(request: Request, active: str = "", after: int = 0) -> StreamingResponse:
    state = jobs_list_state(_int_list(active, "active"), after)
    return response(Stream(states=[state, State("alerts", open_alerts)]))


def job_events_response(request: Request, job_id: int, feeds: Sequence[Feed] = ()) -> StreamingResponse:
    """The stream of a job's page, with the page's extra `feeds`; what a run page's route returns."""
    with Session(get_engine()) as session:
        if records.get_job(session, job_id) is None:
            raise HTTPException(404, f"no job {job_id}")
    all_feeds = [log_feed(job_id), *feeds]
    return response(job_stream(job_id, feeds, start_cursor(request, all_feeds)))


@router.get("/jobs/{job_id}/events")
def job_events(request: Request, job_id: int) -> StreamingResponse:
    return job_events_response(request, job_id)
