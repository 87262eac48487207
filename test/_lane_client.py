"""The client side of the live lane-node tests in mapped mode: publishes a scene, collects the
masks by stamp and the node's diagnostics, sets its parameters through the real service."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import yaml
from _waiting import wait_for
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from rclpy.qos import qos_profile_sensor_data
from rclpy.time import Time
from sensor_msgs.msg import Image
from std_msgs.msg import Header

from dynnet_ros.commands.map_inputs import scene_image
from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.nodes.convert import array_to_image
from dynnet_ros.nodes.diagnostics import status_values  # booleans come back as "True" / "False"
from dynnet_ros.supervisor.runner import stop_process_group

ROOT = Path(__file__).resolve().parents[1]


class LaneClient:
    """Talks to the lane node ``{namespace}/lane_node``. Each status kept is its values plus
    ``"level"`` (the status level, an int)."""

    def __init__(self, name: str, namespace: str) -> None:
        self.namespace = namespace
        self.ros = BackgroundNode(name)
        node = self.ros.node
        self.lock = threading.Lock()
        self.masks: dict[int, Image] = {}
        self.statuses: list[tuple[float, dict]] = []
        self.image_pub = node.create_publisher(Image, namespace + "/camera/image_raw", qos_profile_sensor_data)
        node.create_subscription(Image, namespace + "/lane/mask", self._on_mask, 10)
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 50)
        self.params = AsyncParameterClient(node, namespace + "/lane_node")
        self.stamp = 100
        rgb = (scene_image(3, 224, 320)[0][0].transpose(1, 2, 0) * 255).astype(np.uint8)
        self.rgb = np.ascontiguousarray(rgb)

    def started(self) -> LaneClient:
        """Spinning (after a subclass added its own subscriptions to ``self.ros.node``)."""
        self.ros.start()
        return self

    def _on_mask(self, msg: Image) -> None:
        with self.lock:
            self.masks[msg.header.stamp.sec] = msg

    def _on_diag(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.hardware_id.startswith(self.namespace + "/"):
                level = status.level[0] if isinstance(status.level, bytes) else int(status.level)
                with self.lock:
                    self.statuses.append((time.monotonic(), {**status_values(status), "level": level}))

    def frame(self, timeout: float = 120.0) -> Image:
        """Publish the scene with a fresh stamp until its mask comes back (same header)."""
        self.stamp += 1
        msg = array_to_image(self.rgb, "rgb8", Header(stamp=Time(seconds=self.stamp).to_msg(), frame_id="cam"))

        def answered():
            self.image_pub.publish(msg)
            with self.lock:
                return self.masks.get(self.stamp)
        mask = wait_for(answered, timeout, "the lane mask", interval=0.5)
        assert mask.header.frame_id == "cam" and (mask.width, mask.height) == (320, 224)
        return mask

    def set(self, **values) -> tuple[bool, str]:
        assert self.params.wait_for_services(timeout_sec=30.0)
        future = self.params.set_parameters_atomically([Parameter(k, value=v) for k, v in values.items()])
        wait_for(future.done, 300, f"set_parameters {sorted(values)}")
        response = future.result()
        assert response is not None
        result = response.result
        return result.successful, result.reason

    def status_where(self, t0: float, predicate, what: str, on_poll=None) -> dict:
        """The first status since ``t0`` that ``predicate`` accepts; ``on_poll`` runs before each look."""
        def match():
            if on_poll is not None:
                on_poll()
            with self.lock:
                return next((s for t, s in self.statuses if t >= t0 and predicate(s)), None)
        return wait_for(match, 90, f"a status with {what}", interval=0.5)


@contextmanager
def lane_node(tmp: Path, namespace: str, parameters: dict, client: Callable[[], LaneClient],
              env: dict[str, str] | None = None) -> Iterator[LaneClient]:
    """A lane node in its own process (``parameters`` on top of its defaults, ``env`` added to
    the environment, its output in ``tmp/node.log``) and a started client, until the block ends."""
    params = tmp / "params.yaml"
    params.write_text(yaml.safe_dump({"/**": {"ros__parameters": parameters}}))
    with (tmp / "node.log").open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "dynnet_ros.nodes.lane_node", "--ros-args", "-r",
                                 f"__ns:={namespace}", "--params-file", str(params)], stdout=log,
                                stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                env={**os.environ, **(env or {})})
        started = client()
        try:
            wait_for(lambda: started.params.wait_for_services(timeout_sec=0.5) or proc.poll() is not None, 300,
                     "the lane node to start")
            assert proc.poll() is None, (tmp / "node.log").read_text()
            yield started
        finally:
            started.ros.close()
            stop_process_group(proc)
