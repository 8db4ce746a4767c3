"""Celery tasks: thin. They receive a job id (and a chunk index) and call the service's runners.

`celery -A workers.tasks:celery_app worker` loads this module (app/queue.py's WORKER_APP).
"""

from __future__ import annotations

from typing import Any

from celery import Task
from celery.signals import worker_ready

from app.chunks import run_chunk
from app.queue import RUN_CHUNK, RUN_JOB, get_celery
from app.runner import run_job
from app.settings import get_settings
from app.sweeper import start_sweeper

celery_app = get_celery()


@celery_app.task(name=RUN_JOB, bind=True)
def run_job_task(self: Task, job_id: int) -> str:
    return run_job(job_id, task_id=self.request.id)


@celery_app.task(name=RUN_CHUNK, bind=True)
def run_chunk_task(self: Task, job_id: int, index: int) -> str:
    return run_chunk(job_id, index, task_id=self.request.id)


@worker_ready.connect
def _sweep_from_workers_too(**_: Any) -> None:
    """Workers sweep too, so lost jobs are caught even while no web process runs."""
    start_sweeper(get_settings())
