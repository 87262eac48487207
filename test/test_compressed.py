"""image_transport's compressed camera images (``dynnet_ros.compressed``, ``dynnet sim --record
--compress``): format strings as the compressed plugin writes them, JPEG and PNG of real photos
decoded to RGB, red and blue swapped back where the publisher compressed RGB as BGR, grey and
16-bit images, and every bad payload a ValueError that names it. The nodes' side (ERROR
diagnostic, keep serving) is in test_replay_lossless.py."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
import rclpy
from _corpus import photos
from PIL import Image
from rclpy.parameter import Parameter
from rosbags.highlevel import AnyReader

from dynnet_ros import cli
from dynnet_ros.bags.scenes import CLOUD_TOPIC, COMPRESSED_TOPIC, INFO_TOPIC, record_scenes
from dynnet_ros.bags.writer import standard_typestore
from dynnet_ros.compressed import CompressedFormat, compressed_topic, decode_rgb8, encode_rgb8, parse_format
from dynnet_ros.nodes.base import declare
from dynnet_ros.nodes.model_params import common_specs
from dynnet_ros.sim.frames import SimSettings, render_frame

pytestmark = pytest.mark.graph


@pytest.fixture(scope="module")
def photo() -> np.ndarray:
    found = photos()
    assert found, "scikit-image's photographs are missing"
    return found[1][1]  # coffee, 400x600


def mean_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


@pytest.mark.parametrize("text, parsed", [
    ("rgb8; jpeg compressed bgr8", CompressedFormat("jpeg", "rgb8")),
    ("bgr8; png compressed bgr8", CompressedFormat("png", "bgr8")),
    ("rgb8; jpeg compressed rgb8", CompressedFormat("jpeg", "rgb8", swapped=True)),
    ("mono8; jpeg compressed ", CompressedFormat("jpeg", "mono8")),
    ("mono16; png compressed ", CompressedFormat("png", "mono16")),
    ("jpeg", CompressedFormat("jpeg")),
    ("PNG", CompressedFormat("png")),
])
def test_format_strings_parse_as_image_transport_writes_them(text, parsed):
    assert parse_format(text) == parsed
    if parsed.encoding:
        assert parse_format(parsed.text()) == parsed
        assert parsed.text().rstrip() == text.rstrip()


@pytest.mark.parametrize("text, reason", [
    ("gif", "expected 'jpeg', 'png'"),
    ("rgb8; webp compressed bgr8", "expected '<encoding>; <jpeg|png> compressed"),
    ("16UC1; compressedDepth png", "compressed_depth_image_transport"),
])
def test_unknown_formats_are_refused_with_the_reason(text, reason):
    with pytest.raises(ValueError, match=reason):
        parse_format(text)


@pytest.mark.parametrize("codec, tolerance", [("jpeg", 4.0), ("png", 0.0)])
def test_a_photo_round_trips(photo, codec, tolerance):
    data, fmt = encode_rgb8(photo, codec)
    assert fmt == f"rgb8; {codec} compressed bgr8" and len(data) < photo.nbytes
    decoded = decode_rgb8(data, fmt)
    assert decoded.shape == photo.shape and decoded.dtype == np.uint8
    assert mean_error(decoded, photo) <= tolerance


@pytest.mark.parametrize("codec", ["JPEG", "PNG"])
def test_another_encoders_file_decodes_to_its_true_colours(photo, codec):
    """Pillow's encoder, not ours: a file holds true colours (the plugin compresses from BGR)."""
    buffer = io.BytesIO()
    Image.fromarray(photo).save(buffer, format=codec, quality=90)
    decoded = decode_rgb8(buffer.getvalue(), f"bgr8; {codec.lower()} compressed bgr8")
    assert mean_error(decoded, photo) <= (4.0 if codec == "JPEG" else 0.0)


def test_rgb_compressed_as_bgr_is_swapped_back(photo):
    swapped = np.ascontiguousarray(photo[:, :, ::-1])  # what a BGR encoder stores when handed RGB
    data, _ = encode_rgb8(swapped, "png")
    assert mean_error(decode_rgb8(data, "rgb8; png compressed rgb8"), photo) == 0.0


