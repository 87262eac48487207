"""Open a recorded bag and stream its messages in time order, as the CDR bytes ROS publishes.

A bag is a rosbag2 directory (``metadata.yaml`` beside sqlite3 ``.db3`` or ``.mcap`` files), a
single ``.db3`` or ``.mcap`` file, or a ROS 1 ``.bag``; rosbags reads all of them without a ROS
install. Messages are read one at a time from rosbags' iterators (sqlite3 rows, MCAP chunks,
ROS 1 chunks), so a bag larger than memory plays in the memory of a few messages.

Why raw CDR: a ROS 2 bag stores each message as the CDR bytes its publisher sent, which is what
an rclpy publisher takes as a serialized message, so the player never builds message objects;
ROS 1 messages are converted to CDR byte by byte (rosbags' ``ros1_to_cdr``).

Every failure of the file itself (missing, not a bag, truncated, corrupt) is a ``ValueError``
that names the bag, whether it shows when the bag is opened or halfway through playing it.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rosbags.highlevel import AnyReader
from rosbags.typesys import Stores, get_typestore

from dynnet_ros.bags.forms import BAG_FORMS as BAG_FORMS
from dynnet_ros.bags.topics import SINGLE_CAMERA, BagTopic, CameraTopics, TopicPlan, plan_topics

#: what the reader accepts, for error messages


@dataclass(frozen=True)
class BagMessage:
    """One message to publish: where, its type, the bag's timestamp and its CDR bytes
    (encapsulation header included, as rclpy's ``publish`` of a serialized message expects)."""

    topic: str
    msgtype: str
    timestamp_ns: int
    data: bytes


@contextlib.contextmanager
def _bag_errors(path: Path, what: str) -> Iterator[None]:
    """Turn any failure inside rosbags into a ValueError naming the bag.

    rosbags raises its own errors for most damage, but passes through those of the libraries it
    reads with (apsw for sqlite3, struct, lz4, zstd, its own assertions on record layouts), so
    any exception raised while it reads is taken as the file's fault.
    """
    try:
        yield
    except Exception as exc:  # noqa: BLE001 — see the docstring: every reader failure is the file's
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(f"bag {path}: {what}: {reason}") from None


class Bag:
    """An open bag (context manager): its time span and topics, and its messages on demand.

    Opening reads only the bag's index and metadata; ``messages`` streams the payloads.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise ValueError(f"bag {self.path}: no such file or directory (give {BAG_FORMS})")
        if self.path.is_dir() and not (self.path / "metadata.yaml").is_file():
            raise ValueError(f"bag {self.path}: not a bag: a directory without metadata.yaml (give {BAG_FORMS})")
        if self.path.is_file() and self.path.suffix not in (".db3", ".mcap", ".bag"):
            raise ValueError(f"bag {self.path}: not a bag: unknown file type {self.path.suffix or '(none)'!r} "
                             f"(give {BAG_FORMS})")
        if self.path.is_file() and self.path.stat().st_size == 0:
            raise ValueError(f"bag {self.path}: not a bag: the file is empty")
        with _bag_errors(self.path, "not a readable bag (truncated or corrupt?)"):
            # bags without embedded message definitions (older rosbag2 sqlite3 files) fall back to
            # the standard ROS 2 definitions
            self._reader = AnyReader([self.path], default_typestore=get_typestore(Stores.LATEST))
            self._reader.open()
        self._open = True
        reader = self._reader
        with _bag_errors(self.path, "not a readable bag (truncated or corrupt?)"):
            self.is_ros1 = not reader.is2
            self.message_count = reader.message_count
            self.start_ns = reader.start_time if self.message_count else 0
            self.end_ns = reader.end_time if self.message_count else 0
            self.topics = {name: BagTopic(name, info.msgtype or "", info.msgcount)
                           for name, info in reader.topics.items()}
        if self.message_count == 0:
            self.close()
            raise ValueError(f"bag {self.path}: the bag has no messages")

    def plan(self, topics: list[str] | None = None, remaps: tuple[Any, ...] = (), namespace: str = "",
             type_available: Callable[[str], bool] = lambda _msgtype: True,
             cameras: tuple[CameraTopics, ...] = (SINGLE_CAMERA,)) -> TopicPlan:
        """Which of the bag's topics play, under which names (``bags.topics.plan_topics``)."""
        return plan_topics(str(self.path), self.topics, topics, remaps, namespace, type_available, cameras)

    def messages(self, plan: TopicPlan) -> Iterator[BagMessage]:
        """The planned topics' messages in the bag's time order, read one at a time."""
        played = {p.source: p for p in plan.played}
        connections = [c for c in self._reader.connections if c.topic in played]
        to_cdr = self._ros1_to_cdr() if self.is_ros1 else None
        stream = self._reader.messages(connections=connections)
        read: Counter[str] = Counter()
        while True:
            with _bag_errors(self.path, "cannot read its messages (truncated or corrupt?)"):
                try:
                    connection, timestamp, raw = next(stream)
                except StopIteration:
                    break
                topic = played[connection.topic]
                data = bytes(raw) if to_cdr is None else bytes(to_cdr(raw, connection.msgtype))
            read[topic.source] += 1
            yield BagMessage(topic.target, topic.msgtype, timestamp, data)
        # a damaged MCAP chunk can lose its records without an error: the index's counts tell
        short = [f"{p.source} {read[p.source]} of {p.count}" for p in plan.played if read[p.source] != p.count]
        if short:
            raise ValueError(f"bag {self.path}: its index lists more messages than could be read (corrupt?): "
                             f"{', '.join(short)}")

    def _ros1_to_cdr(self) -> Callable[[Any, str], Any]:
        """ROS 1 bytes -> ROS 2 CDR: the bag's own definitions, except that std_msgs/Header is
        ROS 2's (no ``seq``), as ``rosbags-convert`` does it; the other sensor messages have the
        same layout in both."""
        header = get_typestore(Stores.LATEST).fielddefs["std_msgs/msg/Header"]
        store = get_typestore(Stores.EMPTY)
        store.register({**self._reader.typestore.fielddefs, "std_msgs/msg/Header": header})
        return store.ros1_to_cdr

    def close(self) -> None:
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):  # closing a damaged file must not hide the first error
                self._reader.close()

    def __enter__(self) -> Bag:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
