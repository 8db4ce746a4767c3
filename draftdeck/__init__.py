"""DraftDeck's domain core: chat data conversion, tokenization, shards and drafters.

Plain Python: nothing here imports the web app, Celery or SQL.
"""

__version__ = "0.1.0"
