"""The simulator's cameras: each one's view of the one scene, its extrinsic, its parameters.

Several cameras share the mount point and differ by yaw; the one LiDAR covers all of them. The
geometry is checked the way the depth node uses it: LiDAR returns moved into a camera's optical
frame with ``lidar_to_camera_xyzrpy(yaw_deg=...)`` and projected with the CameraInfo K land where
that camera's rendered depth says the same surface is.
"""
from __future__ import annotations

import numpy as np
import pytest

from dynnet_ros.geometry import extrinsic_matrix, transform_points
from dynnet_ros.graph_config import parse_graph
from dynnet_ros.nodes.base import ParamSpec
from dynnet_ros.nodes.parameter_check import parameter_problems
from dynnet_ros.nodes.sensor_sim import declared_specs
from dynnet_ros.perception.projection import project_depth
from dynnet_ros.sim import scene
from dynnet_ros.sim.frames import SimSettings, render_frame, render_image, scan_points
from dynnet_ros.sim.rig import DEMO_CAMERAS, check_camera_names, default_yaw, demo_cameras


def _agreement(extrinsic: np.ndarray, points: np.ndarray, depth: np.ndarray, where: np.ndarray) -> tuple[int, float]:
    """LiDAR pixels among ``where`` and their median relative depth error against ``depth``."""
    height, width = depth.shape
    sparse = project_depth(transform_points(extrinsic, points[:, :3]), scene.camera_matrix(width, height),
                           height, width)
    both = (sparse > 0) & where
    return int(both.sum()), float(np.median(np.abs(sparse[both] - depth[both]) / depth[both])) if both.any() else 1.0


@pytest.mark.parametrize("yaw", [0.0, 20.0, 45.0, 90.0, -90.0, 180.0, -135.0])
def test_each_camera_agrees_with_the_lidar_through_its_own_extrinsic(yaw):
    world = scene.make_scene(3.0)
    extrinsic = extrinsic_matrix(scene.lidar_to_camera_xyzrpy(yaw_deg=yaw))
    np.testing.assert_allclose(extrinsic, scene.lidar_to_camera(yaw), atol=1e-9)
    points = scene.scan_lidar(world, yaws_deg=(0.0, yaw))
    for width, height in [(320, 240), (640, 480)]:
        _, depth = scene.render_camera(world, width, height, yaw_deg=yaw)
        count, error = _agreement(extrinsic, points, depth, depth > 0)
        assert count > 500 and error < 0.02
        # the pedestrians (nearer than the road behind them) agree too, and only through this
        # camera's own extrinsic: the road alone looks the same from every yaw
        _, road = scene.render_camera(scene.make_scene(3.0, count=0), width, height, yaw_deg=yaw)
        pedestrians = (depth > 0) & (depth < road - 0.5)
        if yaw in (0.0, 20.0):
            count, error = _agreement(extrinsic, points, depth, pedestrians)
            assert count > 20 and error < 0.02
        if yaw == 20.0:
            count, error = _agreement(scene.lidar_to_camera(0.0), points, depth, pedestrians)
            assert count == 0 or error > 0.05


def test_yaw_zero_is_the_front_camera_and_the_default_extrinsic():
    assert scene.lidar_to_camera_xyzrpy() == scene.lidar_to_camera_xyzrpy(yaw_deg=0.0)
    world = scene.make_scene(1.0)
    plain, plain_depth = scene.render_camera(world, 320, 240, frame=3)
    front, front_depth = scene.render_camera(world, 320, 240, frame=3, yaw_deg=0.0)
    assert np.array_equal(plain, front) and np.array_equal(plain_depth, front_depth)


def test_cameras_see_the_pedestrians_only_where_they_are():
    """The pedestrians walk ahead (x >= 8 m, |y| <= 4 m): the front camera sees them at their
    distance, a camera turned a little sees them shifted sideways, the rear camera sees road only."""
    world = scene.make_scene(2.0)
    nearest = min(p.x for p in world.pedestrians)
    _, front = scene.render_camera(world, 320, 240)
    _, turned = scene.render_camera(world, 320, 240, yaw_deg=20.0)
    _, rear = scene.render_camera(world, 320, 240, yaw_deg=180.0)
    _, empty = scene.render_camera(scene.make_scene(2.0, count=0), 320, 240, yaw_deg=180.0)
    assert np.isclose(front, nearest).sum() > 50
    assert np.isclose(turned, nearest / np.cos(np.radians(20.0)), rtol=0.15).sum() > 50
    assert np.array_equal(rear, empty)


