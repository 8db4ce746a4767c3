"""/docs and /redoc work with no network but the server's: vendored bundles, started without inline
script, under their CSP. The page fixture fails each test on a CSP violation or a script error."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.browser.harness import Server

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect


def offline_but_the_server(page: Any, server: Server) -> list[str]:
    """Abort every request that is not for the server; return their URLs."""
    blocked: list[str] = []
    ours = urlsplit(server.url).netloc

    def route(r: Any) -> None:
        if urlsplit(r.request.url).netloc == ours:
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    return blocked


def test_swagger_ui_lists_the_operations_offline(page: Any, server: Server) -> None:
    blocked = offline_but_the_server(page, server)
    response = page.goto("/docs")
    assert response is not None and response.status == 200
    csp = response.headers["content-security-policy"]
    assert "script-src 'self';" in csp and "unsafe-eval" not in csp
    ops = page.locator(".opblock-summary-path")
    expect(ops.first).to_be_visible()
    paths = set(ops.all_inner_texts())
    assert {"/api/jobs", "/api/jobs/{job_id}", "/api/alerts"} <= {p.replace("\u200b", "") for p in paths}
    expect(page.locator(".opblock-post .opblock-summary-path").first).to_be_visible()
    assert blocked == []


def test_redoc_lists_the_operations_offline(page: Any, server: Server) -> None:
    blocked = offline_but_the_server(page, server)
    response = page.goto("/redoc")
    assert response is not None and response.status == 200
    assert "script-src 'self';" in response.headers["content-security-policy"]
    menu = page.locator("[role=menuitem]")
    expect(menu.first).to_be_visible()
    expect(page.locator("h2", has_text="Create Job")).to_be_visible()
    expect(page.get_by_text("/api/jobs/{job_id}/cancel").first).to_be_attached()
    assert blocked == []
