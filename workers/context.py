"""What a running job hands to the core: a progress callback that also checks for cancellation,
and a folder of its own for outputs."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app import jobs
from app.db import session_scope
from draftdeck.errors import Cancelled
from draftdeck.fileio import atomic_output, sha256_file
from draftdeck.quality import Output

PROGRESS_EVERY_SECONDS = 0.5


class Handoff(Exception):
    """Raised by a kind's run when the job continues in other tasks (chunk tasks): the runner leaves
    the job `running` and records nothing; the task that finishes the job records it."""


@dataclass
class JobContext:
    job_id: int
    out_dir: Path
    _last_write: float = field(default=0.0, repr=False)

    def progress(self, done: int, total: int | None = None, unit: str = "rows") -> None:
        now = time.monotonic()
        if now - self._last_write < PROGRESS_EVERY_SECONDS and (total is None or done < total):
            return
        self._last_write = now
        with session_scope() as session:
            if jobs.record_progress(session, self.job_id, done, total, unit):
                raise Cancelled(f"job {self.job_id} was cancelled")

    def write_json_output(self, name: str, data: dict[str, Any], *, rows: int) -> Output:
        path = self.out_dir / name
        with atomic_output(path, "w") as f:
            json.dump(data, f, indent=2, ensure_ascii=False)
        return Output(str(path), rows, path.stat().st_size, sha256_file(path))


class Heartbeat:
    """Refreshes the job's heartbeat from a thread while the job runs, so the sweeper can tell a slow
    job from a dead worker."""

    def __init__(self, job_id: int, every: float):
        self._job_id = job_id
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{job_id}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                with session_scope() as session:
                    jobs.heartbeat(session, self._job_id)
            except Exception:  # a missed beat is retried on the next tick
                continue

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self._every + 1)
