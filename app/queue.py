"""The queue: the Celery app, the task names and sending. The web and the workers both use it; the
web sends by task name and never imports workers/.

Redis when REDIS_URL is set; otherwise kombu's filesystem transport, which needs no server:
messages are files in `<home>/broker/queue`, which is what `draftdeck up` uses on a fresh machine.
It has no broadcast, so remote control is off there; DraftDeck never needs it (cancellation goes
through the job row in SQL).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from celery import Celery
from kombu import Queue

from app.settings import get_settings
from draftdeck.kinds import QUEUES

RUN_JOB = "draftdeck.run_job"
RUN_CHUNK = "draftdeck.run_chunk"
WORKER_APP = "workers.tasks:celery_app"  # what `celery -A` loads in a worker process

__all__ = ["QUEUES", "RUN_CHUNK", "RUN_JOB", "get_celery", "send", "worker_argv"]


def make_celery() -> Celery:
    settings = get_settings()
    app = Celery("draftdeck", broker=settings.broker_url)
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


def send(task_name: str, args: Sequence[Any], queue: str) -> str:
    """Send one task message; return its task id (raises when the broker is unreachable)."""
    if queue not in QUEUES:
        raise ValueError(f"unknown queue {queue!r}; known: {', '.join(QUEUES)}")
    return str(get_celery().send_task(task_name, args=list(args), queue=queue).id)


def send_again(task_name: str, args: Sequence[Any], queue: str) -> str:
    """Send a message the broker lost. A Redis that lost its data lost the queues' bindings too, and
    this process's producer remembers them as declared: declare them again first, or the message
    goes to no queue."""
    app = get_celery()
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for q in app.conf.task_queues:
            q.bind(channel).declare()
    return send(task_name, args, queue)


def holds_message(queue: str, task_id: str) -> bool | None:
    """Whether the message `task_id` still waits on `queue`; None when the broker cannot tell. A
    message delivered to a worker that died before claiming its job does not count: Redis would give
    it back only after the 12-hour visibility timeout (a double delivery is harmless: the claim is
    a compare-and-set)."""
    settings = get_settings()
    needle = task_id.encode()
    try:
        if settings.embedded:
            folder = settings.broker_dir / "queue"
            return any(needle in p.read_bytes() for p in folder.iterdir() if p.is_file())
        import redis

        client = redis.Redis.from_url(settings.broker_url, socket_timeout=5)
        return any(needle in blob for blob in client.lrange(queue, 0, -1))
    except FileNotFoundError:
        return False
    except Exception:
        return None


def worker_argv(queues: str, concurrency: int, name: str | None = None, *, quiet: bool = False) -> list[str]:
    """The command line of a Celery worker for `queues` (also what the integration tests start).
    `quiet`: no banner, warnings and errors only (the worker `draftdeck up` runs beside the web app,
    whose own lines are what a user reads; job events are on the dashboard)."""
    node = name or f"draftdeck-{queues.replace(',', '-')}"
    level = "WARNING" if quiet else "INFO"
    return [sys.executable, "-m", "celery", "-A", WORKER_APP, *(["--quiet"] if quiet else []), "worker",
            "-Q", queues, "-c", str(concurrency), "--loglevel", level, "-n", f"{node}@%h",
            "--without-mingle", "--without-gossip"]  # fmt: skip
