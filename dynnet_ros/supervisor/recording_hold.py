"""``dynnet up --record``: the model nodes held (``enabled: false``) until the recorder records their inputs.

Why: the recorder finds a sensor topic only when it sees a node subscribe to it, and a frame a
model answered before the recorder matched its sensor would leave an output in the bag whose
frame is not there. The supervisor (``runner.GraphRunner``) starts the model nodes disabled and
enables each one once the recorder has a message from each of its sensor inputs and subscribes
to each of its outputs.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from dynnet_ros.graph_config import ProcessSpec, fq_node_name
from dynnet_ros.nodes.recording_graph import unrecorded_inputs
from dynnet_ros.supervisor.runner import GraphRunner

#: executables whose outputs answer camera frames: held (enabled=false) under --record until the
#: recorder records their inputs
HELD_EXECUTABLES = ("lane_node", "pedestrian_node", "depth_node")
#: how long a held node, once its camera has a publisher, waits for the recorder before it starts anyway
RECORD_HOLD_S = 30.0
#: how long the supervisor waits for a held node to answer the call that enables it before calling again
#: (the node may have restarted meanwhile)
ENABLE_ANSWER_S = 10.0


class RecordingHold:
    """``dynnet up --record``: the model nodes start disabled and are enabled one by one once the
    recorder records their inputs, so every output in the bag answers a frame that is in it too.

    Why the supervisor holds the nodes and not the sensors: the sensors may be a robot's drivers,
    started apart. The recorder finds a sensor topic when a model node subscribes to it (after
    loading its model), and until the recorder's subscription has matched the sensor's publisher
    the node answers frames the recorder never gets. A node is enabled once the recorder has a
    message from each of its sensor inputs that has a publisher (``unrecorded_inputs``): from
    then on every frame goes to both. A node whose camera has no publisher yet stays held (it
    has nothing to answer); one whose inputs the recorder does not get within ``RECORD_HOLD_S``
    of its camera having a publisher starts anyway, with a WARN line naming the topics.
    Call ``step`` periodically, as ``run`` does; nodes the config disables are not held.
    """

    def __init__(self, runner: GraphRunner, recorder: str, nodes: list[str]) -> None:
        self.runner = runner
        self.recorder = recorder
        self.waiting: dict[str, float | None] = dict.fromkeys(nodes)  # node -> when its camera had a publisher
        self._calls: dict[str, tuple[float, Any]] = {}  # node -> (when, the enabling call's future)

    @staticmethod
    def hold(runner: GraphRunner) -> list[str]:
        """Start the graph's model nodes with ``enabled: false``; their fully qualified names."""
        held = [n.name for n in runner.hosted_nodes() if n.executable in HELD_EXECUTABLES
                and n.parameters.get("enabled", True) is not False]

        def disabled(node: ProcessSpec) -> ProcessSpec:
            if node.components:
                return replace(node, components=tuple(disabled(n) for n in node.components))
            return replace(node, parameters={**node.parameters, "enabled": False}) if node.name in held else node
        runner.nodes = [disabled(n) for n in runner.nodes]
        return [fq_node_name(n) for n in runner.hosted_nodes() if n.name in held]

    def done(self) -> bool:
        return not self.waiting

    def step(self, now: float) -> None:
        link = self.runner.link
        if link is None:
            return
        for node in list(self.waiting):
            short = node.rpartition("/")[2]
            if node in self._calls:
                self._answer(node, short, now)
                continue
            missing = unrecorded_inputs(link.node, self.recorder, node, link.recorder_status())
            if missing is None:
                continue
            since = self.waiting[node]
            if since is None:
                since = self.waiting[node] = now
            if missing and now - since < RECORD_HOLD_S:
                continue
            self.runner.own_changes.add((node, "enabled"))
            future = link.set_parameter(node, "enabled", True)
            if future is None:  # its parameter service is not discovered yet
                continue
            self._calls[node] = (now, future)
            if missing:
                self.runner._report("WARN", f"{short}: the recorder has nothing from {', '.join(missing)} after "
                                            f"{RECORD_HOLD_S:g} s; enabling it anyway (the bag may hold outputs "
                                            "without their frames)")

    def _answer(self, node: str, short: str, now: float) -> None:
        called, future = self._calls[node]
        if not future.done():
            if now - called >= ENABLE_ANSWER_S:  # no answer (the node may have restarted): call again
                del self._calls[node]
            return
        del self._calls[node]
        result = None if future.exception() is not None else future.result()
        del self.waiting[node]
        if result is not None and result.results and result.results[0].successful:
            self.runner._report("INFO", f"{short} enabled: the recorder records its inputs and outputs")
            return
        reason = result.results[0].reason if result is not None and result.results else str(future.exception())
        self.runner.own_changes.discard((node, "enabled"))
        self.runner._report("WARN", f"{short}: could not enable it after holding it for the recorder: {reason}")
