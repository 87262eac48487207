"""Which of a bag's topics play, under which names, and whether their types fit the graph.

The graph reads sensor topics: each camera's image and CameraInfo (``camera/...`` for a
single-camera graph, each listed camera's under its namespace for a multi-camera one) and the
LiDAR. A bag topic that lands on one of them (after the remap rules and the namespace) must
carry that role's message type, or the model nodes would get
messages they cannot decode. Other topics pass through when ROS knows their type (the
caller's ``type_available``, e.g. "is the rclpy message class importable") and are skipped with
a warning naming the type when it does not; a topic the user asked for by name must play.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from dynnet_ros.frame_reports import FRAMES_TOPIC

#: the message type each role must have
ROLE_TYPES: dict[str, str] = {
    "camera": "sensor_msgs/msg/Image",
    "compressed camera": "sensor_msgs/msg/CompressedImage",
    "camera_info": "sensor_msgs/msg/CameraInfo",
    "lidar": "sensor_msgs/msg/PointCloud2",
}
_TOPIC = re.compile(r"^/?[A-Za-z_~][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class BagTopic:
    """A topic as the bag stores it."""

    name: str
    msgtype: str
    count: int


@dataclass(frozen=True)
class Remap:
    """``source:=target``: the bag topic ``source`` is published as ``target``."""

    source: str
    target: str


@dataclass(frozen=True)
class PlayedTopic:
    """A bag topic that plays: published as ``target`` (remapped, under the namespace)."""

    source: str
    target: str
    msgtype: str
    count: int
    role: str | None  # the graph's sensor role of ``target``, or None (passed through)


@dataclass(frozen=True)
class TopicPlan:
    played: tuple[PlayedTopic, ...]
    skipped: tuple[tuple[str, str], ...]  # (bag topic, why it does not play)

    @property
    def message_count(self) -> int:
        return sum(p.count for p in self.played)

    def warnings(self) -> list[str]:
        return [f"topic {topic} is not played: {why}" for topic, why in self.skipped]


def absolute_topic(name: str) -> str:
    """A topic name made absolute (``camera/x`` -> ``/camera/x``); ValueError if it is not one."""
    name = name.strip()
    if not _TOPIC.match(name):
        raise ValueError(f"{name!r} is not a topic name (letters, digits and _ separated by /)")
    return name if name.startswith("/") else "/" + name


def parse_remap(text: str) -> Remap:
    """``from:=to`` (as ``ros2 bag play --remap``) -> Remap with absolute names."""
    source, sep, target = text.partition(":=")
    if not sep or not source.strip() or not target.strip():
        raise ValueError(f"remap rule {text!r}: expected FROM:=TO (e.g. /front/image:=/camera/image_raw)")
    try:
        return Remap(absolute_topic(source), absolute_topic(target))
    except ValueError as exc:
        raise ValueError(f"remap rule {text!r}: {exc}") from None


@dataclass(frozen=True)
class CameraTopics:
    """One camera the graph reads: its image and CameraInfo topics (relative to the graph's
    namespace, or absolute); its compressed image is ``image`` + ``/compressed``."""

    image: str
    info: str


#: the graph's camera when its model nodes list no ``cameras``
SINGLE_CAMERA = CameraTopics("camera/image_raw", "camera/camera_info")


def role_targets(namespace: str, cameras: Iterable[CameraTopics] = (SINGLE_CAMERA,)) -> dict[str, str]:
    """Absolute sensor topic names under ``namespace`` -> role: each camera's image (raw and
    compressed) and CameraInfo, and the LiDAR."""
    prefix = namespace.rstrip("/")

    def resolved(topic: str) -> str:
        return topic if topic.startswith("/") else f"{prefix}/{topic}"

    roles = {resolved("lidar/points"): "lidar"}
    for camera in cameras:
        roles.update({resolved(camera.image): "camera", resolved(f"{camera.image}/compressed"): "compressed camera",
                      resolved(camera.info): "camera_info"})
    return roles


def plan_topics(bag: str, topics: Mapping[str, BagTopic], requested: Iterable[str] | None = None,
                remaps: Iterable[Remap] = (), namespace: str = "",
                type_available: Callable[[str], bool] = lambda _msgtype: True,
                cameras: Iterable[CameraTopics] = (SINGLE_CAMERA,)) -> TopicPlan:
    """The topics of a bag (``bag`` names it in errors) that play, and why the others do not.

    ``requested``: bag topic names to play (None: all); ``remaps`` apply to bag topic names, then
    the namespace prefixes every target; ``cameras``: the cameras the graph reads (their topics
    take the sensor roles). ValueError: a requested topic or remap source the bag
    lacks, two remap rules for one topic, two topics onto one target, a sensor topic of the wrong
    type, a requested topic of a type ROS does not know, nothing left to play.
    """
    wanted = None if requested is None else [absolute_topic(t) for t in requested]
    missing = [t for t in wanted or [] if t not in topics]
    if missing:
        raise ValueError(f"bag {bag}: no topic {', '.join(missing)} (the bag has {', '.join(sorted(topics))})")
    rules: dict[str, str] = {}
    for rule in remaps:
        if rule.source not in topics:
            raise ValueError(f"bag {bag}: remap rule {rule.source}:={rule.target}: the bag has no topic "
                             f"{rule.source} (it has {', '.join(sorted(topics))})")
        if rule.source in rules and rules[rule.source] != rule.target:
            raise ValueError(f"bag {bag}: two remap rules for {rule.source} ({rules[rule.source]}, {rule.target})")
        rules[rule.source] = rule.target
    roles = role_targets(namespace, cameras)
    prefix = namespace.rstrip("/")
    played: list[PlayedTopic] = []
    skipped: list[tuple[str, str]] = []
    for name in sorted(topics) if wanted is None else wanted:
        topic = topics[name]
        target = prefix + rules.get(name, name)
        role = roles.get(target)
        if target == f"{prefix}/{FRAMES_TOPIC}":  # a recording of a replay: the live nodes report their own
            skipped.append((name, "the model nodes of the graph publish their own frame reports there"))
            continue
        if role is not None and topic.msgtype != ROLE_TYPES[role]:
            raise ValueError(f"bag {bag}: topic {name} (played as {target}, the graph's {role} topic) has type "
                             f"{topic.msgtype or 'unknown'}; the {role} topic must be {ROLE_TYPES[role]}")
        if role is None and not (topic.msgtype and type_available(topic.msgtype)):
            why = f"its message type {topic.msgtype or '(none recorded)'} is unknown to this ROS installation"
            if wanted is not None:
                raise ValueError(f"bag {bag}: topic {name}: {why}")
            skipped.append((name, why))
            continue
        played.append(PlayedTopic(name, target, topic.msgtype, topic.count, role))
    targets: dict[str, str] = {}
    for entry in played:
        if entry.target in targets:
            raise ValueError(f"bag {bag}: topics {targets[entry.target]} and {entry.source} would both be played "
                             f"as {entry.target}; remap one of them")
        targets[entry.target] = entry.source
    if not played:
        reasons = "; ".join(f"{t}: {why}" for t, why in skipped) or "it has no topics"
        raise ValueError(f"bag {bag}: nothing to play ({reasons})")
    return TopicPlan(tuple(played), tuple(skipped))
