"""Authentication and CSRF.

- When the server listens beyond loopback (or a token is configured), every request that changes
  something must carry the token: `Authorization: Bearer <token>` for the API, or the cookie that
  /login sets for the pages.
- HTML forms and htmx requests carry a CSRF token that must match the `dd_csrf` cookie
  (double-submit). JSON API calls must be `application/json`, which a cross-site form cannot send.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from app.settings import Settings, get_settings, is_loopback

CSRF_COOKIE = "dd_csrf"
TOKEN_COOKIE = "dd_token"
CSRF_HEADER = "x-csrf-token"


def token_required(settings: Settings) -> bool:
    return bool(settings.token) or not is_loopback(settings.host)


def _token_ok(request: Request, settings: Settings) -> bool:
    if not token_required(settings):
        return True
    if not settings.token:
        return False
    given = request.headers.get("authorization", "")
    candidate = given[7:] if given.lower().startswith("bearer ") else request.cookies.get(TOKEN_COOKIE, "")
    return hmac.compare_digest(candidate.encode(), settings.token.encode())


def require_api_write(request: Request, settings: Annotated[Settings, Depends(get_settings)]) -> None:
    if (
        not request.headers.get("content-type", "").startswith("application/json")
        and request.method == "POST"
    ):
        # Empty-bodied POSTs (cancel, retry) must still declare JSON: it forces a CORS preflight cross-site.
        raise HTTPException(415, "send Content-Type: application/json")
    if not _token_ok(request, settings):
        raise HTTPException(401, "this server needs a token: send Authorization: Bearer <DRAFTDECK_TOKEN>")


def csrf_token(request: Request) -> str:
    return request.cookies.get(CSRF_COOKIE) or getattr(request.state, "new_csrf", None) or _new_csrf(request)


def _new_csrf(request: Request) -> str:
    token = secrets.token_urlsafe(24)
    request.state.new_csrf = token
    return token


async def require_csrf(request: Request) -> None:
    cookie = request.cookies.get(CSRF_COOKIE, "")
    sent = request.headers.get(CSRF_HEADER, "")
    if not sent:
        form = await request.form()
        sent = str(form.get("csrf", ""))
    if not cookie or not hmac.compare_digest(cookie.encode(), sent.encode()):
        raise HTTPException(403, "the form's CSRF token is missing or stale: reload the page and try again")


async def require_page_write(request: Request, settings: Annotated[Settings, Depends(get_settings)]) -> None:
    await require_csrf(request)
    if not _token_ok(request, settings):
        raise HTTPException(401, "this server needs a token: sign in at /login")
