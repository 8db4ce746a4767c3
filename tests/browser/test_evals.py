"""The leaderboard in a real Chromium against a real `draftdeck up`: two real suite evals of tiny
drafters, filtered by thinking mode with the form, sorted by clicking a column header, the suite's
categories as columns, the eval's own page with its per-category table and tau by context length."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session

from app.store.db import make_engine
from app.store.models import Job
from tests.browser.harness import Server
from tests.support.eval import suite_evals

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect


@pytest.fixture
def evals(server: Server, tmp_path: Path) -> Iterator[list[int]]:
    engine = make_engine(f"sqlite:///{server.home.resolve() / 'draftdeck.db'}")
    ids = []
    with Session(engine, expire_on_commit=False) as s:
        for params, result in suite_evals(tmp_path):
            job = Job(kind="eval", params=params, status="succeeded", queue="gpu", result=result)
            s.add(job)
            s.commit()
            ids.append(job.id)
    engine.dispose()
    yield ids


def _order(page: Any) -> list[str]:
    return page.locator("#evals-table tbody tr").evaluate_all("rows => rows.map(r => r.dataset.eval)")


def test_the_leaderboard_filters_and_sorts_in_the_browser(page: Any, evals: list[int]) -> None:
    trained, barely = (str(i) for i in evals)
    page.goto("/evals")
    expect(page.locator("#evals-table tbody tr")).to_have_count(2)
    page.get_by_role("link", name="τ", exact=True).click()  # sort by tau, highest first
    expect(page).to_have_url(re.compile(r"sort=tau&order=desc"))
    assert _order(page) == [trained, barely]
    page.get_by_role("link", name="τ ↓").click()  # again: lowest first
    assert _order(page) == [barely, trained]
    page.get_by_label("Thinking").select_option("off")
    page.get_by_role("button", name="Filter").click()
    assert _order(page) == [barely]
    page.get_by_label("Thinking").select_option("")
    page.get_by_label("Suite").select_option("mt-bench")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#evals-table thead th", has_text="coding")).to_have_count(1)
    page.get_by_role("link", name=f"eval {trained}").click()
    expect(page.locator("#suite-mt-bench tbody tr")).to_have_count(9)  # 8 categories and the whole
    expect(page.locator("#tau-by-context tbody tr").first).to_be_visible()
    expect(page.locator("#eval-template")).to_contain_text("the chat template's defaults")
