"""/docs and /redoc: our own pages over the vendored bundles, with no inline script and a CSP."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient


@pytest.fixture
def client(migrated: Path) -> Iterator[TestClient]:
    from app.web.main import create_app

    with TestClient(create_app()) as c:
        yield c


@pytest.mark.parametrize(
    ("url", "bundle"), [("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")]
)
def test_docs_pages_load_local_bundles_without_inline_script(
    client: TestClient, url: str, bundle: str
) -> None:
    r = client.get(url)
    assert r.status_code == 200
    csp = r.headers["content-security-policy"]
    assert "script-src 'self';" in csp and "default-src 'self'" in csp
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", r.text, re.S)
    assert scripts and all(body.strip() == "" for _, body in scripts)  # no inline script
    srcs = [re.search(r'src="([^"]+)"', attrs).group(1) for attrs, _ in scripts]  # type: ignore[union-attr]
    assert all(s.startswith("/static/") for s in srcs) and any(s.endswith(bundle) for s in srcs)
    for src in srcs:
        assert client.get(src).status_code == 200, src
    # Offline: every stylesheet, icon and script the page names is ours, and no address leaves the host
    # (FastAPI's own docs page fetches its bundles and favicon from a CDN).
    assert "://" not in r.text
    for ref in re.findall(r'(?:src|href)="([^"]+)"', r.text):
        assert ref.startswith("/static/"), ref
        assert client.get(ref).status_code == 200, ref
    assert 'data-openapi="/openapi.json"' in r.text
    assert client.get("/openapi.json").json()["paths"]["/api/jobs"]


def test_event_streams_stay_out_of_the_api_schema(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.endswith("/events")]
