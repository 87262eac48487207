"""Budget manager node: watches system / cgroup memory and each dynnet node's RSS.

Node processes are found from their own diagnostics (every dynnet node reports its `pid`);
the manager measures their RSS itself with psutil and publishes one status on /diagnostics per
`period_s`. The allocating part (BudgetController, docs/budget.md) splits the DNN memory pool
across the model nodes from their /dynnet/model_profiles and pushes each node's
`memory_budget_mb` through its parameter service; its status rides along on the same array.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node

from dynnet_ros.budget.monitors import snapshot
from dynnet_ros.bytesize import MB
from dynnet_ros.nodes import diagnostics as diag
from dynnet_ros.nodes.base import ParamSpec, declare, run_node, steady_timer
from dynnet_ros.nodes.budget_control import MANAGER_SPECS, BudgetController

SPECS = [
    ParamSpec("period_s", 1.0, "Seconds between memory readings.", low=0.1, high=60.0),
    ParamSpec("warn_available_fraction", 0.1, "WARN when less than this fraction of memory (system or cgroup) "
              "is available.", low=0.0, high=1.0),
]

#: every parameter budget_manager declares, its budget controller's included (also what `dynnet up`
#: and the launch file check)
PARAMETERS = SPECS + MANAGER_SPECS


class BudgetManager(Node):
    def __init__(self, **options: Any) -> None:
        super().__init__("budget_manager", **options)
        self.params = declare(self, SPECS)
        self._pids: dict[str, int] = {"budget_manager": os.getpid()}
        self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 50)
        steady_timer(self, float(self.params["period_s"]), self._tick)
        self.budget = BudgetController(self)

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            node = status.name.split(":", 1)[0].strip()
            if not node or node == self.get_name():
                continue
            pid = diag.status_values(status).get("pid")
            if isinstance(pid, int) and pid > 0:
                self._pids[node] = pid

    def _tick(self) -> None:
        snap = snapshot(self._pids.values())
        values: dict = {
            "pid": os.getpid(),
            "total_mb": snap.total_bytes / MB,
            "available_mb": snap.available_bytes / MB,
            "used_mb": snap.used_bytes / MB,
            "cgroup_limit_mb": "" if snap.cgroup_limit_bytes is None else snap.cgroup_limit_bytes / MB,
            "cgroup_current_mb": "" if snap.cgroup_current_bytes is None else snap.cgroup_current_bytes / MB,
            "effective_available_mb": snap.effective_available_bytes / MB,
        }
        gone = []
        for node, pid in sorted(self._pids.items()):
            if pid in snap.rss_bytes:
                values[f"rss_mb.{node}"] = snap.rss_bytes[pid] / MB
            else:
                gone.append(node)
        for node in gone:  # exited: forget it until it reports again
            del self._pids[node]
        values["nodes_rss_total_mb"] = sum(snap.rss_bytes.values()) / MB
        limit = snap.cgroup_limit_bytes or snap.total_bytes
        if snap.effective_available_bytes < self.params["warn_available_fraction"] * limit:
            level, message = diag.WARN, f"low memory: {snap.effective_available_bytes / MB:.0f} MiB available"
        else:
            level, message = diag.OK, f"{snap.effective_available_bytes / MB:.0f} MiB available"
        diag.publish(self, self.diag_pub, [diag.node_status(self, "memory", level, message, values),
                                           self.budget.diagnostic_status()])


def main(args: list[str] | None = None) -> int:
    return run_node(BudgetManager, args)


if __name__ == "__main__":
    sys.exit(main())
