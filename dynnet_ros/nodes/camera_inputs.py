"""The cameras a model node serves, read from its ``cameras`` parameter: topics and names.

Why a module: the rule that turns an entry into topics and a name is shared by the node (its
subscriptions and publishers), its per-camera parameters and ``dynnet up``'s config check, and it
must read the same everywhere. Plain strings, no ROS imports.

An entry is a camera namespace (``front``: image ``front/image_raw``, CameraInfo
``front/camera_info``) or an image topic (its last segment starts with ``image``:
``/cams/left/image_color``, whose namespace is its parent). Outputs go under the namespace
(``front/lane/mask``). The camera's name, its key in diagnostics and in per-camera parameters
(``front.lidar_to_camera``), is the namespace without its outer slashes, inner ones as ``_``.
No entry (``[]``, or only blank ones): the one camera of a single-camera node, ``camera/image_raw``
in, outputs unprefixed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

#: the name of the one camera of a node without ``cameras`` (serving.CAMERA)
DEFAULT_NAME = "camera"
_SEGMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class CameraInput:
    """One camera: its name, the namespace its outputs go under ('' = none), its topics."""

    name: str
    namespace: str
    image_topic: str
    info_topic: str

    def output(self, topic: str) -> str:
        """The camera's output topic for the single-camera output ``topic`` (``lane/mask``)."""
        return f"{self.namespace}/{topic}" if self.namespace else topic


SINGLE = CameraInput(DEFAULT_NAME, "", "camera/image_raw", "camera/camera_info")


def camera_input(entry: str) -> CameraInput:
    """One ``cameras`` entry (see module doc); ValueError naming what is wrong with it."""
    text = entry.strip()
    absolute = text.startswith("/")
    segments = text.strip("/").split("/")
    bad = [s for s in segments if not _SEGMENT.match(s)]
    if not text.strip("/") or bad:
        raise ValueError(f"camera {entry!r} is no camera namespace or image topic (segments are letters, "
                         f"digits and '_', not starting with a digit)")
    if segments[-1].startswith("image"):
        if len(segments) < 2:
            raise ValueError(f"camera {entry!r}: an image topic needs the camera's namespace before it, "
                             f"e.g. 'front/{segments[-1]}'")
        namespace_parts, image = segments[:-1], segments[-1]
    else:
        namespace_parts, image = segments, "image_raw"
    namespace = ("/" if absolute else "") + "/".join(namespace_parts)
    return CameraInput("_".join(namespace_parts), namespace, f"{namespace}/{image}", f"{namespace}/camera_info")


def camera_inputs(entries: list[str]) -> list[CameraInput]:
    """The cameras of a ``cameras`` parameter (blank entries ignored; none: ``SINGLE``);
    ValueError for a bad entry or two entries of the same name."""
    cameras = [camera_input(entry) for entry in entries if entry.strip()]
    if not cameras:
        return [SINGLE]
    names = [camera.name for camera in cameras]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"cameras: {', '.join(twice)} named twice (a camera's name is its namespace "
                         f"without slashes: {', '.join(f'{e!r}' for e in entries if e.strip())})")
    return cameras


def check_cameras(entries: list[str]) -> str | None:
    """Why a ``cameras`` value is refused, or None."""
    try:
        camera_inputs(entries)
    except ValueError as exc:
        return f"cameras: {exc}"
    return None


def per_camera(entries: list[str]) -> bool:
    """Whether the node serves named cameras (not the single default one)."""
    return any(entry.strip() for entry in entries)
