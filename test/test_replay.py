"""`dynnet replay` on real ROS 2: a bag played into the vehicle graph keeps its stamps, the nodes
run on the bag's time, damage found mid-bag is one error line, and a bag ten times larger than
the replaying process plays in flat memory.

Bags here are written by the test itself (rosbags' writer; the camera, CameraInfo and LiDAR
messages of the simulator's scene, serialized by rclpy) at bag times far from the wall clock,
so a stamp or a /clock value that came from the system clock cannot pass for the bag's.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import yaml
from _bags import NS, storage_file
from _up import Up
from _waiting import wait_for
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rclpy.serialization import serialize_message
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import CameraInfo, Image
from std_msgs.msg import Header
from visualization_msgs.msg import MarkerArray

from dynnet_ros.bags.reader import Bag
from dynnet_ros.graph_config import default_config_path
from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.nodes.convert import array_to_image, xyzi_to_cloud
from dynnet_ros.nodes.diagnostics import status_values
from dynnet_ros.sim.frames import SimSettings, camera_info_fields, render_frame
from dynnet_ros.supervisor.runner import stop_process_group
from dynnet_ros.zoo import ensure_model

ROOT = Path(__file__).resolve().parents[1]
GRAPH_NS = f"/replaytest_{os.getpid()}"
MODEL_NODES = ("lane_node", "pedestrian_node", "depth_node")
OUTPUTS = {"/lane/mask": Image, "/depth/image": Image, "/pedestrian/markers": MarkerArray}
#: bag time of the first frame: 1000 s after the epoch, far from any wall-clock time
BAG_START_NS = 1000 * NS

pytestmark = [pytest.mark.timeout(600), pytest.mark.graph]


def _time(stamp_ns: int):
    header = Header()
    header.stamp.sec, header.stamp.nanosec = stamp_ns // NS, stamp_ns % NS
    return header.stamp


def write_scene_bag(path: Path, frames: int, period_ns: int, *, storage: str = "mcap", width: int = 320,
                    height: int = 240, start_ns: int = BAG_START_NS) -> list[int]:
    """The simulator's frames as a recording: camera, CameraInfo and LiDAR per frame, serialized
    by rclpy; returns the frames' stamps."""
    settings = SimSettings(resolutions=(f"{width}x{height}",), rate_hz=min(60.0, NS / period_ns))
    store = get_typestore(Stores.LATEST)
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    stamps = []
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        cam = writer.add_connection("/camera/image_raw", "sensor_msgs/msg/Image", typestore=store)
        info = writer.add_connection("/camera/camera_info", "sensor_msgs/msg/CameraInfo", typestore=store)
        lidar = writer.add_connection("/lidar/points", "sensor_msgs/msg/PointCloud2", typestore=store)
        for i in range(frames):
            stamp = start_ns + i * period_ns
            frame = render_frame(settings, i, i * period_ns / NS)
            camera_header = Header(stamp=_time(stamp), frame_id=settings.camera_frame_id)
            writer.write(info, stamp, serialize_message(CameraInfo(header=camera_header, width=frame.width,
                                                                   height=frame.height,
                                                                   **camera_info_fields(frame.camera_matrix))))
            writer.write(cam, stamp + 1000, serialize_message(array_to_image(frame.image, "rgb8", camera_header)))
            writer.write(lidar, stamp + 2000, serialize_message(
                xyzi_to_cloud(frame.points, Header(stamp=_time(stamp), frame_id=settings.lidar_frame_id))))
            stamps.append(stamp)
    return stamps


def stamp_ns(header) -> int:
    return header.stamp.sec * NS + header.stamp.nanosec


