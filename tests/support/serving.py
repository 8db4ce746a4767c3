"""Stand-ins for serving engines that need a GPU: real HTTP servers whose /metrics is real Prometheus
text made by `prometheus_client` with vLLM's metric names and labels (or SGLang's gauges). What the
engines decode is scripted per scrape: `then(...)` queues a change that is applied right after the
next scrape is served, so two scrapes see exactly the counts a test names, whatever the machine's
speed."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class VllmStandIn:
    """vLLM's spec-decode counters for any (model_name, engine)."""

    def __init__(
        self,
        k: int = 3,
        missing_positions: frozenset[int] = frozenset(),
        engines: tuple[str, ...] = (),
        model: str = "m",
    ):
        self.k, self.missing = k, missing_positions
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.drafts = Counter("vllm:spec_decode_num_drafts", "verify steps", labels, registry=self.registry)
        self.draft_tokens = Counter(
            "vllm:spec_decode_num_draft_tokens", "draft tokens", labels, registry=self.registry
        )
        self.accepted = Counter(
            "vllm:spec_decode_num_accepted_tokens", "accepted", labels, registry=self.registry
        )
        self.per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos", "per position", [*labels, "position"],
            registry=self.registry,
        )  # fmt: skip
        # a plain server metric beside them, as vLLM has many
        Gauge("vllm:num_requests_running", "running", ["model_name"], registry=self.registry).labels("m").set(
            2
        )
        for engine in engines:  # vLLM creates its engines' series at start, at zero
            self.start_engine(model, engine)

    def start_engine(self, model: str, engine: str) -> None:
        """The series an engine of `model` has from its start, at zero (as vLLM creates them)."""
        for counter in (self.drafts, self.draft_tokens, self.accepted):
            counter.labels(model, engine).inc(0)
        for i in range(self.k):
            if i not in self.missing:
                self.per_pos.labels(model, engine, str(i)).inc(0)

    def decode(self, model: str, engine: str, accepted: list[int]) -> None:
        """One verify step per item, each accepting that many of its k draft tokens."""
        for a in accepted:
            self.drafts.labels(model, engine).inc()
            self.draft_tokens.labels(model, engine).inc(self.k)
            self.accepted.labels(model, engine).inc(a)
            for i in range(self.k):
                if i not in self.missing:
                    self.per_pos.labels(model, engine, str(i)).inc(1 if i < a else 0)

    def restart(self, model: str, engine: str) -> None:
        """The engine's process restarted: its series start again from zero."""
        for counter in (self.drafts, self.draft_tokens, self.accepted):
            counter.remove(model, engine)
        for i in range(self.k):
            if i not in self.missing:
                self.per_pos.remove(model, engine, str(i))
        self.start_engine(model, engine)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


class SglangStandIn:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.length = Gauge(
            "sglang:spec_accept_length", "accept length", ["model_name"], registry=self.registry
        )
        self.rate = Gauge("sglang:spec_accept_rate", "accept rate", ["model_name"], registry=self.registry)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


class MetricsServer:
    """GET /metrics -> `body()`; `then(change)` runs `change` right after the next scrape is served."""

    def __init__(self, body: Callable[[], str]):
        self.body = body
        self.queued: list[Callable[[], None]] = []
        self.scrapes = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                with server.lock:
                    payload = server.body().encode()
                    server.scrapes += 1
                    change = server.queued.pop(0) if server.queued else None
                    if change is not None:
                        change()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"

    def then(self, change: Callable[[], None]) -> None:
        with self.lock:
            self.queued.append(change)


@contextmanager
def _running(server: Any) -> Iterator[Any]:
    """Serve `server.httpd` in a thread for the block."""
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def serving(body: Callable[[], str]) -> AbstractContextManager[MetricsServer]:
    return _running(MetricsServer(body))


class SpecServer:
    """A stand-in speculative server: `/metrics` (vLLM's counters) and the two generate routes the served
    eval calls, vLLM's `/v1/completions` and SGLang's `/generate`. Each request decodes `max_tokens`
    tokens: one from the prefill, then verify steps accepting `accepts` in turn (a + 1 tokens each, the
    last cut at max_tokens), counted in the counters and in SGLang's meta_info."""

    def __init__(self, accepts: list[int], k: int = 3):
        self.vllm = VllmStandIn(k=k, engines=("0",))
        self.accepts, self.requests = accepts, []  # type: ignore[var-annotated]
        self.steps_total = 0
        spec = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, payload: bytes, kind: str = "application/json") -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                self._send(spec.vllm.text().encode(), "text/plain; version=0.0.4")

            def do_POST(self) -> None:
                import json

                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                spec.requests.append((self.path, body))
                if self.path == "/v1/completions":
                    n, steps = spec.decode(int(body["max_tokens"]))
                    self._send(
                        json.dumps({"choices": [{"text": "x"}], "usage": {"completion_tokens": n}}).encode()
                    )
                elif self.path == "/generate":
                    n, steps = spec.decode(int(body["sampling_params"]["max_new_tokens"]))
                    meta = {"completion_tokens": n, "spec_verify_ct": steps}
                    self._send(json.dumps({"text": "x", "meta_info": meta}).encode())
                else:
                    self.send_error(404)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def decode(self, max_tokens: int) -> tuple[int, int]:
        produced, steps, runs = 1, 0, []
        while produced < max_tokens:
            a = self.accepts[steps % len(self.accepts)]
            runs.append(a)
            produced += a + 1
            steps += 1
        self.vllm.decode("m", "0", runs)
        self.steps_total += steps
        return min(produced, max_tokens), steps


def spec_server(accepts: list[int], k: int = 3) -> AbstractContextManager[SpecServer]:
    return _running(SpecServer(accepts, k))
