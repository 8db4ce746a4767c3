"""The one error of the dataset browser."""

from __future__ import annotations

from draftdeck.errors import InputError


class BrowseError(InputError):
    """A request the data cannot answer (row out of range, bad filter, unreadable shard): a message for
    the user, never a crash. Errors of the shard reader are InputErrors too, and are shown the same way."""
