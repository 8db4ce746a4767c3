"""The scraper: a loop beside the sweeper, in every process that runs one (the web's, each worker's), that
reads each enabled endpoint's /metrics on its interval and records what it found (app/serving/endpoints.py).

Why a loop of its own and not a Celery beat task on the cpu queue: `draftdeck up` runs with the
embedded file broker and no beat process, so a beat schedule would never fire there; and a scrape is
one short GET that must not wait behind an hour of tokenizing on the cpu queue. Several processes may
run the loop: a compare-and-set on `next_scrape_at` lets exactly one of them scrape an endpoint per
interval. Every failure (unreachable, HTTP error, not an exposition, no spec-decode series) is the
endpoint's health, never the loop's end.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from sqlalchemy import update
from sqlmodel import Session, col, select

from app.serving import endpoints
from app.settings import Settings, get_settings
from app.store.db import session_scope
from app.store.models import ServingEndpoint, utcnow
from draftdeck.errors import InputError
from draftdeck.serving.exposition import Scrape, parse
from draftdeck.serving.fetch import fetch_text

log = logging.getLogger(__name__)
ROUND_SECONDS = 1.0
PER_ROUND = 50  # endpoints one round scrapes at most


def _claim(session: Session, ep: ServingEndpoint) -> bool:
    """Move the endpoint's next scrape one interval on, if no other process did it first."""
    due = ep.next_scrape_at
    result = session.execute(
        update(ServingEndpoint)
        .where(col(ServingEndpoint.id) == ep.id, col(ServingEndpoint.next_scrape_at) == due)
        .values(next_scrape_at=utcnow() + timedelta(seconds=ep.interval_s))
    )
    session.commit()
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def scrape_one(session: Session, ep: ServingEndpoint, settings: Settings | None = None) -> None:
    """Scrape `ep` now and record it, whatever happens."""
    scrape: Scrape | None = None
    error: str | None = None
    try:
        text = fetch_text(ep.metrics_url, token=endpoints.token_of(ep))
        scrape = parse(text, ep.kind, time.time(), source=ep.metrics_url)
    except InputError as e:
        error = str(e)
    except Exception as e:  # anything else a server can do to us is still its health, not our crash
        error = f"{ep.metrics_url}: {type(e).__name__}: {e}"
    endpoints.record_scrape(session, ep, scrape, error, settings=settings)


def scrape_due(session: Session, settings: Settings | None = None) -> list[int]:
    """One round: scrape every enabled endpoint whose time has come and that this process claims."""
    due = session.exec(
        select(ServingEndpoint)
        .where(col(ServingEndpoint.enabled).is_(True), col(ServingEndpoint.next_scrape_at) <= utcnow())
        .order_by(col(ServingEndpoint.next_scrape_at))
        .limit(PER_ROUND)
    ).all()
    done = []
    for ep in due:
        if _claim(session, ep):
            session.refresh(ep)
            scrape_one(session, ep, settings)
            done.append(ep.id or 0)
    return done


def start_scraper(settings: Settings | None = None) -> threading.Event:
    """Start the scraper thread; set the returned event to stop it."""
    settings = settings or get_settings()
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(ROUND_SECONDS):
            try:
                with session_scope() as session:
                    scrape_due(session, settings)
            except Exception:  # the database may be restarting; try again next round
                log.exception("scraper round failed")

    threading.Thread(target=loop, name="draftdeck-scraper", daemon=True).start()
    return stop
