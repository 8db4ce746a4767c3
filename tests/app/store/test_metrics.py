"""The metric store and the chart query on real SQLite and real PostgreSQL (skipped only when it is down)."""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import Session, col, select

from app.store.db import make_engine, upgrade
from app.store.metric_query import QueryError, query
from app.store.metrics import last_ids, points_since, record_metrics, record_points, summaries
from app.store.models import Job, MetricValue
from draftdeck.jobs.context import MetricPoint

PG_ADMIN = os.environ.get("DRAFTDECK_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _pg_url() -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg")
    try:
        psycopg.connect(PG_ADMIN, connect_timeout=2).close()
    except Exception as exc:
        pytest.skip(f"PostgreSQL is down ({PG_ADMIN}): {exc}")
    name = f"draftdeck_metrics_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://{PG_ADMIN.split('://', 1)[1].rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def session(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Session]:
    if request.param == "sqlite":
        urls: Iterator[str] = iter([f"sqlite:///{tmp_path / 'm.db'}"])
    else:
        urls = _pg_url()
    url = next(urls)
    try:
        upgrade(url)
        engine = make_engine(url)
        with Session(engine) as s:
            yield s
        engine.dispose()
    finally:
        next(urls, None)


def _job(session: Session) -> int:
    job = Job(kind="train", params={})
    session.add(job)
    session.commit()
    assert job.id is not None
    return job.id


def _series(session: Session, job: int, name: str, values: list[float], start: int = 0) -> None:
    record_points(
        session,
        job,
        [MetricPoint(start + i, name, v, tokens=(start + i) * 100) for i, v in enumerate(values)],
    )


def test_points_summary_and_nonfinite_flags(session: Session) -> None:
    job = _job(session)
    record_metrics(session, job, 0, {"train/loss": 3.0, "train/lr": 0.001}, 64)
    record_metrics(session, job, 1, {"train/loss": math.nan, "train/lr": 0.002}, 128)
    record_metrics(session, job, 2, {"train/loss": 2.0, "train/lr": math.inf}, 192)
    rows = session.exec(
        select(MetricValue).where(col(MetricValue.job_id) == job).order_by(col(MetricValue.id))
    ).all()
    assert len(rows) == 6
    nan = next(r for r in rows if r.name == "train/loss" and r.step == 1)
    assert (nan.value, nan.flag) == (None, 1)
    inf = next(r for r in rows if r.name == "train/lr" and r.step == 2)
    assert (inf.value, inf.flag) == (None, 2)
    loss = summaries(session, [job])[job]["train/loss"]
    assert (loss.count, loss.nonfinite, loss.first_value, loss.last_value, loss.last_step) == (
        3,
        1,
        3.0,
        2.0,
        2,
    )
    assert (loss.min_value, loss.max_value, loss.last_tokens) == (2.0, 3.0, 192)
    lr = summaries(session, [job])[job]["train/lr"]
    assert (lr.last_flag, lr.last_value, lr.max_value) == (2, None, 0.002)


def test_bad_point_is_refused_naming_it_and_nothing_is_written(session: Session) -> None:
    job = _job(session)
    with pytest.raises(ValueError, match=r"metric point 1 \(train/loss\): step -1"):
        record_points(session, job, [MetricPoint(0, "train/loss", 1.0), MetricPoint(-1, "train/loss", 1.0)])
    assert summaries(session, [job]) == {}


def test_spike_inside_a_bucket_survives_at_every_level(session: Session) -> None:
    job = _job(session)
    values = [1.0] * 5000
    values[3337] = 100.0
    values[1234] = -50.0
    _series(session, job, "train/grad_norm", values)
    for budget in (10, 200, 5000):
        r = query(session, [job], ["train/grad_norm"], budget=budget).series[0]
        assert max(v for v in r.hi if v is not None) == 100.0
        assert min(v for v in r.lo if v is not None) == -50.0
        assert len(r.x) <= budget + 2
    coarse = query(session, [job], ["train/grad_norm"], budget=10).series[0]
    assert coarse.level >= 1, "5,000 points in 10 buckets should come from a rollup level"


