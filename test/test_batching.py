"""The batch-forming policy (perception/batching.py) on a fake clock, and the mailbox the worker
reads it from: which cameras' frames run together, and when a batch stops waiting for more."""
from __future__ import annotations

import math

import pytest

from dynnet_ros.perception.batching import BatchPolicy, Waiting, form_batch
from dynnet_ros.perception.mailbox import Arrival, Mailbox

POLICY = BatchPolicy(window_s=0.005, max_batch=0, max_latency_s=0.1)


def test_nothing_waiting_takes_nothing_and_waits_for_a_frame():
    assert form_batch([], 10.0, 10.0, POLICY, 4).take == ()
    assert form_batch([], 10.0, 10.0, POLICY, 4).wait_s == math.inf


def test_a_full_batch_runs_at_once_oldest_first():
    waiting = [Waiting("left", 1.002), Waiting("front", 1.000), Waiting("rear", 1.003), Waiting("right", 1.001)]
    batch = form_batch(waiting, 1.003, 1.003, POLICY, 4)
    assert batch.take == ("front", "right", "left", "rear") and batch.wait_s == 0.0


def test_a_partial_batch_waits_out_the_window_then_runs_without_the_silent_camera():
    waiting = [Waiting("front", 1.000), Waiting("left", 1.001)]
    early = form_batch(waiting, 1.002, 1.000, POLICY, 4)   # the window opened at 1.000
    assert early.take == () and early.wait_s == pytest.approx(0.003)
    late = form_batch(waiting, 1.005, 1.000, POLICY, 4)
    assert late.take == ("front", "left")


def test_the_deadline_from_the_oldest_frame_cuts_the_window_short():
    """A frame that waited out a long run (arrived 98 ms before the batch opened) is not held
    back past its arrival + max_latency to fill the batch."""
    waiting = [Waiting("front", 0.902)]
    opened = 1.000
    decision = form_batch(waiting, opened, opened, POLICY, 4)
    assert decision.take == () and decision.wait_s == pytest.approx(0.002)   # 0.902 + 0.1, before 1.005
    assert form_batch(waiting, 1.002, opened, POLICY, 4).take == ("front",)
    overdue = form_batch([Waiting("front", 0.5)], opened, opened, POLICY, 4)
    assert overdue.take == ("front",)   # already past its deadline: no wait at all


def test_max_batch_and_the_model_limit_the_batch_and_the_rest_waits_for_the_next():
    waiting = [Waiting(name, 1.0 + i / 1000) for i, name in enumerate(("front", "left", "right", "rear"))]
    two = BatchPolicy(0.005, 2, 0.1)
    assert two.limit(4, 64) == 2 and POLICY.limit(4, 64) == 4 and POLICY.limit(4, 1) == 1
    assert form_batch(waiting, 1.004, 1.004, two, two.limit(4, 64)).take == ("front", "left")
    assert BatchPolicy(0.0, 0, 0.1).limit(4, 64) == 1   # window 0: no batching
    assert BatchPolicy(0.005, 8, 0.1).limit(3, 64) == 3   # at most one frame per camera


def test_with_batches_in_flight_the_cameras_are_shared_between_them():
    assert POLICY.limit(4, 64, in_flight=2) == 2 and POLICY.limit(5, 64, in_flight=2) == 3
    assert POLICY.limit(4, 64, in_flight=1) == 4 and POLICY.limit(1, 64, in_flight=2) == 1
    assert BatchPolicy(0.005, 4, 0.1).limit(4, 64, in_flight=2) == 4   # max_batch set: taken as given


def test_a_camera_whose_frames_keep_being_replaced_keeps_its_place():
    """Four cameras publishing in the same order each period, batches of two: the cameras last in
    each period are taken once they have waited longest, though their waiting frames are always
    the newest (each replaced the one before it)."""
    clock = [0.0]
    box = Mailbox(clock=lambda: clock[0])
    cameras = ("front", "left", "right", "rear")
    taken: list[tuple[str, ...]] = []
    for period in range(4):
        for i, name in enumerate(cameras):
            clock[0] = period + i / 1000
            box.put(Arrival(name, period, name, None))
        waiting, _ = box.waiting()
        batch = form_batch(waiting, clock[0], clock[0], POLICY, 2)
        taken.append(batch.take)
        box.take_sources(batch.take)
    assert taken == [("front", "left"), ("right", "rear"), ("front", "left"), ("right", "rear")]
    waiting = [Waiting("rear", 4.99, since=1.0), Waiting("front", 4.98)]
    assert form_batch(waiting, 5.0, 5.0, POLICY, 1).take == ("rear",)
    # the deadline counts from the frames' own arrival, not from when their camera began waiting
    assert form_batch(waiting, 5.0, 5.0, POLICY, 4).wait_s == pytest.approx(0.005)


def test_without_a_window_the_oldest_frame_runs_alone_at_once():
    policy = BatchPolicy(0.0, 0, 0.1)
    assert form_batch([Waiting("left", 2.0), Waiting("front", 1.0)], 2.0, 2.0, policy, 1).take == ("front",)


def test_bad_policies_are_refused():
    with pytest.raises(ValueError, match=">= 0"):
        BatchPolicy(-0.001, 0, 0.1)
    with pytest.raises(ValueError, match="limit"):
        form_batch([Waiting("front", 0.0)], 0.0, 0.0, POLICY, 0)


def test_the_policy_reads_the_node_parameters_in_milliseconds():
    policy = BatchPolicy.from_params({"batch_window_ms": 5.0, "max_batch": 3, "max_latency_ms": 100.0})
    assert policy == BatchPolicy(0.005, 3, 0.1)


def test_the_mailbox_stamps_arrivals_with_its_clock_and_hands_out_the_sources_asked_for():
    now = [5.0]
    box = Mailbox(clock=lambda: now[0])
    box.put(Arrival("front", 1, "f", "a"))
    now[0] = 5.25
    box.put(Arrival("left", 2, "l", "b"))
    now[0] = 5.5
    box.put(Arrival("front", 3, "f", "c"))   # replaces front's frame: its arrival is the new one's
    waiting, puts = box.waiting()
    assert sorted((w.source, w.arrived) for w in waiting) == [("front", 5.5), ("left", 5.25)] and puts == 3
    taken = box.take_sources(["left", "rear", "front"])
    assert [(a.source, a.stamp_ns) for a in taken] == [("left", 2), ("front", 3)]
    assert box.waiting() == ([], 3)


def test_a_worker_behind_serves_the_cameras_in_turn_not_in_publishing_order():
    """Cameras triggered together arrive in one order each period; a batch-1 worker that serves
    fewer frames than arrive must still give each camera the same share."""
    clock = [0.0]
    box = Mailbox(clock=lambda: clock[0])
    cameras = ("front", "left", "right", "rear")
    served = {name: 0 for name in cameras}
    for period in range(12):
        for i, name in enumerate(cameras):
            clock[0] = period + i / 1000
            box.put(Arrival(name, period, name, None))
        for _ in range(3):   # three frames served per period of four
            arrival = box.take()
            assert arrival is not None
            served[arrival.source] += 1
    assert set(served.values()) == {9}


def test_the_camera_served_least_recently_goes_first_in_a_batch():
    waiting = [Waiting("front", 1.000, served=7), Waiting("left", 1.001, served=3), Waiting("rear", 1.002)]
    assert form_batch(waiting, 1.002, 1.002, POLICY, 2).take == ("rear", "left")
