"""The Foxglove live view: conversions to Foxglove messages, and `dynnet up --foxglove` served on
loopback to a real WebSocket client.

Foxglove's messages are opaque objects that only encode to protobuf, so the tests read them the
way a client does: ``encode()`` (or the WebSocket payload) decoded field by field with the
numbers of Foxglove's schemas (RawImage: timestamp 1, width 2, height 3, encoding 4, step 5,
data 6, frame_id 7; ...).
"""
from __future__ import annotations

import json
import os
import socket
import struct
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml
from _up import Up
from _waiting import wait_for
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, Image
from std_msgs.msg import Header
from visualization_msgs.msg import MarkerArray
from websockets.sync.client import connect

from dynnet_ros.graph_config import default_config_path, parse_graph, separate_processes
from dynnet_ros.nodes import diagnostics as diag
from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.nodes.convert import array_to_image
from dynnet_ros.nodes.foxglove_view import marker_outlines
from dynnet_ros.nodes.pedestrian_node import markers
from dynnet_ros.perception import Detections
from dynnet_ros.perception.serving import FrameInfo
from dynnet_ros.sim.scene import camera_matrix
from dynnet_ros.view.cameras import CameraModels
from dynnet_ros.view.convert import (
    MAX_DEPTH_MM,
    Stamp,
    box_annotations,
    camera_calibration,
    depth_image,
    mask_image,
    plane_boxes,
    raw_image,
)
from dynnet_ros.view.server import LOOPBACK_HOST

pytestmark = pytest.mark.graph

STAMP = Stamp(1234, 567_000_000)
LINE_LOOP = 2  # foxglove.PointsAnnotation.Type


# --------------------------------------------------------------------------- protobuf, as a client reads it

def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def fields(data: bytes) -> dict[int, list]:
    """Field number -> values of one protobuf message (varints as int, fixed32 as unsigned int,
    fixed64 as double, length-delimited as bytes)."""
    out: dict[int, list] = {}
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        wire = key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 1:
            value, i = struct.unpack_from("<d", data, i)[0], i + 8
        elif wire == 2:
            size, i = _varint(data, i)
            value, i = bytes(data[i:i + size]), i + size
        elif wire == 5:
            value, i = struct.unpack_from("<I", data, i)[0], i + 4
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        out.setdefault(key >> 3, []).append(value)
    return out


def timestamp(data: bytes) -> Stamp:
    f = fields(data)  # google.protobuf.Timestamp: seconds 1, nanos 2 (zero values are left out)
    return Stamp(f.get(1, [0])[0], f.get(2, [0])[0])


def image_fields(data: bytes) -> dict:
    f = fields(data)
    return {"stamp": timestamp(f[1][0]), "width": f[2][0], "height": f[3][0], "encoding": f[4][0].decode(),
            "step": f[5][0], "data": f[6][0], "frame_id": f.get(7, [b""])[0].decode()}


def point(data: bytes) -> tuple[float, float]:
    f = fields(data)
    return f.get(1, [0.0])[0], f.get(2, [0.0])[0]


# --------------------------------------------------------------------------- conversions

def test_raw_image_writes_contiguous_little_endian_rows_with_stamp_and_frame():
    depth_mm = np.array([[1, 258, 65535], [4096, 0, 7]], dtype=">u2")  # big-endian input, host order inside
    msg = image_fields(raw_image(depth_mm.astype(np.uint16), "16UC1", STAMP, "cam").encode())
    assert msg == {"stamp": STAMP, "width": 3, "height": 2, "encoding": "16UC1", "step": 6,
                   "data": depth_mm.astype("<u2").tobytes(), "frame_id": "cam"}
    rgb = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)[:, ::2]  # a strided view
    msg = image_fields(raw_image(rgb, "rgb8", STAMP, "cam").encode())
    assert (msg["width"], msg["height"], msg["step"]) == (3, 4, 9)
    assert msg["data"] == np.ascontiguousarray(rgb).tobytes()


@pytest.mark.parametrize("array,encoding,reason", [
    (np.zeros((2, 2), np.uint8), "rgb8", "3 channel"),
    (np.zeros((2, 2), np.float32), "mono8", "uint8 pixels"),
    (np.zeros((2, 2), np.uint8), "yuv422", "unsupported image encoding"),
])
def test_raw_image_refuses_arrays_that_do_not_fit_the_encoding(array, encoding, reason):
    with pytest.raises(ValueError, match=reason):
        raw_image(array, encoding, STAMP, "cam")


