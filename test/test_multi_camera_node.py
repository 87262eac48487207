"""One live lane node (real rclpy, its own process, the zoo's lane model) serving four cameras:
every camera's masks come back on its own namespace with its own frame's header, each camera has
its own diagnostic status, and a camera that stops publishing leaves the other three served.
Then model nodes built in this process: compressed cameras' topics, and the depth node's
per-camera extrinsics."""
from __future__ import annotations

import os
import threading
import time
from collections import defaultdict

import numpy as np
import pytest
import rclpy
from _lane_client import lane_node
from _waiting import wait_for
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.context import Context
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from rclpy.qos import qos_profile_sensor_data
from rclpy.time import Time
from sensor_msgs.msg import CameraInfo, Image
from std_msgs.msg import Header

from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.nodes.base import close_node
from dynnet_ros.nodes.convert import array_to_image
from dynnet_ros.nodes.depth_node import DepthNode
from dynnet_ros.nodes.diagnostics import level_value, status_values
from dynnet_ros.nodes.pedestrian_node import PedestrianNode
from dynnet_ros.perception.serving import FrameInfo

NS = f"/multicam_{os.getpid()}"
CAMERAS = ("front", "left", "right", "rear")
pytestmark = [pytest.mark.timeout(300), pytest.mark.graph]


