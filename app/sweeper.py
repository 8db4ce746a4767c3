"""The sweeper: a periodic, bounded query for running jobs whose worker stopped beating."""

from __future__ import annotations

import logging
import threading

from app import jobs
from app.db import session_scope
from app.settings import Settings

log = logging.getLogger(__name__)


def start_sweeper(settings: Settings) -> threading.Event:
    """Start the sweeper thread; set the returned event to stop it."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(settings.sweep_seconds):
            try:
                with session_scope() as session:
                    jobs.mark_lost_jobs(session, settings.lost_after_seconds)
            except Exception:  # the database may be restarting; try again next round
                log.exception("sweeper round failed")

    threading.Thread(target=loop, name="draftdeck-sweeper", daemon=True).start()
    return stop
