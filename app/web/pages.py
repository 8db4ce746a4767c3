"""HTML pages (Jinja2 + htmx). Live parts are partials that poll while the job runs and stop when it ends."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import yaml
from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlmodel import Session, col, func, select
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.resources import resource_dir
from app.run import liveness, submit
from app.settings import Settings, get_settings
from app.store import records, state
from app.store.models import Alert, Dataset, Job, JobEvent, JobOutput, JobStatus
from app.web.auth import (
    TOKEN_COOKIE,
    csrf_token,
    require_csrf,
    require_page_write,
    safe_next,
    session_value,
    token_matches,
    token_required,
)
from app.web.deps import SessionDep, SettingsDep
from draftdeck.errors import UsageError
from draftdeck.kinds import KINDS
from draftdeck.mix.composition import composition
from draftdeck.quality import CHOSEN
from draftdeck.units import binary_size, count, duration, noun_for

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=resource_dir("templates"))
WriteDep = Depends(require_page_write)
LOG_TAIL = 200
JOBS_SHOWN = 100


def _short_path(value: object) -> str:
    """`value` relative to the data root that holds it (pages keep the full path in a title)."""
    text = str(value)
    path = Path(text)
    if path.is_absolute():
        for root in sorted(get_settings().roots, key=lambda r: len(r.parts), reverse=True):
            if path.is_relative_to(root) and path != root:
                return str(path.relative_to(root))
    return text


def _job_inputs(job: Job) -> list[str]:
    """The data a job reads, in order: what identifies it in a list. Only `inputs` (every kind names
    its data so): a tokenizer, target model or policy file is a parameter, not one more input."""
    value = job.params.get("inputs")
    return [str(v) for v in (value if isinstance(value, list) else [value]) if v is not None]


_FLAG = re.compile(r"(?:\b(?:pass|use|with|set)\s+)?--([a-z][a-z0-9-]*)(?:\s+([A-Za-z0-9_.]+))?")


def form_words(text: str | None, kind_name: str) -> str:
    """A message of the core (written for the CLI: "pass --on-missing drop") in the form's words ("set
    on_missing to drop in the form"), for the kind's fields; other text is left as it is."""
    if not text:
        return ""
    kind = KINDS.get(kind_name)
    if kind is None:
        return text
    fields = {f["name"]: f for f in _form_fields(kind_name)}

    def say(m: re.Match[str]) -> str:
        name, value = m.group(1).replace("-", "_"), m.group(2)
        field = fields.get(name)
        if field is None:
            return m.group(0)
        if field["widget"] == "checkbox":
            return f"tick “{name}” in the form" + (f" {value}" if value else "")
        if value is not None and value in field["options"]:
            return f"set “{name}” to {value} in the form"
        return f"“{name}” (in the form)" + (f" {value}" if value else "")

    return _FLAG.sub(say, text)


def new_job_link(kind: str, params: Mapping[str, Any]) -> str:
    """The New-job form of `kind` prefilled with `params` (lists repeat their key)."""
    query: list[tuple[str, str]] = [("kind", kind)]
    yaml_fields = {f["name"] for f in _form_fields(kind) if f["widget"] == "yaml"} if kind in KINDS else set()
    for name, value in params.items():
        if value is None or value == [] or value == {}:
            continue
        if name in yaml_fields and isinstance(value, dict):  # a recipe: back as the YAML it was typed as
            query.append((name, yaml_text(value)))
        elif isinstance(value, list):
            query.extend((name, str(v)) for v in value)
        elif isinstance(value, dict):  # KEY=VALUE lines, as the form's pairs field takes them
            query.extend((name, f"{k}={json.dumps(v)}") for k, v in value.items())
        elif isinstance(value, bool):
            query.append((name, "true" if value else "false"))
        else:
            query.append((name, str(value)))
    return "/jobs/new?" + urlencode(query)


OFF_TARGET = "data_not_target_output"


def regenerate_with_target(job: Job) -> str:
    """The New-job form of a `regenerate` job in which a train job's target answers the conversations
    its datasets were tokenized from (the fix for data_not_target_output), prefilled."""
    from draftdeck.errors import InputError
    from draftdeck.shards.manifest import read_manifest

    target = job.params.get("target")
    sources: list[str] = []
    for folder in _job_inputs(job):
        try:
            sources += read_manifest(Path(folder)).inputs
        except InputError:
            continue
    params: dict[str, Any] = {"local": target, "temperature": 0}
    if sources:
        first = Path(sources[0])
        params |= {
            "inputs": sources,
            "out": str(first.with_name(f"{first.stem}.by-{Path(str(target)).name}.jsonl")),
        }
    return new_job_link("regenerate", params)


