"""Served drafters as records: register an endpoint, record what a scrape found (app/serving/scraper.py runs
them), sum its windows into served tau, and raise or clear its alerts.

Counts are stored (ServingWindow); served tau, acceptance and p_i are ratios of sums over any range,
computed here when shown, through the same `Window` the CLI prints (draftdeck/serving/window.py).

Alerts, both cleared (acknowledged) by the scrape that finds the cause gone:
- ``endpoint_unreachable``: `serving_alert_failures` failed scrapes in a row, with the last error;
- ``served_tau_low``: over the newest windows holding at least `serving_min_drafts` drafts, served
  tau more than `serving_tau_drop` below the eval tau of the run it serves, naming both figures.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import delete, update
from sqlmodel import Session, col, select

from app.settings import Settings, get_settings
from app.store import records
from app.store.models import Alert, Job, ServingEndpoint, ServingHour, ServingWindow, utcnow
from draftdeck.errors import UsageError
from draftdeck.serving.exposition import KINDS, Scrape
from draftdeck.serving.window import Window, sum_positions, windows

UNREACHABLE = "endpoint_unreachable"
TAU_LOW = "served_tau_low"
TRAIN_KIND = "train"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LIKELY_CAUSES = (
    "a different target or chat template at serving, a sampling temperature above 0, a draft-token "
    "count other than the block size (vLLM: num_speculative_tokens = B - 1; SGLang: the block), or a "
    "restart with another checkpoint"
)


class EndpointError(UsageError):
    """An endpoint that cannot be registered as given (the message names the field)."""


def _http_url(value: str, field: str) -> str:
    value = value.strip()
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise EndpointError(f"{field}: expected an http:// or https:// URL, got {value!r}")
    return value


def create_endpoint(
    session: Session,
    *,
    name: str,
    kind: str,
    metrics_url: str,
    base_url: str | None = None,
    drafter: str | None = None,
    run_job_id: int | None = None,
    token_env: str | None = None,
    model_name: str | None = None,
    interval_s: float = 15.0,
) -> ServingEndpoint:
    name = name.strip()
    if not name:
        raise EndpointError("name: give the endpoint a name")
    if session.exec(select(ServingEndpoint).where(ServingEndpoint.name == name)).first() is not None:
        raise EndpointError(f"name: an endpoint named {name!r} exists already")
    if kind not in KINDS:
        raise EndpointError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    metrics_url = _http_url(metrics_url, "metrics_url")
    base = _http_url(base_url, "base_url") if base_url else metrics_url.rsplit("/metrics", 1)[0]
    if token_env and not _ENV_NAME.match(token_env):
        raise EndpointError(f"token_env: {token_env!r} is not an environment variable name")
    if not 1.0 <= interval_s <= 3600:
        raise EndpointError(f"interval_s: between 1 and 3600 seconds, got {interval_s}")
    if run_job_id is not None:
        run = session.get(Job, run_job_id)
        if run is None or run.kind != TRAIN_KIND:
            raise EndpointError(f"run_job_id: job {run_job_id} is not a train run")
    ep = ServingEndpoint(
        name=name, kind=kind, metrics_url=metrics_url, base_url=base, drafter=(drafter or None),
        run_job_id=run_job_id, token_env=token_env or None, model_name=(model_name or "").strip() or None,
        interval_s=interval_s,
    )  # fmt: skip
    session.add(ep)
    session.commit()
    session.refresh(ep)
    return ep


def delete_endpoint(session: Session, ep: ServingEndpoint) -> None:
    """Forget an endpoint and its windows; its alerts stay (their messages name it), detached."""
    for table in (ServingWindow, ServingHour):
        session.execute(delete(table).where(col(table.endpoint_id) == ep.id))
    session.execute(update(Alert).where(col(Alert.endpoint_id) == ep.id).values(endpoint_id=None))
    session.delete(ep)
    session.commit()


def token_of(ep: ServingEndpoint) -> str | None:
    """The bearer token, read from the named variable at each scrape (never stored)."""
    return os.environ.get(ep.token_env) if ep.token_env else None


# -- a scrape's outcome ------------------------------------------------------------------------------
def record_scrape(
    session: Session, ep: ServingEndpoint, scrape: Scrape | None, error: str | None, *,
    settings: Settings | None = None,
) -> list[ServingWindow]:  # fmt: skip
    """Store what a scrape found: its windows over the previous scrape (none for the first), or its
    error as the endpoint's health; then raise or clear the endpoint's alerts."""
    settings = settings or get_settings()
    now = utcnow()
    ep.last_scrape_at = now
    rows: list[ServingWindow] = []
    if scrape is None:
        ep.failures += 1
        ep.last_error = error
        if ep.failures == settings.serving_alert_failures:
            records.raise_alert(
                session, UNREACHABLE,
                f"{ep.name}: {ep.failures} scrapes in a row failed; the last: {error}",
                job_id=ep.run_job_id, endpoint_id=ep.id, commit=False,
            )  # fmt: skip
    else:
        wall_ms = int(scrape.at * 1000)
        if scrape.kind == "sglang":
            rows = [
                ServingWindow(endpoint_id=ep.id or 0, wall_ms=wall_ms, model_name=m, gauges=g)
                for m, g in sorted(scrape.gauges.items())
            ]
        elif ep.last_raw is not None:
            before = Scrape.from_dict(ep.last_raw)
            raw = scrape.to_dict()
            for w in windows(before, scrape):
                rows.append(
                    ServingWindow(
                        endpoint_id=ep.id or 0, wall_ms=wall_ms, model_name=w.model_name, seconds=w.seconds,
                        engines=w.engines, restarted=w.restarted, drafts=w.drafts,
                        draft_tokens=w.draft_tokens, accepted=w.accepted,
                        per_position=w.per_position_counts,
                        raw={"engines": [e for e in raw["engines"] if e["model_name"] == w.model_name]},
                    )
                )  # fmt: skip
        ep.last_raw = scrape.to_dict()
        ep.failures, ep.last_error, ep.last_ok_at = 0, None, now
        _clear(session, ep, UNREACHABLE)
    session.add(ep)
    add_windows(session, ep, rows)
    session.commit()
    if scrape is not None and ep.run_job_id is not None:
        check_tau(session, ep, settings)
    return rows


HOUR_MS = 3_600_000


def figure(ep: ServingEndpoint, w: ServingWindow) -> float | None:
    """What a window shows: its tau incl. bonus (vLLM's counts), its accept length gauge (SGLang)."""
    if ep.kind == "sglang":
        return (w.gauges or {}).get("accept_length")
    return 1 + w.accepted / w.drafts if w.drafts else None


def add_windows(session: Session, ep: ServingEndpoint, rows: list[ServingWindow]) -> None:
    """Store windows of `ep` and add each to its hour's sums, in the caller's transaction. One process
    scrapes an endpoint at a time (app/serving/scraper.py's compare-and-set): the read-modify-write is
    safe."""
    session.add_all(rows)
    for w in rows:
        _add_to_hour(session, ep, w)


def _add_to_hour(session: Session, ep: ServingEndpoint, w: ServingWindow) -> None:
    key = (ep.id or 0, w.model_name, w.wall_ms // HOUR_MS)
    h = session.get(ServingHour, key) or ServingHour(endpoint_id=key[0], model_name=key[1], hour=key[2])
    h.per_position = sum_positions([h.per_position, w.per_position]) if h.windows else list(w.per_position)
    h.windows += 1
    h.drafts += w.drafts
    h.draft_tokens += w.draft_tokens
    h.accepted += w.accepted
    h.last_wall_ms = max(h.last_wall_ms, w.wall_ms)
    v = figure(ep, w)
    if v is not None:
        h.vmin = v if h.vmin is None else min(h.vmin, v)
        h.vmax = v if h.vmax is None else max(h.vmax, v)
        h.vlast = v
    session.add(h)


def _open_alert(session: Session, ep: ServingEndpoint, kind: str) -> Alert | None:
    return session.exec(
        select(Alert).where(
            Alert.endpoint_id == ep.id, Alert.kind == kind, col(Alert.acknowledged).is_(False)
        )
    ).first()


def _clear(session: Session, ep: ServingEndpoint, kind: str) -> None:
    session.execute(
        update(Alert)
        .where(col(Alert.endpoint_id) == ep.id, col(Alert.kind) == kind, col(Alert.acknowledged).is_(False))
        .values(acknowledged=True, acknowledged_at=utcnow())
    )


# -- figures -----------------------------------------------------------------------------------------
def summed(rows: list[ServingWindow], model_name: str = "") -> Window:
    """One Window of the sum of `rows` (per-position counts: None where any row lacks one); its time is
    the span of the scrapes (rows of several models share their scrape times)."""
    first = min(rows, key=lambda r: r.wall_ms, default=None)
    span = (max(r.wall_ms for r in rows) - first.wall_ms) / 1000 + first.seconds if first else 0.0
    w = Window(model_name, span)
    for r in rows:
        w.drafts += r.drafts
        w.draft_tokens += r.draft_tokens
        w.accepted += r.accepted
        w.restarted += r.restarted
        w.engines = max(w.engines, r.engines)
    w.per_position_counts = sum_positions([r.per_position for r in rows])
    return w


def own_windows(ep: ServingEndpoint) -> Any:
    """A select of the endpoint's windows: of its model when it names one, else of every model."""
    stmt = select(ServingWindow).where(ServingWindow.endpoint_id == ep.id)
    return stmt.where(ServingWindow.model_name == ep.model_name) if ep.model_name else stmt


def newest(session: Session, ep: ServingEndpoint, min_drafts: int, limit: int = 10_000) -> Window:
    """The newest windows of `ep`, back until they hold at least `min_drafts` drafts (or all there are,
    up to `limit`). Read in pages that grow 4x: a query's rows are all loaded before the first is
    seen, and the usual answer is a few windows of a long history."""
    rows: list[ServingWindow] = []
    drafts, page = 0, 16
    newest_first = own_windows(ep).order_by(col(ServingWindow.wall_ms).desc(), col(ServingWindow.id).desc())
    while len(rows) < limit:
        got = list(session.exec(newest_first.offset(len(rows)).limit(min(page, limit - len(rows)))))
        for r in got:
            rows.append(r)
            drafts += r.drafts
            if drafts >= min_drafts:
                return summed(rows)
        if len(got) < page:
            break
        page *= 4
    return summed(rows)


def best_eval(session: Session, run: Job) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the best checkpoint's row, the eval row of it): the eval of the best checkpoint (what
    export-drafter exports) with a real tau, else the first such eval of any of its checkpoints (the
    run page's checkpoints and evals tables)."""
    from app.store.run_figures import checkpoints, evals

    ckpts, _ = checkpoints(run)
    best = next((c for c in ckpts if c.get("best")), None)
    rows = [r for r in evals(session, run, ckpts) if r["real"] is not None]
    step = best["step"] if best else None
    return best, next((r for r in rows if r["step"] == step), rows[0] if rows else None)


def eval_tau(session: Session, run: Job) -> tuple[float, Job] | None:
    """Real tau incl. bonus of the run's best eval (`best_eval`) and its job."""
    _, row = best_eval(session, run)
    return (float(row["real"]), row["job"]) if row is not None else None


def served_views(session: Session, run_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """The endpoints serving each run, as `endpoint_view`s, by run id."""
    out: dict[int, list[dict[str, Any]]] = {}
    if not run_ids:
        return out
    for ep in session.exec(
        select(ServingEndpoint)
        .where(col(ServingEndpoint.run_job_id).in_(run_ids))
        .order_by(col(ServingEndpoint.id))
    ):
        out.setdefault(ep.run_job_id or 0, []).append(endpoint_view(session, ep))
    return out


def check_tau(session: Session, ep: ServingEndpoint, settings: Settings) -> None:
    """Raise `served_tau_low` when the newest >= min_drafts drafts are served more than the drop below
    the run's eval tau; clear it when they are not. Fewer drafts than that: no judgement either way."""
    run = session.get(Job, ep.run_job_id) if ep.run_job_id is not None else None
    found = eval_tau(session, run) if run is not None else None
    w = newest(session, ep, settings.serving_min_drafts)
    served = w.tau_incl_bonus
    if found is None or served is None or w.drafts < settings.serving_min_drafts:
        return
    real, ev = found
    low = served < real * (1 - settings.serving_tau_drop)
    if low and _open_alert(session, ep, TAU_LOW) is None:
        records.raise_alert(
            session, TAU_LOW,
            f"{ep.name}: served tau incl. bonus {served:.2f} over the last {w.drafts:,} drafts "
            f"({w.seconds:.0f} s of scrapes) is {1 - served / real:.1%} below eval {ev.id}'s real tau "
            f"{real:.2f} for run {ep.run_job_id}. Likely causes: {LIKELY_CAUSES}.",
            job_id=ep.run_job_id, endpoint_id=ep.id,
        )  # fmt: skip
    elif not low:
        _clear(session, ep, TAU_LOW)
        session.commit()


@dataclass
class Health:
    state: str  # ok | failing | waiting | paused
    text: str


def health(ep: ServingEndpoint, now: datetime | None = None) -> Health:
    if not ep.enabled:
        return Health("paused", "not scraped: paused")
    if ep.last_scrape_at is None:
        return Health("waiting", "not scraped yet")
    if ep.failures:
        return Health("failing", f"{ep.failures} failed scrape(s) in a row: {ep.last_error}")
    return Health("ok", "answering: the last scrape read its spec-decode series")


def endpoint_view(session: Session, ep: ServingEndpoint, settings: Settings | None = None) -> dict[str, Any]:
    """What the pages and the API show of an endpoint: its record, health and the newest window."""
    settings = settings or get_settings()
    w = newest(session, ep, settings.serving_min_drafts)
    gauges = None
    if ep.kind == "sglang":
        last = session.exec(own_windows(ep).order_by(col(ServingWindow.id).desc())).first()
        gauges = last.gauges if last is not None else None
    run = session.get(Job, ep.run_job_id) if ep.run_job_id is not None else None
    found = eval_tau(session, run) if run is not None else None
    raw = ep.last_raw or {}
    seen = {e.get("model_name", "") for e in raw.get("engines", [])} | set(raw.get("gauges") or {})
    return {
        "endpoint": ep,
        "models": sorted(seen),  # the model names the last scrape found
        "health": health(ep),
        "window": w.to_json(),
        "gauges": gauges,
        "eval_tau": found[0] if found else None,
        "eval_job": found[1].id if found else None,
    }
