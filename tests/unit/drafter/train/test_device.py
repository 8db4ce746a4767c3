"""The CPU threads a run on a shared machine takes."""

from __future__ import annotations

import os

from draftdeck.drafter.train.device import idle_cpu_cores


def test_idle_cores_are_the_cores_less_the_load_and_at_least_one() -> None:
    cores = len(os.sched_getaffinity(0))
    idle = idle_cpu_cores()
    assert 1 <= idle <= cores
    # the load average cannot drop between the two reads by a whole core's worth in a test's time
    assert idle >= max(1, min(cores, int(cores - os.getloadavg()[0] - 1)))
