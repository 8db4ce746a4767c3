"""The live job pages in a real Chromium: one event stream per page, progress without a reload, the stream
closing at the end, and a reconnect (after the network drops it) that resumes without duplicates."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.harness import GOOD_ROW, Server, free_port

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect


class Proxy:
    """A TCP relay in front of the server whose connections a test can cut, as a dropped network would."""

    def __init__(self, target_port: int):
        self.port = free_port()
        self.target = target_port
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def cut(self) -> int:
        """Drop every open connection, both ways, mid-response (shutdown: a close alone would not wake
        the relay threads blocked reading them)."""
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        return len(conns)

    def close(self) -> None:
        self.listener.close()
        self.cut()


@pytest.fixture
def proxy(server: Server) -> Iterator[Proxy]:
    p = Proxy(server.port)
    yield p
    p.close()


def stream_requests(page: Any) -> list[Any]:
    seen: list[Any] = []
    page.on("request", lambda r: seen.append(r) if "/events" in r.url else None)
    return seen


def test_progress_reaches_the_page_on_one_stream_that_closes_at_the_end(
    page: Any, server: Server, slow_file: Any
) -> None:
    pipe = slow_file()
    job_id = server.submit("scan", inputs=str(pipe.path))
    streams = stream_requests(page)
    page.goto(f"/jobs/{job_id}")
    page.evaluate("document.getElementById('job-live').dataset.mark = 'first render'")
    expect(page.locator("#job-stream")).to_have_attribute("data-sse-state", "open")
    pipe.open()
    pipe.write_rows([json.loads(GOOD_ROW)])  # a row convert keeps: the scan passes
    expect(page.locator("#job-status")).to_have_text("running")
    # Progress in bytes, drawn in place from the stream's JSON: no reload, no re-render of the partial.
    label = page.locator("#job-live .status-line .progress > .muted")
    expect(label).to_have_text(re.compile(r"^\d+ B$"))
    # and its rate, from the same counts over the time since it started
    expect(page.locator("#job-live .status-line .progress [data-rate]")).to_have_text(re.compile(r"B/s$"))
    page.evaluate("document.getElementById('job-live').dataset.mark = 'running render'")
    first = label.inner_text()
    page.wait_for_timeout(600)  # a job writes progress at most every 0.5 s, and a scan every 2,048 rows
    pipe.write_rows([{"prompt": "x"}] * 3000)
    expect(label).not_to_have_text(first)
    expect(label).to_have_text(re.compile(r"^\d+(\.\d)? ([KM]i)?B$"))
    assert page.evaluate("document.getElementById('job-live').dataset.mark") == "running render"
    pipe.close()
    expect(page.locator("#job-status")).to_have_text("succeeded")
    expect(page.locator("#job-live [data-count='in'] .num")).to_have_text("3,001")
    expect(page.locator("#job-log")).to_contain_text("succeeded: 3,001 rows in, 1 out, 3,000 rejected")
    expect(page.locator("#job-stream")).to_have_attribute("data-sse-state", "closed")
    page.wait_for_timeout(2000)  # EventSource would be back within its 1 s retry if it had not closed
    assert len(streams) == 1 and streams[0].url.startswith(f"{server.url}/jobs/{job_id}/events?log=")
    log = page.locator("#job-log li").all_inner_texts()
    assert len(log) == len(set(log)) == len(server.job(job_id)["events"])


def test_a_dropped_stream_reconnects_and_resumes_without_duplicates(
    browser: Any, server: Server, proxy: Proxy, slow_file: Any, watch: Any
) -> None:
    pipe = slow_file()
    job_id = server.submit("scan", inputs=str(pipe.path))
    context = browser.new_context(base_url=f"http://127.0.0.1:{proxy.port}")
    try:
        page = context.new_page()
        page.on("pageerror", lambda e: watch.page_errors.append(str(e)))
        streams = stream_requests(page)
        page.goto(f"/jobs/{job_id}")
        pipe.open()
        pipe.write_rows([{"q": 1}])
        expect(page.locator("#job-status")).to_have_text("running")
        expect(page.locator("#job-log")).to_contain_text("started on")
        # the page may have drawn those from its HTML: cut only once an event with a cursor came
        expect(page.locator("#job-stream")).to_have_attribute("data-sse-last", re.compile(r"^log="))
        assert proxy.cut() >= 2
        for _ in range(100):  # EventSource comes back after the stream's `retry: 1000`
            if len(streams) == 2:
                break
            page.wait_for_timeout(50)
        expect(page.locator("#job-stream")).to_have_attribute("data-sse-state", "open")
        assert len(streams) == 2
        resumed = streams[1].all_headers().get("last-event-id", "")
        assert resumed.startswith("log="), streams[1].all_headers()
        pipe.write_rows([{"q": 2}, json.loads(GOOD_ROW)])  # a row convert keeps: the scan passes
        pipe.close()
        expect(page.locator("#job-status")).to_have_text("succeeded")
        expect(page.locator("#job-stream")).to_have_attribute("data-sse-state", "closed")
        ids = page.locator("#job-log li").evaluate_all("lis => lis.map(li => li.dataset.event)")
        assert [i for i, n in Counter(ids).items() if n > 1] == []
        assert len(ids) == len(server.job(job_id)["events"])
        assert watch.page_errors == []
    finally:
        context.close()


def test_the_jobs_list_keeps_one_stream_and_redraws_when_jobs_change(
    page: Any, server: Server, slow_file: Any, data_file: Any
) -> None:
    pipe = slow_file()
    streams = stream_requests(page)
    page.goto("/jobs")
    expect(page.locator("#jobs-stream")).to_have_attribute("data-sse-state", "open")
    job_id = server.submit("scan", inputs=str(pipe.path))
    row = page.locator(f"#jobs-table tr[data-job='{job_id}']")
    # A job from elsewhere shows up; the worker may already have taken it (it then waits on the pipe).
    expect(row.locator(".status")).to_have_text(re.compile(r"^(queued|running)$"))
    pipe.open()
    pipe.write_rows([json.loads(GOOD_ROW)])  # a row convert keeps: the scan passes
    expect(row.locator(".status")).to_have_text("running")
    size = len(GOOD_ROW) + 1
    expect(row.locator(".progress > .muted")).to_have_text(f"{size} B")  # bytes read so far, from the stream
    expect(row.locator(".progress [data-rate]")).to_have_text(re.compile(r"B/s$"))
    pipe.close()
    expect(row.locator(".status")).to_have_text("succeeded")
    expect(row.locator(".progress")).to_have_text("1 row")
    assert len(streams) == 1
