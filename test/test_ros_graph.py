"""End to end on real ROS 2: `dynnet up` starts the graph, this process subscribes and
reconfigures it through the parameter services, feeds it bad frames, and stops it with SIGINT.

One graph is shared by the whole module (startup costs ~10-20 s on 2 cores). Tests run in file
order: the SIGINT test is last.
"""
from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml
from _waiting import quoting
from _waiting import wait_for as _wait_for
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.parameter import Parameter, parameter_value_to_python
from rclpy.parameter_client import AsyncParameterClient
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, PointCloud2
from visualization_msgs.msg import MarkerArray

from dynnet_ros.graph_config import default_config_path
from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.nodes.convert import array_to_image, image_to_array, xyzi_to_cloud
from dynnet_ros.nodes.diagnostics import status_values
from dynnet_ros.nodes.pedestrian_node import BOX_NS
from dynnet_ros.sim import scene
from dynnet_ros.zoo import ensure_model

ROOT = Path(__file__).resolve().parents[1]
FRAME_ID = "test_camera_frame"
# Own namespace as well as own ROS_DOMAIN_ID: another graph on this machine that happens to share
# the domain (a concurrent test run) cannot answer our parameter calls or feed our subscribers.
NS = f"/dyntest_{os.getpid()}"
RESOLUTIONS = [(320, 240), (256, 144)]
MODEL_NODES = ("lane_node", "pedestrian_node", "depth_node")
ALL_NODES = ("sensor_sim",) + MODEL_NODES + ("budget_manager",)
#: the default config's processes: the simulator, and the container with the model nodes and the manager
PROCESSES = ("sensor_sim", "model_container")

pytestmark = [pytest.mark.timeout(480), pytest.mark.graph]


def wait_for(predicate, timeout: float, what: str):
    return _wait_for(predicate, timeout, what, interval=0.1)


def stamp_key(header) -> tuple[int, int]:
    return header.stamp.sec, header.stamp.nanosec


class Observer:
    """A node in the test process that records the graph's outputs (spun in a thread)."""

    def __init__(self) -> None:
        self.ros = BackgroundNode("graph_test_observer")
        self.node = self.ros.node
        self.lock = threading.Lock()
        self.messages: dict[str, list] = defaultdict(list)   # topic -> [(arrival, msg)]
        self.diagnostics: dict[str, list] = defaultdict(list)  # node -> [(arrival, status)]
        for topic in ("/camera/image_raw", "/lane/mask", "/depth/image"):
            self.node.create_subscription(Image, NS + topic, self._recorder(topic), qos_profile_sensor_data)
        self.node.create_subscription(MarkerArray, NS + "/pedestrian/markers", self._recorder("/pedestrian/markers"),
                                      qos_profile_sensor_data)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 100)
        self.image_pub = self.node.create_publisher(Image, NS + "/camera/image_raw", qos_profile_sensor_data)
        self.cloud_pub = self.node.create_publisher(PointCloud2, NS + "/lidar/points", qos_profile_sensor_data)
        self.clients: dict[str, AsyncParameterClient] = {}
        self.output: Callable[[], str] = str  # the graph's log, quoted when a parameter call times out
        self.ros.start()

    def _recorder(self, topic: str):
        def record(msg) -> None:
            with self.lock:
                self.messages[topic].append((time.monotonic(), msg))
        return record

    def _on_diag(self, msg: DiagnosticArray) -> None:
        now = time.monotonic()
        with self.lock:
            for status in msg.status:
                if not status.hardware_id.startswith(NS + "/"):  # another graph's node
                    continue
                self.diagnostics[status.name.split(":", 1)[0].strip()].append((now, status))

    def since(self, topic: str, t0: float) -> list:
        with self.lock:
            return [m for t, m in self.messages[topic] if t >= t0]

    def statuses(self, node: str, t0: float = 0.0, until: float = math.inf) -> list:
        """The node's statuses that arrived from ``t0`` on and before ``until`` (time.monotonic())."""
        with self.lock:
            return [s for t, s in self.diagnostics[node] if t0 <= t < until]

    def set_params(self, node: str, **values):
        """Set parameters through the node's real parameter service; returns the results."""
        if node not in self.clients:
            self.clients[node] = AsyncParameterClient(self.node, f"{NS}/{node}")
        client = self.clients[node]
        assert client.wait_for_services(timeout_sec=20.0), f"{node} parameter services not available"
        params = [Parameter(name, value=value) for name, value in values.items()]
        future = client.set_parameters(params)
        with quoting(self.output):
            wait_for(future.done, 30.0, f"set_parameters on {node}")
        return future.result().results

    def set_params_atomically(self, node: str, **values):
        if node not in self.clients:
            self.clients[node] = AsyncParameterClient(self.node, f"{NS}/{node}")
        client = self.clients[node]
        assert client.wait_for_services(timeout_sec=20.0), f"{node} parameter services not available"
        future = client.set_parameters_atomically([Parameter(n, value=v) for n, v in values.items()])
        with quoting(self.output):
            wait_for(future.done, 30.0, f"set_parameters_atomically on {node}")
        return future.result().result

    def get_param(self, node: str, name: str):
        if node not in self.clients:
            self.clients[node] = AsyncParameterClient(self.node, f"{NS}/{node}")
        client = self.clients[node]
        assert client.wait_for_services(timeout_sec=20.0)
        future = client.get_parameters([name])
        with quoting(self.output):
            wait_for(future.done, 30.0, f"get_parameters on {node}")
        return parameter_value_to_python(future.result().values[0])

    def close(self) -> None:
        self.ros.close()


