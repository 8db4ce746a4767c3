# ruff: noqa: E402 - imports follow the sys.path fix
"""Loopback stand-in for vLLM's ``POST /v1/chat/completions/render``, for benchmarking speculators.

    python benchmarks/_render_server.py --tokenizer DIR [--port 0]

speculators 0.9.0 ``prepare-data`` tokenizes conversations only through a vLLM server's render
endpoint (``speculators/data_generation/render_client.py``). There is no vLLM on this machine, so this
helper serves the same endpoint from a local HF tokenizer folder, the way vLLM renders a chat request:
``apply_chat_template(messages, tools=..., add_generation_prompt=..., tokenize=False,
**chat_template_kwargs)`` then an encode with ``add_special_tokens=False``.

Request body (what 0.9.0 sends): ``messages``, ``add_generation_prompt``, and optionally ``tools``,
``chat_template_kwargs``, ``truncate_prompt_tokens``, ``truncation_side`` (``left``/``right``).
Response: ``{"token_ids": [...]}`` (the only key 0.9.0 reads). A template error or a malformed request
answers 400, which speculators does not retry (it skips that conversation and logs why).

``GET /stats`` answers this process's CPU seconds (all threads), the request and error counts and the
wall-clock time (``time.time()``) of the first and last render since start or ``GET /reset``, so the
benchmark can charge the server's CPU to the peer. The server binds to 127.0.0.1 only. On start it
prints ``READY <port>``.

Not part of DraftDeck: a benchmark helper.
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/ holds tokenize.py, which would shadow the stdlib module transformers imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import json
import os
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RENDER_PATH = "/v1/chat/completions/render"


class Renderer:
    def __init__(self, tokenizer_dir: str) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        if not self.tok.chat_template:
            raise SystemExit(f"{tokenizer_dir}: the tokenizer has no chat template")
        self.lock = threading.Lock()
        self.requests = 0
        self.errors = 0
        self.first: float | None = None
        self.last: float | None = None

    def render(self, body: dict[str, Any]) -> list[int]:
        messages = body["messages"]
        if not isinstance(messages, list):
            raise ValueError("messages must be a list")
        kwargs = body.get("chat_template_kwargs") or {}
        text = self.tok.apply_chat_template(
            messages,
            tools=body.get("tools"),
            add_generation_prompt=bool(body.get("add_generation_prompt", True)),
            tokenize=False,
            **kwargs,
        )
        ids: list[int] = self.tok(text, add_special_tokens=False)["input_ids"]
        n = body.get("truncate_prompt_tokens")
        if n is not None and n >= 0 and len(ids) > n:
            ids = ids[:n] if body.get("truncation_side") == "right" else ids[len(ids) - n :]
        return ids


def make_handler(r: Renderer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: speculators pools one connection per worker
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, obj: Any) -> None:
            data = json.dumps(obj).encode()
            head = (
                f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
            ).encode()
            self.wfile.write(head + data)  # one write: no small-packet stalls

        def do_GET(self) -> None:
            if self.path == "/stats":
                with r.lock:
                    stats = {"cpu_s": time.process_time(), "requests": r.requests, "errors": r.errors,
                             "first": r.first, "last": r.last}  # fmt: skip
                self._send(200, stats)
            elif self.path == "/reset":  # forget first/last (the benchmark's own checks)
                with r.lock:
                    r.first = r.last = None
                self._send(200, {"ok": True})
            elif self.path in ("/health", "/v1/models"):
                self._send(200, {"ok": True})
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path != RENDER_PATH:
                self._send(404, {"error": f"no route {self.path}"})
                return
            now = time.time()
            try:
                ids = r.render(json.loads(raw))
            except Exception as exc:  # the template raised, or a malformed body: the client's fault
                with r.lock:
                    r.requests += 1
                    r.errors += 1
                    r.first = r.first or now
                    r.last = time.time()
                self._send(400, {"error": f"{type(exc).__name__}: {exc}"})
                return
            with r.lock:
                r.requests += 1
                r.first = r.first or now
                r.last = time.time()
            self._send(200, {"token_ids": ids})

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="HF tokenizer folder with a chat template")
    ap.add_argument("--port", type=int, default=0, help="0: any free port (printed as READY <port>)")
    args = ap.parse_args()
    renderer = Renderer(args.tokenizer)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(renderer))
    server.daemon_threads = True
    print(f"READY {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
