"""Build and read diagnostic_msgs statuses.

Values travel as strings (that is the message type); `status_values` turns them back into
numbers so the demo table, the budget manager and the tests read one format.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

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
