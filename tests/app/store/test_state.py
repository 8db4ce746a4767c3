"""app/store/state.py: one class per rule, one transition per test; what an accepted change writes with it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlmodel import Session, col, select

from app.store import records, state
from app.store.models import (
    Alert,
    ChunkStatus,
    Dataset,
    Job,
    JobChunk,
    JobEvent,
    JobOutput,
    JobStateHistory,
    JobStatus,
    utcnow,
)
from draftdeck.quality import Output, Policy, Report


@pytest.fixture
def session(migrated: Path) -> Iterator[Session]:
    from app.store.db import session_scope

    with session_scope() as s:
        yield s


def _job(session: Session, status: JobStatus = JobStatus.QUEUED, **values: object) -> int:
    job = records.create_job(session, "scan", {"inputs": ["x.jsonl"]}, "cpu")
    assert job.id is not None
    if status != JobStatus.QUEUED or values:
        session.execute(update(Job).where(col(Job.id) == job.id).values(status=status, **values))
        session.commit()
    return job.id


def _status(session: Session, job_id: int) -> str:
    job = records.get_job(session, job_id)
    assert job is not None
    return job.status


def _history(session: Session, job_id: int) -> list[tuple[str, str]]:
    return [(h.from_status, h.to_status) for h in state.history(session, job_id) if h.chunk_index is None]


def _report(rows: int, *outputs: Output) -> Report:
    report = Report(rows_in=rows, rows_out=rows)
    report.outputs.extend(outputs)
    return report


class TestStartRun:
    def test_a_queued_job_is_claimed_with_its_worker_and_history(self, session: Session) -> None:
        job_id = _job(session)
        decision = state.propose(session, job_id, JobStatus.RUNNING, "started on w:1", worker="w:1")
        assert decision == state.Decision(True, JobStatus.RUNNING, "started on w:1")
        job = records.get_job(session, job_id)
        assert job is not None and job.worker == "w:1" and job.started_at and job.heartbeat_at
        assert _history(session, job_id) == [("queued", "running")]

    def test_a_second_claim_is_rejected_naming_the_current_status(self, session: Session) -> None:
        job_id = _job(session)
        assert state.propose(session, job_id, JobStatus.RUNNING, "first").accepted
        again = state.propose(session, job_id, JobStatus.RUNNING, "redelivered")
        assert not again.accepted and again.status == JobStatus.RUNNING and "is running" in again.reason
        assert _history(session, job_id) == [("queued", "running")]


class TestFinishRun:
    def test_success_writes_status_events_outputs_and_datasets_together(
        self, session: Session, tmp_path: Path
    ) -> None:
        job_id = _job(session, JobStatus.RUNNING)
        report = _report(
            3,
            Output(str(tmp_path / "ds" / "data-00000-of-00001.arrow"), 3, 10, "a" * 64),
            Output(str(tmp_path / "ds"), 3, 10, "b" * 64, kind="dataset"),
        )
        report.warnings["truncated"] = 1
        decision = state.propose(
            session, job_id, JobStatus.SUCCEEDED, "succeeded", report=report, policy=Policy()
        )
        assert decision.accepted
        outputs = session.exec(select(JobOutput).where(JobOutput.job_id == job_id)).all()
        assert [o.path for o in outputs] == [str(tmp_path / "ds" / "data-00000-of-00001.arrow")]
        [ds] = session.exec(select(Dataset).where(Dataset.job_id == job_id)).all()
        assert (ds.path, ds.origin) == (str((tmp_path / "ds").resolve()), "job")
        codes = [e.code for e in session.exec(select(JobEvent).where(JobEvent.job_id == job_id)).all()]
        assert "truncated" in codes
        assert _history(session, job_id) == [("running", "succeeded")]

    def test_a_job_that_left_running_keeps_no_outputs(self, session: Session, tmp_path: Path) -> None:
        job_id = _job(session, JobStatus.RUNNING)
        assert state.fail_lost(session, job_id, "no heartbeat").accepted
        report = _report(1, Output(str(tmp_path / "o.jsonl"), 1, 5, "c" * 64))
        late = state.propose(session, job_id, JobStatus.SUCCEEDED, "succeeded", report=report)
        assert not late.accepted and late.status == JobStatus.FAILED
        assert session.exec(select(JobOutput).where(JobOutput.job_id == job_id)).all() == []

    def test_a_queued_job_cannot_succeed(self, session: Session) -> None:
        job_id = _job(session)
        assert not state.propose(session, job_id, JobStatus.SUCCEEDED, "skipped a step").accepted
        assert _status(session, job_id) == JobStatus.QUEUED


class TestFailRun:
    def test_failure_keeps_the_reason_and_alerts_on_an_empty_output(self, session: Session) -> None:
        job_id = _job(session, JobStatus.RUNNING)
        report = Report(rows_in=2)
        report.rejected["json_error"] = 2
        assert state.propose(session, job_id, JobStatus.FAILED, "no row parsed", report=report).accepted
        job = records.get_job(session, job_id)
        assert job is not None and job.error == "no row parsed" and job.finished_at is not None
        assert [a.kind for a in session.exec(select(Alert).where(Alert.job_id == job_id))] == ["empty_output"]

    def test_a_queued_job_can_fail_when_it_could_not_be_enqueued(self, session: Session) -> None:
        job_id = _job(session)
        assert state.propose(session, job_id, JobStatus.FAILED, "could not enqueue: broker down").accepted

    def test_a_finished_job_cannot_fail(self, session: Session) -> None:
        job_id = _job(session, JobStatus.SUCCEEDED)
        decision = state.propose(session, job_id, JobStatus.FAILED, "late")
        assert not decision.accepted and decision.status == JobStatus.SUCCEEDED


class TestCancelQueued:
    def test_a_queued_job_is_cancelled_at_once(self, session: Session) -> None:
        job_id = _job(session)
        assert state.propose(session, job_id, JobStatus.CANCELLED, "cancelled before it started").accepted
        assert _history(session, job_id) == [("queued", "cancelled")]


class TestCancelRunning:
    def test_only_once_cancellation_was_requested(self, session: Session) -> None:
        job_id = _job(session, JobStatus.RUNNING)
        refused = state.propose(session, job_id, JobStatus.CANCELLED, "stopped")
        assert not refused.accepted and refused.reason == "no cancellation was requested"
        session.execute(update(Job).where(col(Job.id) == job_id).values(cancel_requested=True))
        session.commit()
        assert state.propose(session, job_id, JobStatus.CANCELLED, "cancelled while running").accepted

    def test_pending_chunks_are_skipped_with_it(self, session: Session) -> None:
        job_id = _job(session, JobStatus.RUNNING, cancel_requested=True)
        session.add(JobChunk(job_id=job_id, chunk_index=0))
        session.commit()
        assert state.propose(session, job_id, JobStatus.CANCELLED, "cancelled").accepted
        chunk = session.exec(select(JobChunk).where(JobChunk.job_id == job_id)).one()
        session.refresh(chunk)
        assert chunk.status == ChunkStatus.SKIPPED


class TestCancelRequests:
    """submit.request_cancel: what the Cancel button does."""

    def test_a_running_job_with_no_live_worker_is_cancelled_at_once(self, session: Session) -> None:
        from app.run.submit import request_cancel
        from app.settings import get_settings

        stale = utcnow() - timedelta(seconds=get_settings().lost_after_seconds + 30)
        job_id = _job(session, JobStatus.RUNNING, heartbeat_at=stale)
        assert request_cancel(session, job_id, get_settings()).status == JobStatus.CANCELLED
        [h] = state.history(session, job_id)
        assert "no live worker" in h.reason

    def test_a_running_job_with_a_live_worker_is_asked_to_stop(self, session: Session) -> None:
        from app.run.submit import request_cancel
        from app.settings import get_settings

        job_id = _job(session, JobStatus.RUNNING, heartbeat_at=utcnow())
        job = request_cancel(session, job_id, get_settings())
        assert job.status == JobStatus.RUNNING and job.cancel_requested


class TestRetry:
    def test_one_retry_per_failed_attempt(self, session: Session, migrated: Path) -> None:
        from app.run.submit import retry
        from app.settings import get_settings

        (migrated / "data" / "a.jsonl").write_text("{}\n")
        job = records.create_job(session, "scan", {"inputs": [str(migrated / "data" / "a.jsonl")]}, "cpu")
        assert job.id is not None
        assert state.propose(session, job.id, JobStatus.FAILED, "boom").accepted
        second = retry(session, job.id, get_settings())
        assert second.attempt == 2 and second.retry_of == job.id
        with pytest.raises(state.JobStateError, match="already retried"):
            retry(session, job.id, get_settings())

    def test_the_database_refuses_a_second_retry_too(self, session: Session) -> None:
        from sqlalchemy.exc import IntegrityError

        first = _job(session, JobStatus.FAILED)
        records.create_job(session, "scan", {}, "cpu", attempt=2, retry_of=first)
        with pytest.raises(IntegrityError):
            records.create_job(session, "scan", {}, "cpu", attempt=2, retry_of=first)


def _chunk(session: Session, status: ChunkStatus) -> tuple[int, int]:
    job_id = _job(session, JobStatus.RUNNING)
    session.add(JobChunk(job_id=job_id, chunk_index=0, status=status))
    session.commit()
    return job_id, 0


def _chunk_status(session: Session, job_id: int) -> str:
    return str(session.exec(select(JobChunk.status).where(JobChunk.job_id == job_id)).one())


@pytest.mark.parametrize(
    "rule,start,refused",
    [
        (state.ClaimChunk, ChunkStatus.PENDING, ChunkStatus.RUNNING),
        (state.FinishChunk, ChunkStatus.RUNNING, ChunkStatus.PENDING),
        (state.FailChunk, ChunkStatus.RUNNING, ChunkStatus.DONE),
        (state.CancelChunk, ChunkStatus.PENDING, ChunkStatus.DONE),
        (state.SkipChunk, ChunkStatus.PENDING, ChunkStatus.RUNNING),
        # running -> pending is LoseChunkOnce's: refused from a status no rule to `pending` accepts
        (state.RerunChunk, ChunkStatus.DONE, ChunkStatus.SKIPPED),
        (state.LoseChunkOnce, ChunkStatus.RUNNING, ChunkStatus.CANCELLED),
        (state.LoseChunk, ChunkStatus.RUNNING, ChunkStatus.PENDING),
        (state.ReuseChunk, ChunkStatus.PENDING, ChunkStatus.CANCELLED),
    ],
)
class TestChunkRules:
    def test_the_rule_moves_the_chunk_and_records_it(
        self, session: Session, rule: type[state.ChunkRule], start: ChunkStatus, refused: ChunkStatus
    ) -> None:
        job_id, index = _chunk(session, start)
        fields: dict[str, Any] = {name: job_id for name in rule.REQUIRES}
        assert state.propose_chunk(session, job_id, index, rule.TO, rule.__name__, **fields).accepted
        assert _chunk_status(session, job_id) == rule.TO
        [h] = session.exec(
            select(JobStateHistory).where(JobStateHistory.job_id == job_id, JobStateHistory.chunk_index == 0)
        )
        assert (h.from_status, h.to_status) == (start, rule.TO)

    def test_a_status_outside_the_rule_is_refused(
        self, session: Session, rule: type[state.ChunkRule], start: ChunkStatus, refused: ChunkStatus
    ) -> None:
        job_id, index = _chunk(session, refused)
        if refused in rule.FROM:
            pytest.skip("the rule accepts this status")
        decision = state.propose_chunk(session, job_id, index, rule.TO, "not allowed")
        assert not decision.accepted and decision.status == refused
        assert _chunk_status(session, job_id) == refused


def test_a_pending_chunk_becomes_done_unrun_only_when_reused(session: Session) -> None:
    job_id, index = _chunk(session, ChunkStatus.PENDING)
    assert not state.propose_chunk(session, job_id, index, ChunkStatus.DONE, "no claim").accepted
    assert _chunk_status(session, job_id) == ChunkStatus.PENDING
    assert state.propose_chunk(
        session, job_id, index, ChunkStatus.DONE, "reused", reused_from=job_id
    ).accepted


def test_a_move_judged_on_an_earlier_read_is_refused_once_the_chunk_was_claimed_anew(
    session: Session,
) -> None:
    """Two sweepers read the same lost chunk; one runs it again and a worker claims it. The other's
    verdict (lost) is about the old claim: `only_if` on that claim refuses it, and the new run goes on."""
    from datetime import timedelta

    from sqlmodel import col

    from app.store.models import utcnow

    job_id, index = _chunk(session, ChunkStatus.RUNNING)
    old_start = utcnow() - timedelta(minutes=5)
    chunk = session.exec(select(JobChunk).where(JobChunk.job_id == job_id)).one()
    chunk.started_at = old_start
    session.commit()
    judged = (col(JobChunk.losses) == 0, col(JobChunk.started_at) == old_start)
    assert state.propose_chunk(session, job_id, index, ChunkStatus.PENDING, "run again", losses=1,
                               started_at=None, only_if=judged).accepted  # fmt: skip
    assert state.propose_chunk(session, job_id, index, ChunkStatus.RUNNING, "claimed anew",
                               worker="w2", started_at=utcnow(), heartbeat_at=utcnow()).accepted  # fmt: skip
    late = state.propose_chunk(session, job_id, index, ChunkStatus.LOST, "lost (stale view)", only_if=judged)
    assert not late.accepted and late.status == "changed"
    assert _chunk_status(session, job_id) == ChunkStatus.RUNNING


def test_every_rule_names_what_it_prevents() -> None:
    for rule in (*state.JOB_RULES, *state.CHUNK_RULES):
        assert rule.__doc__ and "->" in rule.__doc__, rule


class TestSqlRunContext:
    def test_progress_events_metrics_alerts_and_the_cancel_flag(
        self, session: Session, tmp_path: Path
    ) -> None:
        from app.run.context import SqlRunContext
        from app.store.models import MetricValue
        from draftdeck.errors import Cancelled

        job_id = _job(session, JobStatus.RUNNING)
        ctx = SqlRunContext(job_id, tmp_path)
        ctx.progress(5, 10, "rows")
        ctx.progress(6, 10, "rows")  # within the throttle: not written
        ctx.event("warning", "slow disk", code="slow")
        ctx.metrics(3, {"train/loss": 1.5, "train/pos/1/correct": 7.0}, tokens=4096)
        ctx.alert("loss_spike", "loss went up")
        job = records.get_job(session, job_id)
        assert job is not None and (job.progress_done, job.progress_total) == (5, 10)
        points = session.exec(
            select(MetricValue).where(MetricValue.job_id == job_id).order_by(MetricValue.name)
        ).all()
        assert [(p.step, p.name, p.value) for p in points] == [
            (3, "train/loss", 1.5),
            (3, "train/pos/1/correct", 7.0),
        ]
        assert [a.kind for a in session.exec(select(Alert).where(Alert.job_id == job_id))] == ["loss_spike"]
        ctx.check_cancelled()
        session.execute(update(Job).where(col(Job.id) == job_id).values(cancel_requested=True))
        session.commit()
        with pytest.raises(Cancelled):
            ctx.check_cancelled()
        with pytest.raises(Cancelled):
            ctx.progress(10, 10, "rows")  # the last step is always written, and reads the flag
