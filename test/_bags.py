"""Small bags for the replay tests, written with rosbags' own writers (no ROS needed).

Camera frames (sensor_msgs/Image with a stamped header), CameraInfo, PointCloud2, a std_msgs
String and a message type no ROS package defines, in rosbag2 (sqlite3 or MCAP) or ROS 1 form;
and a multi-camera rig's bag (several cameras' images and CameraInfo, one LiDAR).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rosbags.rosbag1 import Writer as Ros1Writer
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_types_from_msg, get_typestore

NS = 1_000_000_000
#: a message type that exists in no ROS installation
UNKNOWN_TYPE = "dynnet_test_msgs/msg/Thing"
IMAGE, INFO, CLOUD = "sensor_msgs/msg/Image", "sensor_msgs/msg/CameraInfo", "sensor_msgs/msg/PointCloud2"
STRING = "std_msgs/msg/String"


@dataclass(frozen=True)
class Recorded:
    """One message written: topic, bag timestamp, header stamp (ns, None without a header)."""

    topic: str
    timestamp_ns: int
    stamp_ns: int | None


def typestore(ros1: bool = False):
    store = get_typestore(Stores.ROS1_NOETIC if ros1 else Stores.LATEST)
    store.register(get_types_from_msg("int32 value\nstring note", UNKNOWN_TYPE))
    return store


def _header(store, stamp_ns: int, frame_id: str, ros1: bool):
    t = store.types
    stamp = t["builtin_interfaces/msg/Time"](sec=stamp_ns // NS, nanosec=stamp_ns % NS)
    if ros1:
        return t["std_msgs/msg/Header"](seq=0, stamp=stamp, frame_id=frame_id)
    return t["std_msgs/msg/Header"](stamp=stamp, frame_id=frame_id)


def image(store, stamp_ns: int, width: int = 32, height: int = 24, ros1: bool = False, seed: int = 0,
          frame_id: str = "camera_optical_frame"):
    data = np.random.default_rng(seed).integers(0, 256, height * width * 3, dtype=np.uint8)
    return store.types[IMAGE](header=_header(store, stamp_ns, frame_id, ros1), height=height,
                              width=width, encoding="rgb8", is_bigendian=0, step=width * 3, data=data)


def camera_info(store, stamp_ns: int, width: int = 32, height: int = 24, ros1: bool = False,
                frame_id: str = "camera_optical_frame"):
    t = store.types
    roi = t["sensor_msgs/msg/RegionOfInterest"](x_offset=0, y_offset=0, height=0, width=0, do_rectify=False)
    k = np.array([30.0, 0, width / 2, 0, 30.0, height / 2, 0, 0, 1])
    p = np.array([30.0, 0, width / 2, 0, 0, 30.0, height / 2, 0, 0, 0, 1, 0])
    fields = dict(header=_header(store, stamp_ns, frame_id, ros1), height=height, width=width,
                  distortion_model="plumb_bob", binning_x=0, binning_y=0, roi=roi)
    if ros1:
        return t[INFO](**fields, D=np.zeros(5), K=k, R=np.eye(3).ravel(), P=p)
    return t[INFO](**fields, d=np.zeros(5), k=k, r=np.eye(3).ravel(), p=p)


def cloud(store, stamp_ns: int, points: int = 64, ros1: bool = False):
    t = store.types
    fields = [t["sensor_msgs/msg/PointField"](name=n, offset=4 * i, datatype=7, count=1)
              for i, n in enumerate(("x", "y", "z", "intensity"))]
    xyz = np.random.default_rng(stamp_ns % 1000).normal(0.0, 5.0, (points, 4)).astype(np.float32)
    return t[CLOUD](header=_header(store, stamp_ns, "lidar", ros1), height=1, width=points, fields=fields,
                    is_bigendian=False, point_step=16, row_step=16 * points, data=xyz.view(np.uint8).ravel(),
                    is_dense=True)


def write_bag(path: Path, frames: int = 5, *, storage: str = "sqlite3", start_ns: int = 100 * NS,
              period_ns: int = NS // 10, camera_topic: str = "/camera/image_raw", extra: bool = True,
              camera_type: str = IMAGE) -> list[Recorded]:
    """A rosbag2 bag at ``path`` (a directory) with ``frames`` camera frames, CameraInfo and LiDAR
    per frame, plus (``extra``) a String topic and a topic of ``UNKNOWN_TYPE``; returns what was
    written in time order. ``camera_type`` puts another type on the camera topic."""
    store = typestore()
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    written: list[Recorded] = []
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        cam = writer.add_connection(camera_topic, camera_type, typestore=store)
        info = writer.add_connection("/camera/camera_info", INFO, typestore=store)
        lidar = writer.add_connection("/lidar/points", CLOUD, typestore=store)
        chatter = writer.add_connection("/chatter", STRING, typestore=store) if extra else None
        thing = writer.add_connection("/thing", UNKNOWN_TYPE, typestore=store) if extra else None
        for i in range(frames):
            stamp = start_ns + i * period_ns
            camera = image(store, stamp, seed=i) if camera_type == IMAGE else cloud(store, stamp)
            for offset, connection, msg in ((0, cam, camera), (1000, info, camera_info(store, stamp)),
                                            (2000, lidar, cloud(store, stamp))):
                writer.write(connection, stamp + offset, store.serialize_cdr(msg, connection.msgtype))
                written.append(Recorded(connection.topic, stamp + offset, stamp))
            if chatter is not None and thing is not None:
                writer.write(chatter, stamp + 3000, store.serialize_cdr(store.types[STRING](data=f"frame {i}"),
                                                                         STRING))
                written.append(Recorded("/chatter", stamp + 3000, None))
                writer.write(thing, stamp + 4000, store.serialize_cdr(store.types[UNKNOWN_TYPE](value=i, note="x"),
                                                                      UNKNOWN_TYPE))
                written.append(Recorded("/thing", stamp + 4000, None))
    return written


def write_cameras_bag(path: Path, cameras: tuple[str, ...] = ("front", "left", "right", "rear"), frames: int = 4, *,
                      storage: str = "mcap", start_ns: int = 200 * NS, period_ns: int = NS // 5,
                      topic: str = "/{name}/image_raw") -> list[Recorded]:
    """A multi-camera rig's rosbag2 bag: per frame, each camera's image on ``topic`` (formatted
    with the camera's name) and CameraInfo on /NAME/camera_info, frame_id NAME_optical_frame,
    the cameras a millisecond apart (each camera has its own stamps), then one LiDAR cloud."""
    store = typestore()
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    written: list[Recorded] = []
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        images = {name: writer.add_connection(topic.format(name=name), IMAGE, typestore=store) for name in cameras}
        infos = {name: writer.add_connection(f"/{name}/camera_info", INFO, typestore=store) for name in cameras}
        lidar = writer.add_connection("/lidar/points", CLOUD, typestore=store)
        for i in range(frames):
            stamp = start_ns + i * period_ns
            for index, name in enumerate(cameras):
                at = stamp + index * 1_000_000
                frame_id = f"{name}_optical_frame"
                for offset, connection, msg in ((0, images[name], image(store, at, seed=i * 16 + index,
                                                                          frame_id=frame_id)),
                                                (1000, infos[name], camera_info(store, at, frame_id=frame_id))):
                    writer.write(connection, at + offset, store.serialize_cdr(msg, connection.msgtype))
                    written.append(Recorded(connection.topic, at + offset, at))
            at = stamp + len(cameras) * 1_000_000
            writer.write(lidar, at, store.serialize_cdr(cloud(store, at), CLOUD))
            written.append(Recorded("/lidar/points", at, at))
    return written


def write_ros1_bag(path: Path, frames: int = 4, start_ns: int = 50 * NS, period_ns: int = NS // 5) -> list[Recorded]:
    """A ROS 1 .bag with camera, CameraInfo and LiDAR per frame."""
    store = typestore(ros1=True)
    written: list[Recorded] = []
    with Ros1Writer(path) as writer:
        connections = [(writer.add_connection(topic, msgtype, typestore=store), maker)
                       for topic, msgtype, maker in (("/camera/image_raw", IMAGE, image),
                                                     ("/camera/camera_info", INFO, camera_info),
                                                     ("/lidar/points", CLOUD, cloud))]
        for i in range(frames):
            stamp = start_ns + i * period_ns
            for offset, (connection, maker) in enumerate(connections):
                msg = maker(store, stamp, ros1=True)
                writer.write(connection, stamp + offset, store.serialize_ros1(msg, connection.msgtype))
                written.append(Recorded(connection.topic, stamp + offset, stamp))
    return written


def storage_file(bag: Path) -> Path:
    """The one .db3 / .mcap file inside a rosbag2 directory."""
    files = [p for p in bag.iterdir() if p.suffix in (".db3", ".mcap")]
    assert len(files) == 1, files
    return files[0]


def truncate(path: Path, keep: float) -> None:
    """Cut the file to ``keep`` (0..1) of its length, as an interrupted copy or recording leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