def test_first_and_last_points_are_kept(session: Session) -> None:
    job = _job(session)
    values = [float(i % 7) for i in range(3000)]
    values[0], values[-1] = -9.0, 42.0
    _series(session, job, "train/loss", values, start=10)
    r = query(session, [job], ["train/loss"], budget=7).series[0]
    assert (r.x[0], r.y[0]) == (10, -9.0)
    assert (r.x[-1], r.y[-1]) == (3009, 42.0)
    zoom = query(session, [job], ["train/loss"], lo=100, hi=2000, budget=5).series[0]
    assert zoom.x[0] == 100 and zoom.y[0] == values[90]
    assert zoom.x == sorted(zoom.x)


def test_empty_and_single_point_series(session: Session) -> None:
    job = _job(session)
    assert query(session, [job], ["train/loss"]).series[0].x == []
    record_metrics(session, job, 5, {"train/loss": 0.5}, 320)
    r = query(session, [job], ["train/loss", "train/lr"])
    assert (r.series[0].x, r.series[0].y, r.series[0].lo, r.series[0].hi) == ([5], [0.5], [0.5], [0.5])
    assert r.series[1].x == []
    with pytest.raises(QueryError, match="budget 0"):
        query(session, [job], ["train/loss"], budget=0)
    with pytest.raises(QueryError, match="x axis 'epoch'"):
        query(session, [job], ["train/loss"], axis="epoch")
    with pytest.raises(QueryError, match="the start is after the end"):
        query(session, [job], ["train/loss"], lo=5, hi=1)


def test_nan_is_counted_not_drawn(session: Session) -> None:
    job = _job(session)
    _series(session, job, "train/loss", [1.0, math.nan, 3.0, math.inf, math.nan])
    r = query(session, [job], ["train/loss"], budget=1).series[0]
    assert r.x == [0, 4]  # the first point, then the one bucket (its x: its last point)
    assert r.hi == [1.0, 3.0] and r.lo == [1.0, 1.0]
    assert r.nonfinite == [0, 3]
    assert r.y[-1] is None, "the last point is NaN: the line ends in a gap, not a made-up value"
    raw = query(session, [job], ["train/loss"], budget=100).series[0]
    assert raw.y == [1.0, None, 3.0, None, None]


def test_tau_is_a_ratio_of_summed_counts_never_a_mean_of_ratios(session: Session) -> None:
    job = _job(session)
    counts = [(9, 3), (1, 1), (4, 4), (6, 2)]  # accepted, verify steps per held-out pass
    for step, (acc, steps) in enumerate(counts):
        record_metrics(
            session, job, step, {"heldout/walked/accepted": acc, "heldout/walked/steps": steps}, None
        )
    r = query(session, [job], ["heldout/tau_walked"], budget=2).series[0]
    # buckets: steps {0,1} and {2,3}; the first point (step 0) kept exactly before them
    assert r.x == [0, 1, 3]
    assert r.y[0] == 1 + 9 / 3
    assert r.y[1] == 1 + (9 + 1) / (3 + 1)  # 3.5; the mean of the ratios would be 3.0
    assert r.y[2] == 1 + 6 / 2  # the line ends on the latest pass
    assert (r.lo[1], r.hi[1]) == (2.0, 4.0)
    assert (r.lo[2], r.hi[2]) == (2.0, 4.0)
    pos = query(session, [job], ["heldout/pos/1/acc"]).series[0]
    assert pos.x == []  # no counts written for it


def test_per_position_acceptance_pools_windows(session: Session) -> None:
    job = _job(session)
    pts = [MetricPoint(s, "train/pos/2/correct", 1.0 if s % 2 else 3.0) for s in range(4000)]
    pts += [MetricPoint(s, "train/pos/2/total", 4.0) for s in range(4000)]
    record_points(session, job, pts)
    r = query(session, [job], ["train/pos/2/acc"], budget=4).series[0]
    assert r.level >= 1
    assert all(y is not None and abs(y - 0.5) < 1e-9 for y in r.y[1:-1])  # (3 + 1) / 8 pooled, per bucket
    assert r.y[0] == 0.75 and r.y[-1] == 0.25  # first and last points exact


