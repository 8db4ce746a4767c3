"""Serving endpoints as records: registered on the page, scraped on their interval by the scraper
thread the app runs, health on the page, the unreachable alert after N failures and the served-tau
alert against the run's eval tau, both cleared when the cause goes. Stand-in servers: real HTTP, real
Prometheus text with vLLM's names (tests/support/serving.py)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, col, select

from app.serving import endpoints
from app.serving.scraper import scrape_due, scrape_one
from app.settings import get_settings
from app.store.db import get_engine
from app.store.models import Alert, ServingEndpoint, ServingWindow
from tests.support.run import make_eval, make_run
from tests.support.serving import SglangStandIn, VllmStandIn
from tests.support.serving import serving as serve


@pytest.fixture
def client(migrated: Path) -> Iterator[TestClient]:
    from app.web.main import create_app

    with TestClient(create_app()) as c:
        yield c


def _csrf(client: TestClient, path: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', client.get(path).text)
    assert found is not None
    return found[1]


def _windows(endpoint_id: int) -> list[ServingWindow]:
    with Session(get_engine()) as s:
        return list(s.exec(select(ServingWindow).where(ServingWindow.endpoint_id == endpoint_id)).all())


def test_an_endpoint_registered_on_the_page_is_scraped_on_its_interval(client: TestClient) -> None:
    vllm = VllmStandIn(k=3, engines=("0", "1"))
    with serve(vllm.text) as server:
        made = client.post(
            "/serving",
            data={"csrf": _csrf(client, "/serving"), "name": "prod <b>", "kind": "vllm",
                  "metrics_url": server.url, "interval_s": "1"},
            follow_redirects=False,
        )  # fmt: skip
        assert made.status_code == 303, made.text[-400:]
        endpoint_id = int(made.headers["location"].rsplit("/", 1)[1])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(w.drafts for w in _windows(endpoint_id)) < 600:
            vllm.decode("m", "0", [3, 1] * 10)  # the app's own scraper thread reads these on its interval
            vllm.decode("m", "1", [2] * 10)
            time.sleep(0.2)
        scraped = server.scrapes
    assert sum(w.drafts for w in _windows(endpoint_id)) >= 600 and scraped >= 3
    with Session(get_engine()) as s:
        ep = s.get(ServingEndpoint, endpoint_id)
        assert ep is not None
        w = endpoints.newest(s, ep, 10**9)  # every window there is
    # the stand-in's steps accept 3, 1 and 2 of 3 in equal numbers, up to where the last scrape cut
    assert w.tau_incl_bonus is not None and 2.8 <= w.tau_incl_bonus <= 3.2
    assert w.drafts * 3 == w.draft_tokens and w.per_position_counts[0] == w.drafts
    page = client.get(f"/serving/{endpoint_id}").text
    assert "prod &lt;b&gt;" in page and "<b>" not in page.split("<main", 1)[1]
    assert 'class="health-box health-ok"' in page and "τ incl. bonus" in page
    assert 'id="served-positions"' in page
    listed = client.get("/api/serving").json()
    assert [e["health"] for e in listed] == ["ok"] and listed[0]["window"]["drafts"] == w.drafts


def test_a_failing_endpoint_shows_its_error_and_alerts_after_n_failures_then_clears(migrated: Path) -> None:
    vllm = VllmStandIn(k=2, engines=("0",))
    body = {"text": "<html>502 Bad Gateway</html>"}
    with serve(lambda: body["text"]) as server, Session(get_engine(), expire_on_commit=False) as s:
        ep = endpoints.create_endpoint(s, name="flaky", kind="vllm", metrics_url=server.url)
        n = get_settings().serving_alert_failures
        for i in range(n + 1):
            scrape_one(s, ep)
            open_alerts = s.exec(
                select(Alert).where(Alert.endpoint_id == ep.id, col(Alert.acknowledged).is_(False))
            ).all()
            assert len(open_alerts) == (1 if i + 1 >= n else 0)  # once, at the Nth failure in a row
        assert endpoints.health(ep).state == "failing" and "not a Prometheus text exposition" in (
            ep.last_error or ""
        )
        assert (
            open_alerts[0].kind == "endpoint_unreachable"
            and f"{n} scrapes in a row failed" in open_alerts[0].message
        )
        body["text"] = vllm.text()
        scrape_one(s, ep)
        assert endpoints.health(ep).state == "ok" and ep.failures == 0
        assert (
            s.exec(select(Alert).where(Alert.endpoint_id == ep.id, col(Alert.acknowledged).is_(False))).all()
            == []
        )
        gone = endpoints.create_endpoint(
            s, name="gone", kind="vllm", metrics_url="http://127.0.0.1:9/metrics"
        )
        scrape_one(s, gone)
        assert "cannot reach it" in (gone.last_error or "")


def test_served_tau_below_the_runs_eval_tau_alerts_and_clears(client: TestClient) -> None:
    settings = get_settings()
    vllm = VllmStandIn(k=3, engines=("0",))
    with serve(vllm.text) as server, Session(get_engine(), expire_on_commit=False) as s:
        run = make_run(s, settings.jobs_dir, steps=120, status="succeeded")
        make_eval(s, settings.jobs_dir, run, 100, real_tau=3.0, data_tau=3.0)
        ep = endpoints.create_endpoint(s, name="prod", kind="vllm", metrics_url=server.url, run_job_id=run)
        ep.enabled = False  # scraped by this test alone, not by the app's scraper thread as well
        s.add(ep)
        s.commit()

        def scrape_after(accepted: list[int]) -> list[Alert]:
            vllm.decode("m", "0", accepted)
            scrape_one(s, ep, settings)
            return list(
                s.exec(select(Alert).where(Alert.endpoint_id == ep.id, Alert.kind == "served_tau_low")).all()
            )

        scrape_one(s, ep, settings)  # the baseline
        few = settings.serving_min_drafts // 2
        assert scrape_after([0] * few) == []  # tau 1.0, but too few drafts to judge
        (alert,) = scrape_after([1] * few)  # the newest >= min drafts: tau 1.5, 50 % below 3.0
        assert not alert.acknowledged and alert.job_id == run
        assert re.search(
            r"served tau incl\. bonus 1\.50 over the last 1,000 drafts .* "
            r"50\.0% below eval \d+'s real tau 3\.00",
            alert.message,
        )
        assert "num_speculative_tokens = B - 1" in alert.message
        (cleared,) = scrape_after([3] * settings.serving_min_drafts)  # tau 4.0 now
        assert cleared.acknowledged
        view = endpoints.endpoint_view(s, ep, settings)
        assert view["eval_tau"] == 3.0 and view["window"]["tau_incl_bonus"] == 4.0
    # the run page shows the served figure beside the eval's; the runs table has a column for it
    page = client.get(f"/runs/{run}").text
    served = page.split(f'id="served-{run}"', 1)[1].split("</table>", 1)[0]
    assert (
        ">prod</a>" in served and "4.000" in served and "3.000" in served and "1.00 · 1.00 · 1.00" in served
    )
    assert 'data-label="served τ"' in client.get("/runs").text
    assert f'href="/serving/{ep.id}">Open endpoint' in client.get("/alerts").text


def test_sglang_gauges_are_kept_as_reported_and_registration_refuses_bad_fields(migrated: Path) -> None:
    sglang = SglangStandIn()
    sglang.length.labels("m").set(2.75)
    sglang.rate.labels("m").set(0.6)
    with serve(sglang.text) as server, Session(get_engine(), expire_on_commit=False) as s:
        ep = endpoints.create_endpoint(s, name="sg", kind="sglang", metrics_url=server.url)
        s.commit()
        assert scrape_due(s) == [ep.id]  # due at once, then not before its interval
        assert scrape_due(s) == []
        view = endpoints.endpoint_view(s, ep)
        assert view["gauges"] == {"accept_length": 2.75, "accept_rate": 0.6}
        for bad, message in (
            ({"kind": "tgi"}, "kind: expected one of vllm, sglang"),
            ({"metrics_url": "file:///etc/passwd"}, "metrics_url: expected an http:// or https:// URL"),
            ({"name": "sg"}, "an endpoint named 'sg' exists already"),
            ({"token_env": "A B"}, "not an environment variable name"),
            ({"interval_s": 0.1}, "interval_s: between 1 and 3600"),
            ({"run_job_id": 999}, "job 999 is not a train run"),
        ):
            fields = {"name": "x", "kind": "vllm", "metrics_url": server.url} | bad
            with pytest.raises(endpoints.EndpointError, match=re.escape(message)):
                endpoints.create_endpoint(s, **fields)
