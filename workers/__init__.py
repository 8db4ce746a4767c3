"""Celery app, queues and thin tasks: load the job row, call draftdeck, record what happened."""
