"""The Foxglove WebSocket server of the live view: one channel per view topic, loopback only.

Why loopback only: the server has no authentication and streams the robot's camera, so it is
bound to 127.0.0.1 and reached from elsewhere through an SSH tunnel (docs/ros.md); the host is
not a setting. A port that cannot be bound (another server on it) is reported, not raised, so
the caller keeps running and tries again.
"""
from __future__ import annotations

from dataclasses import dataclass

import foxglove
from foxglove.channels import CameraCalibrationChannel, ImageAnnotationsChannel, RawImageChannel

LOOPBACK_HOST = "127.0.0.1"
SERVER_NAME = "dynnet_ros"


@dataclass(frozen=True)
class ViewTopics:
    """Foxglove topic of each channel (the nodes use the resolved ROS topic names)."""

    camera: str
    calibration: str
    lane_mask: str
    lane_labels: str
    depth: str
    pedestrians: str


class LiveView:
    """The channels, and the server once ``serve`` has bound its port. Channels log nothing
    (and callers may skip converting) while no client is subscribed: see ``has_sinks``."""

    def __init__(self, topics: ViewTopics) -> None:
        self.topics = topics
        self.context = foxglove.Context()
        self.camera = RawImageChannel(topics.camera, context=self.context)
        self.calibration = CameraCalibrationChannel(topics.calibration, context=self.context)
        self.lane_mask = RawImageChannel(topics.lane_mask, context=self.context)
        self.lane_labels = RawImageChannel(topics.lane_labels, context=self.context)
        self.depth = RawImageChannel(topics.depth, context=self.context)
        self.pedestrians = ImageAnnotationsChannel(topics.pedestrians, context=self.context)
        self._server: foxglove.WebSocketServer | None = None

    def serve(self, port: int) -> str | None:
        """Start serving on LOOPBACK_HOST:port (0 = any free port); None once serving, else why
        the port could not be bound."""
        if self._server is not None:
            return None
        try:
            self._server = foxglove.start_server(name=SERVER_NAME, host=LOOPBACK_HOST, port=port,
                                                 context=self.context)
        except RuntimeError as exc:  # foxglove-sdk reports a failed bind as RuntimeError("FoxgloveError: ...")
            return str(exc).removeprefix("FoxgloveError: ")
        return None

    @property
    def port(self) -> int | None:
        """The bound port (the chosen one when asked for 0); None while not serving."""
        return None if self._server is None else int(self._server.port)

    @property
    def url(self) -> str | None:
        return None if self._server is None else f"ws://{LOOPBACK_HOST}:{self.port}"

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
