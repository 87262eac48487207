"""Ordered turns: what lets a serving core run two batches at once and still publish in order.

Why: a model node serving several cameras overlaps one batch's Python work (decoding,
letterboxing, post-processing, publishing) with another batch's engine run, so the interpreter
and the engine use two cores where one worker thread alternates between them. Two batches in
flight must still leave the node as one would: their results published in the order the
batches were taken (a camera's outputs never go back in time), and a parameter swap or a close
waiting until no batch is inside the core (``shared_lock.SharedLock``). Plain ``threading``; no
clocks, so tests drive them with threads and events.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Turns:
    """Tickets handed out in order (``ticket``), and turns taken in ticket order (``turn``).

    A ticket whose holder fails must still take (and so end) its turn: ``turn`` is a context
    manager that ends the turn however its block exits. ``close`` lets every waiting turn go at
    once (a stopping worker must not wait for a batch that will never end its turn)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._issued = 0    # tickets handed out
        self._next = 0      # the ticket whose turn it is
        self._closed = False

    def ticket(self) -> int:
        with self._changed:
            ticket, self._issued = self._issued, self._issued + 1
            return ticket

    @contextmanager
    def turn(self, ticket: int) -> Iterator[None]:
        """Wait until every earlier ticket's turn ended (or ``close``), run the block, end the turn."""
        if not 0 <= ticket < self._issued:
            raise ValueError(f"ticket {ticket} was not handed out (0..{self._issued - 1})")
        with self._changed:
            self._changed.wait_for(lambda: self._next == ticket or self._closed)
        try:
            yield
        finally:
            with self._changed:
                self._next = max(self._next, ticket + 1)
                self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()


class Turn:
    """One batch's place in ``Turns``: ``with turn:`` runs its in-order part once its turn comes;
    ``end()`` takes the turn with nothing in it where the batch never did (it failed before), so
    the batches after it are not held up."""

    def __init__(self, turns: Turns, ticket: int) -> None:
        self._turns, self._ticket = turns, ticket
        self._taken = False
        self._inside: contextlib.AbstractContextManager[None] | None = None

    def __enter__(self) -> None:
        if self._taken:
            raise RuntimeError("a batch takes its turn once")
        self._taken = True
        self._inside = self._turns.turn(self._ticket)
        self._inside.__enter__()

    def __exit__(self, *exc: Any) -> None:
        assert self._inside is not None
        self._inside.__exit__(*exc)

    def end(self) -> None:
        if not self._taken:
            with self:
                pass
