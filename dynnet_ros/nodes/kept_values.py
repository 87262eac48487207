"""Parameter values set at run time on a container's nodes, kept in a file across its restarts.

Why: a respawn re-runs the container's command line, whose components file holds the config's
values, so a value set with ``ros2 param set`` (a threshold, a model_path) or the budget
manager's last budget would silently revert when the process comes back after a crash.
`dynnet up` keeps such values in its supervisor (graph_config.RuntimeParameters) and writes
them into the restart's own files; launch re-runs the same command, so under launch the
container keeps them itself (``container --keep-values FILE``, what vehicle.launch.py passes).

Each accepted change is written (atomically: a new file renamed over the old) in the node's
post-set callback, i.e. before the set call answers, so a caller that saw its set succeed can
rely on the value surviving a SIGKILL the next instant. Entries are keyed by the node's place
in the components file and its plugin: the same command line loads the same nodes in the same
order, and an entry whose plugin does not match its place is not applied.
"""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rclpy.node import Node
from rclpy.parameter import Parameter


@dataclass
class NodeValues:
    """One static node's kept values: parameter name -> (type name, value)."""

    plugin: str
    node: str  # its fully qualified name, for whoever reads the file
    values: dict[str, tuple[str, Any]] = field(default_factory=dict)


def _plain(value: Any) -> Any:
    """A parameter value as YAML writes it: arrays (array.array, tuples) as lists."""
    return value if isinstance(value, (bool, int, float, str)) else list(value)


class KeptValues:
    """The file's entries: read at start, updated at each change of a watched node. Thread-safe
    (the executor's threads run the set callbacks)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._nodes: dict[int, NodeValues] = self._read()

    def _read(self) -> dict[int, NodeValues]:
        """The file's entries; none where it does not exist yet (the first start). A file that
        cannot be read is reported and ignored: the nodes start from the config rather than not at all."""
        if not self.path.exists():
            return {}
        try:
            data = yaml.safe_load(self.path.read_text()) or {}
            return {int(index): NodeValues(entry["plugin"], entry["node"],
                                           {name: (kept["type"], kept["value"])
                                            for name, kept in (entry.get("values") or {}).items()})
                    for index, entry in data["nodes"].items()}
        except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as exc:
            print(f"container: {self.path}: cannot read the kept run-time values ({exc}); the nodes start "
                  "from their configured values", file=sys.stderr, flush=True)
            return {}

    def overrides(self, index: int, plugin: str) -> list[Parameter]:
        """The values kept for the components file's node ``index`` if it is ``plugin``."""
        with self._lock:
            entry = self._nodes.get(index)
            if entry is None or entry.plugin != plugin:
                return []
            return [Parameter(name, Parameter.Type[kind], value) for name, (kind, value) in entry.values.items()]

    def watch(self, index: int, plugin: str, node: Node) -> None:
        """Keep every value ``node`` accepts from now on (its declarations at start are the config's)."""
        name = node.get_fully_qualified_name()

        def keep(parameters: list[Parameter]) -> None:
            with self._lock:
                entry = self._nodes.get(index)
                if entry is None or entry.plugin != plugin:
                    entry = self._nodes[index] = NodeValues(plugin, name)
                for parameter in parameters:
                    if parameter.type_ != Parameter.Type.NOT_SET:
                        entry.values[parameter.name] = (parameter.type_.name, _plain(parameter.value))
                self._write()

        node.add_post_set_parameters_callback(keep)

    def _write(self) -> None:
        data = {"nodes": {index: {"plugin": entry.plugin, "node": entry.node,
                                  "values": {name: {"type": kind, "value": value}
                                             for name, (kind, value) in sorted(entry.values.items())}}
                          for index, entry in sorted(self._nodes.items())}}
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(yaml.safe_dump(data, sort_keys=False))
            os.replace(tmp, self.path)
        except OSError as exc:  # the value is set all the same; only its survival of a crash is lost
            print(f"container: {self.path}: cannot keep the run-time values ({exc})", file=sys.stderr, flush=True)

    def describe(self, index: int, plugin: str) -> str:
        """``name=value, ...`` of what ``overrides`` gives the node (for the log line at start)."""
        return ", ".join(f"{p.name}={p.value!r}" for p in sorted(self.overrides(index, plugin), key=lambda p: p.name))