def write_graph_config(tmp_path: Path) -> Path:
    data = yaml.safe_load(default_config_path().read_text())
    for node in data["nodes"]:
        params = node.setdefault("parameters", {})
        if node["name"] == "sensor_sim":
            params.update(rate_hz=4.0, resolutions=[f"{w}x{h}" for w, h in RESOLUTIONS], resolution_period_s=4.0,
                          camera_frame_id=FRAME_ID, lidar_azimuth_steps=256)
        if node["name"] in MODEL_NODES:
            params.update(threads=1)
    path = tmp_path / "graph.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    for task in ("lane", "pedestrian", "depth"):
        ensure_model(task)
    tmp = tmp_path_factory.mktemp("graph")
    log = (tmp / "up.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "dynnet_ros.cli", "up", "--config", str(write_graph_config(tmp)),
                             "--namespace", NS],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ))
    observer = Observer()
    observer.output = (tmp / "up.log").read_text
    try:
        wait_for(lambda: len(psutil.Process(proc.pid).children()) == len(PROCESSES) or proc.poll() is not None,
                 240, "dynnet up to start its nodes")  # includes measuring footprints on a cold cache
        assert proc.poll() is None, (tmp / "up.log").read_text()
        children = psutil.Process(proc.pid).children(recursive=True)
        wait_for(lambda: all(observer.since(t, 0) for t in ("/lane/mask", "/depth/image", "/pedestrian/markers")),
                 120, "first outputs of all model nodes")
        yield {"proc": proc, "observer": observer, "children": children, "log": tmp / "up.log"}
    finally:
        observer.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


# ----------------------------------------------------------------------------- outputs

@pytest.mark.subset
def test_outputs_follow_camera_resolution_and_carry_stamp_and_frame(graph):
    obs: Observer = graph["observer"]
    t0 = time.monotonic()

    def both_sizes(topic):
        sizes = {(m.width, m.height) for m in obs.since(topic, t0)}
        return set(RESOLUTIONS) <= sizes

    wait_for(lambda: both_sizes("/lane/mask") and both_sizes("/depth/image"), 120,
             "lane and depth outputs at both camera resolutions")
    camera = {stamp_key(m.header): (m.width, m.height) for m in obs.since("/camera/image_raw", 0)}
    for topic, encoding in (("/lane/mask", "mono8"), ("/depth/image", "32FC1")):
        outputs = obs.since(topic, t0)
        matched = 0
        for msg in outputs:
            assert msg.header.frame_id == FRAME_ID
            assert msg.encoding == encoding
            if stamp_key(msg.header) in camera:
                assert camera[stamp_key(msg.header)] == (msg.width, msg.height), f"{topic} size != its camera frame's"
                matched += 1
        assert matched >= len(outputs) // 2 > 0, (f"{topic}: only {matched}/{len(outputs)} stamps match the "
                                                  f"{len(camera)} camera frames this test received")
    depth = image_to_array(obs.since("/depth/image", t0)[-1])
    assert depth.dtype == np.float32 and np.all(np.isfinite(depth)) and depth.max() > 0
    markers = obs.since("/pedestrian/markers", t0)
    assert markers and all(ma.markers[0].action == ma.markers[0].DELETEALL for ma in markers)
    assert all(m.header.frame_id == FRAME_ID and stamp_key(m.header) in camera for ma in markers[:5]
               for m in ma.markers)


