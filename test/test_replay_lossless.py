"""`dynnet replay` loses no frame by default, and says so: a bag of real photographs replayed
with the shipped graph config reaches every model node, every frame is processed and answered
(the recording of the replay holds each model's output for each frame), and the report lists
per node and camera topic what became of the frames. A frame lost on purpose (``--realtime``
with a node capped far below the bag's rate) is a warning, and exit status 1 with ``--strict``;
a frame missing from the camera's stamps is counted by the node in /diagnostics. A real
detector's recorded detections equal `dynnet infer`'s on the same frames.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from _corpus import by_name
from _photo_bag import COMPRESSED_TOPIC, IMAGE_TOPIC, INFO_TOPIC, NS, header_ns, read_bag, write_photo_bag
from PIL import Image as PILImage
from sensor_msgs.msg import Image

from dynnet_ros.compressed import decode_rgb8
from dynnet_ros.graph_config import default_config_path
from dynnet_ros.nodes.convert import image_to_array
from dynnet_ros.nodes.diagnostics import status_values
from dynnet_ros.zoo import ensure_model

ROOT = Path(__file__).resolve().parents[1]
GRAPH_NS = f"/lossless_{os.getpid()}"
MODEL_NODES = ("lane_node", "pedestrian_node", "depth_node")
OUTPUTS = ("/lane/mask", "/pedestrian/markers", "/depth/image")

pytestmark = [pytest.mark.timeout(900), pytest.mark.graph]


def replay(*args: str, timeout: float = 840) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dynnet_ros.cli", "replay", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def frame_rows(summary: dict) -> dict[str, dict]:
    """node name (without namespace) -> its frame counts, from ``--json``."""
    return {row["node"].rsplit("/", 1)[1]: row for row in summary["frames"].values()}


@pytest.mark.parametrize("compress", [None, "jpeg"], ids=["raw", "jpeg"])
def test_a_bag_of_photos_replays_with_every_frame_processed_by_every_model_node(tmp_path, compress):
    """Raw: sensor_msgs/Image. JPEG: CompressedImage on /camera/image_raw/compressed only, as a
    robot records it; the model nodes take ``image_transport: compressed`` for it."""
    for task in ("lane", "pedestrian", "depth"):
        ensure_model(task)
    stamps = write_photo_bag(tmp_path / "photos.mcap", 6, compress=compress)
    namespace = f"{GRAPH_NS}_{compress or 'raw'}"
    camera = namespace + (IMAGE_TOPIC if compress is None else COMPRESSED_TOPIC)
    result = replay(str(tmp_path / "photos.mcap"), "--namespace", namespace, "--strict", "--linger", "1",
                    "--json", str(tmp_path / "replay.json"), "--record", str(tmp_path / "out.mcap"))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "every model node processed every frame" in result.stdout, output[-4000:]
    assert "warning" not in result.stderr and "lost" not in result.stderr, result.stderr
    rows = frame_rows(json.loads((tmp_path / "replay.json").read_text()))
    assert set(rows) == set(MODEL_NODES), rows
    for node, row in rows.items():
        assert row["topic"] == camera
        assert (row["published"], row["received"], row["processed"], row["dropped"], row["lost"]) == (6, 6, 6, 0, 0), \
            (node, row)
        assert f"{namespace}/{node} <- {camera}: published 6, received 6, processed 6" in result.stdout
    if compress is not None:
        assert "take image_transport=compressed: the bag's camera is compressed" in result.stdout
    recorded = read_bag(tmp_path / "out.mcap")  # the recorder records CompressedImage topics too
    assert [header_ns(m) for m in recorded[camera]] == stamps
    for topic in OUTPUTS:  # each model answered each photo, once, in order
        assert [header_ns(m) for m in recorded.get(namespace + topic, [])] == stamps, topic


def to_rclpy_image(msg) -> Image:
    """A rosbags Image as rclpy's, for the package's own conversion."""
    return Image(height=msg.height, width=msg.width, encoding=msg.encoding, is_bigendian=msg.is_bigendian,
                 step=msg.step, data=bytes(msg.data))


def lane_only_config(tmp_path: Path, **params) -> Path:
    data = yaml.safe_load(default_config_path().read_text())
    data["nodes"] = [node for node in data["nodes"] if node["name"] == "lane_node"]
    data["nodes"][0]["parameters"].update(params)
    path = tmp_path / "lane.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_frames_lost_in_a_replay_are_a_warning_and_fail_strict(tmp_path):
    """``--realtime`` plays on the bag's clock whatever the nodes do: a lane node that takes one
    frame per 60 s drops the frames arriving meanwhile. The bag also lacks frame 4 (the camera
    lost it), which the node counts from the stamps."""
    ensure_model("lane")
    frames = write_photo_bag(tmp_path / "gap.mcap", 7, period_ns=NS // 10, skip=(4,))
    namespace = f"{GRAPH_NS}_lost"
    result = replay(str(tmp_path / "gap.mcap"), "--namespace", namespace, "--config",
                    str(lane_only_config(tmp_path, max_rate_hz=1 / 60)), "--realtime", "--strict", "--linger", "3",
                    "--json", str(tmp_path / "replay.json"), "--record", str(tmp_path / "out.mcap"))
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]
    row = frame_rows(json.loads((tmp_path / "replay.json").read_text()))["lane_node"]
    assert row["published"] == len(frames) == 6 and row["processed"] < 6 and row["dropped"] >= 1, row
    assert row["lost"] == 6 - row["processed"], row
    assert f"dynnet replay: warning: {namespace}/lane_node lost {row['lost']} of 6 frames from " \
           f"{namespace}{IMAGE_TOPIC}" in result.stderr, output[-4000:]
    assert "dropped (replaced by a newer frame before the model took it)" in result.stderr
    # the node's own count of frames missing from the camera's stamps (frame 4), in /diagnostics
    statuses = [status for array in read_bag(tmp_path / "out.mcap")["/diagnostics"] for status in array.status
                if status.hardware_id == f"{namespace}/lane_node"]
    values = [status_values(status) for status in statuses]
    received = [v for v in values if v.get("frames_received") == 6]
    assert received, [(v.get("frames_received"), v.get("frames_missing")) for v in values]
    assert {v["frames_missing"] for v in received} == {1} and {v["frames_out_of_order"] for v in received} == {0}


def test_bad_compressed_payloads_are_error_diagnostics_and_the_node_keeps_serving(tmp_path):
    """JPEG and PNG frames with a truncated JPEG, bytes that are no image, and a depth-image
    format between them: each bad frame fails with an ERROR diagnostic naming why, and the next
    good frame is processed and answered."""
    ensure_model("lane")
    from_photos = write_photo_bag(tmp_path / "good.mcap", 7, compress=("jpeg", "jpeg", "png"))
    jpeg = read_bag(tmp_path / "good.mcap")[COMPRESSED_TOPIC][0]
    truncated = bytes(jpeg.data[: len(jpeg.data) // 2])
    bad = {1: ("rgb8; jpeg compressed bgr8", truncated), 3: ("jpeg", b"not an image at all"),
           5: ("16UC1; compressedDepth png", bytes(jpeg.data))}
    stamps = write_photo_bag(tmp_path / "bad.mcap", 7, compress=("jpeg", "jpeg", "png"), payloads=bad)
    assert stamps == from_photos
    namespace = f"{GRAPH_NS}_bad"
    result = replay(str(tmp_path / "bad.mcap"), "--namespace", namespace, "--config", str(lane_only_config(tmp_path)),
                    "--linger", "3", "--json", str(tmp_path / "replay.json"), "--record", str(tmp_path / "out.mcap"))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]  # lost frames fail only --strict
    row = frame_rows(json.loads((tmp_path / "replay.json").read_text()))["lane_node"]
    assert (row["published"], row["received"], row["processed"], row["failed"], row["lost"]) == (7, 7, 4, 3, 3), row
    assert f"warning: {namespace}/lane_node lost 3 of 7 frames" in result.stderr and "3 failed" in result.stderr
    recorded = read_bag(tmp_path / "out.mcap")
    good = [s for i, s in enumerate(stamps) if i not in bad]
    assert [header_ns(m) for m in recorded[namespace + "/lane/mask"]] == good  # the frames after each bad one too
    errors = {status.message for array in recorded["/diagnostics"] for status in array.status
              if status.hardware_id == f"{namespace}/lane_node" and status.level == b"\x02"[0]}
    for reason in ("does not decode as JPEG", "is neither JPEG nor PNG", "compressed_depth_image_transport"):
        assert any(reason in message for message in errors), (reason, errors)


LABEL_NS = "pedestrian_labels"


def recorded_detections(markers, k_for) -> dict[int, list[tuple[str, list[float]]]]:
    """stamp -> [(label text, box corners in camera pixels)] from the recorded MarkerArrays: the
    label's position is the box's top-left corner back-projected onto z = 1 m with the frame's K."""
    out: dict[int, list[tuple[str, list[float]]]] = {}
    for array in markers:
        stamp = header_ns(array)
        boxes = {m.id: m for m in array.markers if m.ns == "pedestrian_boxes"}
        rows = []
        for text in sorted((m for m in array.markers if m.ns == LABEL_NS), key=lambda m: m.id):
            fx, fy, cx, cy = k_for(stamp)
            corners = [(p.x * fx + cx, p.y * fy + cy) for p in boxes[text.id].points]
            rows.append((text.text, [corners[0][0], corners[0][1], corners[2][0], corners[2][1]]))
        out[stamp] = rows
    return out


