"""Message <-> array conversion, letterboxing and LiDAR projection (no ROS graph needed)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from sensor_msgs.msg import Image, PointCloud2, PointField

from dynnet_ros.geometry import extrinsic_matrix, matrix_to_rpy, rpy_to_matrix, transform_points
from dynnet_ros.graph_config import default_config_path, load_graph
from dynnet_ros.nodes.convert import array_to_image, cloud_to_xyzi, image_to_array, image_to_rgb8, xyzi_to_cloud
from dynnet_ros.perception.letterbox import Letterbox, plan_letterbox, resize_bilinear
from dynnet_ros.perception.projection import project_depth, validate_intrinsics
from dynnet_ros.sim import scene

RNG = np.random.default_rng(7)


def padded_image(array: np.ndarray, encoding: str, pad: int, big_endian: bool = False) -> Image:
    """Build an Image by hand with `pad` garbage bytes at the end of every row."""
    h, w = array.shape[:2]
    order = ">" if big_endian else "<"
    typed = array.astype(array.dtype.newbyteorder(order))
    rows = typed.reshape(h, -1).view(np.uint8).reshape(h, -1)
    garbage = np.full((h, pad), 0xAB, dtype=np.uint8)
    data = np.concatenate([rows, garbage], axis=1).tobytes()
    return Image(height=h, width=w, encoding=encoding, is_bigendian=int(big_endian), step=rows.shape[1] + pad,
                 data=data)


# ----------------------------------------------------------------------------- images

@pytest.mark.parametrize("encoding,shape,dtype", [("rgb8", (5, 7, 3), np.uint8), ("bgr8", (5, 7, 3), np.uint8),
                                                  ("mono8", (5, 7), np.uint8), ("32FC1", (5, 7), np.float32),
                                                  ("mono16", (4, 3), np.uint16)])
def test_image_roundtrip(encoding, shape, dtype):
    array = (RNG.random(shape) * 200).astype(dtype)
    msg = array_to_image(array, encoding)
    assert (msg.height, msg.width) == shape[:2]
    assert msg.step == shape[1] * (shape[2] if len(shape) == 3 else 1) * np.dtype(dtype).itemsize
    np.testing.assert_array_equal(image_to_array(msg), array)


@pytest.mark.parametrize("encoding,channels,dtype", [("rgb8", 3, np.uint8), ("mono8", 1, np.uint8),
                                                     ("32FC1", 1, np.float32)])
def test_row_padding_in_step_is_skipped(encoding, channels, dtype):
    shape = (6, 9, channels) if channels > 1 else (6, 9)
    array = (RNG.random(shape) * 250).astype(dtype)
    msg = padded_image(array, encoding, pad=13)
    np.testing.assert_array_equal(image_to_array(msg), array)


def test_big_endian_flag_is_honoured():
    array = RNG.random((4, 5)).astype(np.float32)
    msg = padded_image(array, "32FC1", pad=4, big_endian=True)
    np.testing.assert_array_equal(image_to_array(msg), array)
    little = padded_image(array, "32FC1", pad=4, big_endian=False)
    np.testing.assert_array_equal(image_to_array(little), array)


def test_every_encoding_gives_the_rgb8_frame_the_cores_take():
    rgb = (RNG.random((4, 6, 3)) * 255).astype(np.uint8)
    msg = array_to_image(rgb, "rgb8")
    from_rgb = image_to_rgb8(msg)
    np.testing.assert_array_equal(from_rgb, rgb)
    assert np.shares_memory(from_rgb, np.frombuffer(msg.data, dtype=np.uint8))  # no copy for rgb8
    np.testing.assert_array_equal(image_to_rgb8(array_to_image(rgb[:, :, ::-1], "bgr8")), rgb)
    alpha = np.concatenate([rgb, np.full((4, 6, 1), 7, np.uint8)], axis=2)
    np.testing.assert_array_equal(image_to_rgb8(array_to_image(alpha, "rgba8")), rgb)
    np.testing.assert_array_equal(image_to_rgb8(array_to_image(alpha[:, :, [2, 1, 0, 3]], "bgra8")), rgb)
    grey = rgb[..., 1]
    for encoding, value in (("mono8", grey), ("mono16", grey.astype(np.uint16) * 257),
                            ("32FC1", grey.astype(np.float32) / 255.0)):
        out = image_to_rgb8(array_to_image(value, encoding))
        assert out.dtype == np.uint8 and out.shape == (4, 6, 3), encoding
        np.testing.assert_array_equal(out[..., 0], grey, err_msg=encoding)
        np.testing.assert_array_equal(out[..., 2], grey, err_msg=encoding)


@pytest.mark.parametrize("mutate,reason", [
    (lambda m: setattr(m, "step", m.width * 3 - 1), "shorter than one row"),
    (lambda m: setattr(m, "encoding", "yuv422_weird"), "unsupported image encoding"),
    (lambda m: (setattr(m, "width", 0), setattr(m, "height", 0)), "zero size"),
    (lambda m: setattr(m, "data", bytes(m.step * m.height - 5)), "needs"),
])
def test_bad_images_raise_with_reason(mutate, reason):
    msg = array_to_image(np.zeros((4, 5, 3), np.uint8), "rgb8")
    mutate(msg)
    with pytest.raises(ValueError, match=reason):
        image_to_array(msg)


def test_nan_float_image_is_rejected():
    msg = array_to_image(np.full((3, 4), np.nan, np.float32), "32FC1")
    with pytest.raises(ValueError, match="NaN"):
        image_to_rgb8(msg)


def test_array_to_image_rejects_wrong_channels():
    with pytest.raises(ValueError, match="rgb8 needs"):
        array_to_image(np.zeros((3, 4), np.uint8), "rgb8")


# ----------------------------------------------------------------------------- point clouds

def test_cloud_roundtrip():
    pts = RNG.normal(size=(257, 4)).astype(np.float32)
    msg = xyzi_to_cloud(pts)
    assert msg.point_step == 16 and msg.width == 257 and msg.height == 1
    np.testing.assert_array_equal(cloud_to_xyzi(msg), pts)


def test_cloud_with_foreign_layout_big_endian_and_row_padding():
    """float64 xyz, an extra field, padding inside points and rows, big-endian, 2 rows."""
    dtype = np.dtype({"names": ["x", "y", "z", "ring", "intensity"],
                      "formats": [">f8", ">f8", ">f8", ">u2", ">f4"],
                      "offsets": [0, 8, 16, 24, 28], "itemsize": 40})
    pts = np.zeros(6, dtype=dtype)
    for name in ("x", "y", "z", "intensity"):
        pts[name] = RNG.normal(size=6)
    rows = pts.reshape(2, 3).view(np.uint8).reshape(2, -1)
    data = np.concatenate([rows, np.zeros((2, 8), np.uint8)], axis=1).tobytes()
    fields = [PointField(name="x", offset=0, datatype=PointField.FLOAT64, count=1),
              PointField(name="y", offset=8, datatype=PointField.FLOAT64, count=1),
              PointField(name="z", offset=16, datatype=PointField.FLOAT64, count=1),
              PointField(name="ring", offset=24, datatype=PointField.UINT16, count=1),
              PointField(name="intensity", offset=28, datatype=PointField.FLOAT32, count=1)]
    msg = PointCloud2(height=2, width=3, fields=fields, is_bigendian=True, point_step=40, row_step=128, data=data)
    out = cloud_to_xyzi(msg)
    expected = np.column_stack([pts[n].astype(np.float32) for n in ("x", "y", "z", "intensity")])
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_cloud_without_intensity_and_with_nan_points():
    pts = RNG.normal(size=(5, 4)).astype(np.float32)
    pts[2, 1] = np.nan
    msg = xyzi_to_cloud(pts)
    msg.fields = msg.fields[:3]
    out = cloud_to_xyzi(msg)
    assert out.shape == (4, 4) and np.all(out[:, 3] == 0)


@pytest.mark.parametrize("mutate,reason", [
    (lambda m: setattr(m, "fields", m.fields[:2]), "lacks field"),
    (lambda m: setattr(m, "data", bytes(10)), "needs"),
    (lambda m: setattr(m.fields[0], "datatype", 99), "unknown datatype"),
    (lambda m: setattr(m, "row_step", 4), "row_step"),
    (lambda m: setattr(m.fields[3], "offset", 14), "overruns"),
])
def test_bad_clouds_raise_with_reason(mutate, reason):
    msg = xyzi_to_cloud(np.ones((3, 4), np.float32))
    mutate(msg)
    with pytest.raises(ValueError, match=reason):
        cloud_to_xyzi(msg)


# ----------------------------------------------------------------------------- letterbox

def zoo_letterbox(height: int, width: int, max_side: int) -> Letterbox:
    """How the zoo formats place a frame: shrink to fit ``max_side`` (0: keep), pad right/bottom."""
    return plan_letterbox(height, width, target=(max_side, max_side) if max_side else None, multiple=32,
                          scaleup=False)


@pytest.mark.parametrize("size,max_side,expected_input,expected_new", [
    ((240, 320), 640, (256, 320), (240, 320)),
    ((480, 640), 640, (480, 640), (480, 640)),
    ((720, 1280), 640, (384, 640), (360, 640)),
    ((720, 1280), 0, (736, 1280), (720, 1280)),
    ((100, 33), 0, (128, 64), (100, 33)),
])
def test_letterbox_sizes_are_multiples_of_32(size, max_side, expected_input, expected_new):
    lb = zoo_letterbox(*size, max_side=max_side)
    assert lb.input_shape == expected_input
    assert (lb.new_h, lb.new_w) == expected_new
    assert lb.pad_h % 32 == 0 and lb.pad_w % 32 == 0


def test_letterbox_maps_results_back_to_camera_pixels():
    h, w = 720, 1280
    lb = zoo_letterbox(h, w, max_side=640)
    assert (lb.top, lb.left, lb.new_h, lb.pad_h) == (0, 0, 360, 384)  # padding only at the bottom
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    smooth = xx / w
    model_map = np.full((lb.pad_h, lb.pad_w), -1.0, np.float32)
    model_map[: lb.new_h, : lb.new_w] = resize_bilinear(smooth, lb.new_h, lb.new_w)
    back = lb.to_source(model_map)
    assert back.shape == (h, w)
    assert np.abs(back - smooth).max() < 3.0 / w
    # a box around camera pixels (100..300, 50..150) in model coordinates maps back exactly
    boxes = np.array([[100 * lb.scale, 50 * lb.scale, 300 * lb.scale, 150 * lb.scale],
                      [-5, -5, 5000, 5000]], np.float32)
    out = lb.boxes_to_source(boxes)
    np.testing.assert_allclose(out[0], [100, 50, 300, 150], atol=1e-3)
    np.testing.assert_allclose(out[1], [0, 0, w, h])


def test_scaled_intrinsics_project_like_a_resized_image():
    k = scene.camera_matrix(1280, 720)
    lb = zoo_letterbox(720, 1280, max_side=640)
    ks = lb.scale_intrinsics(k)
    point = np.array([1.3, -0.4, 7.0])
    u, v = (k @ point)[:2] / point[2]
    us, vs = (ks @ point)[:2] / point[2]
    s = lb.new_w / 1280
    assert us == pytest.approx((u + 0.5) * s - 0.5) and vs == pytest.approx((v + 0.5) * s - 0.5)


def test_resize_bilinear_is_exact_on_constant_and_identity():
    a = RNG.random((5, 7)).astype(np.float32)
    np.testing.assert_array_equal(resize_bilinear(a, 5, 7), a)
    np.testing.assert_allclose(resize_bilinear(np.full((4, 4, 2), 3.0), 9, 13), 3.0)
    with pytest.raises(ValueError):
        resize_bilinear(np.zeros((2, 2, 2, 2)), 3, 3)


@pytest.mark.parametrize(("height", "width"), [(6, 8), (7, 5), (60, 40), (61, 40)])
def test_resize_bilinear_matches_onnx_resize_at_half_size_and_elsewhere(height, width):
    """Half-pixel bilinear as ONNX Resize defines it (onnx's reference implementation), on the
    exact halving the 2x2-mean path serves and on sizes the general path serves."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear",
                            coordinate_transformation_mode="half_pixel")
    graph = helper.make_graph([node], "resize", [helper.make_tensor_value_info("x", 1, None),
                                                 helper.make_tensor_value_info("sizes", 7, [2])],
                              [helper.make_tensor_value_info("y", 1, None)])
    reference = ReferenceEvaluator(helper.make_model(graph))
    image = RNG.integers(0, 256, (height, width, 3), dtype=np.uint8)
    for out_h, out_w in [(height // 2, width // 2), (height * 2 // 3 or 1, width + 3)]:
        if out_h == 0 or out_w == 0:
            continue
        got = resize_bilinear(image, out_h, out_w)
        for c in range(3):
            want = reference.run(None, {"x": image[:, :, c].astype(np.float32),
                                        "sizes": np.array([out_h, out_w], np.int64)})[0]
            np.testing.assert_allclose(got[:, :, c], want, rtol=0, atol=1e-3)


# ----------------------------------------------------------------------------- extrinsics / projection

def test_rpy_matrix_roundtrip_and_six_vs_sixteen_values():
    for rpy in [(0.1, -0.4, 2.0), (-1.2, 0.3, -0.7), (0.0, 0.0, 0.0)]:
        r = rpy_to_matrix(*rpy)
        np.testing.assert_allclose(r @ r.T, np.eye(3), atol=1e-12)
        np.testing.assert_allclose(rpy_to_matrix(*matrix_to_rpy(r)), r, atol=1e-12)
        six = extrinsic_matrix([1.0, 2.0, 3.0, *rpy])
        sixteen = extrinsic_matrix(six.ravel().tolist())
        np.testing.assert_allclose(six, sixteen)
    # yaw of +90 degrees turns x into y
    np.testing.assert_allclose(rpy_to_matrix(0, 0, math.pi / 2) @ [1, 0, 0], [0, 1, 0], atol=1e-12)


@pytest.mark.parametrize("values,reason", [
    ([1.0, 2.0, 3.0], "needs 6 values"),
    ([0, 0, 0, 0, 0, float("nan")], "NaN"),
    ([2, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1], "not a proper rotation"),
    ([1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1], "last row"),
])
def test_bad_extrinsics_are_rejected(values, reason):
    with pytest.raises(ValueError, match=reason):
        extrinsic_matrix(values)


def test_project_depth_keeps_nearest_and_drops_points_behind():
    k = np.array([[100.0, 0, 50], [0, 100.0, 40], [0, 0, 1]])
    pts = np.array([[0.0, 0.0, 5.0], [0.0, 0.0, 3.0], [0.0, 0.0, -2.0], [10.0, 0.0, 1.0], [0.02, 0.016, 2.0]])
    depth = project_depth(pts, k, 80, 100)
    assert depth[40, 50] == pytest.approx(3.0)       # nearest of the two on the optical axis
    assert depth[40 + 1, 50 + 1] == pytest.approx(2.0)  # (0.02, 0.016, 2) -> u = 51, v = 40.8 -> 41
    assert np.count_nonzero(depth) == 2               # behind-camera and out-of-image points dropped


def test_validate_intrinsics():
    assert validate_intrinsics(list(range(1, 10))).shape == (3, 3)
    with pytest.raises(ValueError, match="focal"):
        validate_intrinsics([0, 0, 1, 0, 0, 1, 0, 0, 1])
    with pytest.raises(ValueError, match="9 values"):
        validate_intrinsics([1, 2, 3])


def test_simulated_lidar_agrees_with_camera_depth_through_the_configured_extrinsic():
    """The depth node's configured extrinsic + the CameraInfo K put LiDAR returns where the
    simulator's camera sees the same surface at the same depth."""
    graph = load_graph(default_config_path())
    extrinsic = extrinsic_matrix(graph.node("depth_node").parameters["lidar_to_camera"])
    np.testing.assert_allclose(extrinsic, scene.lidar_to_camera(), atol=1e-9)
    world = scene.make_scene(3.0)
    for width, height in [(320, 240), (1280, 720)]:
        _, depth = scene.render_camera(world, width, height)
        points = scene.scan_lidar(world)
        sparse = project_depth(transform_points(extrinsic, points[:, :3]), scene.camera_matrix(width, height),
                               height, width)
        both = (sparse > 0) & (depth > 0)
        assert both.sum() > 1000
        rel = np.abs(sparse[both] - depth[both]) / depth[both]
        assert np.median(rel) < 0.02
        # and a wrong extrinsic (LiDAR assumed 1 m higher) does not agree
        shifted = extrinsic.copy()
        shifted[1, 3] -= 1.0
        wrong = project_depth(transform_points(shifted, points[:, :3]), scene.camera_matrix(width, height),
                              height, width)
        both = (wrong > 0) & (depth > 0)
        assert np.median(np.abs(wrong[both] - depth[both]) / depth[both]) > 0.05


def test_scene_renders_lanes_and_pedestrians():
    world = scene.make_scene(0.0)
    image, depth = scene.render_camera(world, 320, 240)
    assert image.shape == (240, 320, 3) and image.dtype == np.uint8
    assert (depth[:100] == 0).mean() > 0.9                 # sky above the horizon
    assert (depth[200:] > 0).all()                         # road below
    bright = (image.min(axis=2) > 200)[130:].mean()        # white paint on the road
    assert 0.001 < bright < 0.2
    cloud = scene.scan_lidar(world, azimuth_steps=100)
    assert cloud.shape[1] == 4 and 100 < len(cloud) < 1600
    assert len(scene.scan_lidar(world, azimuth_steps=200)) > len(cloud)
