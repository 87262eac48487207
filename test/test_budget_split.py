"""The node's budget split reports an overrun only where the model's size needs more than its share.

The engine's minimum follows the input size it last ran, so on the first frame of a new size a
share can be refused against the previous size's minimum and the engine handed that minimum
instead; the frame itself fits the share, and the next frame's charge hands the share over. Such a
frame is no overrun. A share below the minimum at the size just run is one."""
from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from dynnet_ros.perception.budget_split import BudgetSplit, FrameCosts
from dynnet_ros.perception.frame_memory import MESSAGE_COPIES
from dynnet_ros.perception.letterbox import plan_letterbox


@dataclass
class Stats:
    over_budget: object = None


class MinimumOnly:
    """The two things ``over_budget`` reads of an engine: its stats and its minimum now."""

    def __init__(self, minimum_mb: float) -> None:
        self.minimum_mb = minimum_mb

    def engine_stats(self) -> Stats:
        return Stats()

    def min_budget_mb(self) -> float:
        return self.minimum_mb


@pytest.fixture
def split() -> BudgetSplit:
    return BudgetSplit(FrameCosts(), max_input_side=-1, warn=lambda message: None)


def test_a_share_the_size_just_run_fits_is_no_overrun(split):
    node_mb = 60.0
    share = split.share(node_mb)
    split.engine_budget_mb = share + 3.0   # the previous size's minimum, handed before this frame
    assert split.over_budget(MinimumOnly(share - 1.0), node_mb) is None


def test_a_share_below_the_minimum_at_the_size_just_run_is_an_overrun(split):
    node_mb = 60.0
    share = split.share(node_mb)
    split.engine_budget_mb = share + 3.0
    reason = split.over_budget(MinimumOnly(share + 2.9), node_mb)
    assert reason is not None
    assert f"leaves the model {share:.1f} MB" in reason and f"below its minimum {share + 2.9:.1f} MB" in reason


def test_the_share_handed_over_is_no_overrun(split):
    node_mb = 60.0
    split.engine_budget_mb = split.share(node_mb)
    assert split.over_budget(MinimumOnly(1000.0), node_mb) is None


def test_a_batch_is_charged_at_the_largest_batch_formed_and_every_cameras_messages():
    """With budget 0 (unlimited) ``charge_frames`` only accounts: a batch of one frame, charged as
    the four the node forms, costs what four frames of that size do; a camera's messages stay
    charged while its frames are not in the batch."""
    costs = FrameCosts(output_bytes_per_pixel=8.0)
    split = BudgetSplit(costs, max_input_side=0, warn=lambda message: None, cameras=4)
    box, small = plan_letterbox(480, 640, target=None), plan_letterbox(240, 320, target=None)
    message = 640 * 480 * 3
    cameras = [("front", message), ("left", message), ("right", message), ("rear", message)]
    split.charge_frames(MinimumOnly(1.0), lambda: 0.0, cameras, [box] * 4, batch=4)
    four = split.frame
    assert four == costs.batch_bytes([message] * 4, [box] * 4)
    split.charge_frames(MinimumOnly(1.0), lambda: 0.0, cameras[:1], [box], batch=4)
    assert split.frame == four   # one frame now, four next: the share does not swing
    split.charge_frames(MinimumOnly(1.0), lambda: 0.0, [("left", 320 * 240 * 3)], [small], batch=4)
    assert split.frame.messages == four.messages   # left's larger messages are still in flight
    assert split.frame.inputs == costs.batch_bytes([], [small] * 4).inputs < four.inputs


def test_each_batch_in_flight_holds_its_own_inputs_and_outputs_and_one_more_message_per_camera():
    one = FrameCosts(output_bytes_per_pixel=8.0)
    two = replace(one, in_flight=2)
    box = plan_letterbox(480, 640, target=(640, 640), multiple=32, scaleup=False)
    alone, both = one.batch_bytes([1000] * 4, [box] * 4), two.batch_bytes([1000] * 4, [box] * 4)
    assert (both.inputs, both.scratch, both.outputs) == (2 * alone.inputs, 2 * alone.scratch, 2 * alone.outputs)
    assert (alone.messages, both.messages) == (MESSAGE_COPIES * 4000, (MESSAGE_COPIES + 1) * 4000)
