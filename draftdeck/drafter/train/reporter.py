"""`--report-to URL`: a run launched anywhere (torchrun on a cluster, srun, a laptop) reports live to
a DraftDeck server, where it is a train job like any other (app/run/external.py).

Rank 0 wraps the run's context. What the run says (progress, events, metric points, alerts) goes to
the console as before and is numbered and appended to a spool in the run folder
(`report/job-<id>.jsonl`) before anything is sent; a thread sends what the server has not
acknowledged, in batches, at least every HEARTBEAT_SECONDS (the job's heartbeat). The server applies
each numbered item once and in order, so a batch sent twice (an answer lost, a server restarted)
adds nothing twice, and nothing is lost while the server is away: the spool keeps it until the
server answers. The answers carry the job's cancel flag: Cancel on the run page stops the run, every
rank at the same step. The run folder's run.json and checkpoint index are mirrored when they change.
The run's outcome is the last item; the run waits up to END_WAIT_SECONDS for the server to take it,
and a relaunch of the same folder sends whatever is left.

The token comes from DRAFTDECK_TOKEN (never a parameter: parameters are stored and shown).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from draftdeck.errors import Cancelled, DraftDeckError
from draftdeck.jobs.context import RunContext

HEARTBEAT_SECONDS = 5.0
SEND_EVERY_SECONDS = 1.0
REGISTER_WAIT_SECONDS = 60.0
END_WAIT_SECONDS = 60.0
MIRRORED = ("run.json", "checkpoints/index.json")
# What one report may carry; the server checks the same bounds (app/run/report_items.py), under its 1 MiB
# request limit. A batch is cut by bytes as well as items; a larger file is not mirrored (an event says so).
MAX_BATCH_ITEMS = 500
BATCH_BYTES = 512 * 1024
MAX_MIRRORED_BYTES = 768 * 1024
MAX_MESSAGE_CHARS = 8000


class ReportError(DraftDeckError):
    """The server refused the run (a bad token, parameters it cannot read) or never answered."""


def _post(url: str, body: dict[str, Any], token: str | None, timeout: float = 30.0) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        data = json.loads(answer.read() or b"{}")
    return data if isinstance(data, dict) else {}


def _cut(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else message[: MAX_MESSAGE_CHARS - 3] + "..."


def _refusal(exc: urllib.error.HTTPError) -> str:
    try:
        detail = json.loads(exc.read() or b"{}").get("detail")
    except (ValueError, AttributeError):
        detail = None
    return f"HTTP {exc.code}: {detail or exc.reason}"


class Reporter:
    """Rank 0's RunContext for a run that reports to a server: `inner` (the console) plus the spool."""

    def __init__(self, url: str, out: Path, params: dict[str, Any], world: int, inner: RunContext):
        self.url = url.rstrip("/")
        self.token = os.environ.get("DRAFTDECK_TOKEN") or None
        self.inner = inner
        self.out_dir = inner.out_dir
        self.run_folder = out
        self.dir = out / "report"
        self.dir.mkdir(parents=True, exist_ok=True)
        key_file = self.dir / "key"
        if not key_file.is_file():
            key_file.write_text(uuid.uuid4().hex)
        self.job_id = self._register(key_file.read_text().strip(), params, world)
        self.spool = self.dir / f"job-{self.job_id}.jsonl"
        self._acked_file = self.dir / f"job-{self.job_id}.acked"
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.acked = int(self._acked_file.read_text()) if self._acked_file.is_file() else 0
        self.pending = [i for i in self._read_spool() if i["seq"] > self.acked]
        self.seq = max([self.acked, *(i["seq"] for i in self.pending)])
        self.cancel = False
        self.status = "running"
        self.unreachable_since: float | None = None
        self._mtimes: dict[str, float] = {}
        self.batch_items = MAX_BATCH_ITEMS
        self._thread = threading.Thread(target=self._send_loop, name="draftdeck-reporter", daemon=True)
        self._thread.start()
        inner.event("info", f"reporting to {self.url}/jobs/{self.job_id}")

    # --- registration and sending ---------------------------------------------------------------
    def _register(self, key: str, params: dict[str, Any], world: int) -> int:
        host, folder = socket.gethostname(), str(self.run_folder)
        body = {"key": key, "params": params, "host": host, "run_folder": folder, "world": world}
        deadline = time.monotonic() + REGISTER_WAIT_SECONDS
        while True:
            try:
                return int(_post(f"{self.url}/api/runs", body, self.token)["id"])
            except urllib.error.HTTPError as exc:
                if exc.code < 500:
                    raise ReportError(f"{self.url} refused the run: {_refusal(exc)}") from None
                error = _refusal(exc)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                error = str(getattr(exc, "reason", exc))
            if time.monotonic() > deadline:
                raise ReportError(
                    f"cannot reach {self.url} to register the run ({error}); is `draftdeck up` running there?"
                )
            time.sleep(2.0)

    def _read_spool(self) -> list[dict[str, Any]]:
        if not self.spool.is_file():
            return []
        items = []
        for line in self.spool.read_text(encoding="utf-8").splitlines():
            try:
                items.append(json.loads(line))
            except ValueError:  # a line cut by a crash mid-write: the items after it are gone too
                break
        return items

    def _append(self, kind: str, **fields: Any) -> int:
        with self._lock:
            self.seq += 1
            item = {"seq": self.seq, "kind": kind, "at": time.time(), **fields}
            with open(self.spool, "a", encoding="utf-8") as f:
                f.write(json.dumps(item) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self.pending.append(item)
            return self.seq

    def _mirror_changed(self) -> None:
        for name in MIRRORED:
            path = self.run_folder / name
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue
            if self._mtimes.get(name) != mtime:
                self._mtimes[name] = mtime
                text = path.read_text(encoding="utf-8")
                if len(text) > MAX_MIRRORED_BYTES:
                    why = f"{name} ({len(text):,} characters) is over {MAX_MIRRORED_BYTES:,}: not mirrored"
                    self.event("warning", f"{why}; the run page shows the last copy that fit")
                else:
                    self._append("file", name=name, text=text)

    def _batch(self) -> list[dict[str, Any]]:
        """The next items to send: at most `self.batch_items` of them and BATCH_BYTES (at least one)."""
        with self._lock:
            batch: list[dict[str, Any]] = []
            size = 0
            for item in self.pending[: self.batch_items]:
                size += len(json.dumps(item))
                if batch and size > BATCH_BYTES:
                    break
                batch.append(item)
            return batch

    def _too_large(self, batch: list[dict[str, Any]]) -> None:
        """The server refused a batch as too large (413): send fewer items at a time; a single item it
        cannot take becomes an event saying so, under the same number, so the items after it apply (the
        end stays the end, without its result)."""
        if len(batch) > 1:
            self.batch_items = max(1, len(batch) // 2)
            return
        item = batch[0]
        said = f"a report item ({item['kind']}) was too large for the server and was not sent"
        if item["kind"] == "end":
            why = "its result was too large for the server and was not sent"
            note = {**item, "result": None, "message": _cut(f"{item['message']} ({why})")}
        else:
            note = {"seq": item["seq"], "kind": "event", "at": item.get("at"), "level": "warning"}
            note["message"] = said
        with self._lock:
            self.pending = [note if i["seq"] == item["seq"] else i for i in self.pending]

    def _send_once(self) -> bool:
        """Send one batch of what is unacknowledged; False when the server could not be reached."""
        batch = self._batch()
        try:
            ack = _post(f"{self.url}/api/jobs/{self.job_id}/report", {"items": batch}, self.token)
        except urllib.error.HTTPError as exc:
            if exc.code >= 500:
                return False
            if exc.code == 413 and batch:
                self._too_large(batch)
                return True
            self.status = "refused"  # 4xx: sending again would be refused again
            why = _refusal(exc)
            self.inner.event("warning", f"{self.url} refused the run's report: {why}; it stops reporting")
            return True
        except (urllib.error.URLError, OSError, ValueError):
            return False
        if self.unreachable_since is not None:  # said before the acknowledgement: the run may end on it
            self.unreachable_since = None
            self.inner.event("info", f"{self.url} answers again: the buffered points are sent")
        acked = int(ack.get("acked", 0))
        self.batch_items = min(MAX_BATCH_ITEMS, self.batch_items * 2)
        with self._lock:
            self.pending = [i for i in self.pending if i["seq"] > acked]
            self.acked = max(self.acked, acked)
        self._acked_file.write_text(str(self.acked))
        self.cancel = bool(ack.get("cancel"))
        self.status = str(ack.get("status", "running"))
        return True

    def _send_loop(self) -> None:
        last = 0.0
        while not self._stop.is_set():
            self._wake.wait(SEND_EVERY_SECONDS)
            self._wake.clear()
            with contextlib.suppress(OSError):  # a file replaced while read: the next round reads it
                self._mirror_changed()
            if self.status != "running":
                continue
            if not self.pending and time.monotonic() - last < HEARTBEAT_SECONDS:
                continue
            if self._send_once():
                last = time.monotonic()
            elif self.unreachable_since is None:
                self.unreachable_since = time.monotonic()
                self.event("warning", f"{self.url} does not answer: the points are kept in {self.spool}")

    # --- RunContext ----------------------------------------------------------------------------
    def progress(self, done: int, total: int | None = None, unit: str = "rows") -> None:
        self.inner.progress(done, total, unit)
        self._append("progress", done=done, total=total, unit=unit)

    def check_cancelled(self) -> None:
        self.inner.check_cancelled()
        if self.cancel:
            raise Cancelled(f"cancelled on {self.url}/jobs/{self.job_id}")

    def event(self, level: str, message: str, *, code: str | None = None, count: int = 1) -> None:
        self.inner.event(level, message, code=code, count=count)
        self._append("event", level=level, message=_cut(message), code=code, count=count)

    def metrics(self, step: int, values: Mapping[str, float], *, tokens: int | None = None) -> None:
        self.inner.metrics(step, values, tokens=tokens)
        # JSON has no NaN or inf: sent as null, stored as a flagged point (a diverged loss stays visible)
        finite = {k: (float(v) if math.isfinite(float(v)) else None) for k, v in values.items()}
        self._append("metrics", step=step, values=finite, tokens=tokens)

    def alert(self, kind: str, message: str) -> None:
        self.inner.alert(kind, message)
        self._append("alert", alert=kind, message=_cut(message))

    def end(self, status: str, message: str, result: dict[str, Any] | None = None) -> bool:
        """The run's outcome, sent last; True once the server took it (waits up to END_WAIT_SECONDS)."""
        self._mirror_changed()
        seq = self._append("end", status=status, message=_cut(message), result=result)
        deadline = time.monotonic() + END_WAIT_SECONDS
        while self.acked < seq and self.status == "running" and time.monotonic() < deadline:
            self._wake.set()
            time.sleep(0.2)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        taken = self.acked >= seq
        if not taken:
            self.inner.event(
                "warning", f"{self.url} has not taken the run's end: it is kept in {self.spool}; relaunching"
                " with the same --out and --report-to sends it",
            )  # fmt: skip
        return taken
