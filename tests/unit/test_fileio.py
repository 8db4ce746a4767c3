"""fileio.InOrder: the writer's thread runs the calls in the order given, and an error there reaches
the caller (the next submit, or close) instead of being lost with the thread."""

from __future__ import annotations

import threading

import pytest

from draftdeck.fileio import InOrder


def test_calls_run_in_order_on_another_thread() -> None:
    seen: list[tuple[int, str]] = []
    worker = InOrder("t", depth=2)
    for i in range(50):
        worker.submit(lambda i: seen.append((i, threading.current_thread().name)), i)
    worker.close()
    assert [i for i, _ in seen] == list(range(50))
    assert {name for _, name in seen} == {"t"}


def test_the_first_error_is_raised_by_submit_and_close_and_later_calls_are_skipped() -> None:
    ran: list[int] = []
    gate = threading.Event()

    def call(i: int) -> None:
        if i == 1:
            gate.wait(10)  # call 2 is queued behind this one before it fails
            raise OSError("disk full")
        ran.append(i)

    worker = InOrder("t", depth=2)
    worker.submit(call, 0)
    worker.submit(call, 1)
    worker.submit(call, 2)  # waits for call 0's slot, then queues behind the failing call
    gate.set()
    with pytest.raises(OSError, match="disk full"):
        worker.close()
    assert ran == [0]  # call 2 was skipped: nothing is written after a failed write
    with pytest.raises(OSError, match="disk full"):
        worker.submit(call, 3)
    assert ran == [0]
