"""The service commands of `draftdeck` (up, web, worker, db, jobs, serving, demo): the entry point."""
