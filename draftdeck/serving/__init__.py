"""Watching a served drafter: a server's Prometheus text read with `prometheus_client`'s parser
(exposition.py), windows of counter deltas turned into acceptance figures (window.py), and the HTTP
fetch (fetch.py). The core knows nothing of the web or of Celery: the app's scraper and
`draftdeck serving watch` both call it."""
