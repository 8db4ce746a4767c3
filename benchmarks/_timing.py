"""What the query benchmarks time with: p50 and p95 of a call, in milliseconds."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def p50_p95(fn: Callable[[], Any], reps: int, warmup: int = 3) -> tuple[float, float]:
    """(p50, p95) ms of `reps` calls of `fn` after `warmup` calls (caches, plans, the page cache)."""
    for _ in range(warmup):
        fn()
    ms = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t) * 1000)
    ms.sort()
    return statistics.median(ms), ms[min(len(ms) - 1, int(len(ms) * 0.95))]