@pytest.mark.parametrize("compress", [None, "jpeg"], ids=["raw", "jpeg"])
def test_replayed_detections_equal_dynnet_infers_on_the_same_frames(tmp_path, compress):
    """A real detector (YOLOv8n from the nudenet wheel) in the pedestrian node of the shipped
    config, the photo bag replayed into it: the recorded detections of every frame are those
    `dynnet infer` gives for the same pixels (the photos, or the JPEG frames as decoded)."""
    yolo = by_name("yolov8n-detector")
    if not yolo.available():
        pytest.skip(yolo.skip_reason)
    data = yaml.safe_load(default_config_path().read_text())
    data["nodes"] = [node for node in data["nodes"] if node["name"] == "pedestrian_node"]
    data["nodes"][0]["parameters"]["model_path"] = str(yolo.path())
    config = tmp_path / "yolo.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    stamps = write_photo_bag(tmp_path / "photos.mcap", 6, compress=compress)
    frames = read_bag(tmp_path / "photos.mcap")
    camera = frames[IMAGE_TOPIC if compress is None else COMPRESSED_TOPIC]
    files = []
    for index, msg in enumerate(camera):  # the pixels the node gets, as lossless files for infer
        rgb = image_to_array(to_rclpy_image(msg)) if compress is None else decode_rgb8(msg.data, msg.format)
        files.append(tmp_path / f"frame{index}.png")
        PILImage.fromarray(rgb).save(files[-1])
    infer = subprocess.run([sys.executable, "-m", "dynnet_ros.cli", "infer", str(yolo.path()), *map(str, files),
                            "--out", str(tmp_path / "infer"), "--json", "-"], cwd=ROOT, capture_output=True,
                           text=True, timeout=600)
    assert infer.returncode == 0, infer.stderr
    expected = json.loads(infer.stdout)["images"]
    namespace = f"{GRAPH_NS}_infer_{compress or 'raw'}"
    result = replay(str(tmp_path / "photos.mcap"), "--namespace", namespace, "--config", str(config), "--strict",
                    "--linger", "1", "--record", str(tmp_path / "out.mcap"))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    infos = {header_ns(info): info for info in frames[INFO_TOPIC]}
    recorded = recorded_detections(read_bag(tmp_path / "out.mcap")[namespace + "/pedestrian/markers"],
                                   lambda stamp: (infos[stamp].k[0], infos[stamp].k[4], infos[stamp].k[2],
                                                  infos[stamp].k[5]))
    assert list(recorded) == stamps
    total = 0
    for stamp, entry in zip(stamps, expected):
        want = [(f"{d['class_name'] or d['class_id']} {d['score']:.2f}", d["box_xyxy"]) for d in entry["detections"]]
        got = recorded[stamp]
        assert [text for text, _ in got] == [text for text, _ in want], (entry["image"], got, want)
        for (_, box), (_, want_box) in zip(got, want):
            assert np.allclose(box, want_box, atol=0.011), (entry["image"], box, want_box)  # infer rounds to 0.01
        total += len(got)
    assert total > 0, "no frame had a detection: nothing was compared"
