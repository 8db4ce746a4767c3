"""Bad input gets a 4xx with a reason, never a 500: huge ids, NUL bytes, lone surrogates, over-long
names, huge bodies. The same cases run on PostgreSQL in tests/integration/test_bad_input_pg.py."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from tests.support.web import form_token

CSRF = "test-csrf-cookie"
TOKENS: dict[int, str] = {}  # a client's form token (app/web/auth.py signs the cookie's value)
JSON = {"content-type": "application/json"}
NUMBERS = [2**31, 2**31 - 1, -(2**31) - 1, 2**63, 10**30]


@pytest.fixture
def client(migrated: Path) -> Iterator[TestClient]:
    yield from make_client(migrated)


def make_client(home: Path) -> Iterator[TestClient]:
    from app.web.main import create_app

    (home / "data" / "a.jsonl").write_text('{"messages": []}\n')
    with TestClient(create_app(), raise_server_exceptions=False) as c:
        c.cookies.set("dd_csrf", CSRF)
        TOKENS[id(c)] = form_token(c)  # what the pages sign for that cookie
        yield c


def _api_routes() -> Iterator[APIRoute]:
    """Every route of the app (FastAPI keeps included routers' routes on their original router)."""
    from app.web.main import app

    for route in app.routes:
        router = getattr(route, "original_router", None)
        for r in router.routes if router is not None else [route]:
            if isinstance(r, APIRoute):
                yield r


def id_requests(c: TestClient) -> Iterator[tuple[str, str]]:
    """(method, url) for every route with a {parameter}, each parameter set to each number."""
    routes = [r for r in _api_routes() if "{" in r.path]
    assert len(routes) >= 15, [r.path for r in routes]  # the routes this file was written against
    for route in routes:
        for number in NUMBERS:
            url = re.sub(r"\{[^}]+\}", str(number), route.path)
            assert route.methods is not None  # an API route has its methods
            for method in route.methods:
                yield method, url
    for number in NUMBERS:
        yield "GET", f"/datasets/compare?a={number}"
        yield "GET", f"/datasets/compare?a=1&b={number}"


def _send(c: TestClient, method: str, url: str, **kwargs: Any) -> Any:
    headers = {"x-csrf-token": TOKENS[id(c)], **JSON, **kwargs.pop("headers", {})}
    return c.request(method, url, headers=headers, **kwargs)


def assert_4xx(response: Any, what: str) -> None:
    assert 400 <= response.status_code < 500, (what, response.status_code, response.text[:300])


def check_ids(c: TestClient) -> None:
    for method, url in id_requests(c):
        body: dict[str, Any] | None = {} if method == "POST" else None
        assert_4xx(_send(c, method, url, json=body), f"{method} {url}")


LONG = "x" * 256
TEXT_CASES = [
    ("NUL", "data/a\x00.jsonl", "NUL byte"),
    ("long name", f"data/{LONG}", "256 bytes long"),
    ("long path", "data/" + "d/" * 2100 + "a.jsonl", "the limit is 4095"),
]


def check_text(c: TestClient) -> None:
    for query in ("status=%00", "status=a%00b", "limit=%00", "%00=1"):
        r = c.get(f"/api/jobs?{query}")
        assert r.status_code == 400 and "NUL" in r.json()["detail"], query
    assert_4xx(c.get("/jobs/%00"), "NUL in the URL path")
    assert_4xx(c.get("/datasets/compare?row=%00"), "NUL in compare's row")
    for name, path, reason in TEXT_CASES:
        for kind, params in (("scan", {"inputs": [path]}), ("convert", {"inputs": [path]})):
            r = _send(c, "POST", "/api/jobs", json={"kind": kind, "params": params})
            assert r.status_code == 400 and reason in r.json()["detail"], (name, kind, r.text[:300])
        for url, form in (("/jobs", {"kind": "scan", "inputs": path}), ("/datasets", {"path": path})):
            r = c.post(url, data={**form, "csrf": TOKENS[id(c)]}, follow_redirects=False)
            assert_4xx(r, f"{name} in the form of {url}")
    # A lone surrogate can only come as a JSON escape (forms and URLs decode bytes, never to one).
    raw = b'{"kind": "scan", "params": {"inputs": ["data/\\ud800.jsonl"]}}'
    r = c.post("/api/jobs", content=raw, headers=JSON)
    assert (
        r.status_code == 400
        and r.json()["detail"] == "params.inputs[0] contains a lone surrogate (not valid Unicode)"
    )
    r = c.post("/api/jobs", content=b'{"kind": "scan", "params": {"\\udfff": 1}}', headers=JSON)
    assert r.status_code == 400 and "a key in params" in r.json()["detail"]
    r = c.post("/api/jobs", content=b"[" * 200_000, headers=JSON)
    assert r.status_code == 400 and "nested too deeply" in r.json()["detail"]


def test_huge_and_negative_ids_are_4xx(client: TestClient) -> None:
    check_ids(client)
    r = client.get(f"/api/jobs/{2**31}")
    assert r.status_code == 404 and "ids go up to 2147483647" in r.json()["detail"]
    r = client.get(f"/datasets/compare?a={2**31}")
    assert r.status_code == 422 and "'a'" in r.json()["detail"]
    # a chart's coordinates (epoch ms, tokens) pass 2^31 and reach the route, up to a 64-bit column
    r = client.get("/serving/999/data?lo=1800000000000&hi=1800000001000")
    assert r.status_code == 404 and "endpoint" in r.json()["detail"]
    r = client.get(f"/serving/999/data?lo={2**63}")
    assert r.status_code == 422 and "'lo'" in r.json()["detail"]


def test_nul_surrogates_and_long_names_are_400_with_the_reason(client: TestClient) -> None:
    check_text(client)


def test_a_huge_body_is_413_before_it_is_read(client: TestClient) -> None:
    # "Before it is read" counted in the body's chunks the app asked for, not in seconds: a clock bound
    # on a 50 MiB body is missed by a loaded machine, and a fast one reads it all within the bound.
    head = b'{"kind": "scan", "params": {"inputs": "'
    sent: list[int] = []

    def declared() -> Iterator[bytes]:  # Content-Length says 50 MiB
        for chunk in (head, *[b"x" * (1 << 20)] * 50, b'"}}'):
            sent.append(len(chunk))
            yield chunk

    length = len(head) + (50 << 20) + 3
    r = client.post("/api/jobs", content=declared(), headers=JSON | {"content-length": str(length)})
    assert r.status_code == 413 and "over 1,048,576 bytes" in r.json()["detail"]
    assert sent == [], sum(sent)  # not a byte asked for (the test client reads it all at the first ask)

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit counts what arrives
        yield b'{"kind": "scan", "params": {"inputs": "'
        for _ in range(50):
            yield b"x" * (1 << 20)
        yield b'"}}'

    r = client.post("/api/jobs", content=chunks(), headers=JSON)
    assert r.status_code == 413
    form = client.post("/jobs", data={"kind": "scan", "inputs": "x" * (2 << 20), "csrf": TOKENS[id(client)]})
    assert form.status_code == 413
    ok = client.post("/api/jobs", json={"kind": "scan", "params": {"inputs": ["data/a.jsonl"]}})
    assert ok.status_code == 201  # a normal body still reaches the route, replayed intact


def test_log_lines_are_capped(capsys: pytest.CaptureFixture[str]) -> None:
    from uvicorn.logging import AccessFormatter

    from app.web.limits import MAX_LOG_LINE_CHARS, cap_log_lines

    cap_log_lines()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    log = logging.getLogger("draftdeck.test.capped")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    try:
        log.error("body: %s", "y" * (5 << 20))
        log.error("x" * (5 << 20))
        # uvicorn's access formatter unpacks record.args: a long path must leave it a 5-tuple
        access = logging.StreamHandler(stream)
        access.setFormatter(AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s'))
        log.addHandler(access)
        log.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:1", "GET", "/" + "p" * (5 << 20), "1.1", 404)
        log.removeHandler(access)
        try:
            raise ValueError("z" * (5 << 20))
        except ValueError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert max(len(line) for line in lines) < MAX_LOG_LINE_CHARS + 100
    assert lines[0].startswith("body: yyy") and "characters cut]" in lines[0]
    assert lines[1].startswith("xxx") and "characters cut]" in lines[1]
    assert [line for line in lines if line.startswith('127.0.0.1:1 - "GET /ppp')], lines[2][:200]
    assert "Logging error" not in capsys.readouterr().err  # logging reports a formatter's failure there
    assert any(line.startswith("ValueError: zzz") for line in lines)
    assert len(stream.getvalue()) < 50_000
