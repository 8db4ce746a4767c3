"""Acceptance from a served drafter's /metrics: real Prometheus text (prometheus_client, vLLM's names
and labels) over real HTTP, parsed with prometheus_client's parser, turned into windows of counter
deltas; and `draftdeck serving watch` on it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from draftdeck.serving.exposition import ExpositionError, parse
from draftdeck.serving.fetch import ScrapeError, fetch_text
from draftdeck.serving.window import windows
from tests.support.serving import SglangStandIn, VllmStandIn, serving


def _scrape(url: str, at: float, kind: str = "vllm"):
    return parse(fetch_text(url), kind, at, source=url)


def test_a_window_sums_engines_and_gives_rate_tau_and_per_position() -> None:
    vllm = VllmStandIn(k=3)
    vllm.decode("m", "0", [3, 0])  # before the window: left out
    with serving(vllm.text) as server:
        before = _scrape(server.url, 0.0)
        vllm.decode("m", "0", [3, 1, 0, 2])
        vllm.decode("m", "1", [2, 2])
        now = _scrape(server.url, 10.0)
    (w,) = windows(before, now)
    assert (w.model_name, w.engines, w.restarted, w.seconds) == ("m", 2, 1, 10.0)  # engine 1 is new
    assert (w.drafts, w.draft_tokens, w.accepted) == (6, 18, 10)
    assert w.per_position_counts == [5, 4, 1]  # drafts that accepted more than 0, 1, 2 tokens
    assert w.acceptance_rate == pytest.approx(10 / 18) and w.tau_incl_bonus == pytest.approx(1 + 10 / 6)
    per = [p for p in w.per_position if p is not None]
    assert len(per) == len(w.per_position) and w.tau_incl_bonus is not None
    assert sum(per) == pytest.approx(w.tau_incl_bonus - 1)
    assert w.accepted_length == pytest.approx([1 / 6, 1 / 6, 3 / 6, 1 / 6])  # P(accepted = 0..3)


def test_a_restart_mid_window_counts_from_zero_never_a_negative_rate() -> None:
    vllm = VllmStandIn(k=2)
    vllm.decode("m", "0", [2] * 10)
    vllm.decode("m", "1", [1] * 10)
    with serving(vllm.text) as server:
        before = _scrape(server.url, 0.0)
        vllm.restart("m", "0")
        vllm.decode("m", "0", [0, 2])  # since the restart
        vllm.decode("m", "1", [1, 1])
        now = _scrape(server.url, 5.0)
    (w,) = windows(before, now)
    assert w.restarted == 1 and (w.drafts, w.accepted) == (4, 4) and w.per_position_counts == [3, 1]
    assert w.tau_incl_bonus == 2.0


def test_a_missing_per_position_series_is_unknown_not_zero() -> None:
    vllm = VllmStandIn(k=3, missing_positions=frozenset({1}), engines=("0",))
    with serving(vllm.text) as server:
        before = _scrape(server.url, 0.0)
        vllm.decode("m", "0", [3, 3])
        now = _scrape(server.url, 1.0)
    (w,) = windows(before, now)
    assert w.per_position_counts == [2, None, 2] and w.per_position == [1.0, None, 1.0]
    assert w.accepted_length == [0.0, None, None, 1.0]
    assert w.tau_incl_bonus == 4.0  # the totals do not depend on the per-position series


def test_garbage_and_unreachable_urls_are_clear_errors() -> None:
    with serving(lambda: "<html><body>Welcome to nginx</body></html>") as server:
        with pytest.raises(ExpositionError, match=r"not a Prometheus text exposition.*Welcome to nginx"):
            _scrape(server.url, 0.0)
        with pytest.raises(ScrapeError, match="HTTP 404"):
            fetch_text(server.url.replace("/metrics", "/nothing"))
    with (
        serving(lambda: "# a valid exposition with no spec-decode series\nup 1\n") as server,
        pytest.raises(ExpositionError, match="without vllm's speculative-decoding series"),
    ):
        _scrape(server.url, 0.0)
    with pytest.raises(ScrapeError, match="cannot reach it"):
        fetch_text("http://127.0.0.1:9/metrics", timeout=2)


def _watch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "draftdeck.cli", "serving", "watch", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_serving_watch_prints_a_json_line_per_window_and_exits_2_on_bad_input() -> None:
    vllm = VllmStandIn(k=2, engines=("0",))
    with serving(vllm.text) as server:
        server.then(lambda: vllm.decode("m", "0", [2, 1, 0, 1]))  # after the first scrape
        done = _watch(server.url, "--kind", "vllm", "--interval", "0.2", "--once", "--json")
        assert done.returncode == 0, done.stderr
        (line,) = done.stdout.splitlines()
        window = json.loads(line)
        assert {k: window[k] for k in ("drafts", "draft_tokens", "accepted", "per_position")} == {
            "drafts": 4, "draft_tokens": 8, "accepted": 4, "per_position": [0.75, 0.25],
        }  # fmt: skip
        assert window["acceptance_rate"] == 0.5 and window["tau_incl_bonus"] == 2.0
        server.then(lambda: vllm.decode("m", "0", [2]))
        plain = _watch(server.url, "--interval", "0.2", "--once")
        assert "tau incl. bonus 3.00 (1 + accepted / drafts, as vLLM counts)" in plain.stdout
    with serving(lambda: "not metrics at all {") as server:
        bad = _watch(server.url, "--once")
        assert bad.returncode == 2 and "not a Prometheus text exposition" in bad.stderr
        assert "Traceback" not in bad.stderr
    gone = _watch("http://127.0.0.1:9/metrics", "--once")
    assert gone.returncode == 2 and "cannot reach it" in gone.stderr and "Traceback" not in gone.stderr


def test_sglang_gauges_are_shown_as_its_last_interval() -> None:
    sglang = SglangStandIn()
    sglang.length.labels("m").set(3.25)
    sglang.rate.labels("m").set(0.45)
    with serving(sglang.text) as server:
        done = _watch(server.url, "--kind", "sglang", "--once", "--json")
    assert done.returncode == 0, done.stderr
    gauges = {"accept_length": 3.25, "accept_rate": 0.45}
    assert json.loads(done.stdout) == {"model_name": "m", "gauges": gauges, "convention": "last interval"}