class Observer:
    """Records the graph's outputs (under GRAPH_NS), its diagnostics and /clock."""

    def __init__(self, namespace: str, qos: QoSProfile = qos_profile_sensor_data) -> None:
        self.ros = BackgroundNode("replay_test_observer")
        self.lock = threading.Lock()
        self.stamps: dict[str, list[int]] = defaultdict(list)
        self.diagnostics: dict[str, list[int]] = defaultdict(list)  # node -> header stamps of its arrays
        self.counters: dict[str, tuple[dict, str]] = {}  # model node -> its last status values and message
        self.clock: list[int] = []
        node = self.ros.node
        self.outputs = [node.create_subscription(kind, namespace + topic, self._recorder(topic), qos)
                        for topic, kind in OUTPUTS.items()]
        node.create_subscription(Image, namespace + "/camera/image_raw", self._recorder("/camera/image_raw"), qos)
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag(namespace), 100)
        node.create_subscription(Clock, "/clock", self._on_clock,
                                 QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT))
        self.ros.start()

    def _recorder(self, topic: str):
        def record(msg) -> None:
            header = msg.markers[0].header if isinstance(msg, MarkerArray) else msg.header
            with self.lock:
                self.stamps[topic].append(stamp_ns(header))
        return record

    def _on_diag(self, namespace: str):
        def record(msg: DiagnosticArray) -> None:
            with self.lock:
                for status in msg.status:
                    if status.hardware_id.startswith(namespace + "/"):
                        name = status.name.split(":", 1)[0].strip()
                        self.diagnostics[name].append(stamp_ns(msg.header))
                        values = status_values(status)
                        if "frames_received" in values:
                            self.counters[name] = (values, status.message)
        return record

    def _on_clock(self, msg: Clock) -> None:
        with self.lock:
            self.clock.append(msg.clock.sec * NS + msg.clock.nanosec)

    def matched_outputs(self) -> bool:
        """Whether DDS has matched each output subscription with its publisher (what a node
        publishes before that never reaches the observer)."""
        return all(sub.get_publisher_count() >= 1 for sub in self.outputs)

    def snapshot(self) -> tuple[dict[str, list[int]], dict[str, list[int]], list[int]]:
        with self.lock:
            return ({k: list(v) for k, v in self.stamps.items()}, {k: list(v) for k, v in self.diagnostics.items()},
                    list(self.clock))

    def close(self) -> None:
        self.ros.close()


