"""What the model nodes publish, built from the cores' results without a running graph: pedestrian
markers (boxes and "class score" labels, read back to pixels the way `dynnet demo` does), the
colour-coded lane class map, and the demo's montage of recent frames."""
from __future__ import annotations

import numpy as np
from std_msgs.msg import Header
from visualization_msgs.msg import Marker

from dynnet_ros.commands.demo_frames import Pair, lidar_pixels, marker_boxes, render_montage
from dynnet_ros.geometry import extrinsic_matrix
from dynnet_ros.nodes.convert import array_to_image, xyzi_to_cloud
from dynnet_ros.nodes.lane_node import label_colours
from dynnet_ros.nodes.model_params import class_list
from dynnet_ros.nodes.pedestrian_node import BOX_NS, LABEL_NS, markers
from dynnet_ros.perception import Detections
from dynnet_ros.perception.serving import FrameInfo
from dynnet_ros.sim.scene import camera_matrix, lidar_to_camera_xyzrpy

HEADER = Header(frame_id="cam")
HEADER.stamp.sec = 12


def _detections() -> Detections:
    boxes = np.array([[10.5, 20.0, 110.0, 220.25], [300.0, 40.0, 340.0, 120.0]], np.float32)
    return Detections(boxes, np.array([0.91, 0.4], np.float32), np.array([0, 7], np.int64), ["person", ""])


def test_markers_label_every_box_with_its_class_and_score_and_read_back_to_pixels():
    k = camera_matrix(640, 480)
    array = markers(FrameInfo(HEADER, 640, 480, "rgb8"), _detections(), k)
    assert array.markers[0].action == Marker.DELETEALL
    boxes = [m for m in array.markers if m.ns == BOX_NS]
    labels = [m for m in array.markers if m.ns == LABEL_NS]
    assert [m.type for m in labels] == [Marker.TEXT_VIEW_FACING] * 2
    assert [m.text for m in labels] == ["person 0.91", "7 0.40"]  # no name: the class id
    assert [m.id for m in boxes] == [m.id for m in labels] == [0, 1]
    assert all(m.header.frame_id == "cam" and m.header.stamp.sec == 12 for m in array.markers)
    read = marker_boxes(array, k)
    np.testing.assert_allclose([b for b, _ in read], _detections().boxes_xyxy, atol=1e-3)
    assert [t for _, t in read] == ["person 0.91", "7 0.40"]


def test_class_lists_drop_blank_entries():
    assert class_list([""]) == [] and class_list([" person ", "", "3"]) == ["person", "3"]


def test_label_colours_are_fixed_per_class_and_background_is_black():
    classes = np.array([[0, 1, 2], [2, 1, 0]], np.int32)
    rgb = label_colours(classes)
    assert rgb.shape == (2, 3, 3) and rgb.dtype == np.uint8
    assert (rgb[classes == 0] == 0).all()
    np.testing.assert_array_equal(rgb[0, 1], rgb[1, 1])
    np.testing.assert_array_equal(rgb[0, 2], rgb[1, 0])
    assert len({tuple(c) for c in rgb[classes > 0]}) == 2  # two classes, two colours
    np.testing.assert_array_equal(label_colours(classes), rgb)  # the same every call


def test_lidar_pixels_project_the_cloud_like_the_depth_node():
    transform = extrinsic_matrix(lidar_to_camera_xyzrpy())
    ahead = np.array([[10.0, 0.0, -1.8 + 1.5, 0.0], [-5.0, 0.0, 0.0, 0.0]], np.float32)  # one in front, one behind
    u, v, z = lidar_pixels(xyzi_to_cloud(ahead), transform, camera_matrix(640, 480), 640, 480)
    assert len(z) == 1 and abs(z[0] - 10.2) < 0.3 and 0 <= u[0] < 640 and 0 <= v[0] < 480


def test_the_montage_pairs_outputs_with_their_frames(tmp_path):
    rgb = np.full((48, 64, 3), 90, np.uint8)
    camera = array_to_image(rgb, "rgb8", HEADER)
    mask = np.zeros((48, 64), np.uint8)
    mask[30:, 20:40] = 255
    depth = np.tile(np.linspace(1.0, 30.0, 48, dtype=np.float32)[:, None], (1, 64))
    cloud = xyzi_to_cloud(np.array([[8.0, 0.0, 0.0, 1.0]], np.float32))
    k = camera_matrix(64, 48)
    array = markers(FrameInfo(HEADER, 64, 48, "rgb8"), _detections(), k)
    pairs = {"lane": [Pair(12.0, camera, array_to_image(mask, "mono8", HEADER))],
             "pedestrian": [Pair(12.0, camera, array, k)],
             "depth": [Pair(12.0, camera, array_to_image(depth, "32FC1", HEADER), k, cloud)]}
    path = tmp_path / "montage.png"
    assert render_montage(pairs, extrinsic_matrix(lidar_to_camera_xyzrpy()), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not render_montage({"lane": [], "pedestrian": [], "depth": []}, np.eye(4), tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
