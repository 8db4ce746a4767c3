# ruff: noqa: E402, E501 - imports follow the sys.path fix; table layout lines
"""Benchmark: the chart query at 10K and 1M points per series, and metric writes during a run.

    python benchmarks/metrics.py [--small 10000] [--large 1000000] [--reps 30] [--pg URL | --no-pg]

For each database (SQLite file under benchmarks/.work/metrics/, and PostgreSQL when it answers), one
run per size writes a training-like series (`train/loss`: noise around a falling curve with spikes)
and the held-out walked-tau counts (`heldout/walked/accepted` and `.../steps`, every 100 steps), in
batches of 10,000 points through `app.store.metrics.record_points` (bulk write rate). The query
(`app.store.metric_query.query`, what GET /runs/data runs) is then timed in-process, p50 and p95 over
--reps calls after a warm-up, for:
- full: the whole series, 1,000 buckets (a chart 1,000 px wide);
- zoom 1%: a range of 1% of the steps in the middle (re-resolved: finer store level);
- tau: the walked tau incl. bonus (a ratio of summed counts) over the whole run.
Live writes: one `record_metrics` call per step with 24 names (loss, lr, grad norm, tokens/s, 2 x 10
per-position counts), as the trainer writes them: steps/s and points/s.

Goal: p50 < 50 ms at 1M, 1M/10K p50 ratio <= 3.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO))

import argparse
import functools
import math
import random
import shutil
import time
import uuid
from typing import Any

from sqlmodel import Session

from app.store.db import make_engine, upgrade
from app.store.metric_query import query
from app.store.metrics import record_metrics, record_points
from app.store.models import Job
from benchmarks._timing import p50_p95
from draftdeck.jobs.context import MetricPoint

WORK = REPO / "benchmarks" / ".work" / "metrics"
BATCH = 10_000


def _write_run(session: Session, n: int) -> tuple[int, float]:
    """A train job with `n` loss points (+ tau counts every 100 steps); returns (job id, points/s)."""
    job = Job(kind="train", params={"bench": n})
    session.add(job)
    session.commit()
    assert job.id is not None
    rng = random.Random(n)
    written = 0
    t0 = time.perf_counter()
    for start in range(0, n, BATCH):
        pts = []
        for step in range(start, min(n, start + BATCH)):
            loss = 4.0 * math.exp(-step / (n / 3)) + 0.5 + rng.gauss(0, 0.05)
            if step == n // 3 + 7:
                loss *= 20  # one spike the band must show, inside a bucket
            pts.append(MetricPoint(step, "train/loss", loss, tokens=step * 4096))
            if step % 100 == 0:
                pts.append(MetricPoint(step, "heldout/walked/accepted", float(rng.randint(100, 400))))
                pts.append(MetricPoint(step, "heldout/walked/steps", 100.0))
        written += record_points(session, job.id, pts)
    return job.id, written / (time.perf_counter() - t0)


def _live(session: Session, steps: int) -> tuple[float, float]:
    job = Job(kind="train", params={"bench": "live"})
    session.add(job)
    session.commit()
    assert job.id is not None
    t0 = time.perf_counter()
    for step in range(steps):
        values = {"train/loss": 2.0, "train/lr": 1e-3, "train/grad_norm": 0.7, "train/tokens_per_s": 9000.0}
        for k in range(1, 11):
            values[f"train/pos/{k}/correct"] = 10.0
            values[f"train/pos/{k}/total"] = 16.0
        record_metrics(session, job.id, step, values, step * 4096)
    dt = time.perf_counter() - t0
    return steps / dt, steps * 24 / dt


def bench(label: str, url: str, sizes: list[int], reps: int, live: int = 300) -> list[dict[str, Any]]:
    upgrade(url)
    engine = make_engine(url)
    rows = []
    with Session(engine) as session:
        for n in sizes:
            print(f"  {label}: writing {n:,} points", file=sys.stderr, flush=True)
            job, rate = _write_run(session, n)
            mid = n // 2
            r: dict[str, Any] = {"db": label, "n": n, "write": rate}
            r["full"] = p50_p95(functools.partial(query, session, [job], ["train/loss"], budget=1000), reps)
            r["zoom"] = p50_p95(
                functools.partial(
                    query, session, [job], ["train/loss"], lo=mid, hi=mid + n // 100, budget=1000
                ),
                reps,
            )
            r["tau"] = p50_p95(
                functools.partial(query, session, [job], ["heldout/tau_walked"], budget=1000), reps
            )
            res = query(session, [job], ["train/loss"], budget=1000).series[0]
            r["level"] = res.level
            r["spike_kept"] = max(v for v in res.hi if v is not None) > 5
            rows.append(r)
        live_steps, live_points = _live(session, live)
        for r in rows:
            r["live"] = (live_steps, live_points)
    engine.dispose()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--no-pg", action="store_true")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny: checks the script runs, measures nothing",
    )
    args = parser.parse_args()
    if args.smoke:  # the large size past 1,000 buckets, so that the query reads a coarser store level
        args.small, args.large, args.reps = 500, 5_000, 2
    live = 20 if args.smoke else 300  # steps of live writes
    sizes = [args.small, args.large]
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    rows = bench("SQLite", f"sqlite:///{WORK / 'bench.db'}", sizes, args.reps, live)
    if not args.no_pg:
        try:
            import psycopg

            psycopg.connect(args.pg, connect_timeout=2).close()
        except Exception as exc:
            print(f"PostgreSQL skipped ({args.pg}): {exc}", file=sys.stderr)
        else:
            name = f"draftdeck_bench_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(args.pg, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            try:
                base = args.pg.split("://", 1)[1].rsplit("/", 1)[0]
                rows += bench("PostgreSQL", f"postgresql+psycopg://{base}/{name}", sizes, args.reps, live)
            finally:
                with psycopg.connect(args.pg, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print()
    print(
        f"Chart query (app.store.metric_query.query, in-process), p50 / p95 ms over {args.reps} calls; 1,000 buckets"
    )
    print(
        f"| {'db':>10} | {'points':>9} | {'level':>5} | {'full':>13} | {'zoom 1%':>13} | {'tau (counts)':>13} | {'spike':>5} | {'bulk write':>12} |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        cells = " | ".join(f"{r[k][0]:5.1f} / {r[k][1]:5.1f}" for k in ("full", "zoom", "tau"))
        print(
            f"| {r['db']:>10} | {r['n']:>9,} | {r['level']:>5} | {cells} | {'yes' if r['spike_kept'] else 'NO':>5} | {r['write']:>8,.0f} pt/s |"
        )
    print()
    for db in dict.fromkeys(r["db"] for r in rows):
        small, large = (next(r for r in rows if r["db"] == db and r["n"] == n) for n in sizes)
        ratio = large["full"][0] / small["full"][0]
        print(
            f"{db}: 1M/10K full-range p50 ratio {ratio:.2f} (goal <= 3); 1M p50 {large['full'][0]:.1f} ms (goal < 50); "
            f"live writes {small['live'][0]:,.0f} steps/s = {small['live'][1]:,.0f} points/s (24 names a step, one call a step)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
