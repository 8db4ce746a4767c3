"""Celery task bodies: thin wrappers over app/run/job.py and app/run/chunks.py. Nothing imports workers/."""