def test_zoom_re_resolves_to_finer_levels(session: Session) -> None:
    job = _job(session)
    _series(session, job, "train/loss", [float(i) for i in range(20_000)])
    wide = query(session, [job], ["train/loss"], budget=100).series[0]
    assert wide.level >= 2
    narrow = query(session, [job], ["train/loss"], lo=5000, hi=5150, budget=100).series[0]
    assert narrow.level == 0
    assert narrow.x[0] == 5000 and narrow.x[-1] == 5150
    assert max(v for v in narrow.hi if v is not None) == 5150.0


def test_tokens_and_time_axes(session: Session) -> None:
    job = _job(session)
    record_points(
        session,
        job,
        [MetricPoint(s, "train/loss", float(s), tokens=s * 1000) for s in range(10)],
        wall_time=1000.0,
    )
    record_points(
        session,
        job,
        [MetricPoint(s, "train/loss", float(s), tokens=s * 1000) for s in range(10, 20)],
        wall_time=1010.0,
    )
    record_points(session, job, [MetricPoint(19, "heldout/loss", 7.0)])  # tokens taken from step 19
    by_tokens = query(session, [job], ["train/loss"], axis="tokens", lo=5000, hi=12000, budget=100).series[0]
    assert by_tokens.x == [5000, 6000, 7000, 8000, 9000, 10000, 11000, 12000]
    held = query(session, [job], ["heldout/loss"], axis="tokens").series[0]
    assert held.x == [19000]
    by_time = query(session, [job], ["train/loss"], axis="time", budget=10).series[0]
    assert (by_time.x, by_time.y) == ([1_000_000, 1_010_000], [9.0, 19.0])  # epoch ms; ties go by step


def test_overlay_shares_one_grid_and_live_reads_follow_an_id_cursor(session: Session) -> None:
    a, b = _job(session), _job(session)
    _series(session, a, "train/loss", [1.0] * 50)
    _series(session, b, "train/loss", [2.0] * 80)
    r = query(session, [a, b], ["train/loss"], budget=1000)
    assert [s.job_id for s in r.series] == [a, b]
    assert r.series[0].x[-1] == 49 and r.series[1].x[-1] == 79
    ids = last_ids(session, [a, b])
    rows, cursor = points_since(session, a, ["train/loss"], ids[a] - 2)
    assert [(name, step) for _id, name, step, *_ in rows] == [("train/loss", 48), ("train/loss", 49)]
    assert cursor == ids[a]
    assert points_since(session, a, ["train/loss"], cursor) == ([], cursor)
    record_metrics(session, a, 50, {"train/loss": 0.5, "train/lr": 1.0}, None)
    rows, after = points_since(session, a, ["train/loss"], cursor)
    assert [(name, step) for _id, name, step, *_ in rows] == [("train/loss", 50)] and after > cursor


def test_migration_matches_the_models_and_downgrades(session: Session) -> None:
    from alembic import command
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy import Engine, inspect

    from app.store.db import alembic_config
    from app.store.models import SQLModel

    engine = session.get_bind()
    assert isinstance(engine, Engine)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
    mine = [d for d in diff if "metric" in repr(d)]
    assert mine == [], f"migration 0005 and app/store/models.py disagree: {mine}"
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    session.close()
    command.downgrade(cfg, "0004")
    tables = set(inspect(engine).get_table_names())
    assert "metrics" in tables and "metric_points" not in tables
    command.upgrade(cfg, "head")
    assert {"metric_points", "metric_series", "metric_rollups", "metric_steps"} <= set(
        inspect(engine).get_table_names()
    )


def test_a_live_read_cut_by_its_limit_keeps_a_steps_counts_together(session: Session) -> None:
    job = _job(session)
    names = ["heldout/walked/accepted", "heldout/walked/steps"]
    for step in range(3):
        record_metrics(session, job, step, dict(zip(names, (5.0, 2.0), strict=True)), None)
    rows, cursor = points_since(session, job, names, 0, limit=3)
    assert [step for _id, _n, step, *_ in rows] == [0, 0]  # not step 1's first count without its second
    rest, _ = points_since(session, job, names, cursor)
    assert [step for _id, _n, step, *_ in rest] == [1, 1, 2, 2]