def test_depth_goes_out_as_16uc1_millimetres_with_no_depth_as_zero():
    metres = np.array([[0.5, 1.2344, np.nan], [np.inf, -1.0, 70.0]], np.float32)
    msg = image_fields(depth_image(metres, STAMP, "cam").encode())
    assert (msg["encoding"], msg["width"], msg["height"], msg["step"]) == ("16UC1", 3, 2, 6)
    mm = np.frombuffer(msg["data"], "<u2").reshape(2, 3)
    np.testing.assert_array_equal(mm, [[500, 1234, 0], [0, 0, MAX_DEPTH_MM]])


def test_a_mask_becomes_mono8_with_255_where_set():
    msg = image_fields(mask_image(np.array([[0, 1], [255, 0]], np.uint8), STAMP, "cam").encode())
    assert (msg["encoding"], msg["step"]) == ("mono8", 2)
    assert msg["data"] == bytes([0, 255, 255, 0])
    with pytest.raises(ValueError, match="HxW"):
        mask_image(np.zeros((2, 2, 3), np.uint8), STAMP, "cam")


def test_boxes_become_closed_outlines_and_labels_at_the_image_stamp():
    boxes = np.array([[10.0, 20.0, 50.0, 80.0], [0.5, 1.5, 2.5, 3.5]])
    f = fields(box_annotations(boxes, ["person 0.91", "7 0.40"], STAMP).encode())
    assert timestamp(f[5][0]) == STAMP
    outlines = [fields(p) for p in f[2]]
    assert [o[2][0] for o in outlines] == [LINE_LOOP, LINE_LOOP]
    assert [point(p) for p in outlines[0][3]] == [(10.0, 20.0), (50.0, 20.0), (50.0, 80.0), (10.0, 80.0)]
    assert all(timestamp(o[1][0]) == STAMP for o in outlines)
    texts = [fields(t) for t in f[3]]
    assert [t[3][0].decode() for t in texts] == ["person 0.91", "7 0.40"]
    assert [point(t[2][0]) for t in texts] == [(10.0, 20.0), (0.5, 1.5)]


def test_no_boxes_is_an_empty_annotation_that_clears_the_last_ones():
    f = fields(box_annotations(np.zeros((0, 4)), [], STAMP).encode())
    assert timestamp(f[5][0]) == STAMP and 2 not in f and 3 not in f
    with pytest.raises(ValueError, match="2 boxes but 1 labels"):
        box_annotations(np.zeros((2, 4)), ["a"], STAMP)


def test_calibration_carries_k_r_p_and_the_distortion():
    k = camera_matrix(640, 480)
    p = np.hstack([k, np.zeros((3, 1))])
    msg = camera_calibration(640, 480, k.ravel(), STAMP, "cam", distortion_model="plumb_bob", d=[0.1] * 5,
                             r=np.eye(3).ravel(), p=p.ravel())
    f = fields(msg.encode())
    assert (timestamp(f[1][0]), f[2][0], f[3][0], f[4][0], f[9][0]) == (STAMP, 640, 480, b"plumb_bob", b"cam")
    np.testing.assert_array_equal(np.frombuffer(f[6][0], "<f8"), k.ravel())
    np.testing.assert_array_equal(np.frombuffer(f[8][0], "<f8"), p.ravel())
    np.testing.assert_array_equal(np.frombuffer(f[5][0], "<f8"), [0.1] * 5)


def test_pedestrian_markers_go_back_to_the_pixel_boxes_they_were_drawn_from():
    """The adapter's half: markers as pedestrian_node draws them -> outlines -> pixels."""
    detections = Detections(np.array([[10.5, 20.0, 110.0, 220.25], [300.0, 40.0, 340.0, 120.0]], np.float32),
                            np.array([0.91, 0.4], np.float32), np.array([0, 7], np.int64), ["person", ""])
    header = Header(frame_id="cam")
    header.stamp.sec, header.stamp.nanosec = STAMP.sec, STAMP.nanosec
    k = camera_matrix(640, 480)
    outlines, labels, first = marker_outlines(markers(FrameInfo(header, 640, 480, "rgb8"), detections, k))
    np.testing.assert_allclose(plane_boxes(outlines, k), detections.boxes_xyxy, atol=1e-3)
    assert labels == ["person 0.91", "7 0.40"]
    assert first.stamp.sec == STAMP.sec and first.frame_id == "cam"


