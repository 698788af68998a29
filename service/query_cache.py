"""The query-vector cache: the vectors of a text already searched, kept for the next search with the same text.

Searches repeat (a gallery's suggested queries, a user paging or refining filters, many users asking for "dog"),
and the query tower is most of a search's time with a chosen model. So the Searcher asks here before the batcher:
a hit skips the queue and the query tower. The key is the model's fingerprint, its query precision and the text
exactly as the tower receives it (the request's own cleaning already applied): the same key always gives the same
vectors, so a hit returns what the tower would. Bounded by bytes (CROSSPROBE_QUERY_CACHE_MB; least recently used
out first), and 0 turns it off. Hits and misses are counted on /metrics (crossprobe_query_cache_total) and shown on
the dashboard. One event loop thread calls it; the lock keeps it correct from any other.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import fields

import numpy as np

from crossprobe.core.inference import QueryVectors
from crossprobe.service import metrics

Key = tuple[str, str, str]  # (model fingerprint, query precision, text)


def nbytes(q: QueryVectors) -> int:
    return sum(v.nbytes for f in fields(q) if isinstance(v := getattr(q, f.name), np.ndarray)) + 200


class QueryCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self._items: OrderedDict[Key, tuple[QueryVectors, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def get(self, key: Key) -> QueryVectors | None:
        if not self.enabled:
            return None
        with self._lock:
            got = self._items.get(key)
            if got is not None:
                self._items.move_to_end(key)
        metrics.QUERY_CACHE.labels("hit" if got is not None else "miss").inc()
        return got[0] if got is not None else None

    def put(self, key: Key, q: QueryVectors) -> None:
        size = nbytes(q)
        if not self.enabled or size > self.max_bytes:
            return
        for f in fields(q):  # shared by every later hit: nobody may write into them
            v = getattr(q, f.name)
            if isinstance(v, np.ndarray):
                v.flags.writeable = False
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (q, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, s) = self._items.popitem(last=False)
                self._bytes -= s
            metrics.QUERY_CACHE_BYTES.set(self._bytes)

    def __len__(self) -> int:
        return len(self._items)
