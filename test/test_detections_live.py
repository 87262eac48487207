"""`dynnet infer` answers what a live pedestrian node answers, read back as real vision_msgs.

One pedestrian node process with the node's default parameters (only its camera link made
reliable, so no frame is lost) runs a real pretrained detector (YOLOv8n from the nudenet wheel,
test/_corpus.py, whose export records ``imgsz`` 320); each bundled photograph goes to it as an
rgb8 Image with a stamp of its own. A subscriber of this process reads the node's
``vision_msgs/Detection2DArray`` (the real message package, built in .venv/ros2-interfaces):
class ids, scores and boxes in camera pixels, the header carried through. `dynnet infer` on
the same photo files, with no options, must give the same detections.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import yaml
from _corpus import PHOTO_FILES, by_name, package_dir, photos
from _waiting import wait_for
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.time import Time
from std_msgs.msg import Header

from dynnet_ros import cli
from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.nodes.convert import array_to_image
from dynnet_ros.supervisor.runner import stop_process_group

try:  # optional: built from source beside the repo (`make test` sources it)
    from vision_msgs.msg import Detection2DArray
except ImportError:  # pragma: no cover - depends on the install
    Detection2DArray = None

NS = f"/detlive_{os.getpid()}"
YOLO = by_name("yolov8n-detector")
FRAME_ID = "detections_test_camera"
#: the JSON report rounds boxes to 0.01 px and scores to 1e-4
BOX_TOLERANCE_PX = 0.011
SCORE_TOLERANCE = 2e-4

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(Detection2DArray is None, reason="vision_msgs is not importable: source "
                       ".venv/ros2-interfaces/install/local_setup.sh (`make test` builds and sources it)"),
    pytest.mark.skipif(not YOLO.available() or not photos(), reason=YOLO.skip_reason),
    pytest.mark.graph,
]


class DetectionReader:
    """Publishes frames and keeps the node's Detection2DArray messages by stamp."""

    def __init__(self) -> None:
        self.ros = BackgroundNode("detections_live_test")
        node = self.ros.node
        self.lock = threading.Lock()
        self.arrays: dict[tuple[int, int], object] = {}
        reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        self.image_pub = node.create_publisher(type(array_to_image(np.zeros((1, 1, 3), np.uint8), "rgb8")),
                                               f"{NS}/camera/image_raw", reliable)
        node.create_subscription(Detection2DArray, f"{NS}/pedestrian/detections", self._on_array, reliable)
        self.stamp = 2000
        self.ros.start()

    def _on_array(self, msg) -> None:
        with self.lock:
            self.arrays[(msg.header.stamp.sec, msg.header.stamp.nanosec)] = msg

    def detect(self, rgb: np.ndarray) -> tuple[object, Header]:
        """Publish ``rgb`` with a stamp of its own until the node's array for it arrives."""
        self.stamp += 1
        header = Header(stamp=Time(seconds=self.stamp).to_msg(), frame_id=FRAME_ID)
        msg = array_to_image(rgb, "rgb8", header)
        key = (self.stamp, 0)

        def answered():
            self.image_pub.publish(msg)
            with self.lock:
                return self.arrays.get(key)
        return wait_for(answered, 240, f"detections for a {rgb.shape[1]}x{rgb.shape[0]} frame", interval=1.0), header

    def close(self) -> None:
        self.ros.close()


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("detections_live")
    params = tmp / "params.yaml"
    reliable_camera = {f"qos_overrides./{NS.strip('/')}/camera/image_raw.subscription.reliability": "reliable",
                       "model_path": str(YOLO.path())}
    params.write_text(yaml.safe_dump({"/**": {"ros__parameters": reliable_camera}}))
    log_path = tmp / "node.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "dynnet_ros.nodes.pedestrian_node", "--ros-args",
                                 "-r", f"__ns:={NS}", "--params-file", str(params)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    client = DetectionReader()
    try:
        wait_for(lambda: client.ros.node.count_publishers(f"{NS}/pedestrian/detections") > 0
                 and client.ros.node.count_subscribers(f"{NS}/camera/image_raw") > 0 or proc.poll() is not None,
                 240, "the pedestrian node's detections publisher and camera subscription")
        assert proc.poll() is None, log_path.read_text()
        yield client, log_path
    finally:
        client.close()
        stop_process_group(proc)


def box_xyxy(detection) -> list[float]:
    box = detection.bbox
    cx, cy = box.center.position.x, box.center.position.y
    return [cx - box.size_x / 2, cy - box.size_y / 2, cx + box.size_x / 2, cy + box.size_y / 2]


def test_infer_and_the_live_node_give_the_same_detections_read_as_vision_msgs(reader, tmp_path, capsys):
    client, log_path = reader
    root = package_dir("skimage")
    assert root is not None
    files = [root / "data" / name for name in PHOTO_FILES]
    code = cli.main(["infer", str(YOLO.path()), *map(str, files), "--out", str(tmp_path), "--json", "-"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["parameters"]["score_threshold"] == 0.3 and report["parameters"]["max_input_side"] == -1
    assert "fit into 320x320" in report["preprocess"]   # the export's own imgsz
    by_name = dict(photos())
    total = 0
    for path, entry in zip(files, report["images"]):
        rgb = by_name[Path(path).stem]
        array, header = client.detect(rgb)
        assert array.header.frame_id == FRAME_ID and array.header.stamp == header.stamp
        expected = entry["detections"]
        got = array.detections
        assert len(got) == len(expected), (path.name, expected, [box_xyxy(d) for d in got], log_path.read_text())
        for detection, want in zip(got, expected):
            assert detection.header.frame_id == FRAME_ID and detection.header.stamp == header.stamp
            [hypothesis] = detection.results
            assert hypothesis.hypothesis.class_id == want["class_name"]
            assert abs(hypothesis.hypothesis.score - want["score"]) <= SCORE_TOLERANCE, (path.name, want)
            assert np.allclose(box_xyxy(detection), want["box_xyxy"], atol=BOX_TOLERANCE_PX), (path.name, want)
        total += len(got)
    assert total > 0, "no photo had a detection: nothing was compared"