class Cameras:
    """Four camera publishers (each stamps its frames in a range of its own) and the masks and
    diagnostics that come back."""

    def __init__(self) -> None:
        self.ros = BackgroundNode("multi_camera_test")
        node = self.ros.node
        self.lock = threading.Lock()
        self.masks: dict[str, list[Image]] = defaultdict(list)   # by the namespace they came on
        self.statuses: list[tuple[float, str, int, str, dict]] = []   # (time, name, level, message, values)
        self.pubs = {cam: node.create_publisher(Image, f"{NS}/{cam}/image_raw", qos_profile_sensor_data)
                     for cam in CAMERAS}
        for cam in CAMERAS:
            node.create_subscription(Image, f"{NS}/{cam}/lane/mask",
                                     lambda msg, cam=cam: self._on_mask(cam, msg), 10)
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 50)
        self.params = AsyncParameterClient(node, NS + "/lane_node")
        rng = np.random.default_rng(0)
        self.rgb = {cam: rng.integers(0, 255, (96, 128, 3), dtype=np.uint8) for cam in CAMERAS}
        self.sent: dict[str, set[int]] = defaultdict(set)   # stamps (s) each camera published
        self.count = 0

    def started(self) -> Cameras:
        self.ros.start()
        return self

    def _on_mask(self, cam: str, msg: Image) -> None:
        with self.lock:
            self.masks[cam].append(msg)

    def _on_diag(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.hardware_id.startswith(NS + "/"):
                with self.lock:
                    self.statuses.append((time.monotonic(), status.name, level_value(status.level), status.message,
                                          status_values(status)))

    def publish(self, cameras: tuple[str, ...]) -> None:
        """One frame from each of ``cameras``: stamp 1000 * (index + 1) + count, frame_id ``<cam>_optical``."""
        self.count += 1
        for cam in cameras:
            stamp = 1000 * (CAMERAS.index(cam) + 1) + self.count
            self.sent[cam].add(stamp)
            header = Header(stamp=Time(seconds=stamp).to_msg(), frame_id=f"{cam}_optical")
            self.pubs[cam].publish(array_to_image(self.rgb[cam], "rgb8", header))

    def answered(self, cam: str, after: int = 0) -> int:
        """Masks of ``cam`` for frames counted after ``after``."""
        with self.lock:
            return sum(1 for m in self.masks[cam] if m.header.stamp.sec % 1000 > after)

    def status(self, t0: float, name: str, predicate) -> tuple[int, str, dict] | None:
        with self.lock:
            return next(((level, message, values) for t, n, level, message, values in self.statuses
                         if t >= t0 and n == name and predicate(level, message, values)), None)


@pytest.fixture(scope="module", params=["threads", "events"])
def cameras(request, tmp_path_factory):
    """The node process spinning on each executor DYNNET_EXECUTOR offers (nodes/base.make_executor)."""
    tmp = tmp_path_factory.mktemp("multi_camera")
    params = {"threads": 1, "max_input_side": 0, "cameras": list(CAMERAS), "batch_window_ms": 20.0}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DYNNET_EXECUTOR", request.param)
        with lane_node(tmp, NS, params, lambda: Cameras().started()) as client:
            yield client


def _publish_until(client: Cameras, cams: tuple[str, ...], done, what: str) -> None:
    def step():
        client.publish(cams)
        return done()
    wait_for(step, 120, what, interval=0.1)


def test_every_camera_is_answered_on_its_own_namespace_with_its_own_header(cameras):
    client: Cameras = cameras
    _publish_until(client, CAMERAS, lambda: all(client.answered(cam) for cam in CAMERAS), "a mask from every camera")
    with client.lock:
        masks = {cam: list(client.masks[cam]) for cam in CAMERAS}
    for cam, received in masks.items():
        assert all(m.header.frame_id == f"{cam}_optical" for m in received), cam
        assert all(m.header.stamp.sec in client.sent[cam] for m in received), cam   # its own frames' stamps
        assert all((m.width, m.height) == (128, 96) for m in received)
    t0 = time.monotonic()
    node_status = wait_for(lambda: client.status(t0, "lane_node: lane model",
                                                 lambda lv, msg, v: v.get("camera.rear.processed", 0) > 0),
                           30, "the node's status counting every camera")
    values = node_status[2]
    assert values["cameras"] == ",".join(CAMERAS) and values["batch_formed"] == 4   # the zoo lane model batches
    assert all(values[f"camera.{cam}.received"] >= values[f"camera.{cam}.processed"] > 0 for cam in CAMERAS)
    front = wait_for(lambda: client.status(t0, "lane_node: lane camera front", lambda lv, msg, v: lv == 0), 30,
                     "the front camera's own status")
    assert front[2]["camera"] == "front" and front[2]["processed"] > 0 and front[2]["topic"] == "front/image_raw"


def test_a_camera_that_stops_leaves_the_others_served(cameras):
    client: Cameras = cameras
    stopped_at = client.count
    t0 = time.monotonic()
    live = CAMERAS[:3]
    _publish_until(client, live, lambda: all(client.answered(cam, stopped_at) >= 3 for cam in live),
                   "three masks from each camera still publishing")
    assert client.answered("rear", stopped_at) == 0   # nothing published, nothing answered
    rear = wait_for(lambda: client.status(t0, "lane_node: lane camera rear",
                                          lambda lv, msg, v: msg.startswith("no frame for")), 30,
                    "the silent camera's warning")
    assert rear[0] == 1   # WARN


def _in_process(node_class, context: Context, *params: str):
    """A model node in this process on ``context``, with ``params`` (``-p`` arguments)."""
    args = ["--ros-args", "-r", f"__ns:={NS}_inproc", "-p", "threads:=1", "-p", "camera_sizes:=[160x120]"]
    for param in params:
        args += ["-p", param]
    return node_class(context=context, cli_args=args, use_global_arguments=False)


@pytest.fixture()
def context():
    ctx = Context()
    rclpy.init(context=ctx)
    yield ctx
    ctx.try_shutdown()


def test_compressed_cameras_subscribe_under_each_namespace_and_publish_there_with_their_own_intrinsics(context):
    node = _in_process(PedestrianNode, context, "image_transport:=compressed",
                       "cameras:=[front, /cams/left/image_color]")
    try:
        subscribed = {sub.topic_name for sub in node.subscriptions}
        assert {f"{NS}_inproc/front/image_raw/compressed", "/cams/left/image_color/compressed",
                f"{NS}_inproc/front/camera_info", "/cams/left/camera_info"} <= subscribed
        assert not any(topic.endswith("camera/image_raw/compressed") for topic in subscribed)
        published = {pub.topic_name for pub in node.publishers}
        assert {f"{NS}_inproc/front/pedestrian/markers", "/cams/left/pedestrian/markers"} <= published
        assert f"{NS}_inproc/pedestrian/markers" not in published
        assert node.frames.topics == {"front": f"{NS}_inproc/front/image_raw/compressed",
                                      "cams_left": "/cams/left/image_color/compressed"}
        k = [500.0, 0.0, 320.0, 0.0, 500.0, 240.0, 0.0, 0.0, 1.0]
        node._on_camera_info(CameraInfo(width=640, height=480, k=k), "front")   # front's CameraInfo only
        front = FrameInfo(Header(), 640, 480, "rgb8", "front")
        left = FrameInfo(Header(), 640, 480, "rgb8", "cams_left")
        np.testing.assert_array_equal(node.intrinsics_for(front), np.reshape(k, (3, 3)))
        assert node.intrinsics_for(left) is None
    finally:
        close_node(node)


def test_the_depth_node_declares_each_cameras_extrinsic(context):
    front = [0.0, -0.3, 0.2, 0.0, -1.5, 1.5]
    node = _in_process(DepthNode, context, "cameras:=[front, left]",
                       f"front.lidar_to_camera:=[{', '.join(map(str, front))}]")
    try:
        assert node.params["front.lidar_to_camera"] == front
        assert node.params["left.lidar_to_camera"] == node.params["lidar_to_camera"]   # the default
        assert node.describe_parameter("left.lidar_to_camera").description.startswith("That camera's extrinsic.")
        result = node.set_parameters_atomically([Parameter("left.lidar_to_camera", value=[0.0, 1.0])])
        assert not result.successful and "lidar_to_camera" in result.reason
        assert node.set_parameters_atomically([Parameter("left.lidar_to_camera", value=front)]).successful
        assert node.params["left.lidar_to_camera"] == front
        for cam in ("front", "left"):   # both served through the one core, as one batch or two
            msg = array_to_image(np.zeros((96, 128, 3), np.uint8), "rgb8", Header(frame_id=f"{cam}_optical"))
            node._on_image(msg, cam)
        wait_for(lambda: node.serving.stats.processed == 2, 60, "both cameras' depth maps")
        assert node.serving.stats.failed == 0
        assert [node.serving.cameras[cam].frames.processed for cam in ("front", "left")] == [1, 1]
    finally:
        close_node(node)