def graph_config(tmp_path: Path) -> Path:
    data = yaml.safe_load(default_config_path().read_text())
    for node in data["nodes"]:
        if node["name"] in MODEL_NODES:
            node.setdefault("parameters", {}).update(threads=1)
    path = tmp_path / "graph.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def replay(*args: str, log: Path) -> subprocess.Popen:
    """`dynnet replay ARGS`, in a session of its own, output to ``log``."""
    return subprocess.Popen([sys.executable, "-m", "dynnet_ros.cli", "replay", *args], cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_replay_into_the_graph_keeps_the_bags_stamps_and_time(tmp_path):
    for task in ("lane", "pedestrian", "depth"):
        ensure_model(task)
    frames, period_ns = 6, NS // 2
    stamps = write_scene_bag(tmp_path / "scene", frames, period_ns)
    observer = Observer(GRAPH_NS)
    log = tmp_path / "replay.log"
    proc = replay(str(tmp_path / "scene"), "--config", str(graph_config(tmp_path)), "--namespace", GRAPH_NS,
                  "--rate", "0.5", "--linger", "120", "--json", str(tmp_path / "replay.json"), log=log)
    try:
        # the last frame is never replaced in a node's one-frame mailbox, so every model answers it
        wait_for(lambda: proc.poll() is not None or all(stamps[-1] in observer.snapshot()[0].get(t, [])
                                                        for t in OUTPUTS),
                 420, "every model's output for the bag's last frame")
        assert proc.poll() is None, log.read_text()[-3000:]
        outputs, diagnostics, clock = observer.snapshot()
    finally:
        code = stop_process_group(proc, timeout=60.0)
        observer.close()
    text = log.read_text()
    assert code == 0, text[-3000:]
    for topic in OUTPUTS:
        assert outputs[topic] and set(outputs[topic]) <= set(stamps), f"{topic}: stamps not from the bag"
    assert outputs["/camera/image_raw"] == stamps, "the camera frames went out once each, in order"
    # /clock is the bag's time, and the nodes' own stamps (use_sim_time) follow it, not the wall clock
    assert clock and min(clock) >= BAG_START_NS and clock == sorted(clock)
    for node in MODEL_NODES:
        timed = [s for s in diagnostics.get(node, []) if s > 0]  # 0: before the first /clock
        assert timed, f"{node}: no diagnostics on the bag's time"
        assert all(BAG_START_NS <= s <= max(clock) for s in timed), (node, timed)
    summary = json.loads((tmp_path / "replay.json").read_text())
    assert summary["completed"] and summary["passes"] == 1
    assert {t: v["published"] for t, v in summary["topics"].items()} == {
        f"{GRAPH_NS}/camera/image_raw": frames, f"{GRAPH_NS}/camera/camera_info": frames,
        f"{GRAPH_NS}/lidar/points": frames}


def test_a_loop_replays_the_bag_until_ctrl_c(tmp_path):
    stamps = write_scene_bag(tmp_path / "short", 3, NS // 5, storage="sqlite3", width=64, height=48)
    namespace = f"{GRAPH_NS}_loop"
    observer = Observer(namespace)
    log = tmp_path / "replay.log"
    proc = replay(str(tmp_path / "short"), "--no-graph", "--loop", "--rate", "4", "--namespace", namespace,
                  "--json", str(tmp_path / "loop.json"), log=log)
    try:
        wait_for(lambda: proc.poll() is not None or len(observer.snapshot()[0].get("/camera/image_raw", [])) >= 9,
                 120, "three passes of the camera frames")
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=60)
        outputs, _, clock = observer.snapshot()
        observer.close()
    assert code == 0, log.read_text()[-3000:]
    seen = outputs["/camera/image_raw"]
    assert set(seen) == set(stamps) and len(seen) >= 9
    assert any(b < a for a, b in zip(clock, clock[1:])), "/clock starts again with each pass"
    summary = json.loads((tmp_path / "loop.json").read_text())
    assert summary["loop"] and summary["passes"] >= 3 and not summary["completed"]


def test_damage_found_mid_bag_ends_the_replay_with_one_error_line(tmp_path):
    write_scene_bag(tmp_path / "damaged", 12, NS // 10, width=64, height=48)
    path = storage_file(tmp_path / "damaged")
    data = bytearray(path.read_bytes())
    third = len(data) // 3  # the middle third: record headers as well as payloads
    data[third:2 * third] = b"\x07" * third
    path.write_bytes(bytes(data))
    result = subprocess.run([sys.executable, "-m", "dynnet_ros.cli", "replay", str(tmp_path / "damaged"),
                             "--no-graph", "--rate", "50"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(f"dynnet replay: error: bag {tmp_path / 'damaged'}: "), result.stderr
    assert "corrupt" in lines[-1]
    assert "Traceback" not in result.stderr


PEAK_RSS = ("import resource, subprocess, sys\n"
            "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
            "print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)\n")


def peak_rss(bag: Path) -> int:
    """Peak RSS (bytes) of one `dynnet replay --no-graph` of ``bag``, measured by a parent of its own
    (getrusage of its only child) so no other process of the test run counts."""
    result = subprocess.run([sys.executable, "-c", PEAK_RSS, sys.executable, "-m", "dynnet_ros.cli", "replay",
                             str(bag), "--no-graph", "--rate", "1000"], cwd=ROOT, capture_output=True, text=True,
                            timeout=900)
    code, peak = result.stdout.split()
    assert code == "0", result.stderr
    return int(peak)


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_a_bag_ten_times_the_players_memory_plays_in_flat_memory(tmp_path, storage):
    """Random 1280x720 frames: a 10-frame bag gives the player's peak RSS; a bag over ten times
    that peak must raise it by a small fraction of the bag's size."""
    small = write_big_bag(tmp_path / "small", 10, storage)
    base = peak_rss(small)
    frames = int(11 * base / (1280 * 720 * 3)) + 1
    big = write_big_bag(tmp_path / "big", frames, storage)
    try:
        size = sum(p.stat().st_size for p in big.iterdir())
        assert size > 10 * base
        growth = peak_rss(big) - base
    finally:
        shutil.rmtree(big)  # gigabytes: not left for pytest's kept temporary directories
    assert growth < 0.05 * size, f"peak RSS grew {growth / 2**20:.0f} MiB replaying {size / 2**20:.0f} MiB"


def write_big_bag(path: Path, frames: int, storage: str) -> Path:
    """``frames`` camera frames of random 1280x720 pixels (eight distinct images, cycled)."""
    store = get_typestore(Stores.LATEST)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (720, 1280, 3), dtype=np.uint8) for _ in range(8)]
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        cam = writer.add_connection("/camera/image_raw", "sensor_msgs/msg/Image", typestore=store)
        for i in range(frames):
            stamp = BAG_START_NS + i * NS // 10
            msg = array_to_image(images[i % len(images)], "rgb8", Header(stamp=_time(stamp), frame_id="camera"))
            writer.write(cam, stamp, serialize_message(msg))
    return path


# ----------------------------------------------------------------------------- simulator bag vs live simulator

SIM_SEED, SIM_RATE_HZ, SIM_FRAMES = 7, 0.25, 5  # 4 s per frame: every model answers every frame, none dropped
SENSOR_TOPICS = ("camera/image_raw", "camera/camera_info", "lidar/points")
#: the observer takes outputs and camera frames reliably (the graph publishes them reliable here)
RELIABLE = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)


def reliable_sensor_links(namespace: str, entity: str) -> dict:
    """QoS overrides that make every sensor link of a node reliable (no frame lost in transport)
    and transient-local (a subscription that matches a publisher only after its first frame was
    sent still gets it: DDS matches each side on its own)."""
    return {f"{namespace}/{topic}": {entity: {"reliability": "reliable", "durability": "transient_local"}}
            for topic in SENSOR_TOPICS}


def parity_config(tmp_path: Path, enabled: bool, namespace: str) -> Path:
    """The vehicle graph with the simulator at SIM_RATE_HZ, one 320x240 camera size and SIM_SEED,
    reliable sensor links (a frame lost by the transport would make live and replay differ), and
    a budget manager that reports but pushes no budgets (no re-plans between frames)."""
    data = yaml.safe_load(default_config_path().read_text())
    for node in data["nodes"]:
        params = node.setdefault("parameters", {})
        if node["name"] == "sensor_sim":
            params.update(rate_hz=SIM_RATE_HZ, resolutions=["320x240"], seed=SIM_SEED, enabled=enabled,
                          lidar_azimuth_steps=256, qos_overrides=reliable_sensor_links(namespace, "publisher"))
        elif node["name"] in MODEL_NODES:
            params.update(threads=1, qos_overrides=reliable_sensor_links(namespace, "subscription"))
        elif node["name"] == "budget_manager":
            params.update(allocate=False)
    path = tmp_path / f"parity-{'live' if enabled else 'off'}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _answered(observer: Observer, stamps: list[int]) -> bool:
    outputs = observer.snapshot()[0]
    return bool(stamps) and all(set(stamps) <= set(outputs.get(t, [])) for t in OUTPUTS)


def _unanswered(observer: Observer, stamps: list[int]) -> str:
    """Which frames each output is missing, which the observer's own camera subscription missed,
    and each model node's last frame counters (for a failure message)."""
    outputs = observer.snapshot()[0]
    with observer.lock:
        latest = sorted(observer.counters.items())
    keys = ("frames_received", "frames_processed", "frames_dropped", "frames_failed")
    counters = "; ".join(f"{node}: " + " ".join(f"{key.removeprefix('frames_')} {values.get(key)}" for key in keys)
                         + f" ({message})" for node, (values, message) in latest)
    return "; ".join(f"{t} lacks {sorted(set(stamps) - set(outputs.get(t, [])))}"
                     for t in (*OUTPUTS, "/camera/image_raw")) + f"\nmodel nodes' last diagnostics: {counters}"


def wait_for_graph(observer: Observer, up: Up, namespace: str) -> None:
    """Until the model nodes and the observer subscribe to the camera and the observer has matched
    every output publisher (so no first output is published before anyone can receive it)."""
    node = observer.ros.node

    def sensor_links(topic: str) -> list:
        """The topic's publishers and the model nodes' subscriptions, as the ROS graph shows them."""
        return [*node.get_publishers_info_by_topic(f"{namespace}/{topic}"),
                *(s for s in node.get_subscriptions_info_by_topic(f"{namespace}/{topic}")
                  if s.node_name in MODEL_NODES)]

    wait_for(lambda: up.proc.poll() is not None or (node.count_subscribers(f"{namespace}/camera/image_raw") >= 4
                                                    and observer.matched_outputs()
                                                    and all(sensor_links(t) for t in SENSOR_TOPICS)),
             420, "the model nodes (and the observer) to subscribe to the sensors, the outputs to be matched")
    assert up.proc.poll() is None, up.log()
    for topic in SENSOR_TOPICS:  # the QoS overrides reached rclpy: every sensor link is reliable, transient-local
        links = sensor_links(topic)
        assert all(i.qos_profile.reliability == ReliabilityPolicy.RELIABLE
                   and i.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL for i in links), \
            (topic, [(i.node_name, i.qos_profile.reliability, i.qos_profile.durability) for i in links])


def live_outputs(tmp_path: Path) -> tuple[int, dict[str, list[int]]]:
    """Frames the live simulator published once every model node listened, and the outputs."""
    namespace = f"{GRAPH_NS}_live"
    observer = Observer(namespace, RELIABLE)
    up = Up(parity_config(tmp_path, enabled=False, namespace=namespace), namespace)
    try:
        node = observer.ros.node
        wait_for_graph(observer, up, namespace)
        client = AsyncParameterClient(node, f"{namespace}/sensor_sim")
        assert client.wait_for_services(timeout_sec=30.0)

        def enable(value: bool) -> None:
            future = client.set_parameters([Parameter("enabled", value=value)])
            wait_for(future.done, 30.0, "set enabled on sensor_sim")
            assert future.result().results[0].successful

        enable(True)
        try:
            wait_for(lambda: len(observer.snapshot()[0].get("/camera/image_raw", [])) >= SIM_FRAMES, 120,
                     f"{SIM_FRAMES} live camera frames")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {observer.snapshot()[0]}\n{up.log()}") from None
        enable(False)
        wait_for(lambda: _answered(observer, observer.snapshot()[0]["/camera/image_raw"]), 240,
                 "every model's output for every live frame")
        outputs = observer.snapshot()[0]
    finally:
        code = up.stop()
        observer.close()
    assert code == 0, up.log()
    camera = outputs["/camera/image_raw"]
    assert _answered(observer, camera) and len(set(camera)) == len(camera)
    return len(camera), outputs


def test_a_simulator_bag_replays_to_the_same_outputs_as_the_live_simulator(tmp_path):
    for task in ("lane", "pedestrian", "depth"):
        ensure_model(task)
    frames, live = live_outputs(tmp_path)
    bag = tmp_path / "sim.mcap"
    subprocess.run([sys.executable, "-m", "dynnet_ros.cli", "sim", "--record", str(bag), "--seed", str(SIM_SEED),
                    "--frames", str(frames), "--rate", str(SIM_RATE_HZ), "--resolutions", "320x240"],
                   cwd=ROOT, check=True, capture_output=True, timeout=300)
    with Bag(bag) as recorded:
        plan = recorded.plan(["/camera/image_raw"])
        stamps = [m.timestamp_ns for m in recorded.messages(plan)]
    assert len(stamps) == frames
    # the same graph (the simulator disabled), and the bag played into it once the observer is matched
    namespace = f"{GRAPH_NS}_bag"
    observer = Observer(namespace, RELIABLE)
    up = Up(parity_config(tmp_path, enabled=False, namespace=namespace), namespace)
    log = tmp_path / "replay.log"
    proc = None
    try:
        wait_for_graph(observer, up, namespace)
        proc = replay(str(bag), "--no-graph", "--namespace", namespace, log=log)
        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
        try:
            wait_for(lambda: up.proc.poll() is not None or _answered(observer, stamps), 240,
                     "every model's output for every frame of the bag")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {_unanswered(observer, stamps)}\n{up.log()}\n"
                                 f"{log.read_text()[-2000:]}") from None
        assert up.proc.poll() is None, f"{_unanswered(observer, stamps)}\n{up.log()}"
        replayed = observer.snapshot()[0]
    finally:
        if proc is not None and proc.poll() is None:
            stop_process_group(proc, timeout=60.0)
        code = up.stop()
        observer.close()
    assert code == 0, up.log()
    for topic in OUTPUTS:
        assert len(replayed[topic]) == len(live[topic]) == frames, (topic, len(replayed[topic]), len(live[topic]))
        assert replayed[topic] == stamps, f"{topic}: the replayed outputs carry the bag's stamps, in order"