def test_diagnostics_carry_each_nodes_status(graph):
    obs: Observer = graph["observer"]
    t0 = time.monotonic()
    wait_for(lambda: all(obs.statuses(n, t0) for n in ALL_NODES), 30, "a fresh status from every node")
    for node in MODEL_NODES:
        values = status_values(obs.statuses(node, t0)[-1])
        for key in ("latency_p50_ms", "latency_p95_ms", "input_shape", "frames_processed", "frames_dropped",
                    "rss_mb", "engine.runs", "hz", "pid"):
            assert key in values, f"{node} diagnostics lack {key}"
        assert values["frames_processed"] > 0 and values["rss_mb"] > 50
        assert values["latency_p95_ms"] >= values["latency_p50_ms"] > 0
        h, w = (int(d) for d in values["input_shape"].split("x")[2:])
        assert h % 32 == 0 and w % 32 == 0
        assert values["pid"] in {c.pid for c in graph["children"]}
    assert status_values(obs.statuses("depth_node", t0)[-1])["lidar_pixels_in_view"] > 100, "LiDAR not fused"
    sim = status_values(obs.statuses("sensor_sim", t0)[-1])
    assert sim["frames_published"] > 0 and sim["lidar_points"] > 0

    def memory_with_every_model_node():
        """The newest memory status of the manager that lists every model node's RSS. The manager
        learns a node's pid from that node's own diagnostics, so a node whose statuses have not
        reached it yet (DDS discovery on a loaded machine) is not listed until they have."""
        memory = [status_values(s) for s in obs.statuses("budget_manager", t0) if s.name.endswith(": memory")]
        return next((v for v in reversed(memory) if all(f"rss_mb.{n}" in v for n in MODEL_NODES)), None)

    values = wait_for(memory_with_every_model_node, 60, "a budget_manager memory status with every model node's RSS")
    assert values["available_mb"] > 0
    assert all(values[f"rss_mb.{n}"] > 0 for n in MODEL_NODES)


# ----------------------------------------------------------------------------- parameters

def stamp_sec(msg) -> float:
    header = msg.markers[0].header if isinstance(msg, MarkerArray) else msg.header
    return header.stamp.sec + header.stamp.nanosec * 1e-9


def output_after(obs: Observer, topic: str, wall: float, timeout: float = 90.0):
    """The first output of a camera frame captured after `wall` (time.time()).

    Stamps, not arrival times: a frame taken before a parameter change may be published after
    it on a slow machine; one taken after the change must use the new value.
    """
    return wait_for(lambda: next((m for m in obs.since(topic, 0) if stamp_sec(m) > wall), None), timeout,
                    f"output on {topic} for a frame taken after the change")


def test_valid_threshold_changes_the_output(graph):
    obs: Observer = graph["observer"]
    results = obs.set_params("lane_node", lane_threshold=0.0)
    assert results[0].successful, results[0].reason
    mask = image_to_array(output_after(obs, "/lane/mask", time.time()))
    assert np.all(mask == 255), "lane_threshold 0 must mark every pixel"
    assert obs.set_params("lane_node", lane_threshold=1.0)[0].successful
    mask = image_to_array(output_after(obs, "/lane/mask", time.time()))
    assert not np.all(mask == 255)
    assert obs.set_params("lane_node", lane_threshold=0.5)[0].successful

    def boxes(ma):
        return sum(1 for m in ma.markers if m.ns == BOX_NS)

    assert obs.set_params("pedestrian_node", score_threshold=0.0, max_detections=7)[0].successful
    loose = boxes(output_after(obs, "/pedestrian/markers", time.time()))
    assert 0 < loose <= 7
    assert obs.set_params("pedestrian_node", score_threshold=0.99)[0].successful
    assert boxes(output_after(obs, "/pedestrian/markers", time.time())) == 0
    assert obs.set_params("pedestrian_node", score_threshold=0.3, max_detections=50)[0].successful


@pytest.mark.parametrize("node,name,value,reason", [
    ("lane_node", "lane_threshold", 1.5, ""),
    ("pedestrian_node", "nms_iou", -0.1, ""),
    ("pedestrian_node", "max_detections", 0, ""),
    ("lane_node", "memory_budget_mb", -5.0, ""),
    ("lane_node", "backend", "tensorrt", "unavailable"),
    ("depth_node", "lidar_to_camera", [1.0, 2.0, 3.0], "6 values"),
    ("depth_node", "depth_scale", "deep", ""),
    ("sensor_sim", "resolutions", ["big"], "640x480"),
])
def test_invalid_values_are_rejected_with_a_reason(graph, node, name, value, reason):
    obs: Observer = graph["observer"]
    before = obs.get_param(node, name)
    result = obs.set_params(node, **{name: value})[0]
    assert not result.successful
    assert result.reason and reason in result.reason
    after = obs.get_param(node, name)
    if name == "memory_budget_mb":  # the budget manager may push a new budget meanwhile
        assert after >= 0
    else:
        assert after == before


