"""Celery tasks: thin. They receive a job id only."""

from __future__ import annotations

from celery import Task

from workers.celery_app import RUN_JOB, celery_app
from workers.runner import run_job


@celery_app.task(name=RUN_JOB, bind=True)
def run_job_task(self: Task, job_id: int) -> str:
    return run_job(job_id, task_id=self.request.id)
