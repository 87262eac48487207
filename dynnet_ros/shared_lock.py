"""A lock held shared by many or exclusively by one: work that may overlap against the changes
that must wait for it.

Why its own module: a serving core's batches and an engine's runs both overlap among themselves
while a swap (a new model, a new budget, a close) must wait for them and keep new ones out, and
the engine sits below the perception code that serves it. Plain ``threading``.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class SharedLock:
    """A lock held shared (``shared()``: the batches being served) or exclusive (``with lock:``:
    a core swap, a budget change, closing). An exclusive request waits for the shared holders to
    leave and keeps new ones out meanwhile, so a swap is never starved by back-to-back batches."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._shared = 0            # shared holders inside
        self._exclusive = False     # an exclusive holder inside
        self._waiting = 0           # exclusive requests waiting

    def acquire(self) -> None:
        with self._changed:
            self._waiting += 1
            self._changed.wait_for(lambda: not self._exclusive and self._shared == 0)
            self._waiting -= 1
            self._exclusive = True

    def release(self) -> None:
        with self._changed:
            if not self._exclusive:
                raise RuntimeError("release of a SharedLock not held exclusively")
            self._exclusive = False
            self._changed.notify_all()

    def __enter__(self) -> SharedLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._exclusive and self._waiting == 0)
            self._shared += 1
        try:
            yield
        finally:
            with self._changed:
                self._shared -= 1
                self._changed.notify_all()
