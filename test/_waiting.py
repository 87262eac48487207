"""Polling helper shared by the tests that watch real processes and topics."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """The first truthy value of ``predicate()`` within ``timeout`` seconds, else AssertionError
    naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@contextmanager
def quoting(output: Callable[[], str], chars: int = 6000) -> Iterator[None]:
    """An AssertionError raised inside gets the tail of ``output()`` (the processes' log) appended,
    so a failure on a loaded machine shows what the nodes said while it happened."""
    try:
        yield
    except AssertionError as exc:
        exc.args = (f"{exc}\n--- the processes' output, last {chars} characters ---\n{output()[-chars:]}",)
        raise
