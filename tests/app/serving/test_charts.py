"""The served charts' data (GET /serving/<id>/data): served tau over time bucketed from the windows'
summed counts, with gaps where no draft was made and the windows' own taus as the band; SGLang's
gauge as reported; p_i served, of the run's best eval and of its held-out walk, from their counts."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.serving import endpoints
from app.serving.scraper import scrape_one
from app.serving.series import tau_series
from app.settings import get_settings
from app.store.db import get_engine
from app.store.models import ServingEndpoint, ServingWindow
from tests.support.run import BLOCK, make_eval, make_run, step_points, target_accepted
from tests.support.serving import SglangStandIn, VllmStandIn
from tests.support.serving import serving as serve

T0 = 1_800_000_000_000  # epoch ms


@pytest.fixture
def client(migrated: Path) -> Iterator[TestClient]:
    from app.web.main import create_app

    with TestClient(create_app()) as c:
        yield c


def _endpoint_with_windows(rows: list[tuple[int, int, int, list[int]]]) -> tuple[int, int]:
    """A run (best checkpoint at step 100, its eval's p_i 0.9, 0.6, 0.3) served by an endpoint whose
    windows are (ms after T0, drafts, accepted, per-position counts); (run id, endpoint id)."""
    settings = get_settings()
    with Session(get_engine(), expire_on_commit=False) as s:
        run = make_run(s, settings.jobs_dir, steps=120, status="succeeded")
        make_eval(s, settings.jobs_dir, run, 100, real_tau=3.0, data_tau=3.0, per_pos=[90, 60, 30],
                  served_tau=2.5)  # fmt: skip
        ep = endpoints.create_endpoint(
            s, name="prod", kind="vllm", metrics_url="http://127.0.0.1:9/metrics", run_job_id=run
        )
        ep.enabled = False  # these windows are the test's; no scrape adds any
        s.add(ep)
        for dt, drafts, accepted, per in rows:
            s.add(ServingWindow(endpoint_id=ep.id or 0, wall_ms=T0 + dt, drafts=drafts,
                                draft_tokens=3 * drafts, accepted=accepted,
                                per_position=list(per)))  # fmt: skip
        s.commit()
        assert ep.id is not None
        return run, ep.id


def test_served_tau_is_bucketed_from_summed_counts_beside_the_runs_eval_and_walk(client: TestClient) -> None:
    run, ep = _endpoint_with_windows(
        [(0, 100, 300, [100, 100, 100]), (1000, 100, 100, [60, 30, 10]), (6000, 0, 0, [0, 0, 0]),
         (10_000, 50, 50, [40, 10, 0])]
    )  # fmt: skip
    two = client.get(f"/serving/{ep}/data", params={"budget": 2}).json()
    (s,) = two["series"]
    # bucket 0 sums 400 accepted over 200 drafts (tau 3, not the mean of 4 and 2, though the band
    # spans those two); bucket 1 holds the idle window and 50 of 50
    assert s["name"] == "served/tau" and s["x"] == [T0 + 1000, T0 + 10_000]
    assert s["y"] == [3.0, 2.0] and s["min"] == [2.0, 2.0] and s["max"] == [4.0, 2.0]
    three = client.get(f"/serving/{ep}/data", params={"budget": 3}).json()["series"][0]
    assert three["y"] == [3.0, None, 2.0]  # the idle window alone: no drafts, no tau (a gap)
    # p_i: served over the newest windows (fewer drafts than the minimum: all of them), the eval's
    # from its per-position counts, the held-out walk's from the histogram at the best step (100)
    pos = two["positions"]
    assert pos["served"] == [200 / 250, 140 / 250, 110 / 250] and pos["served_drafts"] == 250
    assert pos["eval"] == [0.9, 0.6, 0.3] and pos["eval_steps"] == 100
    hist = {int(p.name.rsplit("/", 1)[1]): p.value for p in step_points(100, random.Random(0), steps=1000)
            if p.name.startswith("heldout/hist/")}  # fmt: skip
    total = sum(hist.values())
    walked = [sum(c for n, c in hist.items() if n > i + 1) / total for i in range(BLOCK - 1)]
    assert pos["walked"] == pytest.approx(walked) and pos["walked_step"] == 100
    assert two["eval_tau"] == 3.0 and two["target_tau"] == 1 + target_accepted(100 / 1000, 200) / 200
    zoomed = client.get(f"/serving/{ep}/data", params={"lo": T0, "hi": T0 + 1000, "budget": 10}).json()
    assert zoomed["positions"]["served"] == [0.8, 0.65, 0.55]  # the two windows in range
    assert zoomed["series"][0]["x"] == [T0, T0 + 1000]
    for bad, message in (({"budget": 0}, "point budget 0"), ({"lo": 5, "hi": 1}, "the start is after")):
        r = client.get(f"/serving/{ep}/data", params=bad)
        assert r.status_code == 400 and message in r.json()["detail"]
    assert client.get("/serving/999/data").status_code == 404
    page = client.get(f"/runs/{run}").text
    assert f'data-served="{ep}"' in page and 'id="served-tau-' in page and "/static/served.js" in page
    evals = page.split('class="small evals"', 1)[1].split("</table>", 1)[0]
    assert "Served τ" in evals and ">2.500<" in evals  # the served eval's figure beside real tau


def test_sglang_accept_length_is_charted_as_reported(migrated: Path) -> None:
    sglang = SglangStandIn()
    with serve(sglang.text) as server, Session(get_engine(), expire_on_commit=False) as s:
        ep = endpoints.create_endpoint(s, name="sg", kind="sglang", metrics_url=server.url)
        for length in (2.75, 3.25, 3.0):
            sglang.length.labels("m").set(length)
            scrape_one(s, ep)
        one = tau_series(s, ep, budget=1)
        assert one.name == "served/accept_length" and one.y == [3.0] and (one.lo, one.hi) == ([2.75], [3.25])
        assert tau_series(s, ep, budget=100).y[-1] == 3.0


def test_an_endpoint_naming_its_model_reads_only_that_models_counts(client: TestClient) -> None:
    vllm = VllmStandIn(k=3, engines=("0",), model="drafted")
    vllm.start_engine("other", "0")  # a second model behind the same /metrics
    with serve(vllm.text) as server, Session(get_engine(), expire_on_commit=False) as s:
        mine = endpoints.create_endpoint(
            s, name="mine", kind="vllm", metrics_url=server.url, model_name="drafted"
        )
        every = endpoints.create_endpoint(s, name="every", kind="vllm", metrics_url=server.url)
        for ep in (mine, every):
            ep.enabled = False  # scraped by this test alone
            scrape_one(s, ep)
        vllm.decode("drafted", "0", [3] * 100)  # tau 4 on the drafter's model
        vllm.decode("other", "0", [0] * 300)  # tau 1 on another model behind the same /metrics
        for ep in (mine, every):
            scrape_one(s, ep)
        settings = get_settings()
        assert endpoints.newest(s, mine, settings.serving_min_drafts).tau_incl_bonus == 4.0
        assert endpoints.newest(s, every, settings.serving_min_drafts).tau_incl_bonus == 1 + 300 / 400
        assert tau_series(s, mine).y == [4.0] and tau_series(s, every).y == [1.75]
        view = endpoints.endpoint_view(s, mine)
        assert view["models"] == ["drafted", "other"] and view["window"]["drafts"] == 100
    assert client.get(f"/api/serving/{mine.id}").json()["model_name"] == "drafted"
    page = client.get(f"/serving/{every.id}").text
    assert "every model, summed" in page and "the last scrape found: drafted, other" in page


def test_the_newest_windows_are_read_back_until_they_hold_the_drafts_asked(migrated: Path) -> None:
    _, ep_id = _endpoint_with_windows([(i * 1000, 10, 10 + i % 3, [10, 5, 0]) for i in range(100)])
    with Session(get_engine()) as s:
        ep = s.get(ServingEndpoint, ep_id)
        assert ep is not None
        four = endpoints.newest(s, ep, 35)  # the newest 4 windows: 99, 98, 97 and 96
        assert four.drafts == 40 and four.accepted == 4 * 10 + 0 + 2 + 1 + 0
        assert endpoints.newest(s, ep, 10**9).drafts == 1000  # all, across the growing pages
        assert endpoints.newest(s, ep, 10**9, limit=50).drafts == 500
