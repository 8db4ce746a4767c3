"""The FastAPI application."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.resources import resource_dir
from app.run.sweeper import start_sweeper
from app.serving.scraper import start_scraper
from app.settings import get_settings
from app.web import api, datasets, evals, guide, jobs, picker, render, runs, sse, sweeps
from app.web import serving as serving_routes
from app.web.auth import CSRF_COOKIE, AccessGuard
from app.web.limits import RequestLimits, cap_log_lines

# No inline scripts or styles anywhere: samples hold arbitrary text, and this is the second wall
# behind escaping.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
# The API docs render only our own schema, from our own bundles, and still run no inline script; but
# Swagger UI and Redoc (styled-components) inject <style> elements, and Redoc's search runs in a blob: worker.
DOCS_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "worker-src 'self' blob:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
DOCS_PATHS = ("/docs", "/redoc")
# The guide is our own documentation site, built by MkDocs: Material's pages run small inline scripts
# (its palette and scope) and inline styles. It holds no user data.
GUIDE_CSP = DOCS_CSP.replace("script-src 'self'", "script-src 'self' 'unsafe-inline'")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    stops = [start_sweeper(get_settings()), start_scraper(get_settings())]
    try:
        yield
    finally:
        for stop in stops:
            stop.set()


# The progress label is formatted once, for the template and the event stream alike.
render.templates.env.globals["progress_view"] = sse.progress_view
# Every page's Guide link, and each issue code's, lead to the page of the guide that explains it.
render.templates.env.globals["guide_url"] = guide.guide_url
render.templates.env.globals["issue_url"] = guide.issue_url


def _api_docs(request: Request, ui: str, app: FastAPI) -> HTMLResponse:
    return render.templates.TemplateResponse(
        request, "api_docs.html", {"ui": ui, "title": app.title, "openapi_url": app.openapi_url}
    )


def create_app() -> FastAPI:
    app = FastAPI(
        title="DraftDeck",
        version="0.1.0",
        lifespan=lifespan,
        description="Jobs and data for speculative-decoding drafters.",
        docs_url=None,  # FastAPI's own pages load their scripts from a CDN, inline: ours are below
        redoc_url=None,
    )
    # Added first, so they run inside security_headers (their refusals get its headers too); the
    # token check runs before any body is read.
    cap_log_lines()
    app.add_middleware(RequestLimits)
    app.add_middleware(AccessGuard)

    @app.middleware("http")
    async def security_headers(request: Request, call_next):
        response: Response = await call_next(request)
        path = request.url.path
        docs = path in DOCS_PATHS
        guided = path == "/guide" or path.startswith(guide.PREFIX)
        response.headers["Content-Security-Policy"] = GUIDE_CSP if guided else DOCS_CSP if docs else CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        new = getattr(request.state, "new_csrf", None)
        if new:
            response.set_cookie(CSRF_COOKIE, new, httponly=True, samesite="strict")
        return response

    app.mount("/static", StaticFiles(directory=resource_dir("static")), name="static")
    app.include_router(api.router)
    app.include_router(serving_routes.api)
    app.include_router(sse.router)  # before the pages: /jobs/events is not /jobs/{job_id}
    app.include_router(picker.router)  # before the pages: /jobs/new/files is not /jobs/{job_id}/...
    app.include_router(jobs.router)
    app.add_exception_handler(StarletteHTTPException, render.http_error_page)  # HTML for pages, JSON for /api
    app.include_router(datasets.router)
    app.include_router(runs.router)
    app.include_router(evals.router)
    app.include_router(sweeps.router)
    app.include_router(serving_routes.router)
    app.include_router(guide.router)

    @app.get("/docs", include_in_schema=False, response_class=HTMLResponse)
    def swagger_docs(request: Request) -> HTMLResponse:
        return _api_docs(request, "swagger", app)

    @app.get("/redoc", include_in_schema=False, response_class=HTMLResponse)
    def redoc_docs(request: Request) -> HTMLResponse:
        return _api_docs(request, "redoc", app)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


app = create_app()
