"""Celery tasks: thin. They receive a job id (and a chunk index) and call the service's runners.

`celery -A workers.tasks:celery_app worker` loads this module (app/queue.py's WORKER_APP).
"""

from __future__ import annotations

from typing import Any

from celery import Task
from celery.signals import worker_init, worker_process_init, worker_ready, worker_shutdown

from app.queue import RUN_CHUNK, RUN_JOB, get_celery
from app.run.chunks import run_chunk
from app.run.job import run_job
from app.run.liveness import start_beat
from app.run.sweeper import start_sweeper
from app.serving.scraper import start_scraper
from app.settings import get_settings
from app.store.db import get_engine
from draftdeck.tokenize.loaded import preload_imports

celery_app = get_celery()


@celery_app.task(name=RUN_JOB, bind=True)
def run_job_task(self: Task, job_id: int) -> str:
    return run_job(job_id, task_id=self.request.id)


@celery_app.task(name=RUN_CHUNK, bind=True)
def run_chunk_task(self: Task, job_id: int, index: int) -> str:
    return run_chunk(job_id, index, task_id=self.request.id)


_stops: list[Any] = []


@worker_ready.connect
def _beat_and_sweep(sender: Any = None, **_: Any) -> None:
    """The worker beats its row in `workers` (with the queues it serves) from its main process, which
    outlives its pool's children. Workers sweep and scrape served drafters too, so lost jobs are caught
    and endpoints watched even while no web process runs."""
    settings = get_settings()
    queues = sorted(celery_app.amqp.queues.consume_from or celery_app.amqp.queues)
    name = str(getattr(sender, "hostname", None) or celery_app.conf.get("worker_name") or "worker")
    _stops.append(start_beat(name, queues, settings.heartbeat_seconds))
    _stops.append(start_sweeper(settings))
    _stops.append(start_scraper(settings))


@worker_init.connect
def _preload_tokenizer_imports(**_: Any) -> None:
    """In the main process, before the pool forks: each pool process then starts its first tokenize
    chunk with transformers (and the torch it imports) already imported, copy-on-write, instead of
    spending seconds importing them; the tokenizer itself is loaded by the first chunk that needs it
    and kept for the next jobs (draftdeck/tokenize/loaded.py)."""
    preload_imports()


@worker_process_init.connect
def _own_connections(**_: Any) -> None:
    """A pool process forked from the main one (at start, or to replace one killed mid-task) must not
    share the main process's pooled database connections: its beat and sweeper use them."""
    get_engine().dispose(close=False)


@worker_shutdown.connect
def _stop_beat(**_: Any) -> None:
    for stop in _stops:
        stop.set()
