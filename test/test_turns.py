"""Two batches in flight (perception/turns.py, mailbox.FrameWorker with two workers): turns in
ticket order, a turn that is never taken not holding up the next, the shared/exclusive lock a
swap takes, and a worker pipeline whose second batch is served while the first is still in
its work, its in-order part after the first's. Driven by threads and events, no clock."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from _waiting import wait_for

from dynnet_ros.perception.mailbox import Arrival, FrameWorker, Mailbox
from dynnet_ros.perception.turns import Turn, Turns
from dynnet_ros.shared_lock import SharedLock

#: how long a test waits for something that must not happen (a correct implementation never
#: does it; a broken one is caught unless the machine stalls the other thread that long)
NOT_HAPPENING_S = 0.3


def _in_thread(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_turns_go_in_ticket_order_whatever_order_they_are_asked_in():
    turns = Turns()
    first, second = turns.ticket(), turns.ticket()
    assert (first, second) == (0, 1)
    order: list[int] = []
    entered = threading.Event()

    def late() -> None:
        with turns.turn(second):
            order.append(second)
            entered.set()

    thread = _in_thread(late)
    assert not entered.wait(NOT_HAPPENING_S)   # ticket 1 waits for ticket 0's turn
    with turns.turn(first):
        order.append(first)
    thread.join(timeout=30)
    assert order == [0, 1]
    with pytest.raises(ValueError, match="not handed out"), turns.turn(5):
        pass


def test_a_turn_never_taken_is_ended_for_its_batch_and_holds_nobody_up():
    turns = Turns()
    failed, next_ = Turn(turns, turns.ticket()), Turn(turns, turns.ticket())
    done = threading.Event()

    def served() -> None:
        with next_:
            done.set()

    thread = _in_thread(served)
    assert not done.wait(NOT_HAPPENING_S)
    failed.end()   # the first batch failed before its in-order part
    thread.join(timeout=30)
    assert done.is_set()
    next_.end()    # taken already: end() does nothing more
    with pytest.raises(RuntimeError, match="once"), next_:
        pass


def test_closing_lets_a_waiting_turn_go():
    turns = Turns()
    turns.ticket()
    stuck = Turn(turns, turns.ticket())
    thread = _in_thread(stuck.end)
    turns.close()   # the first batch never ends: a stopping worker must not wait for it
    thread.join(timeout=30)
    assert not thread.is_alive()


def test_shared_holders_run_together_and_an_exclusive_one_waits_for_them_and_keeps_new_ones_out():
    lock = SharedLock()
    both_inside = threading.Barrier(3)
    leave = threading.Event()

    def batch() -> None:
        with lock.shared():
            both_inside.wait(timeout=30)   # two shared holders inside at once
            leave.wait(timeout=30)

    batches = [_in_thread(batch), _in_thread(batch)]
    both_inside.wait(timeout=30)
    swapped = threading.Event()

    def swap() -> None:
        with lock:
            swapped.set()

    swapper = _in_thread(swap)
    wait_for(lambda: lock._waiting == 1, 30, "the swap waiting")
    late = threading.Event()

    def late_batch() -> None:
        with lock.shared():
            late.set()

    latecomer = _in_thread(late_batch)
    assert not swapped.wait(NOT_HAPPENING_S)   # the batches inside keep the swap waiting ...
    assert not late.is_set()                    # ... and a new batch waits behind the swap
    leave.set()
    for thread in (*batches, swapper, latecomer):
        thread.join(timeout=30)
    assert swapped.is_set() and late.is_set()
    with pytest.raises(RuntimeError, match="not held"):
        lock.release()


@contextmanager
def _two_workers(serve, errors: list[BaseException], release: threading.Event) -> Iterator[Mailbox]:
    """A mailbox served by a two-worker FrameWorker; ``release`` is set and the workers stopped
    and joined on the way out, whatever the test did."""
    mailbox = Mailbox()
    worker = FrameWorker(mailbox, serve, lambda: 0.0, errors.append, "pipeline", workers=2)
    worker.start()
    try:
        yield mailbox
    finally:
        release.set()
        worker.stop()
        worker.join(30)
    assert worker.alive() == []


def test_two_workers_serve_a_second_batch_while_the_first_is_busy_and_keep_their_order():
    first_busy, release_first, second_done = threading.Event(), threading.Event(), threading.Event()
    order: list[int] = []
    errors: list[BaseException] = []

    def serve(arrivals: list[Arrival], turn: Turn) -> None:
        stamp = arrivals[0].stamp_ns
        if stamp == 1:
            first_busy.set()
            release_first.wait(timeout=30)   # the first batch's work (its engine run, say) goes on
        else:
            second_done.set()                # the second batch's work is done meanwhile
        with turn:
            order.append(stamp)

    with _two_workers(serve, errors, release_first) as mailbox:
        mailbox.put(Arrival("cam", 1, "f", None))
        wait_for(first_busy.is_set, 30, "the first batch in its work")
        mailbox.put(Arrival("cam", 2, "f", None))
        wait_for(second_done.is_set, 30, "the second batch served beside the first")
        assert order == []   # its results wait for the first batch's
        release_first.set()
        wait_for(lambda: len(order) == 2, 30, "both batches out")
        assert order == [1, 2] and errors == []
    with pytest.raises(ValueError, match="at least one"):
        FrameWorker(Mailbox(), serve, lambda: 0.0, errors.append, "none", workers=0)


def test_a_batch_that_raises_before_its_turn_does_not_hold_up_the_next():
    first_in, release_first = threading.Event(), threading.Event()
    order: list[int] = []
    errors: list[BaseException] = []

    def serve(arrivals: list[Arrival], turn: Turn) -> None:
        stamp = arrivals[0].stamp_ns
        if stamp == 1:
            first_in.set()
            release_first.wait(timeout=30)
            raise RuntimeError("the first batch broke")
        with turn:
            order.append(stamp)

    with _two_workers(serve, errors, release_first) as mailbox:
        mailbox.put(Arrival("cam", 1, "f", None))
        wait_for(first_in.is_set, 30, "the first batch in its work")
        mailbox.put(Arrival("cam", 2, "f", None))
        release_first.set()
        wait_for(lambda: order == [2], 30, "the second batch out after the first failed")
        assert [str(exc) for exc in errors] == ["the first batch broke"]
