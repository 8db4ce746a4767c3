"""Rendering pages: the Jinja2 templates with DraftDeck's filters and globals, `render` (with the
nav's open-alert count), and HTTP errors as a page for browsers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, Response
from fastapi.templating import Jinja2Templates
from sqlmodel import Session, func, select
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.resources import resource_dir
from app.run.outcomes import retry_may_help
from app.settings import get_settings
from app.store.models import Alert
from app.web.auth import csrf_token
from app.web.dataset_views import source_place
from app.web.job_views import form_words, inputs_changed_since, job_duration, job_inputs, yaml_text
from app.web.provenance_view import FOLDED as PROVENANCE_FOLDED
from app.web.provenance_view import LABELS as PROVENANCE_LABELS
from app.web.provenance_view import provenance_rows, versions_differ
from app.web.run_views import shown_params
from draftdeck.drafter.kinds import NAMES as DRAFTER_KINDS
from draftdeck.drafter.kinds import get_kind as get_drafter_kind
from draftdeck.issue_codes import CHOSEN, FOLDED
from draftdeck.mix.composition import composition
from draftdeck.paths import resolve_user_path
from draftdeck.units import binary_size, count, noun_for, short_count

templates = Jinja2Templates(directory=resource_dir("templates"))


def short_path(value: object) -> str:
    """`value` as a user can type it back into a form (pages keep the full path in a title): relative
    to the server's working folder or to the first data root, where `resolve_user_path` takes it back
    to the same place; else absolute."""
    text = str(value)
    path = Path(text)
    if not path.is_absolute():
        return text
    roots = get_settings().roots
    for base in (Path.cwd(), *roots[:1]):
        if path.is_relative_to(base) and path != base:
            typed = str(path.relative_to(base))
            if resolve_user_path(typed, roots) == path.resolve():
                return typed
    return text


templates.env.filters["bytes"] = binary_size


templates.env.filters["count"] = lambda n, noun: count(n, noun) if isinstance(n, int) else f"? {noun}"


templates.env.filters["noun"] = lambda n, noun: noun_for(n if isinstance(n, int) else None, noun)


templates.env.filters["short_count"] = short_count
templates.env.filters["thousands"] = lambda n: (
    f"{n:,}" if isinstance(n, int) and not isinstance(n, bool) else n
)


templates.env.filters["short_path"] = short_path


def param_text(value: object) -> str:
    """A parameter's value as a person reads it (the page escapes it): lists joined, mappings as
    KEY=VALUE, never JSON's escapes (`\\u003c|mask|\\u003e`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ", ".join(param_text(v) for v in value)
    if isinstance(value, dict):
        return "; ".join(f"{k}={param_text(v)}" for k, v in value.items())
    return str(value)


templates.env.filters["param_text"] = param_text


templates.env.globals["job_inputs"] = job_inputs
templates.env.globals["shown_params"] = shown_params


templates.env.globals["duration"] = job_duration


templates.env.globals["composition"] = composition


templates.env.globals["yaml_text"] = yaml_text


templates.env.globals["chosen_codes"] = sorted(CHOSEN)
templates.env.globals["folded_codes"] = sorted(FOLDED)


def retry_helps(job: Any) -> bool:
    """Whether a page offers Retry: not for a failure that the same inputs and parameters would
    repeat, unless an input changed since (the user fixed the file); never for a run launched
    outside the job system (it is relaunched where it ran)."""
    if getattr(job, "external_key", None) is not None:
        return False
    return retry_may_help(job.status, job.error) or inputs_changed_since(job)


templates.env.globals["retry_helps"] = retry_helps


def drafting(kind: object, block: object) -> str:
    """What an eval's verify steps drafted, in words (eval.json's `drafter` and `block_size`)."""
    name = kind if isinstance(kind, str) and kind in DRAFTER_KINDS else "dflash"
    return get_drafter_kind(name).drafting(block) if isinstance(block, int) else ""


templates.env.globals["drafting"] = drafting


def floor_name(kind: object) -> str:
    """What an eval's floor line (`untrained`) decoded with, as its kind names it (eval.json's `drafter`)."""
    name = kind if isinstance(kind, str) and kind in DRAFTER_KINDS else "dflash"
    return get_drafter_kind(name).floor


templates.env.globals["floor_name"] = floor_name
# what a run or an eval ran with (templates/partials/provenance.html)
templates.env.filters["provenance_rows"] = provenance_rows
templates.env.globals["provenance_labels"] = PROVENANCE_LABELS
templates.env.globals["provenance_folded"] = PROVENANCE_FOLDED
templates.env.globals["versions_differ"] = versions_differ


def drafter_title(name: object) -> str:
    """A drafter kind as pages name it ("dflash" -> "DFlash", "eagle3" -> "EAGLE-3"); an unknown
    name as it is."""
    return get_drafter_kind(name).title if isinstance(name, str) and name in DRAFTER_KINDS else str(name)


templates.env.filters["drafter_title"] = drafter_title
templates.env.globals["planned_drafter"] = lambda plan: get_drafter_kind(plan.drafter).planned(plan)[0]


templates.env.globals["source_place"] = source_place


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
