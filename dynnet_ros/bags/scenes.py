"""The simulator's frames as bag messages: CameraInfo, Image and PointCloud2 in CDR, no ROS graph.

Why: tests and users need a bag made by our own code (``dynnet sim --record``) that replays into
the graph exactly like the live ``sensor_sim`` node feeds it. Frames come from the same renderer
(``sim/frames.render_frame``) with the same topics, frame_ids, encodings and field layouts
(``layouts.py``); only the clock differs: frame ``i`` is stamped ``start_ns + i / rate_hz``
instead of the wall clock, so the same settings and seed always give the same bag. With
``compress`` the camera goes out as image_transport's compressed plugin publishes it:
sensor_msgs/CompressedImage (JPEG or PNG, ``dynnet_ros.compressed``) on
``/camera/image_raw/compressed``, what most robots record.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rosbags.typesys.store import Typestore

from dynnet_ros.bags.writer import SENSOR_DATA_QOS, BagWriter, TopicQos, standard_typestore
from dynnet_ros.compressed import compressed_topic, encode_rgb8
from dynnet_ros.layouts import (
    HOST_BIG_ENDIAN,
    POINT_FIELD_FLOAT32,
    XYZI_DTYPE,
    XYZI_FIELDS,
    pack_image,
    pack_xyzi,
    xyzi_dense,
)
from dynnet_ros.sim.frames import (
    CameraImage,
    SimFrame,
    SimSettings,
    camera_info_fields,
    render_frame,
    render_image,
    scan_points,
)
from dynnet_ros.sim.rig import SINGLE_CAMERA, SimCamera
from dynnet_ros.sim.scene import make_scene

#: stamp of frame 0 (2024-01-01T00:00:00Z): fixed, so a bag depends only on its settings and seed
DEFAULT_START_NS = 1_704_067_200 * 10**9

IMAGE_TOPIC, INFO_TOPIC, CLOUD_TOPIC = "/camera/image_raw", "/camera/camera_info", "/lidar/points"
#: topic -> (message type, QoS), the topics the sensor_sim node publishes (no namespace)
SIM_TOPICS: dict[str, tuple[str, TopicQos]] = {
    INFO_TOPIC: ("sensor_msgs/msg/CameraInfo", SENSOR_DATA_QOS),
    IMAGE_TOPIC: ("sensor_msgs/msg/Image", SENSOR_DATA_QOS),
    CLOUD_TOPIC: ("sensor_msgs/msg/PointCloud2", SENSOR_DATA_QOS),
}
COMPRESSED_TOPIC = compressed_topic(IMAGE_TOPIC)


def camera_topics(name: str, compress: str | None = None) -> tuple[str, str]:
    """(CameraInfo topic, image topic) of the simulator's camera ``name`` (``camera``: the single
    camera's), the image compressed with ``compress`` or raw."""
    image = f"/{name}/image_raw"
    return f"/{name}/camera_info", compressed_topic(image) if compress is not None else image


def sim_topics(compress: str | None = None,
               cameras: Sequence[str] = (SINGLE_CAMERA,)) -> dict[str, tuple[str, TopicQos]]:
    """topic -> (message type, QoS) of a recording of ``cameras`` (names; the single camera by
    default) and the LiDAR, the cameras compressed with ``compress`` ('jpeg', 'png') or raw (None)."""
    image = ("sensor_msgs/msg/CompressedImage" if compress is not None else "sensor_msgs/msg/Image", SENSOR_DATA_QOS)
    topics: dict[str, tuple[str, TopicQos]] = {}
    for name in cameras:
        info_topic, image_topic = camera_topics(name, compress)
        topics.update({info_topic: SIM_TOPICS[INFO_TOPIC], image_topic: image})
    topics[CLOUD_TOPIC] = SIM_TOPICS[CLOUD_TOPIC]
    return topics


@dataclass(frozen=True)
class BagMessage:
    topic: str
    stamp_ns: int
    data: bytes  # CDR


