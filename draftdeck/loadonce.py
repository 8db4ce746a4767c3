"""A bounded, thread-safe, single-flight cache of things that are slow to load (shard stores, tokenizers).

Concurrent callers of one key share one load instead of loading it again each; at most `size` values
are kept, least recently used out first. Used by the dataset browser (draftdeck/browse/loading.py) and
by tokenize (draftdeck/tokenize/loaded.py), which keeps a worker's tokenizers across jobs.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LoadOnce(Generic[K, V]):
    """A bounded LRU cache whose misses are loaded once: concurrent callers of one key share one load.

    A value is stored with a version; asking with another version (the files changed) loads it again.
    A load that raises is not cached: the next caller tries again, and gets its own error.
    """

    def __init__(self, load: Callable[[K], V], size: int):
        self._load = load
        self._size = size
        self._lock = threading.Lock()
        self._values: OrderedDict[K, tuple[Any, V]] = OrderedDict()
        self._flights: dict[K, threading.Lock] = {}
        self.loads = 0  # how many loads ran (for tests: N concurrent first requests make one)

    def _hit(self, key: K, version: Any) -> tuple[bool, V | None]:
        entry = self._values.get(key)
        if entry is not None and entry[0] == version:
            self._values.move_to_end(key)
            return True, entry[1]
        return False, None

    def get(self, key: K, version: Any = None) -> V:
        return self.lookup(key, version)[0]

    def lookup(self, key: K, version: Any = None) -> tuple[V, bool]:
        """The value and whether this call loaded it (False: it was kept, or another caller loaded it)."""
        with self._lock:
            found, value = self._hit(key, version)
            if found:
                return value, False  # type: ignore[return-value]
            flight = self._flights.setdefault(key, threading.Lock())
        with flight:
            with self._lock:
                found, value = self._hit(key, version)
            if found:
                return value, False  # type: ignore[return-value]
            try:
                loaded = self._load(key)
                with self._lock:
                    self.loads += 1
                    self._values[key] = (version, loaded)
                    self._values.move_to_end(key)
                    while len(self._values) > self._size:
                        self._values.popitem(last=False)
            finally:
                with self._lock:
                    if self._flights.get(key) is flight:
                        del self._flights[key]
        return loaded, True

    def forget(self, key: K) -> None:
        with self._lock:
            self._values.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
