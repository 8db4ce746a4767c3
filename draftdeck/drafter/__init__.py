"""The DFlash drafter: its configuration, the frozen target, the model, the objective, the metrics
(as counts) and the trainer. Imports nothing of the web, Celery or SQL."""
