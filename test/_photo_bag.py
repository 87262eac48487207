"""A bag of real photographs, as a user records their own camera: sensor_msgs/Image (or
CompressedImage) with a CameraInfo per frame, written with the package's own bag writer
(``bags/writer.py``) from messages serialized by rclpy.

The photographs are the corpus' (``_corpus.photos``: scikit-image's bundled photos, four sizes);
more frames than photos take the photos again mirrored, so every frame is a different image.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from _corpus import photos
from rclpy.serialization import serialize_message
from rosbags.highlevel import AnyReader
from sensor_msgs.msg import CameraInfo, CompressedImage
from std_msgs.msg import Header

from dynnet_ros.bags.writer import SENSOR_DATA_QOS, BagWriter, standard_typestore
from dynnet_ros.compressed import compressed_topic, encode_rgb8
from dynnet_ros.nodes.convert import array_to_image
from dynnet_ros.sim.frames import camera_info_fields

NS = 1_000_000_000
#: the first frame's stamp: 2000 s after the epoch, far from any wall-clock time
START_NS = 2000 * NS
IMAGE_TOPIC, INFO_TOPIC = "/camera/image_raw", "/camera/camera_info"
COMPRESSED_TOPIC = compressed_topic(IMAGE_TOPIC)
#: a payload per frame index instead of the photo (``payloads``): (format, bytes)
Payload = tuple[str, bytes]


def photo_frames(count: int) -> list[np.ndarray]:
    """``count`` distinct HxWx3 uint8 RGB photographs (the corpus' photos, then mirrored)."""
    images = [image for _name, image in photos()]
    assert images, "scikit-image's photographs are missing (requirements-dev.txt)"
    frames = images + [np.ascontiguousarray(image[:, ::-1]) for image in images]
    assert count <= len(frames), f"at most {len(frames)} distinct photo frames"
    return frames[:count]


def _stamp(stamp_ns: int):
    header = Header()
    header.stamp.sec, header.stamp.nanosec = stamp_ns // NS, stamp_ns % NS
    return header.stamp


def camera_info(image: np.ndarray, header: Header) -> CameraInfo:
    """The CameraInfo of a frame of ``image``'s size: focal lengths 0.8 x the size, the centre in
    the middle. Proportional to the size, so a node that rescales another size's K (a frame's
    CameraInfo not yet arrived) gets this K exactly."""
    height, width = image.shape[:2]
    k = np.array([[0.8 * width, 0.0, width / 2], [0.0, 0.8 * height, height / 2], [0.0, 0.0, 1.0]])
    return CameraInfo(header=header, width=width, height=height, **camera_info_fields(k))


def write_photo_bag(path: Path, frames: int, *, period_ns: int = NS, skip: tuple[int, ...] = (),
                    compress: str | tuple[str, ...] | None = None,
                    payloads: dict[int, Payload] | None = None) -> list[int]:
    """A camera recording of ``frames`` photos every ``period_ns`` (default 1 Hz): CameraInfo,
    then the camera, same stamp, frame_id ``camera_optical_frame``, after a first CameraInfo
    one period before the first frame. The camera is an rgb8
    Image, or with ``compress`` ('jpeg', 'png', or one per frame, cycled) a CompressedImage on
    ``/camera/image_raw/compressed`` as image_transport's compressed plugin publishes it;
    ``payloads`` replaces frames' compressed data and format (bad payloads). The frames whose
    index is in ``skip`` are left out (a camera that lost them). Returns the stamps written."""
    images = photo_frames(frames)
    codecs = (compress,) if isinstance(compress, str) else compress
    stamps = []
    with BagWriter(path) as writer:
        writer.add_topic(INFO_TOPIC, "sensor_msgs/msg/CameraInfo", SENSOR_DATA_QOS)
        camera_topic = IMAGE_TOPIC if codecs is None else COMPRESSED_TOPIC
        writer.add_topic(camera_topic, "sensor_msgs/msg/Image" if codecs is None else "sensor_msgs/msg/CompressedImage",
                         SENSOR_DATA_QOS)
        lead = START_NS - period_ns  # the driver's CameraInfo is out before its first frame
        writer.write(INFO_TOPIC, lead, serialize_message(camera_info(images[0], Header(
            stamp=_stamp(lead), frame_id="camera_optical_frame"))))
        for index in range(frames):
            if index in skip:
                continue
            image = images[index]
            stamp = START_NS + index * period_ns
            header = Header(stamp=_stamp(stamp), frame_id="camera_optical_frame")
            writer.write(INFO_TOPIC, stamp, serialize_message(camera_info(image, header)))
            if codecs is None:
                camera = serialize_message(array_to_image(image, "rgb8", header))
            else:
                replaced = (payloads or {}).get(index)
                if replaced is None:
                    data, fmt = encode_rgb8(image, codecs[index % len(codecs)])
                else:
                    fmt, data = replaced
                camera = serialize_message(CompressedImage(header=header, format=fmt, data=data))
            writer.write(camera_topic, stamp + 1000, camera)
            stamps.append(stamp)
    return stamps


def read_bag(path: Path) -> dict[str, list]:
    """topic -> its messages (rosbags' objects), in bag order."""
    out: dict[str, list] = {}
    with AnyReader([path], default_typestore=standard_typestore()) as reader:
        for connection, _time, raw in reader.messages():
            out.setdefault(connection.topic, []).append(reader.deserialize(raw, connection.msgtype))
    return out


def header_ns(msg) -> int:
    header = msg.markers[0].header if hasattr(msg, "markers") else msg.header
    return header.stamp.sec * NS + header.stamp.nanosec
