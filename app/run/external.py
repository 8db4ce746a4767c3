"""Runs launched outside the job system (torchrun on a cluster, srun, a notebook) that report to this
server: `draftdeck train ... --report-to URL` (draftdeck/drafter/train/reporter.py).

A run registers with a key it keeps in its run folder and becomes a `train` job on the `external`
queue, running, its worker named after its host. Its reporter then sends numbered items in batches:
progress, events, metric points (with the time they were taken), alerts, the run folder's run.json
and checkpoint index (mirrored into the job's folder, where the run page reads them), and at last
its end. Each item applies once and in order: the job keeps the last number applied (`report_seq`),
a batch sent again applies nothing twice, and an item after a gap waits for the missing ones. Every
report refreshes the job's heartbeat; a run whose reporter goes silent is marked lost by the sweeper
like a dead worker's job. The answer carries the job's cancel flag, so Cancel on the page stops the run.

A relaunch of the same run folder (a resume after a failure) registers again: it continues the job
while that is still running, else it becomes the job's next attempt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import update
from sqlmodel import Session, col, select

from app.run import report_items
from app.run.report_items import ReportItem
from app.settings import get_settings
from app.store import metrics, records, state
from app.store.models import Job, JobStatus
from draftdeck.errors import UsageError
from draftdeck.fileio import atomic_output
from draftdeck.jobs.context import MetricPoint
from draftdeck.kinds import get_kind

QUEUE = "external"
ENDS = {"succeeded": JobStatus.SUCCEEDED, "failed": JobStatus.FAILED, "cancelled": JobStatus.CANCELLED}


class NotExternal(UsageError):
    """The job is not a run that reports from outside."""


@dataclass(frozen=True)
class Ack:
    acked: int  # the last item applied
    status: str
    cancel: bool  # the job's cancel flag: the run should stop


def register(
    session: Session, key: str, params: dict[str, Any], host: str, run_folder: str, world: int
) -> Job:
    """The job of the run whose reporter keeps `key`: the one still running, or a new attempt."""
    if not key or len(key) > 128:
        raise UsageError("key: 1 to 128 characters")
    train = get_kind("train").params.model_validate(params)  # its parameters, checked as a train job's
    # Its paths are where it runs; the pages read some (a dataset's manifest): within the data roots, as
    # every path that arrives over HTTP (a shared filesystem is one: DRAFTDECK_DATA_ROOTS names it).
    train = train.confined(get_settings().roots, here=False)
    latest = session.exec(select(Job).where(Job.external_key == key).order_by(col(Job.id).desc())).first()
    if latest is not None and latest.status == JobStatus.RUNNING:
        records.add_event(session, latest.id or 0, "info", f"reporter reconnected from {host}")
        return latest
    stored = train.model_dump(mode="json")
    job = records.create_job(
        session, "train", stored, QUEUE,
        attempt=latest.attempt + 1 if latest else 1, retry_of=latest.id if latest else None,
    )  # fmt: skip
    assert job.id is not None
    folder = get_settings().jobs_dir / str(job.id)  # the run page reads the mirrored files here
    folder.mkdir(parents=True, exist_ok=True)
    session.execute(
        update(Job).where(col(Job.id) == job.id)
        .values(external_key=key, report_seq=0, params={**stored, "out": str(folder)})
    )  # fmt: skip
    session.commit()
    ranks = f"{world} rank{'s' if world != 1 else ''}"
    state.propose(
        session, job.id, JobStatus.RUNNING,
        f"launched outside the job system on {host} ({ranks}); its run folder there: {run_folder}",
        worker=f"external:{host}",
    )  # fmt: skip
    refreshed = records.get_job(session, job.id)
    assert refreshed is not None
    return refreshed


def apply(session: Session, job_id: int, items: list[ReportItem]) -> Ack:
    """Apply the items of a report past the job's last applied one, in order; refresh its beat. The
    items are checked already (app/run/report_items.py): whatever is applied, a page can show."""
    job = records.get_job(session, job_id)
    if job is None:
        raise NotExternal(f"no job {job_id}")
    if job.external_key is None:
        raise NotExternal(f"job {job_id} was not launched outside the job system: it takes no reports")
    for item in sorted(items, key=lambda i: i.seq):
        job = records.get_job(session, job_id)
        assert job is not None
        last = job.report_seq or 0
        if item.seq <= last:
            continue  # applied already: a batch sent again
        if item.seq != last + 1 or job.status != JobStatus.RUNNING:
            break  # a gap (the missing items come first), or the job has ended
        _apply_one(session, job, item)
    job = records.get_job(session, job_id)
    assert job is not None
    if job.status == JobStatus.RUNNING:
        records.heartbeat(session, job_id)
    return Ack(job.report_seq or 0, str(job.status), bool(job.cancel_requested))


def _apply_one(session: Session, job: Job, item: ReportItem) -> None:
    assert job.id is not None
    mark = update(Job).where(col(Job.id) == job.id).values(report_seq=item.seq)
    if isinstance(item, report_items.End):
        session.execute(mark)
        _end(session, job, item)
        return
    if isinstance(item, report_items.Metrics):
        session.execute(mark)
        points = [
            MetricPoint(item.step, name, math.nan if v is None else v, item.tokens)
            for name, v in item.values.items()
        ]
        metrics.record_points(session, job.id, points, wall_time=item.at)  # commits, with the mark
        return
    if isinstance(item, report_items.Progress):
        mark = mark.values(progress_done=item.done, progress_total=item.total, progress_unit=item.unit)
    elif isinstance(item, report_items.Event):
        records.add_event(
            session, job.id, item.level, item.message, code=item.code, count=item.count, commit=False
        )
    elif isinstance(item, report_items.Alert):
        records.raise_alert(session, item.alert, f"job {job.id}: {item.message}", job_id=job.id, commit=False)
    else:
        _mirror(job, item.name, item.text)
    session.execute(mark)
    session.commit()


def _mirror(job: Job, name: str, text: str) -> None:
    """Write a run folder file the run page reads into the job's folder (only those, only there)."""
    path = get_settings().jobs_dir / str(job.id) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path, "w") as f:
        f.write(text)


def _end(session: Session, job: Job, item: report_items.End) -> None:
    assert job.id is not None
    to = ENDS[item.status]
    result = item.result.model_dump(exclude_unset=True) if item.result is not None else None
    if to == JobStatus.SUCCEEDED:
        reason = f"succeeded: {item.message or 'the run ended'}"
        state.propose(session, job.id, to, reason, result=result)
        return
    if to == JobStatus.CANCELLED:  # stopped where it runs (Ctrl-C, the page's Cancel): the flag says so
        session.execute(update(Job).where(col(Job.id) == job.id).values(cancel_requested=True))
    state.propose(session, job.id, to, item.message or to.value, result=result)
