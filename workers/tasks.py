"""Celery tasks: thin. They receive a job id only."""

from __future__ import annotations

from typing import Any

from celery import Task
from celery.signals import worker_ready

from app.settings import get_settings
from app.sweeper import start_sweeper
from workers.celery_app import RUN_JOB, celery_app
from workers.chunks import RUN_CHUNK, run_chunk
from workers.runner import run_job


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