def test_enabled_false_stops_output(graph):
    obs: Observer = graph["observer"]
    assert obs.set_params("lane_node", enabled=False)[0].successful
    switched = time.time()
    t0 = time.monotonic()
    # the camera goes on for 3 s more, and the other nodes keep serving ...
    wait_for(lambda: any(stamp_sec(m) > switched + 3.0 for m in obs.since("/camera/image_raw", t0)), 60,
             "3 s more of camera frames")
    output_after(obs, "/depth/image", switched)
    # ... but no lane mask of any frame taken after the switch
    late = [stamp_sec(m) - switched for m in obs.since("/lane/mask", 0) if stamp_sec(m) > switched]
    assert not late, f"lane_node published frames taken {late} s after enabled=false"
    wait_for(lambda: any("disabled" in s.message for s in obs.statuses("lane_node", t0)), 30, "'disabled' status")
    assert obs.set_params("lane_node", enabled=True)[0].successful
    output_after(obs, "/lane/mask", time.time())


def test_bad_model_path_is_rejected_and_the_old_model_keeps_serving(graph, tmp_path):
    obs: Observer = graph["observer"]
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"this is not a model")
    for path, reason in ((tmp_path / "missing.onnx", "not found"), (garbage, "ONNX"),
                         (ensure_model("depth"), "no segmentation format fits")):
        result = obs.set_params("lane_node", model_path=str(path))[0]
        assert not result.successful and reason in result.reason, result.reason
        output_after(obs, "/lane/mask", time.time())  # still serving
    # a valid path switches models without stopping the node
    lane = str(ensure_model("lane"))
    # atomically with an unlimited budget: the budget manager's current push may be below what a
    # freshly loaded model accepts, which would (rightly) reject the switch; the budget belongs to
    # the manager, so the override says so (budget_owner '')
    result = obs.set_params_atomically("lane_node", model_path=lane, memory_budget_mb=0.0, budget_owner="")
    assert result.successful, result.reason
    t0 = time.monotonic()
    output_after(obs, "/lane/mask", time.time())
    wait_for(lambda: any(status_values(s).get("model_path") == lane for s in obs.statuses("lane_node", t0)), 30,
             "diagnostics to report the new model path")


# ----------------------------------------------------------------------------- bad input

def _bad_frames(stamp_sec: int):
    short = array_to_image(np.zeros((48, 64, 3), np.uint8), "rgb8")
    short.step = 10
    unknown = array_to_image(np.zeros((48, 64, 3), np.uint8), "rgb8")
    unknown.encoding = "yuv_mystery"
    empty = Image(height=0, width=0, encoding="rgb8", step=0, data=b"")
    nan = array_to_image(np.full((48, 64), np.nan, np.float32), "32FC1")
    frames = [(short, "shorter than one row"), (unknown, "unsupported image encoding"), (empty, "zero size"),
              (nan, "NaN")]
    for i, (msg, _) in enumerate(frames):
        msg.header.frame_id = FRAME_ID
        msg.header.stamp.sec = stamp_sec + i
    return frames