def frame_stamp_ns(settings: SimSettings, index: int, start_ns: int = DEFAULT_START_NS) -> int:
    """Stamp (and bag time) of frame ``index``: evenly spaced at the simulator's rate."""
    return start_ns + round(index * 1e9 / settings.rate_hz)


def frame_count(settings: SimSettings, *, frames: int | None = None, duration_s: float | None = None) -> int:
    """Frames to write: ``frames`` itself, or as many as the simulator publishes in ``duration_s``
    (frame 0 at t = 0). ValueError unless exactly one is given and it is positive."""
    if (frames is None) == (duration_s is None):
        raise ValueError("give the number of frames or a duration (one of them)")
    if frames is not None:
        if frames <= 0:
            raise ValueError(f"frames must be positive, got {frames}")
        return frames
    assert duration_s is not None
    if duration_s <= 0:
        raise ValueError(f"duration must be positive, got {duration_s}")
    return max(1, int(duration_s * settings.rate_hz + 1e-9))


class SceneSerializer:
    """Builds each frame's messages with rosbags' types and serialises them to CDR: per camera its
    CameraInfo and image, then the LiDAR cloud."""

    def __init__(self, settings: SimSettings, typestore: Typestore | None = None,
                 start_ns: int = DEFAULT_START_NS, compress: str | None = None) -> None:
        self.settings = settings
        self.start_ns = start_ns
        self.compress = compress
        self.typestore = typestore or standard_typestore()
        types = self.typestore.types
        self._time = types["builtin_interfaces/msg/Time"]
        self._header = types["std_msgs/msg/Header"]
        self._image = types["sensor_msgs/msg/Image"]
        self._compressed = types["sensor_msgs/msg/CompressedImage"]
        self._info = types["sensor_msgs/msg/CameraInfo"]
        self._roi = types["sensor_msgs/msg/RegionOfInterest"]
        self._cloud = types["sensor_msgs/msg/PointCloud2"]
        self._field = types["sensor_msgs/msg/PointField"]

    def _header_at(self, stamp_ns: int, frame_id: str):
        return self._header(stamp=self._time(sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9), frame_id=frame_id)

    def messages(self, frame: SimFrame) -> list[BagMessage]:
        """CameraInfo, Image, PointCloud2 of one single-camera frame, in the order the node publishes them."""
        camera = CameraImage(frame.index, frame.elapsed, frame.width, frame.height, frame.image, frame.camera_matrix)
        return [*self.camera_messages(SINGLE_CAMERA, self.settings.camera_frame_id, camera),
                self.cloud_message(frame.index, frame.points)]

    def camera_messages(self, name: str, frame_id: str, frame: CameraImage) -> list[BagMessage]:
        """Camera ``name``'s CameraInfo and image (raw or compressed) of ``frame``, at its index's stamp."""
        s = self.settings
        stamp = frame_stamp_ns(s, frame.index, self.start_ns)
        header = self._header_at(stamp, frame_id)
        calib = camera_info_fields(frame.camera_matrix)
        info = self._info(header=header, height=frame.height, width=frame.width,
                          distortion_model=calib["distortion_model"],
                          d=np.asarray(calib["d"], dtype=np.float64), k=np.asarray(calib["k"], dtype=np.float64),
                          r=np.asarray(calib["r"], dtype=np.float64), p=np.asarray(calib["p"], dtype=np.float64),
                          binning_x=0, binning_y=0,
                          roi=self._roi(x_offset=0, y_offset=0, height=0, width=0, do_rectify=False))
        info_topic, image_topic = camera_topics(name, self.compress)
        if self.compress is not None:
            data, fmt = encode_rgb8(frame.image, self.compress, encoding=s.encoding)
            image = self._compressed(header=header, format=fmt, data=np.frombuffer(data, dtype=np.uint8))
            image_type = "sensor_msgs/msg/CompressedImage"
        else:
            pixels, step = pack_image(frame.image, s.encoding)
            image = self._image(header=header, height=frame.height, width=frame.width, encoding=s.encoding,
                                is_bigendian=int(HOST_BIG_ENDIAN), step=step,
                                data=np.frombuffer(pixels.tobytes(), dtype=np.uint8))
            image_type = "sensor_msgs/msg/Image"
        serialize = self.typestore.serialize_cdr
        return [BagMessage(info_topic, stamp, bytes(serialize(info, "sensor_msgs/msg/CameraInfo"))),
                BagMessage(image_topic, stamp, bytes(serialize(image, image_type)))]

    def cloud_message(self, index: int, points: np.ndarray) -> BagMessage:
        """The LiDAR cloud of frame ``index``."""
        stamp = frame_stamp_ns(self.settings, index, self.start_ns)
        packed = pack_xyzi(points)
        fields = [self._field(name=name, offset=4 * i, datatype=POINT_FIELD_FLOAT32, count=1)
                  for i, name in enumerate(XYZI_FIELDS)]
        cloud = self._cloud(header=self._header_at(stamp, self.settings.lidar_frame_id), height=1, width=len(packed),
                            fields=fields, is_bigendian=HOST_BIG_ENDIAN, point_step=XYZI_DTYPE.itemsize,
                            row_step=XYZI_DTYPE.itemsize * len(packed),
                            data=np.frombuffer(packed.tobytes(), dtype=np.uint8), is_dense=xyzi_dense(packed))
        return BagMessage(CLOUD_TOPIC, stamp, bytes(self.typestore.serialize_cdr(cloud, "sensor_msgs/msg/PointCloud2")))


