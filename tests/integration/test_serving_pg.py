"""Served tau on PostgreSQL: the migrations (0009's model_name and hourly sums) apply, windows add to
their hour, and the bucketed query gives the same numbers as on SQLite, from the windows or their hours
(PostgreSQL sums BIGINT counts as NUMERIC: the figures must still be floats a JSON response can carry)."""

from __future__ import annotations

import json
from typing import Any

from sqlmodel import Session


def test_served_tau_buckets_sum_counts_on_postgresql(pg_engine: Any) -> None:
    from app.serving import endpoints
    from app.serving.series import tau_series
    from app.store.models import ServingWindow

    with Session(pg_engine, expire_on_commit=False) as s:
        ep = endpoints.create_endpoint(
            s, name="prod", kind="vllm", metrics_url="http://127.0.0.1:9/metrics", model_name="m"
        )
        t0 = 1_800_000_000_000
        rows = [
            ServingWindow(endpoint_id=ep.id or 0, wall_ms=t0 + dt, model_name=model, drafts=drafts,
                          draft_tokens=3 * drafts, accepted=accepted, per_position=[drafts, 0])
            for dt, model, drafts, accepted in ((0, "m", 100, 300), (1000, "m", 100, 100),
                                                (1500, "x", 50, 0), (10_000, "m", 50, 50))
        ]  # fmt: skip
        endpoints.add_windows(s, ep, rows)
        s.commit()
        series = tau_series(s, ep, budget=2)
        # two more of model "m": 5 windows are more than a 1-bucket chart reads, so it reads their hour
        more = [ServingWindow(endpoint_id=ep.id or 0, wall_ms=t0 + dt, model_name="m", drafts=50,
                              draft_tokens=150, accepted=100, per_position=[50, 0])
                for dt in (20_000, 30_000)]  # fmt: skip
        endpoints.add_windows(s, ep, more)
        s.commit()
        hourly = tau_series(s, ep, budget=1)
    assert series.x == [t0 + 1000, t0 + 10_000] and series.y == [3.0, 2.0]  # model "x" left out
    assert (series.lo, series.hi) == ([2.0, 2.0], [4.0, 2.0])
    assert all(type(v) is float for v in series.y + series.lo + series.hi)
    json.dumps(series.as_json())
    assert hourly.level == 1 and hourly.y == [1 + 650 / 350] and type(hourly.y[0]) is float
    assert (hourly.lo, hourly.hi) == ([2.0], [4.0])
