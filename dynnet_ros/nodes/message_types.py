"""rclpy message classes looked up by their ROS type name (``pkg/msg/Name``).

Bags and the live graph name message types as strings; the player and the recorder both need
the class this ROS installation generated for such a name, and both treat a missing package as
"this type is not available here" rather than as a crash."""
from __future__ import annotations

import importlib


def message_class(msgtype: str) -> type | None:
    """The rclpy message class of ``pkg/msg/Name``, or None when this ROS installation lacks it."""
    parts = msgtype.split("/")
    if len(parts) != 3 or parts[1] != "msg" or not all(p.isidentifier() for p in parts):
        return None
    try:
        module = importlib.import_module(f"{parts[0]}.msg")
    except ImportError:
        return None
    found = getattr(module, parts[2], None)
    return found if isinstance(found, type) else None