def test_bad_frames_give_error_diagnostics_and_the_next_good_frame_is_processed(graph):
    obs: Observer = graph["observer"]
    assert obs.set_params("sensor_sim", enabled=False)[0].successful
    try:
        time.sleep(1.5)  # let in-flight simulator frames drain
        rgb, _ = scene.render_camera(scene.make_scene(0.0), 160, 96)
        for index, (bad, reason) in enumerate(_bad_frames(1_000_000)):
            t0 = time.monotonic()
            obs.image_pub.publish(bad)

            def errored(node, reason=reason, t0=t0):
                return any(s.level == b"\x02" and reason in s.message for s in obs.statuses(node, t0))

            wait_for(lambda: all(errored(n) for n in MODEL_NODES), 60, f"ERROR diagnostics for '{reason}'")
            good = array_to_image(rgb, "rgb8")
            good.header.frame_id = FRAME_ID
            good.header.stamp.sec = 2_000_000 + index
            t1 = time.monotonic()
            obs.image_pub.publish(good)

            def recovered(topic, t1=t1, good=good):
                headers = [m.markers[0].header if isinstance(m, MarkerArray) else m.header
                           for m in obs.since(topic, t1)]
                return any(stamp_key(h) == stamp_key(good.header) for h in headers)

            wait_for(lambda: recovered("/lane/mask") and recovered("/depth/image")
                     and recovered("/pedestrian/markers"), 60, "outputs for the good frame after a bad one")
            assert (obs.since("/lane/mask", t1)[-1].width, obs.since("/lane/mask", t1)[-1].height) == (160, 96)
            wait_for(lambda t1=t1: all(any(s.level == b"\x00" for s in obs.statuses(n, t1)) for n in MODEL_NODES), 30,
                     "diagnostics back to OK")
        # a malformed LiDAR cloud: the depth node reports it and keeps its last good cloud
        cloud = xyzi_to_cloud(np.ones((10, 4), np.float32))
        cloud.fields = cloud.fields[:2]
        t0 = time.monotonic()
        obs.cloud_pub.publish(cloud)
        wait_for(lambda: any(s.level == b"\x02" and "bad point cloud" in s.message and "lacks field" in s.message
                             for s in obs.statuses("depth_node", t0)), 60, "ERROR diagnostic for a bad cloud")
        good = array_to_image(rgb, "rgb8")
        good.header.stamp.sec = 3_000_000
        t1 = time.monotonic()
        obs.image_pub.publish(good)
        wait_for(lambda: any(stamp_key(m.header) == stamp_key(good.header) for m in obs.since("/depth/image", t1)),
                 60, "depth output after a bad cloud")
        assert graph["proc"].poll() is None
        for node in MODEL_NODES:
            assert status_values(obs.statuses(node)[-1])["frames_failed"] >= 4
    finally:
        assert obs.set_params("sensor_sim", enabled=True)[0].successful


#: depth_node's max_rate_hz while the burst arrives: one frame per 1000 s, longer than the test
#: may run (its timeout), so the worker takes no frame until the cap is cleared
HOLD_RATE_HZ = 0.001


def test_a_burst_of_frames_drops_stale_ones_instead_of_queueing(graph):
    """Frames that arrive while the worker cannot take them replace each other in the one-frame
    mailbox (counted as dropped); once the worker takes frames again it answers the newest.

    The worker is kept from taking frames by ``max_rate_hz``, not by a model that is slower than
    the publisher: how fast either runs on a loaded machine does not decide whether a frame goes
    stale."""
    obs: Observer = graph["observer"]
    assert obs.set_params("sensor_sim", enabled=False)[0].successful
    try:
        time.sleep(1.5)  # let in-flight simulator frames drain

        def counters_after(marker_size: tuple[int, int], sec: int) -> tuple[int, int, int]:
            """depth_node's counters once it has processed a marker frame of ``marker_size`` (a size
            no other frame here has): the node's status names the camera size of its last processed
            frame, and every frame it received before the marker was processed or dropped by then."""
            rgb, _ = scene.render_camera(scene.make_scene(2.0), *marker_size)
            marker = array_to_image(rgb, "rgb8")
            marker.header.frame_id = FRAME_ID
            marker.header.stamp.sec = sec
            t0 = time.monotonic()
            obs.image_pub.publish(marker)
            size = f"{marker_size[0]}x{marker_size[1]}"
            values = wait_for(lambda: next((v for v in (status_values(s) for s in obs.statuses("depth_node", t0))
                                            if v["camera_resolution"] == size), None), 60,
                              f"a depth_node status after the {size} marker frame")
            return values["frames_received"], values["frames_processed"], values["frames_dropped"]

        received0, processed0, dropped0 = counters_after((224, 128), 3_900_000)
        # the worker took the marker last: under the cap it takes nothing else until the cap is cleared
        assert obs.set_params("depth_node", max_rate_hz=HOLD_RATE_HZ)[0].successful
        t_held = time.monotonic()
        rgb, _ = scene.render_camera(scene.make_scene(1.0), 320, 240)
        sent = 0

        def three_burst_frames_received():
            """Publish the next burst frame; the newest depth_node status once it counts three of them
            (best-effort QoS: a busy machine's transport may lose some before the callback)."""
            nonlocal sent
            frame = array_to_image(rgb, "rgb8")
            frame.header.frame_id = FRAME_ID
            frame.header.stamp.sec = 4_000_000 + sent
            obs.image_pub.publish(frame)
            sent += 1
            values = [status_values(s) for s in obs.statuses("depth_node", t_held)]
            return next((v for v in reversed(values) if v["frames_received"] - received0 >= 3), None)

        held = wait_for(three_burst_frames_received, 60, "depth_node to receive three burst frames")
        t_release = time.monotonic()
        # every status published while the worker was held: one frame waits in the mailbox, each
        # one it replaced is counted as dropped, and none is processed
        for values in (status_values(s) for s in obs.statuses("depth_node", t_held, until=t_release)):
            waiting = values["frames_received"] - received0
            assert values["frames_processed"] == processed0, values
            assert values["frames_dropped"] - dropped0 == max(waiting - 1, 0), values
        assert obs.set_params("depth_node", max_rate_hz=0.0)[0].successful
        # the frame left in the mailbox is answered once the worker takes frames again
        wait_for(lambda: any(m.header.stamp.sec >= 4_000_000 for m in obs.since("/depth/image", t_release)), 60,
                 "an output for the newest burst frame")
        # the marker follows the burst from the same publisher: by the time the node has processed
        # it, each frame of the burst it received was processed or dropped
        received, processed, dropped = counters_after((192, 96), 4_100_000)
        delta = {"received": received - received0 - 1, "processed": processed - processed0 - 1,
                 "dropped": dropped - dropped0}
        assert delta["received"] >= held["frames_received"] - received0 >= 3, (delta, held)
        assert delta["dropped"] >= held["frames_received"] - received0 - 1, (delta, held)
        assert delta["processed"] >= 1, delta
        assert delta["processed"] + delta["dropped"] == delta["received"], delta
    finally:
        assert obs.set_params("depth_node", max_rate_hz=0.0)[0].successful
        assert obs.set_params("sensor_sim", enabled=True)[0].successful


