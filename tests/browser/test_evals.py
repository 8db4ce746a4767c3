"""The leaderboard in a real Chromium against a real `draftdeck up`: two real suite evals of tiny
drafters, filtered by thinking mode with the form, sorted by clicking a column header, the suite's
categories as columns, the eval's own page with its per-category table and tau by context length; and
the board and a run's evals table laid out for a laptop (1366 px) and a phone (390 px)."""

from __future__ import annotations

import os
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
from tests.support.run import make_eval, make_run

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect


@pytest.fixture(scope="module")
def evals(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    """Two real suite evals, built once for the module (the tiny drafters train for a while)."""
    engine = make_engine(f"sqlite:///{server.home.resolve() / 'draftdeck.db'}")
    ids = []
    with Session(engine, expire_on_commit=False) as s:
        # a folder not named "suite": get_by_label("Suite") also reads the Target select's option text
        for params, result in suite_evals(tmp_path_factory.mktemp("tiny-drafters")):
            job = Job(kind="eval", params=params, status="succeeded", queue="gpu", result=result)
            s.add(job)
            s.commit()
            assert job.id is not None
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


def _clipped(page: Any, wrap: str) -> dict[str, Any]:
    """How a table inside `wrap` (a .table-wrap) fits it: its scroll and client widths, and the header
    cells whose right edge lies past the wrap's (cut off, or only seen by scrolling)."""
    return page.evaluate(
        """(sel) => { const wrap = document.querySelector(sel);
          const right = wrap.getBoundingClientRect().right;
          return {scroll: wrap.scrollWidth, client: wrap.clientWidth,
                  past: [...wrap.querySelectorAll('thead th')]
                    .filter(th => th.getBoundingClientRect().right > right + 1)
                    .map(th => th.textContent.trim())}; }""",
        wrap,
    )


def _shot(page: Any, name: str) -> None:
    if os.environ.get("DD_SCREENS"):  # DD_SCREENS=/tmp/shots: the pages to look at by eye
        Path(os.environ["DD_SCREENS"]).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=f"{os.environ['DD_SCREENS']}/{name}.png", full_page=True)


def test_the_board_and_a_runs_evals_fit_a_laptop_and_a_phone(
    browser: Any, server: Server, evals: list[int]
) -> None:
    """Issue 49: at 1366 px a suite's board squeezed Target to ~40 px (its path wrapped letter by letter)
    and cut off the last categories; a run's evals table was cut at "By dat…"; at 390 px the board hid
    the Drafter column, so DFlash and EAGLE-3 rows looked alike."""
    engine = make_engine(f"sqlite:///{server.home.resolve() / 'draftdeck.db'}")
    with Session(engine, expire_on_commit=False) as s:
        run = make_run(s, server.home / "jobs", steps=120, status="succeeded")
        # with every column the run's evals table has (tokens per step, served)
        make_eval(s, server.home / "jobs", run, 100, real_tau=1.94, data_tau=2.37, target_tau=1.97,
                  tokens_per_step=1.9, served_tau=1.9)  # fmt: skip
    engine.dispose()
    laptop = browser.new_context(base_url=server.url, viewport={"width": 1366, "height": 900})
    page = laptop.new_page()
    page.goto("/evals?suite=mt-bench")
    expect(page.locator("#evals-table thead th", has_text="writing")).to_have_count(1)
    fit = _clipped(page, ".table-wrap:has(#evals-table)")
    assert fit["past"] == [] and fit["scroll"] <= fit["client"], fit
    target = page.locator("#evals-table thead th.target").bounding_box()
    assert target is not None and target["width"] > 120, target
    _shot(page, "evals-suite-1366")
    page.goto(f"/runs/{run}")
    fit = _clipped(page, f"#run-evals-{run} .table-wrap")
    assert fit["past"] == [] and fit["scroll"] <= fit["client"], fit
    expect(page.locator(f"#run-evals-{run} thead th").last).to_contain_text("By data")
    _shot(page, "run-1366")
    laptop.close()
    phone = browser.new_context(base_url=server.url, viewport={"width": 390, "height": 844})
    page = phone.new_page()
    page.goto("/evals")
    drafter = page.locator("#evals-table thead th", has_text="Drafter")
    expect(drafter).to_be_visible()
    box = drafter.bounding_box()
    assert box is not None and box["x"] + box["width"] <= 390, box  # on screen without scrolling
    expect(page.locator(f'#evals-table tr[data-eval="{evals[0]}"] td.drafter')).to_have_text("DFlash")
    _shot(page, "evals-390")
    phone.close()
