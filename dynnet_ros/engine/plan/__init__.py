"""engine/plan: execution order and arena memory planning for the planned engine."""
from dynnet_ros.engine.plan.exec_order import (
    OpNode,
    OrderResult,
    best_order,
    exact_order,
    heuristic_order,
    is_topological,
    lifetimes_to_buffers,
    peak_live_bytes,
    tensor_lifetimes,
)
from dynnet_ros.engine.plan.memory_plan import (
    PlanStats,
    check_plan,
    greedy_by_size,
    lower_bound,
    plan_height,
    plan_offsets,
    plan_offsets_stats,
)

__all__ = [
    "OpNode",
    "OrderResult",
    "PlanStats",
    "best_order",
    "check_plan",
    "exact_order",
    "greedy_by_size",
    "heuristic_order",
    "is_topological",
    "lifetimes_to_buffers",
    "lower_bound",
    "peak_live_bytes",
    "plan_height",
    "plan_offsets",
    "plan_offsets_stats",
    "tensor_lifetimes",
]
