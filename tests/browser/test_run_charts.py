"""Run charts in a real Chromium against a real `draftdeck up`: live points without a reload within 1 s
(measured in the page), zoom re-resolves, two runs overlaid, the real-vs-walked tau alarm.

Points are written by this process with `record_points` into the server's own database, as a worker
running the trainer does. Every test also fails (the `page` fixture) on a CSP violation, a script
error or a server traceback.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlmodel import Session

from app.store.db import make_engine
from app.store.metrics import record_points
from app.store.models import JobStatus
from app.store.state import propose
from tests.browser.harness import Server
from tests.support.run import make_eval, make_run, step_points
from tests.support.serving import VllmStandIn
from tests.support.serving import serving as serving_server

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect


@pytest.fixture
def db(server: Server) -> Iterator[Session]:
    engine = make_engine(f"sqlite:///{server.home.resolve() / 'draftdeck.db'}")
    with Session(engine, expire_on_commit=False) as session:
        yield session
    engine.dispose()


def _plot_points(page: Any, chart: str) -> int:
    return int(page.get_attribute(f"#plot-{chart}", "data-points") or 0)


def test_points_reach_the_open_page_within_a_second_without_reload(
    page: Any, server: Server, db: Session
) -> None:
    run = make_run(db, server.home / "jobs", steps=40, status="running")
    page.goto(f"/runs/{run}")
    expect(page.locator("#charts")).to_have_attribute("data-stream", "open")
    page.evaluate("window.__ddNoReload = 'still here'")
    before = page.evaluate(f"window.ddCharts.points['{run}|train/loss']")
    assert before == 40

    rng = random.Random(1)
    last_loss: list[float] = []

    def train() -> None:
        for step in range(40, 60):
            pts = step_points(step, rng)
            record_points(db, run, pts)
            last_loss[:] = [p.value for p in pts if p.name == "train/loss"]
            time.sleep(0.1)

    writer = threading.Thread(target=train)
    writer.start()
    writer.join()
    page.wait_for_function(f"() => window.ddCharts.points['{run}|train/loss'] >= 60", timeout=3000)
    latencies = page.evaluate("window.ddCharts.latencies")
    assert len(latencies) >= 20
    # Measured in the page: arrival time (Date.now) minus the wall time record_points stored.
    assert max(latencies) < 1000, f"points took up to {max(latencies)} ms to reach the page"
    assert page.evaluate("window.__ddNoReload") == "still here", "the page reloaded"
    shown = page.locator(f'[data-latest="{run}|train/loss"]').text_content()
    assert abs(float(shown or "nan") - last_loss[0]) < 1e-3 * abs(last_loss[0]), (shown, last_loss)
    tau_points = page.evaluate(f"window.ddCharts.points['{run}|heldout/tau_walked']")
    assert tau_points == 2  # held-out passes at steps 0 and 50: the one at 50 came live, as a ratio
    assert _plot_points(page, "loss") >= 60

    propose(db, run, JobStatus.SUCCEEDED, "run ended")
    expect(page.locator("#charts")).to_have_attribute("data-stream", "ended", timeout=5000)
    expect(page.locator("#run-status")).to_have_text("succeeded")


def test_zoom_asks_again_with_the_range_and_gets_more_detail(page: Any, server: Server, db: Session) -> None:
    run = make_run(db, server.home / "jobs", steps=6000, status="succeeded")
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"/runs/{run}")
    page.wait_for_function(f"() => window.ddCharts.series('{run}|train/loss') !== undefined")
    wide = page.evaluate(f"window.ddCharts.series('{run}|train/loss')")
    assert wide["level"] >= 1, "6,000 steps in a chart ~500 px wide should come from rollups"
    box = page.locator("#plot-loss .u-over").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.40, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.45, y, steps=5)
    page.mouse.up()
    expect(page.locator("#chart-state")).to_contain_text("zoomed")
    page.wait_for_function(f"() => window.ddCharts.series('{run}|train/loss').level === 0")
    last = page.evaluate("window.ddCharts.requests[window.ddCharts.requests.length - 1]")
    assert "lo=" in last and "hi=" in last
    zoomed = page.evaluate(f"window.ddCharts.series('{run}|train/loss')")
    lo, hi = zoomed["x"][0], zoomed["x"][-1]
    before = [x for x in wide["x"] if lo <= x <= hi]
    assert len(zoomed["x"]) > 3 * max(1, len(before)), (len(zoomed["x"]), len(before))
    assert zoomed["x"] == list(range(lo, hi + 1)), "at level 0 every step of the range is a point"
    page.click("#zoom-reset")
    page.wait_for_function(f"() => window.ddCharts.series('{run}|train/loss').level >= 1")
    expect(page.locator("#zoom-reset")).to_be_disabled()


def test_two_runs_overlay_in_distinct_colours_with_parameters_compared(
    page: Any, server: Server, db: Session
) -> None:
    a = make_run(db, server.home / "jobs", steps=120, status="succeeded", params={"lr": 1e-3}, seed=1)
    b = make_run(db, server.home / "jobs", steps=200, status="succeeded", params={"lr": 3e-3}, seed=2)
    page.goto("/runs")
    page.check(f'#runs-table tr[data-run="{a}"] input[type=checkbox]')
    page.check(f'#runs-table tr[data-run="{b}"] input[type=checkbox]')
    page.click("#compare-form button[type=submit]")
    page.wait_for_url(re.compile(rf"/runs/compare\?ids={b}&ids={a}$"))  # the table lists newest first
    legend = page.locator("#plot-loss .u-legend")
    expect(legend).to_contain_text(f"run {a} · train")
    expect(legend).to_contain_text(f"run {b} · train")
    colours = page.evaluate(
        """() => Array.from(document.querySelectorAll('#plot-loss .u-legend .u-series')).filter(
             (el) => /^run \\d+ · train$/.test(el.querySelector('.u-label').textContent.trim())).map(
             (el) => getComputedStyle(el.querySelector('.u-marker')).borderColor)"""
    )
    assert len(colours) == 2 and colours[0] != colours[1], colours
    # not hovered, the legend gives each series' latest value (it said "--" until hovered)
    page.mouse.move(0, 0)
    expect(legend.locator(".u-series").first).to_contain_text("(latest)")
    latest = page.evaluate(
        """() => Array.from(document.querySelectorAll('#plot-loss .u-legend .u-series')).filter(
             (el) => /^run \\d+ · train$/.test(el.querySelector('.u-label').textContent.trim())).map(
             (el) => el.querySelector('.u-value').textContent)"""
    )
    assert len(latest) == 2 and all(re.fullmatch(r"[-\d.e]+", v) for v in latest), latest
    assert page.evaluate(f"window.ddCharts.series('{a}|train/loss').x.slice(-1)[0]") == 119
    assert page.evaluate(f"window.ddCharts.series('{b}|train/loss').x.slice(-1)[0]") == 199
    expect(page.locator('#params tr.diff[data-param="lr"]')).to_be_visible()
    expect(page.locator('#params tr[data-param="block_size"]')).not_to_have_class("diff")


def test_the_alarm_shows_every_figure_on_run_runs_and_alerts_pages(
    page: Any, server: Server, db: Session
) -> None:
    run = make_run(db, server.home / "jobs", steps=250, status="succeeded")
    ev = make_eval(db, server.home / "jobs", run, 200, real_tau=1.42, data_tau=1.64, target_tau=1.45)
    page.goto(f"/runs/{run}")
    alarm = page.locator(f'.alarm[data-alarm="{ev}"]').first
    expect(alarm).to_contain_text("Real τ 1.420 vs the run's 1.450 judged by the target")
    expect(alarm).to_contain_text("1.640 judged by the data (+15.5 %)")
    expect(alarm).to_contain_text("checkpoint step 200")
    page.wait_for_function(f"() => window.ddCharts.series('{run}|heldout/tau_walked') !== undefined")
    marker = page.locator("#plot-tau .u-legend .u-series", has_text="real τ (eval)")
    expect(marker).to_have_count(1)
    page.goto(f"/runs?q={run}")
    expect(page.locator(f'#runs-table tr[data-run="{run}"] .alarm')).to_contain_text("1.420")
    page.goto("/alerts")
    found = page.locator(".alert", has_text="data not target output").first
    expect(found).to_contain_text("real tau 1.420")
    expect(found).to_contain_text("judged by the data 1.640 and judged by the target (its own answers) 1.450")


def test_an_endpoint_registered_on_the_page_is_charted_on_the_run_page_beside_its_eval(
    page: Any, server: Server, db: Session
) -> None:
    run = make_run(db, server.home / "jobs", steps=120, status="succeeded")
    make_eval(db, server.home / "jobs", run, 100, real_tau=3.0, data_tau=3.0, per_pos=[90, 60, 30])
    vllm = VllmStandIn(k=3, engines=("0",))
    with serving_server(vllm.text) as metrics:
        page.set_viewport_size({"width": 1280, "height": 900})
        page.goto("/serving")
        page.fill("input[name=name]", "prod")
        page.fill("input[name=metrics_url]", metrics.url)
        page.select_option("select[name=run_job_id]", str(run))
        page.fill("input[name=interval_s]", "1")
        page.click("form.form button[type=submit]")
        page.wait_for_url(re.compile(r"/serving/\d+$"))
        ep = int(page.url.rsplit("/", 1)[1])
        deadline = time.monotonic() + 30  # the server's own scraper takes a window each second
        while time.monotonic() < deadline and metrics.scrapes < 4:
            vllm.decode("m", "0", [3, 1, 2] * 20)  # tau incl. bonus 3: 2 of 3 accepted per step
            time.sleep(0.3)
        page.goto(f"/runs/{run}")
        tau, pos = page.locator(f"#served-tau-{ep}"), page.locator(f"#served-pos-{ep}")
        expect(tau).to_have_attribute("data-points", re.compile(r"^[2-9]|\d\d"))
        expect(pos).to_have_attribute("data-points", "3")  # positions 0, 1, 2 of a block of 4
    legend = tau.locator(".u-legend").inner_text()
    assert "served τ incl. bonus" in legend and "eval τ (real decoding" in legend
    assert "held-out walk, by the target" in legend
    assert "eval, real decoding (100 steps)" in pos.locator(".u-legend").inner_text()
    expect(page.locator(f"[data-served='{ep}'] [data-served-state]")).to_contain_text("drag across")
    data = page.evaluate(f"window.ddServed.data['{ep}']")
    ys = [y for y in data["series"][0]["y"] if y is not None]
    # a window is what came between two scrapes: whole decode calls, or (rarely) a cut one
    assert any(abs(y - 3.0) < 0.1 for y in ys) and data["eval_tau"] == 3.0
    assert data["positions"]["eval"] == [0.9, 0.6, 0.3]
