"""A bounded LRU map from shape signature to plan (or kernel version).

Why bounded: a camera stream can produce many distinct sizes; plans are cheap to rebuild but
must not accumulate without limit. ``OrderedDict`` is the standard-library LRU.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class LruCache(Generic[V]):
    """LRU by entry count and, optionally, by a per-entry cost (bytes)."""

    def __init__(self, max_entries: int = 32, max_cost: int | None = None,
                 cost: Callable[[V], int] | None = None,
                 on_evict: Callable[[Hashable, V], None] | None = None) -> None:
        if max_entries < 1:
            raise ValueError(f"cache size must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self.max_cost = max_cost
        self._cost = cost or (lambda _v: 0)
        self._on_evict = on_evict
        self._items: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def peek(self, key: Hashable) -> V | None:
        """Look up without touching recency or hit counts (for background readers)."""
        with self._lock:
            return self._items.get(key)

    def put(self, key: Hashable, value: V) -> None:
        evicted = []
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries or (
                    self.max_cost is not None and len(self._items) > 1 and self.total_cost() > self.max_cost):
                old_key, old = self._items.popitem(last=False)
                self.evictions += 1
                evicted.append((old_key, old))
        if self._on_evict:
            for old_key, old in evicted:
                self._on_evict(old_key, old)

    def total_cost(self) -> int:
        return sum(self._cost(v) for v in self._items.values())

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def values(self) -> list[V]:
        with self._lock:
            return list(self._items.values())

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
