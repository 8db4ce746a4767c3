"""Celery task bodies: thin wrappers over app/runner.py and app/chunks.py. Nothing imports workers/."""
