# ruff: noqa: E402, E501 - imports follow the sys.path fix; table layout lines
"""Benchmark: the served-tau chart query (GET /serving/<id>/data) at 10K and 200K scrape windows.

    python benchmarks/serving.py [--small 10000] [--large 200000] [--reps 20]

An endpoint scraped every 15 s has 5,760 windows a day: 10K is under two days, 200K a month. One
endpoint per size gets windows with drafts, accepted and per-position counts, stored as scrapes store
them (`app.serving.endpoints.add_windows`: each window and its hour's sums; 10,000 a transaction, the rate is
shown) in a migrated SQLite file under benchmarks/.work/serving/. Timed in-process, p50 / p95 over
--reps calls after a warm-up:
- chart: `app.serving.series.chart_data` over all windows, 1,000 buckets (what the page asks first:
  the SQL-bucketed tau series, from the windows or, past 4 a bucket, their hourly sums; p_i over the
  newest windows; the run's figures);
- zoom 1%: the same over 1 % of the time range (p_i summed over the windows in it);
- naive: what the chart would cost without SQL bucketing or hours, the baseline: every window read
  as a row and summed per bucket in Python.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO))

import argparse
import functools
import random
import shutil
import time

from sqlmodel import Session, col, select

from app.serving import endpoints
from app.serving.series import chart_data
from app.store.db import make_engine, upgrade
from app.store.models import ServingEndpoint, ServingWindow
from benchmarks._timing import p50_p95

WORK = REPO / "benchmarks" / ".work" / "serving"
BATCH = 10_000
T0 = 1_800_000_000_000
EVERY_MS = 15_000


def _endpoint(session: Session, n: int) -> tuple[ServingEndpoint, float]:
    """An endpoint with `n` windows stored as scrapes store them, and the windows/s of that."""
    ep = endpoints.create_endpoint(
        session, name=f"bench-{n}", kind="vllm", metrics_url="http://127.0.0.1:9/metrics"
    )
    rng = random.Random(n)
    t0 = time.perf_counter()
    for start in range(0, n, BATCH):
        rows = []
        for i in range(start, min(n, start + BATCH)):
            drafts = rng.randint(200, 2000)
            per = [round(drafts * p * rng.uniform(0.9, 1.0)) for p in (0.8, 0.6, 0.45, 0.3, 0.2, 0.1, 0.05)]
            rows.append(ServingWindow(endpoint_id=ep.id or 0, wall_ms=T0 + i * EVERY_MS, model_name="m",
                                      seconds=15.0, engines=2, drafts=drafts, draft_tokens=7 * drafts,
                                      accepted=sum(per), per_position=list(per)))  # fmt: skip
        endpoints.add_windows(session, ep, rows)
        session.commit()
    return ep, n / (time.perf_counter() - t0)


def _naive(session: Session, ep: ServingEndpoint, budget: int) -> list[float | None]:
    rows = session.exec(
        select(ServingWindow).where(ServingWindow.endpoint_id == ep.id).order_by(col(ServingWindow.wall_ms))
    ).all()
    lo, hi = rows[0].wall_ms, rows[-1].wall_ms
    acc, drafts = [0] * budget, [0] * budget
    for r in rows:
        b = min((r.wall_ms - lo) * budget // max(hi - lo, 1), budget - 1)
        acc[b] += r.accepted
        drafts[b] += r.drafts
    return [1 + a / d if d else None for a, d in zip(acc, drafts, strict=True)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny: checks the script runs, measures nothing",
    )
    args = parser.parse_args()
    if args.smoke:  # the large size past 4 windows a bucket, so that the chart reads hourly sums
        args.small, args.large, args.reps = 500, 5_000, 2
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    url = f"sqlite:///{WORK / 'bench.db'}"
    upgrade(url)
    engine = make_engine(url)
    rows = []
    with Session(engine, expire_on_commit=False) as session:
        for n in (args.small, args.large):
            print(f"  writing {n:,} windows", file=sys.stderr, flush=True)
            ep, rate = _endpoint(session, n)
            span = (n - 1) * EVERY_MS
            mid = T0 + span // 2
            # the figure over the whole range, one bucket: summed from hours or windows, the same
            agree = (
                abs(chart_data(session, ep, budget=1)["series"][0]["y"][0] - _naive(session, ep, 1)[0]) < 1e-9
            )
            rows.append({
                "n": n, "agree": agree, "rate": rate, "level": chart_data(session, ep, budget=1000)["series"][0]["level"],
                "chart": p50_p95(functools.partial(chart_data, session, ep, budget=1000), args.reps),
                "zoom": p50_p95(functools.partial(chart_data, session, ep, mid, mid + span // 100, 1000), args.reps),
                "naive": p50_p95(functools.partial(_naive, session, ep, 1000), max(3, args.reps // 4)),
            })  # fmt: skip
    engine.dispose()
    print()
    print("Served-tau chart (app.serving.series.chart_data, in-process, SQLite), p50 / p95 ms; 1,000 buckets")
    print(
        f"| {'windows':>9} | {'read':>7} | {'chart':>13} | {'zoom 1%':>13} | {'naive (baseline)':>16} | {'naive / chart':>13} | same tau | {'stored':>12} |"
    )
    print("|---:|---|---:|---:|---:|---:|---|---:|")
    for r in rows:
        ratio = r["naive"][0] / r["chart"][0]
        print(
            f"| {r['n']:>9,} | {'hours' if r['level'] else 'windows':>7} | {r['chart'][0]:5.1f} / {r['chart'][1]:5.1f} | "
            f"{r['zoom'][0]:5.1f} / {r['zoom'][1]:5.1f} | {r['naive'][0]:7.1f} / {r['naive'][1]:6.1f} | {ratio:12.1f}x | "
            f"{'yes' if r['agree'] else 'NO':>8} | {r['rate']:>6,.0f} win/s |"
        )
    small, large = rows
    print(
        f"\n{large['n']:,}/{small['n']:,} windows: chart p50 ratio {large['chart'][0] / small['chart'][0]:.1f}, "
        f"zoom p50 ratio {large['zoom'][0] / small['zoom'][0]:.1f}; same tau: the whole range in one bucket, "
        "from the chart's source and from every window"
    )
    return 0 if all(r["agree"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
