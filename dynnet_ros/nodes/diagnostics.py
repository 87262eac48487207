"""Build and read diagnostic_msgs statuses.

Values travel as strings (that is the message type); `status_values` turns them back into
numbers so the demo table, the budget manager and the tests read one format.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.node import Node
from rclpy.publisher import Publisher

OK, WARN, ERROR, STALE = 0, 1, 2, 3
LEVEL_NAMES = {OK: "OK", WARN: "WARN", ERROR: "ERROR", STALE: "STALE"}


def level_value(level) -> int:
    """DiagnosticStatus.level is a byte; normalise to int for comparisons."""
    return level[0] if isinstance(level, (bytes, bytearray)) else int(level)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def make_status(name: str, hardware_id: str, level: int, message: str,
                values: Mapping[str, Any]) -> DiagnosticStatus:
    status = DiagnosticStatus()
    status.level = bytes([level_value(level)])
    status.name = name
    status.hardware_id = hardware_id
    status.message = message
    status.values = [KeyValue(key=str(k), value=_text(v)) for k, v in values.items()]
    return status


def make_array(stamp, statuses: list[DiagnosticStatus]) -> DiagnosticArray:
    array = DiagnosticArray()
    array.header.stamp = stamp
    array.status = statuses
    return array


def node_status(node: Node, what: str, level: int, message: str, values: Mapping[str, Any]) -> DiagnosticStatus:
    """A status named ``"<node name>: <what>"`` with the node's full name as hardware id, so the
    demo table and the budget manager find every node's status the same way."""
    return make_status(f"{node.get_name()}: {what}", node.get_fully_qualified_name(), level, message, values)


def publish(node: Node, publisher: Publisher, statuses: list[DiagnosticStatus]) -> None:
    """Publish ``statuses`` stamped with the node's ROS time (the bag's time under replay).

    A timer tick racing Ctrl-C finds the context shut down and the publish fails; that failure
    is dropped, any other is raised.
    """
    try:
        publisher.publish(make_array(node.get_clock().now().to_msg(), statuses))
    except Exception:  # which exception a shut-down context raises depends on the rclpy call
        if node.context.ok():
            raise


def status_values(status: DiagnosticStatus) -> dict[str, Any]:
    """KeyValues back to Python: numbers where they parse, else the string."""
    out: dict[str, Any] = {}
    for kv in status.values:
        text = kv.value
        try:
            out[kv.key] = int(text)
            continue
        except ValueError:
            pass
        try:
            out[kv.key] = float(text)
        except ValueError:
            out[kv.key] = text
    return out
