"""The sweep page in a real Chromium against a real `draftdeck up`, from a real sweep on the tiny world:
reached from its job page, the scatter and the flags shown, a column sorted by a click, the Copy button
copying the flags, and the page laid out for a laptop (1366 px) and a phone (390 px) with nothing cut
off (DD_SCREENS=/tmp/shots keeps screenshots to look at)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session

from app.store.db import make_engine
from app.store.models import Job
from tests.browser.harness import Server
from tests.support.sweep import RealSweep, real_sweep

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect


@pytest.fixture(scope="module")
def sweep_job(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, RealSweep]]:
    swept = real_sweep(tmp_path_factory.mktemp("sweep"))
    engine = make_engine(f"sqlite:///{server.home.resolve() / 'draftdeck.db'}")
    with Session(engine, expire_on_commit=False) as s:
        job = Job(kind="sweep", params=swept.params, status="succeeded", queue="gpu", result=swept.result)
        s.add(job)
        s.commit()
        assert job.id is not None
        job_id = job.id
    engine.dispose()
    yield job_id, swept


def _shot(page: Any, name: str) -> None:
    if os.environ.get("DD_SCREENS"):
        Path(os.environ["DD_SCREENS"]).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=f"{os.environ['DD_SCREENS']}/{name}.png", full_page=True)


def test_the_sweep_page_from_its_job_sorts_and_copies_the_flags(
    page: Any, sweep_job: tuple[int, RealSweep]
) -> None:
    job_id, swept = sweep_job
    sweep = swept.result["sweep"]
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.goto(f"/jobs/{job_id}")
    page.get_by_role("link", name="Open the sweep").click()
    expect(page.locator("#sweep-scatter circle.dot")).to_have_count(len(sweep["points"]))
    expect(page.locator("#sweep-table tbody tr")).to_have_count(len(sweep["points"]))
    page.locator("#sweep-table thead").get_by_role("link", name="τ").click()
    taus = page.locator("#sweep-table tbody td:nth-child(4)").all_inner_texts()
    assert taus == sorted(taus)  # ascending first (same digits before the point: text order is numeric)
    page.locator("#sweep-recommended button.copy").first.click()
    expect(page.locator("#sweep-recommended button.copy").first).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == sweep["serving"][0]["flags"]


@pytest.mark.parametrize("width", [1366, 390])
def test_the_sweep_page_fits_a_laptop_and_a_phone(
    browser: Any, server: Server, sweep_job: tuple[int, RealSweep], width: int
) -> None:
    job_id, _ = sweep_job
    context = browser.new_context(base_url=server.url, viewport={"width": width, "height": 900})
    page = context.new_page()
    try:
        page.goto(f"/sweeps/{job_id}")
        expect(page.locator("#sweep-scatter")).to_be_visible()
        page_width = page.evaluate("document.documentElement.scrollWidth")
        assert page_width <= width, f"the page is {page_width} px wide in a {width} px window"
        box = page.locator("#sweep-scatter").bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width
        # each flag line wraps inside its box instead of running past the window
        for pre in page.locator("pre.flags").all():
            assert pre.evaluate("e => e.scrollWidth <= e.clientWidth + 1")
        _shot(page, f"sweep-{width}")
    finally:
        context.close()
