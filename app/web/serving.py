"""Served drafters on the web: the /serving pages (register, list, one endpoint's health and figures,
pause, resume, delete) and the JSON API under /api/serving. Records and figures: app/serving/endpoints.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, Field
from sqlmodel import Session, col, select

from app.serving import endpoints
from app.serving.endpoints import EndpointError
from app.serving.series import chart_data
from app.store.metric_query import QueryError
from app.store.models import Alert, Job, ServingEndpoint, ServingWindow
from app.web.auth import require_api_write, require_page_write
from app.web.deps import SessionDep
from app.web.render import render

router = APIRouter(include_in_schema=False)
api = APIRouter(prefix="/api", tags=["api"])
PageWrite = Depends(require_page_write)
ApiWrite = Depends(require_api_write)
RECENT = 40  # windows the endpoint page lists


class EndpointCreate(BaseModel):
    """An endpoint to watch; the same fields as the form and `draftdeck serving add`."""

    name: str
    kind: str = Field(description="vllm or sglang")
    metrics_url: str = Field(description="the server's Prometheus /metrics URL")
    base_url: str | None = Field(
        default=None, description="the OpenAI-compatible base (default: beside /metrics)"
    )
    drafter: str | None = Field(default=None, description="the checkpoint or exported folder it serves")
    run_job_id: int | None = Field(default=None, description="the train run whose drafter it serves")
    token_env: str | None = Field(default=None, description="environment variable holding a bearer token")
    model_name: str | None = Field(
        default=None, description="the served model whose counts are the drafter's (default: all, summed)"
    )
    interval_s: float = Field(default=15.0, description="seconds between scrapes")


class EndpointPublic(BaseModel):
    id: int
    name: str
    kind: str
    base_url: str
    metrics_url: str
    drafter: str | None
    run_job_id: int | None
    token_env: str | None
    model_name: str | None
    interval_s: float
    enabled: bool
    health: str
    health_text: str
    last_scrape_at: datetime | None
    last_ok_at: datetime | None
    last_error: str | None
    failures: int
    window: dict[str, Any]
    gauges: dict[str, float] | None
    eval_tau: float | None


def _public(view: dict[str, Any]) -> EndpointPublic:
    ep: ServingEndpoint = view["endpoint"]
    return EndpointPublic(
        **ep.model_dump(include=set(EndpointPublic.model_fields) & set(ServingEndpoint.model_fields)),
        health=view["health"].state, health_text=view["health"].text, window=view["window"],
        gauges=view["gauges"], eval_tau=view["eval_tau"],
    )  # fmt: skip


def _get(session: Session, endpoint_id: int) -> ServingEndpoint:
    ep = session.get(ServingEndpoint, endpoint_id)
    if ep is None:
        raise HTTPException(404, f"no serving endpoint {endpoint_id}")
    return ep


def _all(session: Session) -> list[ServingEndpoint]:
    return list(session.exec(select(ServingEndpoint).order_by(col(ServingEndpoint.id))).all())


def _runs(session: Session) -> list[Job]:
    return list(
        session.exec(select(Job).where(Job.kind == endpoints.TRAIN_KIND).order_by(col(Job.id).desc())).all()
    )


def _window_row(r: ServingWindow) -> dict[str, Any]:
    at = datetime.fromtimestamp(r.wall_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return {"at": at, "w": endpoints.summed([r], r.model_name), "gauges": r.gauges}


# -- pages -------------------------------------------------------------------------------------------
@router.get("/serving", response_class=HTMLResponse)
def serving_page(
    request: Request, session: SessionDep, error: str | None = None, form: dict[str, Any] | None = None
) -> HTMLResponse:
    views = [endpoints.endpoint_view(session, ep) for ep in _all(session)]
    return render(request, "serving.html", session, nav="serving", views=views, runs=_runs(session),
                  error=error, form=form or {}, status_code=400 if error else 200)  # fmt: skip


@router.post("/serving", dependencies=[PageWrite])
def register_page(
    request: Request,
    session: SessionDep,
    name: Annotated[str, Form()],
    kind: Annotated[str, Form()],
    metrics_url: Annotated[str, Form()],
    drafter: Annotated[str, Form()] = "",
    run_job_id: Annotated[str, Form()] = "",
    token_env: Annotated[str, Form()] = "",
    model_name: Annotated[str, Form()] = "",
    interval_s: Annotated[str, Form()] = "15",
) -> Response:
    form = {"name": name, "kind": kind, "metrics_url": metrics_url, "drafter": drafter,
            "run_job_id": run_job_id, "token_env": token_env, "model_name": model_name,
            "interval_s": interval_s}  # fmt: skip
    try:
        ep = endpoints.create_endpoint(
            session, name=name, kind=kind, metrics_url=metrics_url, drafter=drafter or None,
            run_job_id=int(run_job_id) if run_job_id.strip() else None, token_env=token_env.strip() or None,
            model_name=model_name, interval_s=float(interval_s),
        )  # fmt: skip
    except ValueError:
        return serving_page(request, session, error="run and interval must be numbers", form=form)
    except EndpointError as exc:
        return serving_page(request, session, error=str(exc), form=form)
    return RedirectResponse(f"/serving/{ep.id}", status_code=303)


@router.get("/serving/{endpoint_id}", response_class=HTMLResponse)
def endpoint_page(request: Request, session: SessionDep, endpoint_id: int) -> HTMLResponse:
    ep = _get(session, endpoint_id)
    recent = session.exec(
        select(ServingWindow)
        .where(ServingWindow.endpoint_id == ep.id)
        .order_by(col(ServingWindow.wall_ms).desc())
        .limit(RECENT)
    ).all()
    alerts = session.exec(
        select(Alert).where(Alert.endpoint_id == ep.id).order_by(col(Alert.id).desc()).limit(20)
    ).all()
    view = endpoints.endpoint_view(session, ep)
    return render(request, "serving_endpoint.html", session, nav="serving", view=view,
                  recent=[_window_row(r) for r in recent], alerts=alerts)  # fmt: skip


@router.get("/serving/{endpoint_id}/data")
def endpoint_data(
    session: SessionDep, endpoint_id: int, lo: int | None = None, hi: int | None = None, budget: int = 500
) -> JSONResponse:
    """Chart data of an endpoint: served tau over time bucketed on [lo, hi] epoch ms, p_i served and of
    its run's best eval and held-out walk, and the run's taus to draw beside them."""
    try:
        return JSONResponse(chart_data(session, _get(session, endpoint_id), lo, hi, budget))
    except QueryError as exc:
        raise HTTPException(400, str(exc)) from None


@router.post("/serving/{endpoint_id}/{action}", dependencies=[PageWrite])
def endpoint_action(session: SessionDep, endpoint_id: int, action: str) -> Response:
    ep = _get(session, endpoint_id)
    if action in ("pause", "resume"):
        ep.enabled = action == "resume"
        session.add(ep)
        session.commit()
        return RedirectResponse(f"/serving/{endpoint_id}", status_code=303)
    if action == "delete":
        endpoints.delete_endpoint(session, ep)
        return RedirectResponse("/serving", status_code=303)
    raise HTTPException(404, f"no action {action!r}: pause, resume or delete")


# -- the JSON API ------------------------------------------------------------------------------------
@api.get("/serving", response_model=list[EndpointPublic])
def list_endpoints(session: SessionDep) -> list[EndpointPublic]:
    """Every serving endpoint with its health and its newest window (served tau incl. bonus)."""
    return [_public(endpoints.endpoint_view(session, ep)) for ep in _all(session)]


@api.post("/serving", status_code=201, response_model=EndpointPublic, dependencies=[ApiWrite])
def create_endpoint(body: EndpointCreate, session: SessionDep) -> EndpointPublic:
    try:
        ep = endpoints.create_endpoint(session, **body.model_dump())
    except EndpointError as exc:
        raise HTTPException(400, str(exc)) from None
    return _public(endpoints.endpoint_view(session, ep))


@api.get("/serving/{endpoint_id}", response_model=EndpointPublic)
def get_endpoint(endpoint_id: int, session: SessionDep) -> EndpointPublic:
    return _public(endpoints.endpoint_view(session, _get(session, endpoint_id)))


@api.delete("/serving/{endpoint_id}", status_code=204, dependencies=[ApiWrite])
def delete_endpoint(endpoint_id: int, session: SessionDep) -> Response:
    endpoints.delete_endpoint(session, _get(session, endpoint_id))
    return Response(status_code=204)
