"""The job pages (list, New-job form, a job and its live part, cancel, retry), the alerts page and
sign-in. What they show is built in app/web/job_views.py."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlmodel import Session, col, select

from app.run import submit
from app.settings import Settings
from app.store import records, state
from app.store.models import Alert
from app.web.auth import (
    TOKEN_COOKIE,
    require_csrf,
    require_page_write,
    safe_next,
    session_value,
    token_matches,
    token_required,
)
from app.web.dataset_views import alerts_datasets
from app.web.deps import SessionDep, SettingsDep
from app.web.job_views import FormError, default_text, form_fields, form_params, job_context, recent_jobs
from app.web.render import render
from draftdeck.errors import UsageError
from draftdeck.kinds import KINDS

router = APIRouter(include_in_schema=False)


WriteDep = Depends(require_page_write)


@router.get("/")
def home() -> RedirectResponse:
    return RedirectResponse("/jobs", status_code=303)


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request, session: SessionDep) -> HTMLResponse:
    return render(request, "jobs.html", session, jobs=recent_jobs(session))


@router.get("/jobs/table", response_class=HTMLResponse)
def jobs_table(request: Request, session: SessionDep) -> HTMLResponse:
    return render(request, "partials/jobs_table.html", session, jobs=recent_jobs(session), partial=True)


@router.get("/jobs/new", response_class=HTMLResponse)
def new_job_page(
    request: Request, session: SessionDep, settings: SettingsDep, kind: str = "scan"
) -> HTMLResponse:
    if kind not in KINDS:
        raise HTTPException(404, f"unknown job kind {kind!r}")
    # Prefilled from the query (a next step's link: the previous job's files); a list field's values
    # come one a line, as the form takes them.
    fields = {f["name"] for f in form_fields(kind)}
    values = {
        name: "\n".join(request.query_params.getlist(name)) for name in fields if name in request.query_params
    }
    return _new_job_form(request, session, settings, kind, values=values)


def _new_job_form(
    request: Request,
    session: Session,
    settings: Settings,
    kind: str,
    *,
    error: str | None = None,
    values: dict[str, str] | None = None,
    invalid: dict[str, str] | None = None,
) -> HTMLResponse:
    """The form, blank or (with `error`) as HTTP 400 with the message and what the user typed, each
    field the server refused marked with its reason (`invalid`)."""
    fields = form_fields(kind)
    given, refused = values or {}, invalid or {}
    return render(
        request,
        "job_new.html",
        session,
        kinds=KINDS,
        kind=kind,
        fields=fields,
        # Advanced opens when one of its fields was refused or holds a value other than its default
        # (a job started again): nothing the user typed or must fix is hidden
        open_advanced=any(
            f["advanced"]
            and (f["name"] in refused or given.get(f["name"], default_text(f)) != default_text(f))
            for f in fields
        ),
        roots=settings.roots,
        error=error,
        values=values or {},
        invalid=invalid or {},
        status_code=400 if error else 200,
    )


@router.post("/jobs", dependencies=[WriteDep])
async def create_job_form(
    request: Request, session: SessionDep, settings: SettingsDep, kind: Annotated[str, Form()]
) -> Response:
    form = await request.form()
    raw: dict[str, str] = {}
    try:
        params, raw = form_params(kind, form) if kind in KINDS else ({}, {})
        job = submit.submit(session, kind, params, settings)
    except FormError as exc:
        return _new_job_form(request, session, settings, kind, error=str(exc), values=exc.raw)
    except UsageError as exc:
        return _new_job_form(
            request, session, settings, kind if kind in KINDS else "scan", error=str(exc), values=raw,
            invalid=exc.fields,
        )  # fmt: skip
    return RedirectResponse(f"/jobs/{job.id}", status_code=303)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: int, session: SessionDep) -> HTMLResponse:
    return render(request, "job.html", session, **job_context(session, job_id))


@router.get("/jobs/{job_id}/live", response_class=HTMLResponse)
def job_live(request: Request, job_id: int, session: SessionDep) -> HTMLResponse:
    return render(request, "partials/job_live.html", session, partial=True, **job_context(session, job_id))


@router.post("/jobs/{job_id}/cancel", dependencies=[WriteDep])
def cancel_job_form(job_id: int, session: SessionDep, settings: SettingsDep) -> RedirectResponse:
    try:
        submit.request_cancel(session, job_id, settings)
    except LookupError:
        raise HTTPException(404, f"no job {job_id}") from None
    except state.JobStateError:
        pass  # it ended between the page and the click: its page shows how
    return RedirectResponse(f"/jobs/{job_id}", status_code=303)


@router.post("/jobs/{job_id}/retry", dependencies=[WriteDep])
def retry_job_form(job_id: int, session: SessionDep, settings: SettingsDep) -> RedirectResponse:
    try:
        job = submit.retry(session, job_id, settings)
    except LookupError:
        raise HTTPException(404, f"no job {job_id}") from None
    except (state.JobStateError, UsageError) as exc:
        raise HTTPException(409, str(exc)) from None
    return RedirectResponse(f"/jobs/{job.id}", status_code=303)


@router.get("/alerts", response_class=HTMLResponse)
def alerts_page(request: Request, session: SessionDep) -> HTMLResponse:
    rows = session.exec(
        select(Alert).order_by(col(Alert.acknowledged), col(Alert.id).desc()).limit(200)
    ).all()
    return render(request, "alerts.html", session, alerts=rows, datasets=alerts_datasets(session, rows))


@router.post("/alerts/{alert_id}/ack", dependencies=[WriteDep])
def ack_alert_form(alert_id: int, session: SessionDep) -> RedirectResponse:
    if not records.acknowledge_alert(session, alert_id):
        raise HTTPException(404, f"no alert {alert_id}")
    return RedirectResponse("/alerts", status_code=303)


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, settings: SettingsDep, next: str = "/jobs") -> HTMLResponse:
    # No session: the nav's alert count is not for someone who has not signed in yet.
    return render(request, "login.html", needed=token_required(settings), next=safe_next(next))


@router.post("/login")
async def login(
    request: Request, settings: SettingsDep, token: Annotated[str, Form()], next: Annotated[str, Form()] = ""
) -> Response:
    await require_csrf(request)
    if not token_matches(token, settings):
        error = "that token is wrong" if settings.token else "this server has no token to sign in with"
        return render(
            request,
            "login.html",
            needed=token_required(settings),
            next=safe_next(next),
            error=error,
            status_code=401 if settings.token else 400,
        )
    assert settings.token is not None
    response = RedirectResponse(safe_next(next), status_code=303)
    response.set_cookie(TOKEN_COOKIE, session_value(settings.token), httponly=True, samesite="strict")
    return response
