"""Authentication and CSRF.

- A server reachable beyond loopback (bound to a non-loopback address, or answering a request that
  arrived from or at a non-loopback address) serves nobody without the token: every request, reads
  included, carries `Authorization: Bearer <token>` or the session cookie /login sets. Only /login,
  /static/ and /healthz stay open. Without a token configured such a request is refused outright,
  however the app was started (`draftdeck web` refuses to start; plain `uvicorn --host 0.0.0.0`
  cannot be stopped from here, so the app itself says no).
- A server bound to loopback and reached over loopback stays open for reads; writes need the token
  whenever one is configured.
- Every request names a Host this server answers to (:func:`host_allowed`): localhost, 127.0.0.1,
  ::1, the bind address, the names in DRAFTDECK_ALLOWED_HOSTS, and, when it listens on every interface,
  any IP address. A page of another site that resolves its own name to this machine (DNS rebinding)
  sends its own name: 400, before anything is read or done.
- HTML forms and htmx requests carry a CSRF token signed with the server's secret over a random value in
  the `dd_csrf` cookie. A page on another port of this host can set that cookie (cookies know no ports)
  but cannot sign a token for it. JSON API calls must be `application/json`, which a cross-site form
  cannot send.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import secrets
from typing import Annotated
from urllib.parse import quote

from fastapi import Depends, HTTPException, Request
from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from app.settings import Settings, get_settings, is_loopback

CSRF_COOKIE = "dd_csrf"
# The cookie holds a value derived from the token, never the token itself: a stolen cookie does not
# reveal the bearer token, and changing the token signs every session out.
TOKEN_COOKIE = "dd_session"
CSRF_HEADER = "x-csrf-token"
OPEN_PREFIXES = ("/static/",)
OPEN_PATHS = ("/login", "/healthz")


def token_required(settings: Settings) -> bool:
    return bool(settings.token) or not is_loopback(settings.host)


def session_value(token: str) -> str:
    return hmac.new(token.encode(), b"draftdeck session v1", hashlib.sha256).hexdigest()


def token_matches(candidate: str, settings: Settings) -> bool:
    return bool(settings.token) and hmac.compare_digest(candidate.encode(), (settings.token or "").encode())


def _signed_in(conn: HTTPConnection, settings: Settings) -> bool:
    """The request carries the bearer token or a session cookie from /login."""
    if not settings.token:
        return False
    given = conn.headers.get("authorization", "")
    if given.lower().startswith("bearer "):
        return token_matches(given[7:], settings)
    cookie = conn.cookies.get(TOKEN_COOKIE, "")
    return hmac.compare_digest(cookie.encode(), session_value(settings.token).encode())


def _token_ok(request: Request, settings: Settings) -> bool:
    return not token_required(settings) or _signed_in(request, settings)


def _remote_ip(host: str | None) -> bool:
    """A non-loopback IP address. A peer that is no IP (a Unix socket, an in-process test client)
    is this machine."""
    try:
        ipaddress.ip_address((host or "").strip("[]"))
    except ValueError:
        return False
    return not is_loopback(host or "")


def beyond_loopback(scope: Scope, settings: Settings) -> bool:
    """Whether this request reaches a server that listens beyond loopback. The bind address in the
    settings says so for `draftdeck web`; for any other launcher the request's own two ends do (a
    server bound to 0.0.0.0 sees its LAN address as the local end of a LAN connection)."""
    if not is_loopback(settings.host):
        return True
    ends = (scope.get("client"), scope.get("server"))
    return any(end is not None and _remote_ip(str(end[0])) for end in ends)


def host_allowed(host_header: str, settings: Settings, local: str | None = None) -> bool:
    """Whether a request's Host header names this server (see the module's rules); `local`: the address
    the connection arrived at (an address of this machine, whatever the server was told)."""
    name = host_header.strip().lower()
    if name.startswith("["):  # [::1]:8000
        name = name[1 : name.find("]")] if "]" in name else name
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    name = name.rstrip(".")
    allowed = settings.allowed_hosts
    if name in ("localhost", "127.0.0.1", "::1", settings.host.lower()) or name.endswith(".localhost"):
        return True
    if (
        "*" in allowed
        or name in allowed
        or any(a[:1] == "." and (name.endswith(a) or name == a[1:]) for a in allowed)
    ):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    # the machine's own addresses are its names (no rebinding page can send one): the one the connection
    # arrived at, and any when it listens on every interface
    arrived = local is not None and local.strip("[]") == str(ip)
    return arrived or settings.host in ("0.0.0.0", "::") or is_loopback(str(ip))


def safe_next(target: str | None) -> str:
    """A same-site path to return to after sign-in (never another host: no open redirect)."""
    if target and target.startswith("/") and not target.startswith(("//", "/\\")) and "\\" not in target:
        return target
    return "/jobs"


class AccessGuard:
    """ASGI middleware enforcing the read rules above before any route or body parsing runs."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = get_settings()
        path = scope.get("path", "")
        host = Headers(scope=scope).get("host")
        local = scope.get("server")
        allowed = host_allowed(host, settings, str(local[0]) if local else None) if host is not None else True
        if not allowed and path != "/healthz":
            assert host is not None
            shown = host[:100].encode("ascii", "backslashreplace").decode()
            await _deny(
                send,
                400,
                f"this server does not answer to the host name {shown!r}: start it with --allowed-hosts"
                " NAME (DRAFTDECK_ALLOWED_HOSTS) to serve that name",
            )
            return
        if not beyond_loopback(scope, settings) or path == "/healthz":
            await self.app(scope, receive, send)
            return
        if not settings.token:
            await _deny(
                send,
                403,
                "this server has no DRAFTDECK_TOKEN, so it answers loopback clients only: "
                "set DRAFTDECK_TOKEN to serve other machines",
            )
            return
        conn = HTTPConnection(scope)
        if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES) or _signed_in(conn, settings):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        wants_page = "text/html" in headers.get("accept", "") and not headers.get("hx-request")
        if scope["method"] in ("GET", "HEAD") and wants_page:
            target = path + (
                "?" + scope["query_string"].decode("latin-1") if scope.get("query_string") else ""
            )
            location = "/login?next=" + quote(target, safe="")
            await _deny(send, 303, "sign in first", extra=[(b"location", location.encode("latin-1"))])
            return
        await _deny(
            send,
            401,
            "this server needs a token: send Authorization: Bearer <DRAFTDECK_TOKEN>, or sign in at /login",
            extra=[(b"www-authenticate", b"Bearer"), (b"hx-redirect", b"/login")],
        )