def test_camera_models_pick_k_like_the_model_nodes():
    cameras = CameraModels(camera_matrix)
    np.testing.assert_array_equal(cameras.k_for(320, 240), camera_matrix(320, 240))  # nothing seen: default
    k = np.array([[500.0, 0, 319.5], [0, 500.0, 239.5], [0, 0, 1]])
    cameras.intrinsics(640, 480, k.ravel())
    np.testing.assert_array_equal(cameras.k_for(640, 480), k)
    np.testing.assert_allclose(cameras.k_for(320, 240), [[250.0, 0, 159.75], [0, 250.0, 119.75], [0, 0, 1]])
    for bad in ([1.0] * 8, [0.0] * 9, [np.nan] * 9):
        with pytest.raises(ValueError, match="camera matrix"):
            cameras.intrinsics(640, 480, bad)
    assert cameras.size_at(5) is None
    cameras.frame(5, 640, 480)
    cameras.frame(6, 320, 240)
    assert cameras.size_at(5) == (640, 480) and cameras.size_at(99) == (320, 240)  # unknown: the latest


# --------------------------------------------------------------------------- the live view under `dynnet up`

NS = f"/foxglove_{os.getpid()}"
TOPICS = {  # Foxglove topic -> schema
    f"{NS}/camera/image_raw": "foxglove.RawImage",
    f"{NS}/camera/camera_info": "foxglove.CameraCalibration",
    f"{NS}/lane/mask": "foxglove.RawImage",
    f"{NS}/lane/labels": "foxglove.RawImage",
    f"{NS}/depth/image": "foxglove.RawImage",
    f"{NS}/pedestrian/annotations": "foxglove.ImageAnnotations",
}
VIEW_STATUS = "foxglove_view: Foxglove live view"
SIM_STATUS = "sensor_sim: sensor simulator"


def quiet_graph(path: Path) -> Path:
    """A graph of the simulator alone, not publishing: the test feeds the view its own messages."""
    data = yaml.safe_load(default_config_path().read_text())
    data = separate_processes(data)
    data["nodes"] = [n for n in data["nodes"] if n["name"] == "sensor_sim"]
    data["nodes"][0]["parameters"]["enabled"] = False
    parse_graph(data, "foxglove graph")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class Feeder:
    """The test's own ROS node: publishes a camera frame and its outputs under one stamp each
    round, and keeps the live view's diagnostics."""

    def __init__(self) -> None:
        self.ros = BackgroundNode("foxglove_test_feeder")
        node = self.ros.node
        self.camera = node.create_publisher(Image, f"{NS}/camera/image_raw", qos_profile_sensor_data)
        self.info = node.create_publisher(CameraInfo, f"{NS}/camera/camera_info", qos_profile_sensor_data)
        self.mask = node.create_publisher(Image, f"{NS}/lane/mask", 2)
        self.depth = node.create_publisher(Image, f"{NS}/depth/image", 2)
        self.markers = node.create_publisher(MarkerArray, f"{NS}/pedestrian/markers", 2)
        self.statuses: list = []  # the view's and the simulator's
        self.lock = threading.Lock()
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        self.sent: set[int] = set()  # stamps (ns) published
        self.rgb = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
        self.ros.start()

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        with self.lock:
            self.statuses += [s for s in msg.status if s.name in (VIEW_STATUS, SIM_STATUS)]

    def levels(self, name: str = VIEW_STATUS) -> list[tuple[int, str]]:
        with self.lock:
            return [(diag.level_value(s.level), s.message) for s in self.statuses if s.name == name]

    def publish(self, round_: int) -> None:
        header = Header(frame_id="fx_camera")
        header.stamp.sec, header.stamp.nanosec = 2000 + round_, 123_456_789
        k = camera_matrix(64, 48)
        info = CameraInfo(header=header, width=64, height=48, distortion_model="plumb_bob")
        info.k = [float(v) for v in k.ravel()]
        self.info.publish(info)
        self.camera.publish(array_to_image(self.rgb, "rgb8", header))
        self.mask.publish(array_to_image((self.rgb[:, :, 0] > 127).astype(np.uint8) * 255, "mono8", header))
        self.depth.publish(array_to_image(np.full((48, 64), 7.5, np.float32), "32FC1", header))
        boxes = Detections(np.array([[8.0, 4.0, 40.0, 44.0]], np.float32), np.array([0.8], np.float32),
                           np.array([0], np.int64), ["person"])
        self.markers.publish(markers(FrameInfo(header, 64, 48, "rgb8"), boxes, k))
        self.sent.add(header.stamp.sec * 1_000_000_000 + header.stamp.nanosec)


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


