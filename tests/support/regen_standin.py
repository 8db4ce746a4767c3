"""A tiny OpenAI-compatible stand-in server (stdlib HTTP, a thread) for the cases `transformers serve`
cannot produce: a refused key, 429s, a slow answer, reasoning in each field servers use, a context
window error, a malformed answer. `answer(messages, request_number)` says what each request gets."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, Any]  # (HTTP status, JSON body or raw text)


def completion(content: str | None = "ok", finish: str = "stop", **message: Any) -> Reply:
    msg = {"role": "assistant", "content": content, **message}
    return 200, {
        "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3},
    }


@dataclass
class StandIn:
    answer: Callable[[list[dict[str, Any]], int], Reply]
    models: list[str] = field(default_factory=lambda: ["m"])
    key: str | None = None
    delay_s: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    model_lists: int = 0
    url: str = ""


@contextmanager
def standin(state: StandIn) -> Iterator[StandIn]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: Any) -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorised(self) -> bool:
            if state.key is not None and self.headers.get("Authorization") != f"Bearer {state.key}":
                self._send(401, {"error": {"message": "Incorrect API key provided"}})
                return False
            return True

        def do_GET(self) -> None:
            with lock:
                state.model_lists += 1
            if self._authorised():
                self._send(
                    200, {"object": "list", "data": [{"id": m, "object": "model"} for m in state.models]}
                )

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                state.requests.append(body)
                n = len(state.requests)
            if not self._authorised():
                return
            if state.delay_s:
                time.sleep(state.delay_s)
            status, reply = state.answer(body["messages"], n)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up
                self._send(status, reply)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