def test_grey_and_16_bit_images_become_rgb(photo):
    grey = photo.mean(axis=2).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(grey, "L").save(buffer, format="JPEG", quality=95)
    decoded = decode_rgb8(buffer.getvalue(), "mono8; jpeg compressed ")
    assert decoded.shape == photo.shape and mean_error(decoded[:, :, 0], grey) <= 3.0
    assert np.array_equal(decoded[:, :, 0], decoded[:, :, 2])
    wide = grey.astype(np.uint16) * 257  # 16-bit grey: the high byte is the 8-bit value
    buffer = io.BytesIO()
    Image.fromarray(wide).save(buffer, format="PNG")
    assert np.array_equal(decode_rgb8(buffer.getvalue(), "mono16; png compressed ")[:, :, 1], grey)


def test_bad_payloads_are_value_errors_naming_the_problem(photo):
    jpeg, fmt = encode_rgb8(photo, "jpeg")
    png, png_fmt = encode_rgb8(photo, "png")
    cases = [(jpeg[: len(jpeg) // 2], fmt, "does not decode as JPEG"), (png[: len(png) // 2], png_fmt,
                                                                         "does not decode as PNG"),
             (b"", fmt, "neither JPEG nor PNG"), (b"GIF89a....", fmt, "neither JPEG nor PNG"),
             (jpeg, "16UC1; compressedDepth png", "compressed_depth_image_transport")]
    for data, text, reason in cases:
        with pytest.raises(ValueError, match=reason):
            decode_rgb8(data, text)


def test_the_compressed_topic_follows_image_transports_suffix():
    assert compressed_topic("/car1/camera/image_raw") == "/car1/camera/image_raw/compressed"


@pytest.mark.parametrize("codec", ["jpeg", "png"])
def test_sim_record_writes_the_camera_compressed(tmp_path, codec):
    out, report = tmp_path / "sim.mcap", tmp_path / "sim.json"
    assert cli.main(["sim", "--record", str(out), "--frames", "3", "--rate", "5", "--resolutions", "96x64",
                     "--compress", codec, "--json", str(report)]) == 0
    topics = json.loads(report.read_text())["topics"]
    assert topics == {INFO_TOPIC: {"type": "sensor_msgs/msg/CameraInfo", "messages": 3},
                      COMPRESSED_TOPIC: {"type": "sensor_msgs/msg/CompressedImage", "messages": 3},
                      CLOUD_TOPIC: {"type": "sensor_msgs/msg/PointCloud2", "messages": 3}}
    settings = SimSettings(rate_hz=5.0, resolutions=("96x64",))
    with AnyReader([out], default_typestore=standard_typestore()) as reader:
        images = [reader.deserialize(raw, conn.msgtype) for conn, _, raw in reader.messages()
                  if conn.topic == COMPRESSED_TOPIC]
    assert [m.format for m in images] == [f"rgb8; {codec} compressed bgr8"] * 3
    for index, msg in enumerate(images):  # the simulator's frame, as the live node renders it
        expected = render_frame(settings, index, index / 5.0).image
        assert mean_error(decode_rgb8(msg.data, msg.format), expected) <= (6.0 if codec == "jpeg" else 0.0)
    raw = tmp_path / "raw.mcap"
    record_scenes(raw, settings, 1)  # without --compress: the raw camera as before
    with AnyReader([raw], default_typestore=standard_typestore()) as reader:
        assert {c.topic for c in reader.connections} == {INFO_TOPIC, "/camera/image_raw", CLOUD_TOPIC}


def test_image_transport_is_read_only_at_run_time():
    """The subscription is made at start; a node refuses to switch transport while it runs."""
    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        node = rclpy.create_node("transport_test", context=context)
        spec = next(s for s in common_specs("lane") if s.name == "image_transport")
        assert declare(node, [spec]) == {"image_transport": "raw"}
        [result] = node.set_parameters([Parameter("image_transport", value="compressed")])
        assert not result.successful and "read-only" in result.reason
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)
