"""How long-running core functions report progress and learn that they were cancelled."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """Called by core loops as work advances.

    Implementations may raise :class:`draftdeck.errors.Cancelled` to stop the work; callers must let
    it propagate. `total` is None when unknown; `unit` names what is counted ("bytes", "rows").
    """

    def __call__(self, done: int, total: int | None = None, unit: str = "rows") -> None: ...


def no_progress(done: int, total: int | None = None, unit: str = "rows") -> None:
    """A :class:`Progress` that ignores everything."""
