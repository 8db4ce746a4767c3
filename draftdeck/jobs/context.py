"""What a run function gets from whoever runs it (a Celery worker, the CLI, a test): the contract.

The core knows nothing of SQL, Celery or the web. A run function receives a `RunContext`; the
service implements it over SQL (progress, events, metric points, alerts, cancellation flags), the
CLI and tests use `LocalContext`, which keeps everything in memory.

Metric names (one flat namespace per run; values are floats, counts are stored as counts and become
ratios only when shown):

- ``train/loss``, ``train/lr``, ``train/grad_norm``, ``train/tokens_per_s``, ``train/step_seconds``
  (a training step's mean wall time since the previous point): plain values per step;
  ``heldout/seconds``: the held-out pass's wall time.
- ``train/pos/{k}/correct``, ``train/pos/{k}/total`` for block slot k = 1..B-1: counts since the
  previous point (per-position accuracy = correct / total, summed over any window, ranks, runs).
- ``heldout/loss``; ``heldout/walked/accepted`` and ``heldout/walked/steps``: the walked estimate
  over the held-out split (tau incl. bonus = 1 + accepted / steps); ``heldout/anchor/accepted`` and
  ``heldout/anchor/blocks``: the mean over a seeded sample of anchors (the optimistic estimate, tau = 1 +
  accepted / blocks); ``heldout/hist/{n}``: verify steps whose tau (incl. bonus) was n, n = 1..B;
  ``heldout/pos/{k}/correct`` / ``heldout/pos/{k}/total``.
- ``eval/accepted``, ``eval/steps``, ``eval/proposed``, ``eval/hist/{n}``, ``eval/pos/{i}/accepted``
  (drafts that accepted more than i tokens, as vLLM counts): real speculative decoding.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from draftdeck.errors import Cancelled


class RunContext(Protocol):
    """The calls a run function may make while it runs. A context may also hold `file_roots`: see
    :func:`file_roots`."""

    out_dir: Path  # a folder of the job's own for its outputs (exists)

    def progress(self, done: int, total: int | None = None, unit: str = "rows") -> None:
        """Report progress (throttled by the implementation); raises `Cancelled` when cancelled."""

    def check_cancelled(self) -> None:
        """Raise `Cancelled` if cancellation was requested (cheap enough to call once per step)."""

    def event(self, level: str, message: str, *, code: str | None = None, count: int = 1) -> None:
        """Record a line in the job's event log (level: info | warning | error)."""

    def metrics(self, step: int, values: Mapping[str, float], *, tokens: int | None = None) -> None:
        """Record metric points at `step` (and `tokens` seen so far); NaN and inf are kept."""

    def alert(self, kind: str, message: str) -> None:
        """Raise an alert (shown on the alerts page and the job page)."""


def file_roots(ctx: RunContext) -> tuple[str, ...] | None:
    """The folders from which a job run under `ctx` may read files that its data names (the images a
    row points at), or None: any file (the CLI, run by a user on their own files). The service's
    context gives its data roots: a row is data someone submitted, and must not make the job copy a
    file from elsewhere into its output. Not a member of the protocol: the contexts that wrap another
    (train's ranks and reporter, sweep points, cache slices) serve runs that read only their datasets'
    stored images, and need not say."""
    roots = getattr(ctx, "file_roots", None)
    return tuple(str(r) for r in roots) if roots is not None else None


@dataclass
class MetricPoint:
    step: int
    name: str
    value: float
    tokens: int | None = None

    @property
    def finite(self) -> bool:
        return math.isfinite(self.value)


@dataclass
class LocalContext:
    """An in-memory `RunContext` for in-process commands and tests; `cancel()` may be called from
    another thread."""

    out_dir: Path
    file_roots: tuple[str, ...] | None = None  # see file_roots(): None, the user's own run
    points: list[MetricPoint] = field(default_factory=list)
    events: list[tuple[str, str, str | None, int]] = field(default_factory=list)
    alerts: list[tuple[str, str]] = field(default_factory=list)
    last_progress: tuple[int, int | None, str] | None = None
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)

    def __post_init__(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def cancel(self) -> None:
        self._cancel.set()

    def check_cancelled(self) -> None:
        if self._cancel.is_set():
            raise Cancelled("cancelled")

    def progress(self, done: int, total: int | None = None, unit: str = "rows") -> None:
        self.last_progress = (done, total, unit)
        self.check_cancelled()

    def event(self, level: str, message: str, *, code: str | None = None, count: int = 1) -> None:
        self.events.append((level, message, code, count))

    def metrics(self, step: int, values: Mapping[str, float], *, tokens: int | None = None) -> None:
        self.points.extend(MetricPoint(step, k, float(v), tokens) for k, v in values.items())

    def alert(self, kind: str, message: str) -> None:
        self.alerts.append((kind, message))

    def series(self, name: str) -> list[tuple[int, float]]:
        """(step, value) of one metric, in the order written."""
        return [(p.step, p.value) for p in self.points if p.name == name]

    def total(self, name: str) -> float:
        """The sum of a count metric over every point written."""
        return sum(p.value for p in self.points if p.name == name)
