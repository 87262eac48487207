"""The node's budget split reports an overrun only where the model's size needs more than its share.

The engine's minimum follows the input size it last ran, so on the first frame of a new size a
share can be refused against the previous size's minimum and the engine handed that minimum
instead; the frame itself fits the share, and the next frame's charge hands the share over. Such a
frame is no overrun. A share below the minimum at the size just run is one."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from dynnet_ros.perception.budget_split import BudgetSplit, FrameCosts


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
