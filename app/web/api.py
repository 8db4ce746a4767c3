"""The JSON API (OpenAPI docs at /docs)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel, ValidationError
from sqlmodel import Session, col, select

from app.run import external, submit
from app.run.report_items import ExternalRun, Report
from app.store import records, state
from app.store.models import Alert, Job, JobEvent, JobOutput
from app.web.auth import require_api_write
from app.web.deps import SessionDep, SettingsDep
from draftdeck.errors import UsageError
from draftdeck.kinds import KINDS

router = APIRouter(prefix="/api", tags=["api"])
WriteDep = Depends(require_api_write)


class JobCreate(BaseModel):
    kind: str
    params: dict[str, Any] = {}


class JobCreated(BaseModel):
    id: int
    # As the job will run them: every path resolved by the one rule (draftdeck/paths.py), absolute.
    params: dict[str, Any] = {}


class JobPublic(BaseModel):
    id: int
    kind: str
    params: dict[str, Any]
    status: str
    progress_done: int
    progress_total: int | None
    progress_unit: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    worker: str | None
    task_id: str | None
    queue: str
    error: str | None
    attempt: int
    retry_of: int | None


class EventPublic(BaseModel):
    at: datetime
    level: str
    code: str | None
    message: str
    count: int
    examples: list[dict[str, Any]]


class OutputPublic(BaseModel):
    path: str
    rows: int
    bytes: int
    sha256: str


class DatasetLink(BaseModel):
    id: int
    path: str
    name: str


class TransitionPublic(BaseModel):
    chunk_index: int | None
    from_status: str
    to_status: str
    reason: str
    at: datetime


class JobDetail(JobPublic):
    result: dict[str, Any] | None
    events: list[EventPublic]
    outputs: list[OutputPublic]
    datasets: list[DatasetLink]
    history: list[TransitionPublic]


class AlertPublic(BaseModel):
    id: int
    job_id: int | None
    dataset: str | None
    endpoint_id: int | None = None
    kind: str
    message: str
    created_at: datetime
    acknowledged: bool


def get_or_404(session: Session, job_id: int) -> Job:
    job = records.get_job(session, job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id}")
    return job


@router.get("/kinds")
def list_kinds() -> dict[str, Any]:
    return {
        k.name: {"queue": k.queue, "summary": k.summary, "params": k.params.model_json_schema()}
        for k in KINDS.values()
    }


@router.post("/jobs", status_code=201, response_model=JobCreated, dependencies=[WriteDep])
def create_job(body: JobCreate, session: SessionDep, settings: SettingsDep) -> JobCreated:
    try:
        job = submit.submit(session, body.kind, body.params, settings)
    except UsageError as exc:
        raise HTTPException(400, str(exc)) from None
    assert job.id is not None
    return JobCreated(id=job.id, params=job.params)


@router.get("/jobs", response_model=list[JobPublic])
def list_jobs(
    session: SessionDep, status: str | None = None, limit: Annotated[int, Query(ge=1, le=500)] = 50
) -> list[Job]:
    query = select(Job).order_by(col(Job.id).desc()).limit(limit)
    if status:
        query = query.where(Job.status == status)
    return list(session.exec(query).all())


@router.get("/jobs/{job_id}", response_model=JobDetail)
def show_job(job_id: int, session: SessionDep) -> dict[str, Any]:
    job = get_or_404(session, job_id)
    events = session.exec(select(JobEvent).where(JobEvent.job_id == job_id).order_by(col(JobEvent.id))).all()
    outputs = session.exec(
        select(JobOutput).where(JobOutput.job_id == job_id).order_by(col(JobOutput.id))
    ).all()
    return {
        **job.model_dump(),
        "events": [e.model_dump() for e in events],
        "outputs": [o.model_dump() for o in outputs],
        "datasets": [d.model_dump() for d in records.datasets_of(session, job_id)],
        "history": [h.model_dump() for h in state.history(session, job_id)],
    }


@router.post("/jobs/{job_id}/cancel", response_model=JobPublic, dependencies=[WriteDep])
def cancel_job(job_id: int, session: SessionDep, settings: SettingsDep) -> Job:
    get_or_404(session, job_id)
    try:
        return submit.request_cancel(session, job_id, settings)
    except state.JobStateError as exc:
        raise HTTPException(409, str(exc)) from None


@router.post("/jobs/{job_id}/retry", status_code=201, response_model=JobCreated, dependencies=[WriteDep])
def retry_job(job_id: int, session: SessionDep, settings: SettingsDep) -> JobCreated:
    get_or_404(session, job_id)
    try:
        job = submit.retry(session, job_id, settings)
    except state.JobStateError as exc:
        raise HTTPException(409, str(exc)) from None
    except UsageError as exc:
        raise HTTPException(400, str(exc)) from None
    assert job.id is not None
    return JobCreated(id=job.id)


class ReportAck(BaseModel):
    acked: int
    status: str
    cancel: bool


@router.post("/runs", status_code=201, response_model=JobCreated, dependencies=[WriteDep])
def register_run(body: ExternalRun, session: SessionDep) -> JobCreated:
    try:
        job = external.register(session, body.key, body.params, body.host, body.run_folder, body.world)
    except (UsageError, ValidationError) as exc:
        raise HTTPException(400, str(exc)) from None
    assert job.id is not None
    return JobCreated(id=job.id, params=job.params)


@router.post("/jobs/{job_id}/report", response_model=ReportAck, dependencies=[WriteDep])
def report_run(job_id: int, body: Report, session: SessionDep) -> ReportAck:
    try:
        ack = external.apply(session, job_id, body.items)
    except external.NotExternal as exc:
        raise HTTPException(404, str(exc)) from None
    return ReportAck(acked=ack.acked, status=ack.status, cancel=ack.cancel)


@router.get("/alerts", response_model=list[AlertPublic])
def list_alerts(
    session: SessionDep,
    acknowledged: bool | None = None,
    job: int | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[Alert]:
    """Alerts, newest first; `job`: only those a job raised."""
    query = select(Alert).order_by(col(Alert.id).desc()).limit(limit)
    if acknowledged is not None:
        query = query.where(Alert.acknowledged == acknowledged)
    if job is not None:
        query = query.where(Alert.job_id == job)
    return list(session.exec(query).all())


@router.post("/alerts/{alert_id}/ack", response_model=AlertPublic, dependencies=[WriteDep])
def ack_alert(alert_id: int, session: SessionDep) -> Alert:
    if not records.acknowledge_alert(session, alert_id):
        raise HTTPException(404, f"no alert {alert_id}")
    alert = session.get(Alert, alert_id)
    assert alert is not None
    session.refresh(alert)
    return alert
