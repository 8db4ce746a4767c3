"""The FastAPI application."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from app import api, datasets, pages, runs
from app.auth import CSRF_COOKIE
from app.db import REPO_ROOT
from app.settings import get_settings
from app.sweeper import start_sweeper

# No inline scripts or styles anywhere: samples hold arbitrary text, and this is the second wall
# behind escaping.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    stop = start_sweeper(get_settings())
    try:
        yield
    finally:
        stop.set()


def create_app() -> FastAPI:
    app = FastAPI(
        title="DraftDeck",
        version="0.1.0",
        lifespan=lifespan,
        description="Jobs and data for speculative-decoding drafters.",
    )

    @app.middleware("http")
    async def security_headers(request: Request, call_next):  # type: ignore[no-untyped-def]
        response: Response = await call_next(request)
        if not request.url.path.startswith(("/docs", "/redoc")):
            response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        new = getattr(request.state, "new_csrf", None)
        if new:
            response.set_cookie(CSRF_COOKIE, new, httponly=True, samesite="strict")
        return response

    app.mount("/static", StaticFiles(directory=str(REPO_ROOT / "static")), name="static")
    app.include_router(api.router)
    app.include_router(pages.router)
    app.add_exception_handler(StarletteHTTPException, pages.http_error_page)  # HTML for pages, JSON for /api
    app.include_router(datasets.router)
    app.include_router(runs.router)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


app = create_app()