@pytest.mark.timeout(600)
def test_up_foxglove_serves_the_graph_on_loopback_and_survives_a_busy_port(tmp_path):
    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # another server on the port asked for
    busy.bind((LOOPBACK_HOST, 0))
    busy.listen()
    port = busy.getsockname()[1]
    feeder = Feeder()
    up = Up(quiet_graph(tmp_path / "vehicle.yaml"), NS, ("--foxglove", "--foxglove-port", str(port)))
    try:
        # the busy port: one ERROR line and an ERROR diagnostic; the graph and the view keep running
        refused = f"cannot serve the live view on {LOOPBACK_HOST}:{port}"
        wait_for(lambda: any(refused in line for line in up.out) or up.proc.poll() is not None, 240,
                 "the live view reporting the busy port")
        assert up.proc.poll() is None, up.log()
        wait_for(lambda: any(level == diag.ERROR and str(port) in text for level, text in feeder.levels()),
                 60, "an ERROR diagnostic about the busy port")
        wait_for(lambda: feeder.levels(SIM_STATUS), 240, "the simulator serving beside the refused view")
        assert up.proc.poll() is None and up.pid("foxglove_view"), up.log()

        # the port frees: the retry binds it, on 127.0.0.1 only
        busy.close()
        wait_for(lambda: any(f"serving the live view on ws://{LOOPBACK_HOST}:{port}" in line for line in up.out),
                 60, "the live view serving once the port is free")
        assert sum(refused in line for line in up.out) == 1, up.log()  # the retries stay quiet
        wait_for(lambda: any(level == diag.OK for level, _ in feeder.levels()[-1:]), 30,
                 "an OK diagnostic once serving")
        listening = listening_addresses(up.pid("foxglove_view"))
        assert (LOOPBACK_HOST, port) in listening, listening
        assert {ip for ip, _ in listening} == {LOOPBACK_HOST}, listening

        with connect(f"ws://{LOOPBACK_HOST}:{port}", subprotocols=["foxglove.sdk.v1"], open_timeout=30,
                     max_size=None) as ws:
            assert ws.subprotocol == "foxglove.sdk.v1"
            channels: dict[str, dict] = {}

            def advertised() -> bool:
                message = ws.recv(timeout=1.0)
                if isinstance(message, str) and json.loads(message)["op"] == "advertise":
                    channels.update({c["topic"]: c for c in json.loads(message)["channels"]})
                return set(TOPICS) <= set(channels)

            wait_for(lambda: _ignore_timeout(advertised), 60, "the view's channels advertised")
            assert {t: channels[t]["schemaName"] for t in TOPICS} == TOPICS
            by_id = {c["id"]: t for t, c in channels.items()}
            ws.send(json.dumps({"op": "subscribe", "subscriptions": [{"id": cid, "channelId": cid}
                                                                    for cid in by_id]}))

            received: dict[str, list[tuple[int, bytes]]] = {}
            round_ = [0]

            def all_topics_arrived() -> bool:
                feeder.publish(round_[0])
                round_[0] += 1
                while True:
                    try:
                        message = ws.recv(timeout=0.3)
                    except TimeoutError:
                        break
                    if isinstance(message, bytes) and message[0] == 0x01:  # messageData
                        subscription, log_time = struct.unpack_from("<IQ", message, 1)
                        received.setdefault(by_id[subscription], []).append((log_time, message[13:]))
                wanted = set(TOPICS) - {f"{NS}/lane/labels"}  # nobody publishes class maps here
                return wanted <= set(received)

            wait_for(all_topics_arrived, 120, "a message on every fed channel", interval=0.0)
    finally:
        busy.close()
        feeder.ros.close()
        code = up.stop()
    log = up.log()
    assert code == 0, log
    assert not any("Traceback" in line for line in up.out + up.err), log

    # every message went out under the stamp of the input it came from, as its log time and timestamp
    for topic, messages in received.items():
        assert {t for t, _ in messages} <= feeder.sent, topic
    log_time, payload = received[f"{NS}/camera/image_raw"][0]
    camera = image_fields(payload)
    assert camera["stamp"].ns == log_time and camera["frame_id"] == "fx_camera"
    assert (camera["width"], camera["height"], camera["encoding"]) == (64, 48, "rgb8")
    assert camera["data"] == feeder.rgb.tobytes()
    depth = image_fields(received[f"{NS}/depth/image"][0][1])
    assert depth["encoding"] == "16UC1" and set(np.frombuffer(depth["data"], "<u2")) == {7500}
    annotations = fields(received[f"{NS}/pedestrian/annotations"][0][1])
    [outline] = [fields(p) for p in annotations[2]]
    np.testing.assert_allclose([point(p) for p in outline[3]], [(8, 4), (40, 4), (40, 44), (8, 44)], atol=1e-3)
    assert [fields(t)[3][0] for t in annotations[3]] == [b"person 0.80"]


def _ignore_timeout(step) -> bool:
    try:
        return step()
    except TimeoutError:
        return False

