"""SwapNet block swapping: run a model inside a memory budget (see docs/swap.md).

blocks/graphinfo (cut points, costs) -> store (skeletons + aligned weights) -> swapin (O_DIRECT
arena) -> assembly (sessions bound by reference) -> pipeline (prefetch) -> scheduler (DP + LUT)
-> executor/control (the Engine's memory-budget policy).  No ROS imports.
"""
