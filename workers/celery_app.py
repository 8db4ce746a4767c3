"""The Celery app. Redis when REDIS_URL is set; otherwise kombu's filesystem transport.

The filesystem transport needs no server: messages are files in `<home>/broker/queue`, which is
what `draftdeck up` uses on a fresh machine. It has no broadcast, so remote control is off there;
DraftDeck never needs it (cancellation goes through the job row in SQL).
"""

from __future__ import annotations

from functools import lru_cache

from celery import Celery
from kombu import Queue

from app.settings import get_settings

QUEUES = ("cpu", "gpu")
RUN_JOB = "draftdeck.run_job"


def make_celery() -> Celery:
    settings = get_settings()
    app = Celery("draftdeck", broker=settings.broker_url, include=["workers.tasks"])
    app.conf.update(
        task_queues=[Queue(q, routing_key=q) for q in QUEUES],
        task_default_queue="cpu",
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        worker_send_task_events=False,
    )
    if settings.embedded:
        settings.ensure_dirs()
        folder = str(settings.broker_dir / "queue")
        app.conf.broker_transport_options = {
            "data_folder_in": folder,
            "data_folder_out": folder,
            "processed_folder": str(settings.broker_dir / "processed"),
            "control_folder": str(settings.broker_dir / "control"),
            "store_processed": False,
        }
        app.conf.worker_enable_remote_control = False
    else:
        # Jobs run for hours; Redis must not hand a running job's message to a second worker.
        app.conf.broker_transport_options = {"visibility_timeout": 12 * 3600}
    return app


@lru_cache
def get_celery() -> Celery:
    """The app for the current settings (tests clear this cache when they switch brokers)."""
    return make_celery()


# What `celery -A workers.celery_app:celery_app worker` loads in a worker process.
celery_app = get_celery()
