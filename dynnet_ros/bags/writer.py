"""Write a rosbag2 bag (MCAP or sqlite3) from CDR bytes, without a ROS install.

Why raw CDR in: a live recorder gets each message as the bytes its publisher sent (an rclpy
subscription with ``raw=True``), and ``bags/scenes.py`` serialises simulator frames with rosbags'
typestore; neither builds message objects twice. Storage is rosbags' writer, so ``ros2 bag
play``, Foxglove Studio, rosbags and the ``mcap`` library all read what it writes.

The output path decides the form:

* ``OUT.mcap`` — one MCAP file. rosbags writes it inside a hidden bag directory beside OUT,
  and ``close`` moves the finished file to OUT, so OUT exists only once it is complete
  (footer, index and the rosbag2 metadata record that ``ros2 bag play`` reads from it).
* any other ``OUT`` — a rosbag2 directory: ``metadata.yaml`` and ``OUT/<name>.mcap`` (or
  ``.db3`` with ``storage="sqlite3"``), what ``ros2 bag record -o OUT`` makes.

An existing OUT is never overwritten; a missing or unwritable parent directory is refused
before anything is written (``check_output``).
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from rosbags.interfaces import Connection, Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore
from rosbags.typesys.store import Typestore

from dynnet_ros.bags.forms import STORAGE_NAMES
from dynnet_ros.bags.paths import check_output

STORAGES = dict(zip(STORAGE_NAMES, (StoragePlugin.MCAP, StoragePlugin.SQLITE3)))
#: message definitions of the standard types (sensor_msgs, std_msgs, ...), as the ROS 2 wheels in .venv have them
TYPESTORE_NAME = Stores.ROS2_KILTED
_UNSET = QosTime(0, 0)


def standard_typestore() -> Typestore:
    """rosbags' typestore of the standard ROS 2 messages (no ROS install needed)."""
    return get_typestore(TYPESTORE_NAME)


@dataclass(frozen=True)
class TopicQos:
    """The QoS a topic's publishers offer, stored with the topic so ``ros2 bag play`` offers it again."""

    reliable: bool = True
    depth: int = 10
    transient_local: bool = False

    def to_rosbags(self) -> Qos:
        return Qos(history=QosHistory.KEEP_LAST, depth=self.depth,
                   reliability=QosReliability.RELIABLE if self.reliable else QosReliability.BEST_EFFORT,
                   durability=QosDurability.TRANSIENT_LOCAL if self.transient_local else QosDurability.VOLATILE,
                   deadline=_UNSET, lifespan=_UNSET, liveliness=QosLiveliness.AUTOMATIC,
                   liveliness_lease_duration=_UNSET, avoid_ros_namespace_conventions=False)


#: qos_profile_sensor_data (the simulator's and cameras' topics)
SENSOR_DATA_QOS = TopicQos(reliable=False, depth=5)


class BagWriter:
    """A bag being written: topics added once, then messages as (topic, time in ns, CDR bytes).

    Use as a context manager: a normal exit finalises the bag (``close``), an exception aborts it
    and removes what was written, so a half-written bag never looks complete.
    """

    def __init__(self, path: str | Path, *, storage: str = "mcap", typestore: Typestore | None = None) -> None:
        self.path = check_output(path, storage)
        self.storage = storage
        self.single_file = self.path.suffix == ".mcap"
        self.bag_dir = self.path.with_name(f".{self.path.name}.partial") if self.single_file else self.path
        if self.single_file and (self.bag_dir.exists() or self.bag_dir.is_symlink()):
            raise ValueError(f"{self.path}: {self.bag_dir} is in the way (left by an interrupted recording?); "
                             "remove it first")
        self.typestore = typestore or standard_typestore()
        self._writer = Writer(self.bag_dir, version=Writer.VERSION_LATEST, storage_plugin=STORAGES[storage])
        self._writer.open()
        self._topics: dict[str, Connection] = {}
        self.counts: dict[str, int] = {}
        self._open = True

    @property
    def topics(self) -> dict[str, str]:
        """topic -> message type of the topics added so far."""
        return {topic: conn.msgtype for topic, conn in self._topics.items()}

    def knows_type(self, msgtype: str) -> bool:
        """Whether the typestore has ``msgtype`` (e.g. ``sensor_msgs/msg/Image``)'s definition."""
        return msgtype in self.typestore.fielddefs

    def add_topic(self, topic: str, msgtype: str, qos: TopicQos = TopicQos()) -> None:
        """Register a topic before its first message. ValueError for a type the typestore lacks
        (a bag without the definition could not be decoded by Foxglove or rosbags) or a topic added twice."""
        if topic in self._topics:
            raise ValueError(f"topic {topic} is already in the bag (as {self._topics[topic].msgtype})")
        if not self.knows_type(msgtype):
            raise ValueError(f"message type {msgtype} has no definition in rosbags' {TYPESTORE_NAME.value} "
                             "typestore; cannot record topic " + topic)
        self._topics[topic] = self._writer.add_connection(topic, msgtype, typestore=self.typestore,
                                                          offered_qos_profiles=[qos.to_rosbags()])
        self.counts[topic] = 0

    def write(self, topic: str, timestamp_ns: int, data: bytes | memoryview) -> None:
        """Append one message (its CDR bytes) received or stamped at ``timestamp_ns``."""
        connection = self._topics.get(topic)
        if connection is None:
            raise ValueError(f"topic {topic} was not added to the bag")
        self._writer.write(connection, int(timestamp_ns), data)
        self.counts[topic] += 1

    def close(self) -> Path:
        """Finalise: index, footer and metadata written; a single MCAP moved into place. Returns the path."""
        if not self._open:
            return self.path
        self._open = False
        self._writer.close()
        if self.single_file:
            inner = self.bag_dir / f"{self.bag_dir.name}.mcap"
            os.replace(inner, self.path)
            shutil.rmtree(self.bag_dir)
        return self.path

    def abort(self) -> None:
        """Stop without finalising and remove the partial bag."""
        if not self._open:
            return
        self._open = False
        self._writer.abort()
        shutil.rmtree(self.bag_dir, ignore_errors=True)

    def __enter__(self) -> BagWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
