"""The pedestrian node as an adapter over the Detector core, live: a real rclpy node process, a real
pretrained detector (YOLOv8n from the nudenet wheel, test/_corpus.py), real photographs.

One node process serves the whole module (a model load costs tens of seconds on 2 shared
cores); the tests run in file order against it. Each frame is published with a stamp of its own
until the markers of that stamp arrive; the boxes read back from the markers must equal what the
Detector core computes in this process for the same frame and options, in camera pixels.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from _corpus import by_name, photos, resize
from _waiting import wait_for
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.parameter import Parameter, parameter_value_to_python
from rclpy.parameter_client import AsyncParameterClient
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.time import Time
from std_msgs.msg import Header, String
from visualization_msgs.msg import MarkerArray

from dynnet_ros.budget.protocol import PROFILES_TOPIC, ModelProfile
from dynnet_ros.commands.demo_frames import marker_boxes
from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.nodes.convert import array_to_image
from dynnet_ros.nodes.diagnostics import status_values
from dynnet_ros.perception import Detector
from dynnet_ros.settings import settings
from dynnet_ros.sim.scene import camera_matrix
from dynnet_ros.supervisor.runner import stop_process_group
from dynnet_ros.zoo import ensure_model

ROOT = Path(__file__).resolve().parents[1]
NS = f"/perctest_{os.getpid()}"
YOLO = by_name("yolov8n-detector")
NODE_PARAMS = {"threads": 1, "score_threshold": 0.3, "nms_iou": 0.45, "max_detections": 50, "max_input_side": 640}
#: the node's camera subscription made reliable through its QoS overrides (nodes/base.py)
CAMERA_QOS_OVERRIDES = {"qos_overrides": {f"{NS}/camera/image_raw": {"subscription": {"reliability": "reliable"}}}}

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(not YOLO.available() or not photos(), reason=YOLO.skip_reason), pytest.mark.graph]


def astronaut() -> np.ndarray:
    return dict(photos())["astronaut"]


class Client:
    """This process's side: publishes frames, reads markers and diagnostics, sets parameters."""

    def __init__(self) -> None:
        self.ros = BackgroundNode("perception_node_test")
        node = self.ros.node
        self.lock = threading.Lock()
        self.markers: dict[tuple[int, int], MarkerArray] = {}
        self.statuses: list[tuple[float, dict]] = []
        # reliable, as the node's camera subscription is made here (CAMERA_QOS_OVERRIDES): a 1280x720
        # frame is 2.7 MB, and best effort loses a fragment of it often enough to lose every try
        self.image_pub = node.create_publisher(type(array_to_image(np.zeros((1, 1, 3), np.uint8), "rgb8")),
                                               NS + "/camera/image_raw",
                                               QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE))
        node.create_subscription(MarkerArray, NS + "/pedestrian/markers", self._on_markers, 10)
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 50)
        self.profiles: list[ModelProfile] = []
        node.create_subscription(String, f"{NS}/{PROFILES_TOPIC}", self._on_profile, 10)
        self.params = AsyncParameterClient(node, NS + "/pedestrian_node")
        self.stamp = 1000
        self.ros.start()

    def _on_markers(self, msg: MarkerArray) -> None:
        if msg.markers:
            stamp = msg.markers[0].header.stamp
            with self.lock:
                self.markers[(stamp.sec, stamp.nanosec)] = msg

    def _on_profile(self, msg: String) -> None:
        with self.lock:
            self.profiles.append(ModelProfile.from_json(msg.data))

    def _on_diag(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.hardware_id.startswith(NS + "/"):
                with self.lock:
                    self.statuses.append((time.monotonic(), status_values(status)))

    def detect(self, rgb: np.ndarray, timeout: float = 120.0) -> tuple[np.ndarray, list[str], Header]:
        """Publish ``rgb`` (stamp of its own) until the node's markers for it arrive; boxes in
        pixels (read back through the same K the node used: no CameraInfo, the default one)."""
        self.stamp += 1
        header = Header(stamp=Time(seconds=self.stamp).to_msg(), frame_id="perception_test_camera")
        msg = array_to_image(rgb, "rgb8", header)
        key = (self.stamp, 0)

        def answered():
            self.image_pub.publish(msg)
            with self.lock:
                return self.markers.get(key)
        markers = wait_for(answered, timeout, f"markers for a {rgb.shape[1]}x{rgb.shape[0]} frame", interval=0.5)
        assert all(m.header.frame_id == "perception_test_camera" for m in markers.markers)
        found = marker_boxes(markers, camera_matrix(rgb.shape[1], rgb.shape[0]))
        boxes = np.array([b for b, _ in found], dtype=np.float64).reshape(-1, 4)
        return boxes, [text for _, text in found], header

    def set(self, **values) -> tuple[bool, str]:
        assert self.params.wait_for_services(timeout_sec=30.0)
        future = self.params.set_parameters_atomically([Parameter(k, value=v) for k, v in values.items()])
        wait_for(future.done, 300, f"set_parameters {sorted(values)}")
        result = future.result().result
        return result.successful, result.reason

    def set_request(self, **values) -> list[tuple[bool, str]]:
        """One request on the node's ``set_parameters`` service (not the atomic one): each
        parameter's result."""
        assert self.params.wait_for_services(timeout_sec=30.0)
        future = self.params.set_parameters([Parameter(k, value=v) for k, v in values.items()])
        wait_for(future.done, 300, f"set_parameters {sorted(values)}")
        return [(result.successful, result.reason) for result in future.result().results]

    def get(self, *names: str) -> list:
        assert self.params.wait_for_services(timeout_sec=30.0)
        future = self.params.get_parameters(list(names))
        wait_for(future.done, 60, f"get_parameters {list(names)}")
        return [parameter_value_to_python(value) for value in future.result().values]

    def status_since(self, t0: float, key: str, value) -> dict:
        return self.status_where(t0, lambda s: s.get(key) == value, f"{key}={value!r}")

    def status_where(self, t0: float, predicate, what: str) -> dict:
        """The first of the node's statuses published after ``t0`` that satisfies ``predicate``."""
        def match():
            with self.lock:
                return next((s for t, s in self.statuses if t >= t0 and predicate(s)), None)
        return wait_for(match, 60, f"a status with {what}")

    def close(self) -> None:
        self.ros.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("perception_node")
    params = tmp / "params.yaml"
    params.write_text(yaml.safe_dump({"/**": {"ros__parameters": {**NODE_PARAMS, **CAMERA_QOS_OVERRIDES}}}))
    log = (tmp / "node.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "dynnet_ros.nodes.pedestrian_node", "--ros-args",
                             "-r", f"__ns:={NS}", "--params-file", str(params)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    client = Client()
    try:
        wait_for(lambda: client.params.wait_for_services(timeout_sec=0.5) or proc.poll() is not None, 300,
                 "the pedestrian node to start")
        assert proc.poll() is None, (tmp / "node.log").read_text()
        yield {"client": client, "tmp": tmp, "log": tmp / "node.log"}
    finally:
        client.close()
        stop_process_group(proc)
        log.close()


def reference(path: Path | str, rgb: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """What the Detector core gives for ``rgb`` with the node's options, in this process."""
    with Detector(str(path), score_threshold=NODE_PARAMS["score_threshold"], nms_iou=NODE_PARAMS["nms_iou"],
                  max_detections=NODE_PARAMS["max_detections"], input_size=NODE_PARAMS["max_input_side"]) as det:
        found = det(rgb)
    return found.boxes_xyxy.astype(np.float64), [f"{n} {s:.2f}" for n, s in zip(found.class_names, found.scores)]


def fixed_640(path: Path, out: Path) -> Path:
    """The same detector with its input fixed to 1x3x640x640 (as `yolo export imgsz=640` writes it)."""
    model = onnx.load(str(path))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for dim, value in zip(dims, (1, 3, 640, 640)):
        dim.Clear()
        dim.dim_value = value
    out_dims = model.graph.output[0].type.tensor_type.shape.dim
    for dim, value in zip(out_dims, (1, 22, 8400)):
        dim.Clear()
        dim.dim_value = value
    del model.graph.value_info[:]
    onnx.save(model, str(out))
    return out


def test_a_frame_above_the_budget_is_an_error_and_its_minimum_goes_to_the_manager(node):
    """A budget that fits 320x240 frames, then a 640x640 frame (a size class the node did not
    announce), which needs more: the node still answers, its diagnostic goes ERROR ("over
    budget: ..."), and the profile it publishes carries that class's minimum, above the budget,
    for the manager to grant."""
    client: Client = node["client"]
    small, large = resize(astronaut(), 240, 320), resize(astronaut(), 640, 640)
    client.detect(small)

    def profile(since: int, size: str):  # the latest profile received after the first ``since``
        with client.lock:
            return next((p for p in reversed(client.profiles[since:]) if size in p.min_by_size), None)
    prof = wait_for(lambda: profile(0, "256x320"), 120, "a profile with the 256x320 minimum")
    budget = round(prof.min_by_size["256x320"] + 0.5, 1)
    try:
        ok, reason = client.set(memory_budget_mb=budget)
        assert ok, reason
        client.detect(small)
        t0 = time.monotonic()
        with client.lock:
            seen = len(client.profiles)
        client.detect(large)  # served, above the budget
        status = client.status_where(t0, lambda s: str(s.get("last_error", "")).startswith("over budget"),
                                     "an over-budget error")
        assert "minimum" in status["last_error"]
        after = wait_for(lambda: profile(seen, "640x640"), 60, "a profile after the frame")
        assert after.min_by_size["640x640"] > budget
    finally:
        ok, reason = client.set(memory_budget_mb=0.0)
        assert ok, reason
    t1 = time.monotonic()
    client.detect(small)
    client.status_where(t1, lambda s: s.get("last_error") == "", "the error cleared by a frame within the budget")


def test_model_path_switches_from_the_zoo_format_to_a_real_yolov8_export(node):
    client: Client = node["client"]
    t0 = time.monotonic()
    boxes, labels, _ = client.detect(resize(astronaut(), 240, 320))
    assert all(text.startswith("pedestrian ") for text in labels), labels  # the zoo's one class
    client.status_since(t0, "model_format", "zoo")
    t1 = time.monotonic()
    ok, reason = client.set(model_path=str(YOLO.path()))
    assert ok, reason
    status = client.status_since(t1, "model_format", "yolov8")
    assert "4 box" in status["model_format_reason"] and status["model_path"] == str(YOLO.path())


def test_a_set_parameters_request_is_applied_all_at_once_or_not_at_all(node):
    """One `set_parameters` request with a new model and classes it does not have: neither is
    applied, both answers carry the reason; a switch needing `model_format` too names it."""
    client: Client = node["client"]
    zoo = str(ensure_model("pedestrian"))
    results = client.set_request(model_path=zoo, classes=["FACE_FEMALE"])
    assert [ok for ok, _ in results] == [False, False], results
    assert results[0][1] == results[1][1] and "FACE_FEMALE" in results[0][1], results
    assert client.get("model_path", "classes") == [str(YOLO.path()), [""]]

    ok, reason = client.set(model_format="yolov8")
    assert ok, reason
    try:
        [(ok, reason)] = client.set_request(model_path=zoo)
        assert not ok and "model_format 'yolov8' does not fit" in reason, reason
        assert "set model_format in the same set_parameters call as model_path" in reason, reason
        assert client.get("model_path") == [str(YOLO.path())]
    finally:
        ok, reason = client.set(model_format="auto")
        assert ok, reason


def test_a_real_photo_at_two_resolutions_gives_detections_in_source_pixels(node):
    client: Client = node["client"]
    photo = astronaut()                        # 512 x 512
    smaller = resize(photo, 384, 384)
    results = {}
    for rgb in (photo, smaller):
        boxes, labels, _ = client.detect(rgb)
        want_boxes, want_labels = reference(YOLO.path(), rgb)
        assert labels == want_labels
        np.testing.assert_allclose(boxes, want_boxes, atol=0.05)  # the core's boxes, camera pixels
        assert len(boxes) and (boxes[:, [0, 2]] <= rgb.shape[1]).all() and (boxes[:, [1, 3]] <= rgb.shape[0]).all()
        results[rgb.shape[0]] = dict(zip(labels, boxes))
    # the astronaut's face, found at both sizes, sits where the photo's pixels put it
    face = [text for text in results[512] if text.startswith("FACE_FEMALE")]
    assert face, results[512]
    big = results[512][face[0]]
    small = next(b for t, b in results[384].items() if t.startswith("FACE_FEMALE"))
    np.testing.assert_allclose(small * (512 / 384), big, atol=12.0)


def test_a_malformed_model_or_a_wrong_format_is_rejected_and_the_old_model_keeps_serving(node):
    client: Client = node["client"]
    garbage = node["tmp"] / "garbage.onnx"
    garbage.write_bytes(b"not an onnx model at all")
    rgb = resize(astronaut(), 300, 300)
    want_boxes, want_labels = reference(YOLO.path(), rgb)
    for values, fragment in (({"model_path": str(garbage)}, "garbage.onnx"),
                             ({"model_format": "ssd"}, "does not fit"),
                             ({"model_format": "yolo5"}, "model_format must be one of")):
        t0 = time.monotonic()
        ok, reason = client.set(**values)
        assert not ok and fragment in reason, reason
        boxes, labels, _ = client.detect(rgb)  # still the YOLOv8 export, unchanged
        assert labels == want_labels
        np.testing.assert_allclose(boxes, want_boxes, atol=0.05)
        if "model_path" in values or values.get("model_format") == "ssd":  # reached the core
            status = client.status_where(t0, lambda s, f=fragment: f in s.get("last_rejected_change", ""),
                                         f"the rejected change ({fragment}) in the diagnostics")
            assert status["model_format"] == "yolov8" and status["model_path"] == str(YOLO.path())


def test_a_fixed_640_input_model_works_with_any_camera_size(node):
    client: Client = node["client"]
    fixed = fixed_640(YOLO.path(), node["tmp"] / "yolov8n_640.onnx")
    t0 = time.monotonic()
    ok, reason = client.set(model_path=str(fixed))
    assert ok, reason
    status = client.status_since(t0, "model_path", str(fixed))
    assert "fixed 640x640" in status["preprocess"]
    for height, width in ((240, 320), (720, 1280), (500, 741)):
        rgb = resize(astronaut(), height, width)
        boxes, labels, _ = client.detect(rgb)
        want_boxes, want_labels = reference(fixed, rgb)
        assert labels == want_labels and len(labels)
        np.testing.assert_allclose(boxes, want_boxes, atol=0.05)
    shapes = {s.get("input_shape") for _, s in client.statuses if s.get("model_path") == str(fixed)}
    assert shapes <= {"", "1x3x640x640"}, shapes  # every camera size became the one fixed input


def test_under_the_budget_manager_the_detections_stay_the_unbudgeted_ones(node):
    """The budget manager splits a pool halfway between the detector's minimum and its full
    in-memory need: the node runs the real model streamed, and its boxes do not change."""
    client: Client = node["client"]
    fixed = node["tmp"] / "yolov8n_640.onnx"
    t0 = time.monotonic()

    def profile():
        with client.lock:
            return next((p for p in reversed(client.profiles) if p.full_mb > p.min_mb > 0), None)
    client.status_since(0.0, "model_path", str(fixed))  # the fixed model serves (the test before)
    prof = wait_for(profile, 120, "a profile of the fixed model with its minimum and full need")
    assert prof.host == settings().host_id  # the manager splits only its own host's memory
    pool = round((prof.min_mb + prof.full_mb) / 2, 1)
    params = node["tmp"] / "manager.yaml"
    params.write_text(yaml.safe_dump({"/**": {"ros__parameters": {
        "node_names": ["pedestrian_node"], "node_priorities": [1.0], "node_min_mb": [0.0], "node_max_mb": [0.0],
        "reserve_mb": 0.0, "total_budget_mb": pool, "rate_hz": 4.0, "min_interval_s": 0.5,
        "hysteresis_mb": 0.5, "hysteresis_frac": 0.01}}}))
    log = (node["tmp"] / "manager.log").open("w")
    manager = subprocess.Popen([sys.executable, "-m", "dynnet_ros.nodes.budget_manager", "--ros-args",
                                "-r", f"__ns:={NS}", "--params-file", str(params)],
                               stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    try:
        status = client.status_where(t0, lambda s: 0 < (s.get("memory_budget_mb") or 0) < prof.full_mb,
                                     "a budget from the manager below the model's full need")
        assert status["memory_budget_mb"] <= pool + 1e-6
        for height, width in ((480, 640), (240, 320)):
            rgb = resize(astronaut(), height, width)
            boxes, labels, _ = client.detect(rgb)
            want_boxes, want_labels = reference(fixed, rgb)
            assert labels == want_labels and len(labels)
            np.testing.assert_allclose(boxes, want_boxes, atol=0.05)

        # the manager owns the budget: a hand-set one is refused, naming where to set it
        assigned, owner = client.get("memory_budget_mb", "budget_owner")
        assert owner == f"{NS}/budget_manager" and 0 < assigned <= pool + 1e-6
        ok, reason = client.set(memory_budget_mb=2000.0)
        assert not ok and f"assigned by the budget manager {NS}/budget_manager" in reason, reason
        assert "node_max_mb" in reason and "'pedestrian_node'" in reason, reason
        results = client.set_request(memory_budget_mb=2000.0)
        assert [ok for ok, _ in results] == [False], results
        assert client.get("memory_budget_mb")[0] != 2000.0
    finally:
        stop_process_group(manager)
        log.close()
    # with the manager gone, a budget set by hand holds
    wait_for(lambda: "budget_manager" not in client.ros.node.get_node_names(), 60, "the manager leaving the graph")
    ok, reason = client.set(memory_budget_mb=2000.0)
    assert ok, reason
    t1 = time.monotonic()
    client.status_since(t1, "memory_budget_mb", 2000.0)
    assert client.get("memory_budget_mb") == [2000.0]


def test_a_real_detector_under_a_quarter_weight_budget_gives_the_unbudgeted_detections():
    rgb = astronaut()
    with Detector(str(YOLO.path()), score_threshold=0.3, swappable=True) as det:
        free = det(rgb)
        det.engine.set_memory_budget(det.engine.min_budget_mb() * 1.001)
        det(rgb)
        window = det.engine.engine_stats().window
        assert window is not None
        quarter = (window.nonweight_bytes + 0.25 * window.weight_bytes) / 2**20
        det.engine.set_memory_budget(max(quarter, det.engine.min_budget_mb() * 1.001))
        budgeted = det(rgb)
        window = det.engine.engine_stats().window
        assert window.allowance_bytes < 0.3 * window.weight_bytes      # a quarter of the weights held
        assert window.last_frame_read_bytes > 0                        # the rest streamed in this frame
    assert len(free) > 0
    np.testing.assert_array_equal(budgeted.class_ids, free.class_ids)
    np.testing.assert_allclose(budgeted.boxes_xyxy, free.boxes_xyxy, atol=1e-3)
    np.testing.assert_allclose(budgeted.scores, free.scores, atol=1e-5)
