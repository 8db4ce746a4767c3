# ruff: noqa: F811 - pytest fixtures imported from tokenize_helpers
"""The sweeper (app/run/sweeper.py) against real SQLite and the real file broker (no consumer: chunk
tasks are called inline): lost chunks run again once, then fail their job naming them; a job waits
for its queued chunks only while a live worker serves its queue; lost messages are sent again; a
lost job leaves no partial files, and its Retry works with `out` set."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import update
from sqlmodel import Session, col, select

from app.run import liveness
from app.run.sweeper import mark_lost_chunks, mark_lost_jobs, resend_lost_messages, sweep
from app.settings import get_settings
from app.store import records
from app.store.db import session_scope
from app.store.models import ChunkStatus, Job, JobChunk, JobStatus, utcnow
from tests.support.chunks import write_chat_input
from tests.support.tokenize import small_dir  # noqa: F401

LIMIT = 30.0
OLD = timedelta(hours=1)


def _tokenize_job(home: Path, small_dir: Path, n: int = 20, **params: object) -> int:
    from app.run.submit import submit

    src = write_chat_input(home / "data" / "chat.jsonl", n)
    tok = home / "data" / "tok"
    tok.mkdir(exist_ok=True)
    for f in small_dir.iterdir():
        (tok / f.name).write_bytes(f.read_bytes())
    raw = {"inputs": [str(src)], "tokenizer": str(tok), "on_missing": "drop", "chunk_rows": 10, **params}
    with session_scope() as session:
        job = submit(session, "tokenize", raw, get_settings())
    assert job.id is not None and job.status == JobStatus.QUEUED, job.error
    return job.id


def _chunk(job_id: int, index: int) -> JobChunk:
    with session_scope() as session:
        return session.exec(
            select(JobChunk).where(JobChunk.job_id == job_id, JobChunk.chunk_index == index)
        ).one()


def _die_in_chunk(job_id: int, index: int) -> None:
    """A worker claims chunk `index` and dies in it: the row stays `running`, its beats stop."""
    from app.store import state

    with session_scope() as session:
        now = utcnow()
        assert state.propose_chunk(session, job_id, index, ChunkStatus.RUNNING, "claimed by dead:1",
                                   worker="dead:1", started_at=now, heartbeat_at=now).accepted  # fmt: skip
        _age(session, job_id, index)


def _age(session: Session, job_id: int, index: int | None = None) -> None:
    old = utcnow() - OLD
    session.execute(update(Job).where(col(Job.id) == job_id).values(heartbeat_at=old))
    if index is not None:
        session.execute(update(JobChunk)
                        .where(col(JobChunk.job_id) == job_id, col(JobChunk.chunk_index) == index)
                        .values(heartbeat_at=old, started_at=old))  # fmt: skip
    session.commit()


def _live_worker(queues: str = "cpu,gpu") -> None:
    with session_scope() as session:
        liveness.beat(session, "celery@live", queues.split(","))


def _messages() -> list[Path]:
    return sorted((get_settings().broker_dir / "queue").iterdir())


def _job(job_id: int) -> Job:
    with session_scope() as session:
        job = records.get_job(session, job_id)
    assert job is not None
    return job


def test_a_lost_chunk_runs_again_once_on_a_live_worker(migrated: Path, small_dir: Path) -> None:
    from app.run.chunks import run_chunk
    from app.run.job import run_job

    job_id = _tokenize_job(migrated, small_dir)
    assert run_job(job_id) == "handed-off"
    n = len(_messages())
    _die_in_chunk(job_id, 0)
    _live_worker()
    with session_scope() as session:
        again, lost = mark_lost_chunks(session, LIMIT)
    assert (again, lost) == ([(job_id, 0)], [])
    chunk = _chunk(job_id, 0)
    assert (chunk.status, chunk.losses, chunk.worker) == (ChunkStatus.PENDING, 1, None)
    assert len(_messages()) == n + 1, "its message was sent again"
    assert _job(job_id).status == JobStatus.RUNNING
    chunks = len(records_of(job_id))
    assert [run_chunk(job_id, i) for i in range(chunks)][-1] == JobStatus.SUCCEEDED
    job = _job(job_id)
    lines = (migrated / "data" / "chat.jsonl").read_text().count("\n")
    assert job.status == JobStatus.SUCCEEDED and job.result and job.result["rows_in"] == lines


def records_of(job_id: int) -> list[JobChunk]:
    with session_scope() as session:
        return list(session.exec(select(JobChunk).where(JobChunk.job_id == job_id)))


def test_a_chunk_lost_twice_fails_the_job_naming_it_and_leaves_no_files(
    migrated: Path, small_dir: Path
) -> None:
    from app.run.chunks import run_chunk
    from app.run.job import run_job

    out = migrated / "data" / "out"
    job_id = _tokenize_job(migrated, small_dir, 30, out=str(out))
    assert run_job(job_id) == "handed-off"
    assert run_chunk(job_id, 1) == "done"  # chunk 1's shard is in `out`
    parts = get_settings().jobs_dir / str(job_id) / "chunks"
    assert parts.is_dir() and list(out.glob("chunk-*.arrow"))
    _live_worker()
    _die_in_chunk(job_id, 0)
    with session_scope() as session:
        assert mark_lost_chunks(session, LIMIT)[0] == [(job_id, 0)]
    _die_in_chunk(job_id, 0)
    (out / ".tmp-4242-chunk-00000.arrow").write_bytes(b"half a shard")  # the dead writer's temporary
    with session_scope() as session:
        assert mark_lost_chunks(session, LIMIT) == ([], [(job_id, 0)])
    job = _job(job_id)
    assert job.status == JobStatus.FAILED
    assert job.error is not None and job.error.startswith("worker lost: chunk 0 lost twice"), job.error
    statuses = {c.chunk_index: c.status for c in records_of(job_id)}
    assert statuses[0] == ChunkStatus.LOST and statuses[1] == ChunkStatus.DONE
    assert ChunkStatus.RUNNING not in statuses.values() and ChunkStatus.PENDING not in statuses.values()
    assert not parts.exists(), "chunk inputs and statistics removed"
    assert list(out.iterdir()) == [], "chunk shards and temporaries removed"


def test_a_lost_chunk_with_no_live_worker_fails_the_job(migrated: Path, small_dir: Path) -> None:
    from app.run.job import run_job

    job_id = _tokenize_job(migrated, small_dir)
    assert run_job(job_id) == "handed-off"
    _die_in_chunk(job_id, 1)
    with session_scope() as session:
        assert mark_lost_chunks(session, LIMIT) == ([], [(job_id, 1)])
    job = _job(job_id)
    assert job.status == JobStatus.FAILED and job.error is not None
    assert job.error.startswith("worker lost: chunk 1 lost, and no live worker serves queue cpu"), job.error
    assert _chunk(job_id, 1).status == ChunkStatus.LOST


def test_queued_chunks_keep_their_job_alive_only_while_a_live_worker_serves_the_queue(
    migrated: Path, small_dir: Path
) -> None:
    from app.run.job import run_job

    job_id = _tokenize_job(migrated, small_dir)
    assert run_job(job_id) == "handed-off"
    _live_worker("gpu")  # alive, but not on the job's queue
    with session_scope() as session:
        _age(session, job_id)
        liveness.beat(session, "celery@cpu", ["cpu"])
        assert mark_lost_jobs(session, LIMIT) == []
        session.execute(update(liveness.Worker).values(heartbeat_at=utcnow() - OLD))
        session.commit()
        assert mark_lost_jobs(session, LIMIT) == [job_id]
    job = _job(job_id)
    assert job.error is not None and "no live worker serves queue cpu" in job.error, job.error
    assert not (get_settings().jobs_dir / str(job_id) / "chunks").exists()


def test_a_lost_job_message_is_sent_again_and_a_double_delivery_runs_once(migrated: Path) -> None:
    from app.run.job import run_job
    from app.run.submit import submit

    row = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'
    (migrated / "data" / "a.jsonl").write_text(row)  # a row convert keeps: the scan passes
    with session_scope() as session:
        job = submit(session, "scan", {"inputs": ["data/a.jsonl"]}, get_settings())
    assert job.id is not None
    [message] = _messages()
    with session_scope() as session:
        assert resend_lost_messages(session, LIMIT) == ([], [])  # young: left alone
        session.execute(update(Job).where(col(Job.id) == job.id).values(sent_at=utcnow() - OLD))
        session.commit()
        assert resend_lost_messages(session, LIMIT) == ([], []), "its message is still in the broker"
    message.unlink()  # the broker lost it
    with session_scope() as session:
        assert resend_lost_messages(session, LIMIT) == ([job.id], [])
        assert resend_lost_messages(session, LIMIT) == ([], []), "sent once"
    assert len(_messages()) == 1 and _job(job.id).task_id != job.task_id
    assert run_job(job.id) == JobStatus.SUCCEEDED
    assert run_job(job.id) == "skipped:succeeded", "a second delivery finds it claimed"


def test_lost_chunk_messages_are_sent_again(migrated: Path, small_dir: Path) -> None:
    from app.run.job import run_job

    job_id = _tokenize_job(migrated, small_dir)
    for m in _messages():
        m.unlink()
    assert run_job(job_id) == "handed-off"
    n = len(records_of(job_id))
    for m in _messages():
        m.unlink()  # a Redis restarted without its data: every chunk message gone
    with session_scope() as session:
        session.execute(update(JobChunk).where(col(JobChunk.job_id) == job_id).values(sent_at=utcnow() - OLD))
        session.commit()
        swept = sweep(session, LIMIT)
    assert sorted(swept.resent_chunks) == [(job_id, i) for i in range(n)]
    assert len(_messages()) == n


def test_retry_of_a_lost_job_with_out_set_runs(migrated: Path, small_dir: Path) -> None:
    from app.run.chunks import run_chunk
    from app.run.job import run_job
    from app.run.submit import retry

    out = migrated / "data" / "out"
    job_id = _tokenize_job(migrated, small_dir, out=str(out))
    assert run_job(job_id) == "handed-off"
    assert run_chunk(job_id, 0) == "done"
    with session_scope() as session:  # the worker of chunk 1 died, and no worker is left
        _die_in_chunk(job_id, 1)
        sweep(session, LIMIT)
    assert _job(job_id).status == JobStatus.FAILED
    with session_scope() as session:
        again = retry(session, job_id, get_settings())
    assert again.id is not None
    assert run_job(again.id) == "handed-off", _job(again.id).error
    assert [run_chunk(again.id, c.chunk_index) for c in records_of(again.id)][-1] == JobStatus.SUCCEEDED


def test_workers_silent_for_a_day_are_forgotten(migrated: Path) -> None:
    _live_worker("cpu")
    with session_scope() as session:
        liveness.beat(session, "celery@gone", ["gpu"])
        session.execute(update(liveness.Worker).where(col(liveness.Worker.name) == "celery@gone")
                        .values(heartbeat_at=utcnow() - timedelta(days=2)))  # fmt: skip
        session.commit()
        assert liveness.serves(session, "cpu", LIMIT) and not liveness.serves(session, "gpu", LIMIT)
        sweep(session, LIMIT)
        assert [w.name for w in session.exec(select(liveness.Worker))] == ["celery@live"]


def test_the_job_page_says_when_no_live_worker_serves_its_queue(migrated: Path) -> None:
    from fastapi.testclient import TestClient

    from app.run.submit import submit
    from app.web.main import create_app

    (migrated / "data" / "a.jsonl").write_text('{"messages": []}\n')
    with session_scope() as session:
        job = submit(session, "scan", {"inputs": ["data/a.jsonl"]}, get_settings())
    with TestClient(create_app()) as client:
        page = client.get(f"/jobs/{job.id}").text
        assert 'id="job-no-worker"' in page and "No live worker serves the queue “cpu”" in page
        _live_worker("cpu")
        assert 'id="job-no-worker"' not in client.get(f"/jobs/{job.id}").text
        assert 'id="job-no-worker"' not in client.get(f"/jobs/{job.id}/live").text


def test_migration_0006_matches_the_models_and_downgrades(migrated: Path) -> None:
    from alembic import command
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy import inspect

    from app.store.db import alembic_config, get_engine
    from app.store.models import SQLModel

    engine = get_engine()
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
    assert diff == [], f"the migrations and app/store/models.py disagree: {diff}"
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    command.downgrade(cfg, "0005")
    assert "workers" not in inspect(engine).get_table_names()
    assert "losses" not in {c["name"] for c in inspect(engine).get_columns("job_chunks")}
    command.upgrade(cfg, "head")
    assert "workers" in inspect(engine).get_table_names()


# -- one liveness rule: Cancel, the job page and the sweeper (app/run/liveness.py's of_job) --------------
def _running(session: Session, *, beat_age: timedelta | None, chunks_waiting: bool = False) -> int:
    job = records.create_job(session, "tokenize", {"inputs": ["x.jsonl"], "tokenizer": "t"}, "cpu")
    assert job.id is not None
    beat = None if beat_age is None else utcnow() - beat_age
    session.execute(update(Job).where(col(Job.id) == job.id).values(status="running", heartbeat_at=beat))
    if chunks_waiting:
        session.add(JobChunk(job_id=job.id, chunk_index=0, status="pending", task_id="t-0", sent_at=utcnow()))
    session.commit()
    return job.id


def _cancel(job_id: int) -> Job:
    from app.run.submit import request_cancel

    with session_scope() as session:
        return request_cancel(session, job_id, get_settings())


def _page_says_no_worker(job_id: int) -> bool:
    from fastapi.testclient import TestClient

    from app.web.main import create_app

    with TestClient(create_app()) as client:
        return 'id="job-no-worker"' in client.get(f"/jobs/{job_id}").text


def test_cancel_of_a_job_whose_worker_lives_but_nothing_beats_for_it_is_at_once(migrated: Path) -> None:
    """The worker is alive (workers table) but the job's beat is stale: its process died and the
    worker's pool replaced it. Nobody would read the flag: cancelled at once; the page shows no
    "no live worker" notice (one serves the queue), and the sweeper finds the same job lost."""
    _live_worker("cpu")
    with session_scope() as session:
        job_id = _running(session, beat_age=OLD)
        other = _running(session, beat_age=OLD)
        live = liveness.of_job(session, records.get_job(session, job_id), 30)  # type: ignore[arg-type]
    assert (live.beating, live.served, live.stranded) == (False, True, True)
    assert not _page_says_no_worker(job_id)
    job = _cancel(job_id)
    assert job.status == "cancelled"
    assert "nothing runs it (a live worker serves queue cpu, but none runs this job (heartbeat 36" in (
        job.error or ""
    )
    with session_scope() as session:
        assert mark_lost_jobs(session, 30) == [other]


def test_cancel_with_no_live_worker_is_at_once_and_the_page_says_why(migrated: Path) -> None:
    with session_scope() as session:
        job_id = _running(session, beat_age=OLD)
    assert _page_says_no_worker(job_id)
    job = _cancel(job_id)
    assert job.status == "cancelled" and "nothing runs it (no live worker serves queue cpu (heartbeat 36" in (
        job.error or ""
    )


def test_cancel_of_a_beating_job_asks_it_to_stop_even_without_a_workers_row(migrated: Path) -> None:
    """A fresh beat means a process runs the job now and reads the flag: it is asked, not ended
    under it (the page still says no worker serves the queue for the work that is left)."""
    with session_scope() as session:
        job_id = _running(session, beat_age=timedelta(seconds=1))
    job = _cancel(job_id)
    assert job.status == "running" and job.cancel_requested
    assert _page_says_no_worker(job_id)


def test_waiting_chunks_a_live_worker_serves_are_not_lost_but_cancel_ends_them_at_once(
    migrated: Path,
) -> None:
    """No chunk runs, some wait: the sweeper leaves the job alone (a live worker will take them);
    Cancel ends it at once (nothing runs to read the flag) and skips the waiting chunks."""
    _live_worker("cpu")
    with session_scope() as session:
        job_id = _running(session, beat_age=OLD, chunks_waiting=True)
        assert mark_lost_jobs(session, 30) == []
    assert not _page_says_no_worker(job_id)
    job = _cancel(job_id)
    assert job.status == "cancelled" and "its chunks wait in the queue" in (job.error or "")
    with session_scope() as session:
        assert session.exec(select(JobChunk.status).where(JobChunk.job_id == job_id)).one() == "skipped"


def test_a_redelivered_message_of_a_job_whose_chunks_wait_does_not_fail_it(migrated: Path) -> None:
    """The job's own message comes again (its planning worker's ack was lost) while its chunks wait
    on a served queue: the same rule says waiting, not lost; it is neither run again nor failed."""
    from app.run.job import run_job

    _live_worker("cpu")
    with session_scope() as session:
        job_id = _running(session, beat_age=OLD, chunks_waiting=True)
    assert run_job(job_id) == "skipped:running"
    assert _job(job_id).status == "running"
    with session_scope() as session:
        session.execute(
            update(JobChunk).where(col(JobChunk.job_id) == job_id).values(task_id=None, sent_at=None)
        )
        session.commit()
    assert run_job(job_id) == "skipped:failed"  # chunks never sent: nothing will run them, it is lost
    assert (_job(job_id).error or "").startswith("worker lost: redelivered after")