async def _deny(
    send: Send, status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps({"detail": message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


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
    """The token this request's pages put in their forms: the cookie's random value, signed."""
    nonce = request.cookies.get(CSRF_COOKIE) or getattr(request.state, "new_csrf", None) or _new_csrf(request)
    return _signed(nonce)


def _signed(nonce: str) -> str:
    key = get_settings().secret_key()
    return hmac.new(key, b"draftdeck csrf v1 " + nonce.encode(), hashlib.sha256).hexdigest()


def _new_csrf(request: Request) -> str:
    nonce = secrets.token_urlsafe(24)
    request.state.new_csrf = nonce
    return nonce


async def require_csrf(request: Request) -> None:
    nonce = request.cookies.get(CSRF_COOKIE, "")
    sent = request.headers.get(CSRF_HEADER, "")
    if not sent:
        form = await request.form()
        sent = str(form.get("csrf", ""))
    if not nonce or not hmac.compare_digest(_signed(nonce).encode(), sent.encode()):
        raise HTTPException(403, "the form's CSRF token is missing or stale: reload the page and try again")


async def require_page_write(request: Request, settings: Annotated[Settings, Depends(get_settings)]) -> None:
    await require_csrf(request)
    if not _token_ok(request, settings):
        raise HTTPException(401, "this server needs a token: sign in at /login")
