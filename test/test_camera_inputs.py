"""A model node's ``cameras`` entries read as topics and names (nodes/camera_inputs.py)."""
from __future__ import annotations

import pytest

from dynnet_ros.nodes.camera_inputs import SINGLE, CameraInput, camera_inputs, check_cameras


def test_no_camera_named_is_the_single_camera_with_unprefixed_outputs():
    assert camera_inputs([]) == camera_inputs([""]) == [SINGLE]
    assert SINGLE.image_topic == "camera/image_raw" and SINGLE.output("lane/mask") == "lane/mask"


def test_a_namespace_entry_gives_its_topics_and_prefixed_outputs():
    (front,) = camera_inputs(["front"])
    assert front == CameraInput("front", "front", "front/image_raw", "front/camera_info")
    assert front.output("pedestrian/markers") == "front/pedestrian/markers"


def test_an_image_topic_entry_names_its_parent_namespace():
    (left,) = camera_inputs(["/cams/left/image_color"])
    assert left == CameraInput("cams_left", "/cams/left", "/cams/left/image_color", "/cams/left/camera_info")
    assert left.output("depth/image") == "/cams/left/depth/image"
    (rear,) = camera_inputs(["rear/image_raw/"])
    assert (rear.name, rear.image_topic) == ("rear", "rear/image_raw")


@pytest.mark.parametrize("entries, reason", [
    (["front", "front/image_raw"], "front named twice"),
    (["image_raw"], "needs the camera's namespace"),
    (["front cam"], "no camera namespace or image topic"),
    (["9lives"], "no camera namespace or image topic"),
    (["/"], "no camera namespace or image topic"),
])
def test_bad_entries_are_refused_with_the_reason(entries, reason):
    with pytest.raises(ValueError, match=reason):
        camera_inputs(entries)
    problem = check_cameras(entries)
    assert problem is not None and problem.startswith("cameras: ")