def scene_messages(settings: SimSettings, count: int, *, start_ns: int = DEFAULT_START_NS,
                   typestore: Typestore | None = None, compress: str | None = None,
                   cameras: Sequence[SimCamera] = ()) -> Iterator[list[BagMessage]]:
    """The messages of frames 0..count-1, one frame at a time (nothing is held beyond a frame):
    the single camera's, or each of ``cameras`` (one scene, one stamp per frame), then the LiDAR
    covering them."""
    serializer = SceneSerializer(settings, typestore, start_ns, compress)
    yaws = tuple(camera.yaw_deg for camera in cameras)
    for index in range(count):
        elapsed = index / settings.rate_hz
        if not cameras:
            yield serializer.messages(render_frame(settings, index, elapsed))
            continue
        world = make_scene(elapsed, count=settings.pedestrians, seed=settings.seed)
        messages = [message for camera in cameras for message in serializer.camera_messages(
            camera.name, camera.frame_id, render_image(settings, index, elapsed, camera.yaw_deg, world))]
        yield messages + [serializer.cloud_message(index, scan_points(settings, index, elapsed, yaws, world))]


def record_scenes(path: str | Path, settings: SimSettings, count: int, *, storage: str = "mcap",
                  start_ns: int = DEFAULT_START_NS, on_frame: Callable[[int], None] | None = None,
                  compress: str | None = None, cameras: Sequence[SimCamera] = ()) -> dict[str, int]:
    """Write ``count`` simulator frames into a new bag at ``path``; returns messages per topic.
    ``compress``: 'jpeg' or 'png' writes the cameras as CompressedImage (``sim_topics``);
    ``cameras``: a multi-camera simulator's (NAME/image_raw, NAME/camera_info), none = the single camera.

    ``on_frame(index)`` is called after each frame is written (a progress bar). An error or an
    interrupt removes the partial bag.
    """
    with BagWriter(path, storage=storage) as bag:
        for topic, (msgtype, qos) in sim_topics(compress, [c.name for c in cameras] or [SINGLE_CAMERA]).items():
            bag.add_topic(topic, msgtype, qos)
        for index, messages in enumerate(scene_messages(settings, count, start_ns=start_ns, typestore=bag.typestore,
                                                        compress=compress, cameras=cameras)):
            for message in messages:
                bag.write(message.topic, message.stamp_ns, message.data)
            if on_frame is not None:
                on_frame(index)
        return dict(bag.counts)