def next_steps(
    job: Job, outputs: Sequence[JobOutput], datasets: Sequence[Dataset], alerts: Sequence[Alert] = ()
) -> list[tuple[str, str]]:
    """(label, link) of what a user does after this job, where they are: a scanned file is converted,
    a converted file tokenized, a tokenized dataset opened; a failed job is changed and started again;
    a run told its data is not its target's output regenerates it with the target (while it runs too)."""
    inputs = _job_inputs(job)
    files = [o.path for o in outputs]
    fixes = []
    if job.kind == "train" and any(a.kind == OFF_TARGET for a in alerts):
        fixes = [("Regenerate with this target", regenerate_with_target(job))]
    if job.status == JobStatus.SUCCEEDED:
        if job.kind == "scan" and inputs:
            return [("Convert this", new_job_link("convert", {"inputs": inputs}))]
        if job.kind == "convert" and files:
            return [("Tokenize this", new_job_link("tokenize", {"inputs": files}))]
        if job.kind == "mix" and files:  # re-weighting after the per-source figures is the next loop
            return [("Tokenize this", new_job_link("tokenize", {"inputs": files})),
                    ("Change the recipe", new_job_link("mix", job.params))]  # fmt: skip
        if job.kind == "tokenize" and datasets:
            return [(f"Open dataset {d.name}", f"/datasets/{d.id}") for d in datasets]
        return fixes
    if job.status == JobStatus.FAILED and job.kind in KINDS:
        return [*fixes, ("Change and start again", new_job_link(job.kind, job.params))]
    return fixes


def yaml_text(value: Any) -> str:
    """A mapping as block YAML, its unset (None) values left out."""

    def bare(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: bare(x) for k, x in v.items() if x is not None}
        return [bare(x) for x in v] if isinstance(v, list) else v

    return yaml.safe_dump(bare(value), sort_keys=False, allow_unicode=True)


def _duration(job: Job) -> str | None:
    if job.started_at is None or job.finished_at is None:
        return None
    return duration((job.finished_at - job.started_at).total_seconds())


templates.env.filters["bytes"] = binary_size
templates.env.filters["count"] = lambda n, noun: count(n, noun) if isinstance(n, int) else f"? {noun}"
templates.env.filters["noun"] = lambda n, noun: noun_for(n if isinstance(n, int) else None, noun)
templates.env.filters["thousands"] = lambda n: (
    f"{n:,}" if isinstance(n, int) and not isinstance(n, bool) else n
)
templates.env.filters["short_path"] = _short_path
templates.env.globals["job_inputs"] = _job_inputs
templates.env.globals["duration"] = _duration
templates.env.globals["composition"] = composition
templates.env.globals["yaml_text"] = yaml_text
templates.env.globals["chosen_codes"] = sorted(CHOSEN)
templates.env.filters["form_words"] = form_words


def _open_alerts(session: Session) -> int:
    return int(
        session.exec(
            select(func.count()).select_from(Alert).where(Alert.acknowledged == False)  # noqa: E712
        ).one()
    )


def render(
    request: Request, name: str, session: Session | None = None, status_code: int = 200, **context: Any
) -> HTMLResponse:
    """Render a page or partial. With a session, the nav's open-alert count comes along (partials
    refresh it out of band, so a job that fails while you watch lights the badge without a reload)."""
    if session is not None:
        context["open_alerts"] = _open_alerts(session)
    return templates.TemplateResponse(
        request, name, {"csrf": csrf_token(request), **context}, status_code=status_code
    )


ERROR_TITLES = {
    400: "Bad request",
    401: "Sign in needed",
    403: "Not allowed",
    404: "Not found",
    409: "Not possible now",
    415: "Unsupported request",
}


async def http_error_page(request: Request, exc: Exception) -> Response:
    """HTTP errors of the pages as a page; the API, htmx and non-HTML clients keep FastAPI's JSON."""
    assert isinstance(exc, StarletteHTTPException)
    wants_html = "text/html" in request.headers.get("accept", "")
    if request.url.path.startswith("/api/") or request.headers.get("hx-request") or not wants_html:
        return await http_exception_handler(request, exc)
    title = ERROR_TITLES.get(exc.status_code, "Something went wrong")
    return render(
        request,
        "error.html",
        status_code=exc.status_code,
        title=title,
        status=exc.status_code,
        message=str(exc.detail),
    )


@router.get("/")
def home() -> RedirectResponse:
    return RedirectResponse("/jobs", status_code=303)


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request, session: SessionDep) -> HTMLResponse:
    return render(request, "jobs.html", session, jobs=_recent_jobs(session))


@router.get("/jobs/table", response_class=HTMLResponse)
def jobs_table(request: Request, session: SessionDep) -> HTMLResponse:
    return render(request, "partials/jobs_table.html", session, jobs=_recent_jobs(session), partial=True)


def _recent_jobs(session: Session) -> list[Job]:
    return list(session.exec(select(Job).order_by(col(Job.id).desc()).limit(JOBS_SHOWN)).all())


