"""What the dataset pages show, computed from shards with no web imports: dataset facts and alerts
(:mod:`.info`), rows loaded once per process (:mod:`.loading`), token chips (:mod:`.tokens`), a row's
sample view and the row diff of two datasets (:mod:`.sample`), filters and text search (:mod:`.filters`).
"""

from draftdeck.browse.errors import BrowseError

__all__ = ["BrowseError"]
