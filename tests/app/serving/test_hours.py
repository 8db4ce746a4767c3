"""Hourly sums of the served windows: a range of more windows than the chart's budget holds is read
from them, with the same figures as the windows give (sums of counts, the band of the windows' own
figures); migration 0009 fills them from the windows stored before it."""

from __future__ import annotations

import random
from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text
from sqlmodel import Session, SQLModel, col, select

from app.serving import endpoints
from app.serving.endpoints import HOUR_MS
from app.serving.series import positions, tau_series
from app.store.db import alembic_config, get_engine
from app.store.models import ServingEndpoint, ServingHour, ServingWindow

H0 = 500_000 * HOUR_MS  # an hour's start, in 2027


def _windows(ep: ServingEndpoint, n: int, every_ms: int, seed: int = 7) -> list[ServingWindow]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        d = rng.randint(50, 150)
        per = [rng.randint(0, d) for _ in range(3)]
        gauges = {"accept_length": round(rng.uniform(2, 4), 3)} if ep.kind == "sglang" else None
        out.append(ServingWindow(endpoint_id=ep.id or 0, wall_ms=H0 + i * every_ms, drafts=d,
                                 draft_tokens=3 * d, accepted=sum(per), per_position=list(per),
                                 gauges=gauges))  # fmt: skip
    return out


def _by_hour(rows: list[ServingWindow]) -> dict[int, list[ServingWindow]]:
    out: dict[int, list[ServingWindow]] = {}
    for w in rows:
        out.setdefault(w.wall_ms // HOUR_MS, []).append(w)
    return out


def test_a_long_range_is_read_from_hourly_sums_with_the_windows_figures(migrated: Path) -> None:
    with Session(get_engine(), expire_on_commit=False) as s:
        vllm = endpoints.create_endpoint(s, name="v", kind="vllm", metrics_url="http://127.0.0.1:9/metrics")
        sglang = endpoints.create_endpoint(
            s, name="g", kind="sglang", metrics_url="http://127.0.0.1:9/metrics"
        )
        rows = _windows(vllm, 2400, 15_000)  # 10 hours of 15 s scrapes
        gauge_rows = _windows(sglang, 600, 60_000)
        endpoints.add_windows(s, vllm, rows)
        endpoints.add_windows(s, sglang, gauge_rows)
        s.commit()
        hi = H0 + 10 * HOUR_MS - 1
        hourly = tau_series(s, vllm, H0, hi, budget=10)  # 2,400 windows > 4 a bucket: the hours
        fine = tau_series(s, vllm, H0, hi, budget=600)  # 2,400 fit 4 x 600: the windows
        hours = list(_by_hour(rows).values())
        assert hourly.level == 1 and fine.level == 0
        assert hourly.x == [h[-1].wall_ms for h in hours]
        assert hourly.y == [1 + sum(w.accepted for w in h) / sum(w.drafts for w in h) for h in hours]
        assert hourly.lo == [min(1 + w.accepted / w.drafts for w in h) for h in hours]
        assert hourly.hi == [max(1 + w.accepted / w.drafts for w in h) for h in hours]
        # p_i over a range of more windows than are summed one by one: from the hours, the same
        drafts = sum(w.drafts for w in rows)
        counts = [[c for c in w.per_position if c is not None] for w in rows]  # every window has 3
        assert all(len(c) == 3 for c in counts)
        expected = [sum(c[i] for c in counts) / drafts for i in range(3)]
        assert positions(s, vllm, H0, hi).served == expected
        assert positions(s, vllm, H0, H0 + HOUR_MS - 1).served_drafts == sum(w.drafts for w in hours[0])
        gauges = tau_series(s, sglang, H0, hi, budget=10)
        by_hour = list(_by_hour(gauge_rows).values())
        assert gauges.level == 1 and gauges.y == [h[-1].gauges["accept_length"] for h in by_hour]  # type: ignore[index]
        assert gauges.lo == [min(w.gauges["accept_length"] for w in h) for h in by_hour]  # type: ignore[index]
        endpoints.delete_endpoint(s, vllm)
        assert s.exec(select(ServingHour).where(ServingHour.endpoint_id == vllm.id)).all() == []


def test_migration_0009_fills_the_hours_of_the_windows_stored_before_it(migrated: Path) -> None:
    engine = get_engine()
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
    assert [d for d in diff if "serving" in repr(d)] == [], "migration 0009 and app/store/models.py disagree"
    with Session(engine, expire_on_commit=False) as s:
        ep = endpoints.create_endpoint(s, name="v", kind="vllm", metrics_url="http://127.0.0.1:9/metrics")
        rows = _windows(ep, 300, 30_000, seed=3)  # 2.5 hours
        endpoints.add_windows(s, ep, rows)
        s.commit()
        kept = [h.model_dump() for h in s.exec(select(ServingHour).order_by(col(ServingHour.hour)))]
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    command.downgrade(cfg, "0008")
    command.upgrade(cfg, "head")
    with Session(engine) as s:
        again = [h.model_dump() for h in s.exec(select(ServingHour).order_by(col(ServingHour.hour)))]
        assert s.execute(text("SELECT COUNT(*) FROM serving_windows")).scalar_one() == 300
    assert len(again) == 3 and again == kept