def test_the_lidar_covers_each_camera_and_one_yaw_is_the_single_camera_scan():
    world = scene.make_scene(0.5)
    one = scene.scan_lidar(world, azimuth_steps=128, seed=4)
    assert np.array_equal(one, scene.scan_lidar(world, azimuth_steps=128, seed=4, yaws_deg=(0.0,)))
    four = scene.scan_lidar(world, azimuth_steps=128, seed=4, yaws_deg=(0.0, 90.0, -90.0, 180.0))
    azimuth = np.degrees(np.arctan2(four[:, 1], four[:, 0]))
    for yaw in (90.0, -90.0, 180.0):
        off = (azimuth - yaw + 180.0) % 360.0 - 180.0
        assert (np.abs(off) < 35.0).sum() > 200, yaw
    assert 3 * len(one) < len(four) < 5 * len(one)
    with pytest.raises(ValueError, match="at least one camera"):
        scene.scan_lidar(world, yaws_deg=())


def test_frames_of_one_camera_and_lidar_are_the_single_camera_frame():
    settings = SimSettings(resolutions=("160x128",), lidar_azimuth_steps=64)
    frame = render_frame(settings, 7, 0.7)
    camera = render_image(settings, 7, 0.7)
    assert np.array_equal(frame.image, camera.image) and np.array_equal(frame.camera_matrix, camera.camera_matrix)
    assert np.array_equal(frame.points, scan_points(settings, 7, 0.7))
    assert not np.array_equal(camera.image, render_image(settings, 7, 0.7, yaw_deg=90.0).image)


def test_default_yaws_name_the_usual_cameras_and_spread_the_others():
    assert [default_yaw(name, i, 8) for i, name in enumerate(DEMO_CAMERAS)] == \
        [0.0, 90.0, -90.0, 180.0, 45.0, -45.0, 135.0, -135.0]
    assert [default_yaw(f"cam{i}", i, 3) for i in range(3)] == [0.0, 120.0, -120.0]
    assert [default_yaw(f"cam{i}", i, 2) for i in range(2)] == [0.0, 180.0]
    assert demo_cameras(1) == ["front"] and demo_cameras(4) == ["front", "left", "right", "rear"]
    for bad in (0, 9):
        with pytest.raises(ValueError, match="1 to 8 cameras"):
            demo_cameras(bad)


def test_camera_names_are_topic_segments_and_unique():
    assert check_camera_names(["front", "rear_left", "_x"]) is None
    assert "listed twice" in check_camera_names(["front", "front"])
    for bad in ("front/left", "1st", "", "a b"):
        assert "not a camera name" in check_camera_names([bad])


def _problems(parameters: dict) -> list[str]:
    return parameter_problems(parse_graph({"nodes": [{"name": "sensor_sim", "executable": "sensor_sim",
                                                      "parameters": parameters}]}))


def test_a_config_may_set_each_listed_cameras_yaw_and_rate():
    assert _problems({"cameras": ["front", "back"], "front.rate_hz": 5.0, "back.yaw_deg": 170.0}) == []
    assert "declares no such parameter" in _problems({"cameras": ["front"], "rear.yaw_deg": 180.0})[0]
    assert "declares no such parameter" in _problems({"front.yaw_deg": 0.0})[0]  # no cameras listed
    assert "front.rate_hz must be in" in _problems({"cameras": ["front"], "front.rate_hz": 100.0})[0]
    assert "listed twice" in _problems({"cameras": ["front", "front"]})[0]
    assert "must be a list of strings" in _problems({"cameras": [1.0]})[0]
    names = [spec.name for spec in declared_specs({"cameras": ["a", "b"], "rate_hz": 4.0})]
    assert names[-4:] == ["a.yaw_deg", "a.rate_hz", "b.yaw_deg", "b.rate_hz"]
    assert [s.default for s in declared_specs({"cameras": ["a", "b"], "rate_hz": 4.0})[-4:]] == [0.0, 4.0, 180.0, 4.0]


def test_an_empty_array_default_takes_the_type_a_file_gives():
    spec = ParamSpec("cameras", [], "Cameras.", kind="string_array")
    assert spec.descriptor().dynamic_typing and spec.validate([]) is None and spec.validate(["a"]) is None
    assert "must be a list of strings" in spec.validate([1.0])
    assert not ParamSpec("classes", [""], "Classes.", kind="string_array").descriptor().dynamic_typing