def test_simulator_encoding_switch_to_bgr8(graph):
    obs: Observer = graph["observer"]
    assert obs.set_params("sensor_sim", encoding="bgr8")[0].successful
    try:
        t0 = time.monotonic()
        first = wait_for(lambda: next((m for m in obs.since("/camera/image_raw", t0) if m.encoding == "bgr8"), None),
                         60, "bgr8 frames")
        for topic in ("/lane/mask", "/depth/image", "/pedestrian/markers"):
            output_after(obs, topic, stamp_sec(first) - 1e-6)
    finally:
        assert obs.set_params("sensor_sim", encoding="rgb8")[0].successful


# ----------------------------------------------------------------------------- shutdown (last)

def test_sigint_to_dynnet_up_leaves_no_child_alive(graph):
    proc: subprocess.Popen = graph["proc"]
    children = graph["children"]
    assert len(children) == len(PROCESSES) and all(c.is_running() for c in children)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=40) == 0, graph["log"].read_text()[-3000:]
    gone, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, f"still running after dynnet up exited: {[c.pid for c in alive]}"
    log = graph["log"].read_text()
    assert "Traceback" not in log and "never retrieved" not in log, log[-3000:]
    assert "stopped (signal)" in log


def test_dynnet_up_fails_when_a_node_dies(tmp_path):
    config = tmp_path / "broken.yaml"
    # a model, so the preflight passes it, but no segmenter: the lane node exits with status 1 at its start
    config.write_text(yaml.safe_dump({"nodes": [{"name": "lane_node", "executable": "lane_node", "respawn": False,
                                                 "parameters": {"model_path": str(ensure_model("depth"))}}]}))
    out = subprocess.run([sys.executable, "-m", "dynnet_ros.cli", "up", "--config", str(config), "--duration", "60"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "no segmentation format fits" in out.stdout
    assert "lane_node exited with status 1; respawn is off, left down" in out.stderr


def test_children_exit_when_dynnet_up_itself_is_killed(tmp_path):
    """SIGKILL cannot be handled by `dynnet up`; the kernel's parent-death signal still stops its nodes."""
    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump({"nodes": [{"name": "budget_manager", "executable": "budget_manager"}]}))
    proc = subprocess.Popen([sys.executable, "-m", "dynnet_ros.cli", "up", "--config", str(config), "--namespace",
                             NS + "_kill"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    children: list[psutil.Process] = []
    try:
        children = wait_for(lambda: psutil.Process(proc.pid).children(), 60, "the node process")
        proc.kill()
        proc.wait(timeout=10)
        gone, alive = psutil.wait_procs(children, timeout=20)
        assert not alive, f"orphaned after SIGKILL of dynnet up: {[c.pid for c in alive]}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for child in children:  # never leave a node behind, even when the assertion failed
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
