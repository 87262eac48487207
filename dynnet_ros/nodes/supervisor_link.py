"""`dynnet up`'s own ROS node: what the supervisor hears from the graph and tells it.

The supervisor (supervisor/runner.py) is plain process management; this adapter gives it three ROS
channels, on its own context and thread:

* /parameter_events in: every parameter change on one of the graph's nodes is recorded in a
  ``RuntimeParameters`` store, so a restarted node gets the values set at run time back;
* dynnet/node_events out: a node's death (``NodeEvent``: an OOM kill, with the evidence, or
  another exit), which the budget manager answers by capping that node;
* dynnet/budgets in: the manager's answer to an OOM kill (``oom_kills`` entries naming the
  event), whose ``start_budget_mb`` the supervisor gives the restarted node;
* with a recorder in the graph, /diagnostics in: the recorder's latest status (messages per
  topic), and parameter calls out, so ``dynnet up --record`` enables each model node once the
  recorder records its inputs (supervisor/recording_hold.py).
"""
from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import ParameterEvent
from rclpy.node import Node
from rclpy.parameter import Parameter, parameter_value_to_python
from rclpy.parameter_client import AsyncParameterClient
from rclpy.qos import qos_profile_parameter_events
from rclpy.task import Future
from std_msgs.msg import String

from dynnet_ros.budget.protocol import BUDGETS_TOPIC, NODE_EVENTS_TOPIC, NodeEvent
from dynnet_ros.graph_config import RuntimeParameters
from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.nodes.diagnostics import status_values

#: the supervisor node's name in the graph (under the graph's namespace)
NODE_NAME = "dynnet_up"


class SupervisorLink:
    """Start with the graph's fully qualified node names; ``on_change(node, name, value)`` is
    called (on the ROS thread) for each recorded change that differs from the kept value.
    ``recorder``: the fully qualified name of the graph's bag recorder, whose status is kept."""

    def __init__(self, namespace: str, nodes: Iterable[str], parameters: RuntimeParameters,
                 on_change: Callable[[str, str, Any], None] | None = None, recorder: str | None = None) -> None:
        self._nodes = set(nodes)
        self._recorder = recorder
        self._recorder_values: dict[str, Any] | None = None
        self._parameter_clients: dict[str, AsyncParameterClient] = {}
        self.parameters = parameters
        self._on_change = on_change
        self._answers: dict[int, dict[str, Any]] = {}  # event number -> the manager's oom_kills entry
        self._lock = threading.Lock()
        self._ros = BackgroundNode(NODE_NAME, handle_signals=False, namespace=namespace or None)
        node = self._ros.node
        node.create_subscription(ParameterEvent, "/parameter_events", self._on_parameter_event,
                                 qos_profile_parameter_events)
        node.create_subscription(String, BUDGETS_TOPIC, self._on_budgets, 10)
        self._events = node.create_publisher(String, NODE_EVENTS_TOPIC, 10)
        if recorder is not None:
            node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 50)
        self._ros.start()

    @property
    def node(self) -> Node:
        """The link's ROS node: what the supervisor sees the ROS graph through."""
        return self._ros.node

    def _on_parameter_event(self, event: ParameterEvent) -> None:
        if event.node not in self._nodes:
            return
        for param in event.changed_parameters:
            value = parameter_value_to_python(param.value)
            if value is not None and self.parameters.record(event.node, param.name, value) and self._on_change:
                self._on_change(event.node, param.name, value)

    def _on_budgets(self, msg: String) -> None:
        try:
            entries = json.loads(msg.data).get("oom_kills") or []
        except (json.JSONDecodeError, AttributeError):
            return
        with self._lock:
            for entry in entries:
                if isinstance(entry, dict) and isinstance(entry.get("event"), int):
                    self._answers[entry["event"]] = entry

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.hardware_id == self._recorder:
                values = status_values(status)
                with self._lock:
                    self._recorder_values = values

    def recorder_status(self) -> dict[str, Any] | None:
        """The values of the recorder's latest status (``messages.<topic>``, ``skipped.<topic>``),
        None until one came."""
        with self._lock:
            return None if self._recorder_values is None else dict(self._recorder_values)

    def set_parameter(self, node: str, name: str, value: Any) -> Future | None:
        """Set ``node``'s (fully qualified) parameter through its parameter service; the call's
        future, or None while this link has not discovered the service yet (call again later)."""
        client = self._parameter_clients.get(node)
        if client is None:
            client = self._parameter_clients[node] = AsyncParameterClient(self._ros.node, node)
        if not client.services_are_ready():
            return None
        return client.set_parameters([Parameter(name, value=value)])

    def publish(self, event: NodeEvent) -> None:
        self._events.publish(String(data=event.to_json()))

    def oom_answer(self, event: int) -> dict[str, Any] | None:
        """The manager's answer to OOM-kill ``event`` (its oom_kills entry), None until it came."""
        with self._lock:
            return self._answers.get(event)

    def close(self) -> None:
        self._ros.close()