def _form_fields(kind_name: str) -> list[dict[str, Any]]:
    """One form field per parameter, from the kind's JSON schema: text, number, checkbox, a select
    for enums and a textarea (one value a line) for lists. Optional (`X | None`) fields are X fields
    that may stay empty."""
    kind = KINDS[kind_name]
    schema = kind.params.model_json_schema()
    required = set(schema.get("required", []))
    fields = []
    for name, spec in schema.get("properties", {}).items():
        options = [o for o in spec.get("anyOf", [spec]) if o.get("type") != "null"]
        base = options[0] if len(options) == 1 else {"type": "string"}
        ftype = base.get("type", "string")
        widget = {"boolean": "checkbox", "array": "textarea", "integer": "number", "number": "number"}.get(
            ftype, "text"
        )
        if spec.get("widget"):  # declared on the field (a recipe's YAML)
            widget = spec["widget"]
        elif "enum" in base:
            widget = "select"
        elif ftype == "object":
            widget = "pairs"  # KEY=VALUE lines, parsed by the model as the CLI's -k KEY=VALUE
        fields.append(
            {
                "name": name,
                "widget": widget,
                "type": ftype,
                "options": base.get("enum", []),
                "min": base.get("minimum"),
                "max": base.get("maximum"),
                "description": spec.get("description", ""),
                "default": spec.get("default"),
                "required": name in required,
                "path": name in kind.params.input_paths,
                "output": name in kind.params.output_paths,
            }
        )
    return fields


class FormError(UsageError):
    """A form value that cannot even be read (its field and what was typed come back to the user)."""

    def __init__(self, message: str, raw: dict[str, str]):
        super().__init__(message)
        self.raw = raw


def _form_params(kind_name: str, form: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """(parameters for the kind, the raw text to show again on an error) from a submitted form."""
    widgets = {f["name"]: f["widget"] for f in _form_fields(kind_name)}
    raw = {k: str(v) for k, v in form.items() if k not in ("kind", "csrf") and str(v).strip() != ""}
    params: dict[str, Any] = {}
    for name, text in raw.items():
        widget = widgets.get(name)
        if widget == "textarea":
            params[name] = [line.strip() for line in text.splitlines() if line.strip()]
        elif widget in ("pairs", "yaml"):
            params[name] = text  # KEY=VALUE lines or YAML: the kind's model parses them, as it does the CLI's
        else:
            params[name] = text.strip()
    return params, raw


@router.get("/jobs/new", response_class=HTMLResponse)
def new_job_page(
    request: Request, session: SessionDep, settings: SettingsDep, kind: str = "scan"
) -> HTMLResponse:
    if kind not in KINDS:
        raise HTTPException(404, f"unknown job kind {kind!r}")
    # Prefilled from the query (a next step's link: the previous job's files); a list field's values
    # come one a line, as the form takes them.
    fields = {f["name"] for f in _form_fields(kind)}
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
    return render(
        request,
        "job_new.html",
        session,
        kinds=KINDS,
        kind=kind,
        fields=_form_fields(kind),
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
        params, raw = _form_params(kind, form) if kind in KINDS else ({}, {})
        job = submit.submit(session, kind, params, settings)
    except FormError as exc:
        return _new_job_form(request, session, settings, kind, error=str(exc), values=exc.raw)
    except UsageError as exc:
        return _new_job_form(
            request, session, settings, kind if kind in KINDS else "scan", error=str(exc), values=raw,
            invalid=exc.fields,
        )  # fmt: skip
    return RedirectResponse(f"/jobs/{job.id}", status_code=303)


def _job_context(session: Session, job_id: int) -> dict[str, Any]:
    job = records.get_job(session, job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id}")
    events = session.exec(
        select(JobEvent).where(JobEvent.job_id == job_id).order_by(col(JobEvent.id).desc()).limit(LOG_TAIL)
    ).all()
    outputs = session.exec(
        select(JobOutput).where(JobOutput.job_id == job_id).order_by(col(JobOutput.id))
    ).all()
    issues = [e for e in events if e.code]
    issues.sort(key=lambda e: ({"error": 0, "rejected": 1, "warning": 2}.get(e.level, 3), -e.count))
    datasets = records.datasets_of(session, job_id)
    alerts = session.exec(select(Alert).where(Alert.job_id == job_id).order_by(col(Alert.id))).all()
    return {
        "job": job,
        "alerts": alerts,
        "next_steps": next_steps(job, outputs, datasets, alerts),
        "log": list(reversed(events)),
        "issues": issues,
        "outputs": outputs,
        "datasets": datasets,
        "terminal": job.status in ("succeeded", "failed", "cancelled"),
        "no_worker": job.status in ("queued", "running")
        and not liveness.of_job(session, job, get_settings().lost_after_seconds).served,
    }


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: int, session: SessionDep) -> HTMLResponse:
    return render(request, "job.html", session, **_job_context(session, job_id))


@router.get("/jobs/{job_id}/live", response_class=HTMLResponse)
def job_live(request: Request, job_id: int, session: SessionDep) -> HTMLResponse:
    return render(request, "partials/job_live.html", session, partial=True, **_job_context(session, job_id))


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
    return render(request, "alerts.html", session, alerts=rows)


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
