"""Depth: the robust scale-and-shift fit, relative models made metric with LiDAR, metric and zoo models."""
from __future__ import annotations

import numpy as np
import pytest
from _perception_models import pixel_map

from dynnet_ros.perception import DepthEstimator
from dynnet_ros.perception.depth_fit import robust_affine_fit

SCALE, SHIFT = 0.08, 0.015          # 1 / metres = SCALE * relative + SHIFT
K = np.array([[60.0, 0.0, 47.5], [0.0, 60.0, 31.5], [0.0, 0.0, 1.0]])   # a 96x64 camera


def synthetic_pairs(rng, n, outlier_share):
    relative = rng.uniform(0.1, 4.0, n)
    inverse = SCALE * relative + SHIFT + rng.normal(0, 1e-4, n)
    bad = rng.random(n) < outlier_share
    inverse[bad] = 1.0 / rng.uniform(0.5, 80.0, bad.sum())   # returns of other surfaces
    return relative, inverse, bad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_recovers_scale_and_shift_with_30_percent_outliers(seed):
    rng = np.random.default_rng(seed)
    relative, inverse, bad = synthetic_pairs(rng, 600, 0.3)
    assert 0.25 < bad.mean() < 0.35
    fit = robust_affine_fit(relative, inverse)
    assert fit is not None
    assert fit.scale == pytest.approx(SCALE, rel=2e-3) and fit.shift == pytest.approx(SHIFT, abs=2e-4)
    assert fit.residual < 5e-4 and 0.6 * 600 < fit.inliers <= 600
    # plain least squares does not: the outliers pull it away
    slope, intercept = np.polyfit(relative, inverse, 1)
    assert abs(slope - SCALE) > 10 * abs(fit.scale - SCALE)


def test_fit_needs_enough_points_and_an_increasing_line():
    rng = np.random.default_rng(5)
    relative, inverse, _ = synthetic_pairs(rng, 10, 0.0)
    assert robust_affine_fit(relative, inverse, min_points=20) is None
    assert robust_affine_fit(relative, -inverse) is None
    assert robust_affine_fit(np.full(50, 2.0), rng.random(50)) is None


def relative_model(tmp_path):
    """Relative inverse depth = 0.5 + 3 x red channel (on the normalised input, ImageNet stats off)."""
    return pixel_map(tmp_path / "rel.onnx", np.array([[3.0, 0.0, 0.0]], np.float32), np.array([0.5], np.float32),
                     input_name="pixel_values", output_name="predicted_depth", squeeze=True)


def scene(height=64, width=96) -> np.ndarray:
    rng = np.random.default_rng(7)
    img = np.zeros((height, width, 3), np.uint8)
    img[:, :, 0] = np.linspace(20, 240, width)[None, :].astype(np.uint8)   # nearer to the right
    img[:, :, 1] = rng.integers(0, 256, (height, width))
    return img


def lidar_for(img, rng, n=400, outlier_share=0.3):
    """Camera-frame points at random pixels whose depth is the truth there; a share are outliers."""
    relative = 0.5 + 3.0 * img[:, :, 0].astype(np.float64) / 255.0
    u = rng.integers(0, img.shape[1], n)
    v = rng.integers(0, img.shape[0], n)
    z = 1.0 / (SCALE * relative[v, u] + SHIFT)
    bad = rng.random(n) < outlier_share
    z[bad] = rng.uniform(0.5, 60.0, bad.sum())
    x = (u - K[0, 2]) * z / K[0, 0]
    y = (v - K[1, 2]) * z / K[1, 1]
    return np.stack([x, y, z], axis=1), relative


def test_relative_model_is_made_metric_with_lidar(tmp_path):
    path = relative_model(tmp_path)
    with pytest.raises(ValueError, match="ambiguous depth model.*metric.*relative"):
        DepthEstimator(path)
    dep = DepthEstimator(path, "relative", mean=(0, 0, 0), std=(1, 1, 1), input_size=0, input_multiple=1)
    img = scene()
    points, relative = lidar_for(img, np.random.default_rng(3))
    depth = dep(img, points, K)
    assert depth.fit is not None and not depth.fit.held
    assert depth.fit.scale == pytest.approx(SCALE, rel=1e-3) and depth.fit.shift == pytest.approx(SHIFT, abs=1e-4)
    assert depth.fit.points == 400 and depth.lidar_points == 400 and depth.fit.inliers < 330
    np.testing.assert_allclose(depth.metres, 1.0 / (SCALE * relative + SHIFT), rtol=1e-3)
    np.testing.assert_allclose(depth.relative, relative, atol=1e-4)
    # too few points: the last good fit is held, and says so
    held = dep(img, points[:5], K)
    assert held.fit is not None and held.fit.held and held.fit.points == 5
    assert held.fit.scale == depth.fit.scale
    np.testing.assert_allclose(held.metres, depth.metres)
    assert dep.last_fit is not None and not dep.last_fit.held


def test_fits_are_held_per_camera_and_batches_make_them_in_order(tmp_path):
    """A camera without enough points holds its own last fit, never another camera's; a batch
    (a model with a symbolic batch) makes and holds fits as one-by-one calls do."""
    path = pixel_map(tmp_path / "rel_b.onnx", np.array([[3.0, 0.0, 0.0]], np.float32), np.array([0.5], np.float32),
                     input_name="pixel_values", output_name="predicted_depth", squeeze=True,
                     input_dims=("B", 3, "H", "W"))
    options = dict(mean=(0, 0, 0), std=(1, 1, 1), input_size=0, input_multiple=1)
    img = scene()
    points, _ = lidar_for(img, np.random.default_rng(3))
    frames = [img, img, img, img]
    lidars = [(points, K), (points[:5], K), (points[:5], K), None]
    sources = ["front", "rear", "front", "rear"]
    with DepthEstimator(path, "relative", **options) as dep:
        assert dep.max_batch > 1
        one_by_one = [dep(f, *(item or (None, None)), source=name) for f, item, name in zip(frames, lidars, sources)]
    assert one_by_one[0].fit is not None and not one_by_one[0].fit.held
    assert one_by_one[1].fit is None and not one_by_one[1].metres.any()       # rear has no fit of its own
    assert one_by_one[2].fit is not None and one_by_one[2].fit.held           # front holds its own
    assert one_by_one[3].fit is None
    with DepthEstimator(path, "relative", **options) as dep:
        runs = dep.engine.engine_stats().runs
        together = dep.batch(frames, lidars, sources)
        assert dep.engine.engine_stats().runs == runs + 1
        with pytest.raises(ValueError, match="one camera name per frame"):
            dep.batch(frames, lidars, ["front"])
    for alone, batched in zip(one_by_one, together):
        assert (alone.fit is None) == (batched.fit is None)
        assert alone.fit is None or (alone.fit.held, alone.fit.scale) == (batched.fit.held, batched.fit.scale)
        np.testing.assert_allclose(batched.metres, alone.metres, rtol=1e-5)


def test_relative_model_before_any_fit_is_unknown(tmp_path):
    dep = DepthEstimator(relative_model(tmp_path), "relative", mean=(0, 0, 0), std=(1, 1, 1), input_size=0,
                         input_multiple=1)
    depth = dep(scene())
    assert depth.fit is None and not depth.metres.any() and depth.relative is not None
    with pytest.raises(ValueError, match="go together"):
        dep(scene(), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="lidar_points must be an \\(N, 3\\)"):
        dep(scene(), np.zeros((3, 2)), K)
    with pytest.raises(ValueError, match="focal lengths"):
        dep(scene(), np.zeros((3, 3)), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="depth_scale applies to metric"):
        DepthEstimator(relative_model(tmp_path), "relative", depth_scale=2.0)


def test_metric_model_scaled_and_clipped(tmp_path):
    path = pixel_map(tmp_path / "metric.onnx", np.array([[30.0, 0.0, 0.0]], np.float32), np.array([1.0], np.float32))
    dep = DepthEstimator(path, "metric", mean=(0, 0, 0), std=(1, 1, 1), input_size=0, input_multiple=1,
                         depth_scale=2.0, max_depth_m=40.0)
    img = scene()
    depth = dep(img)
    want = np.minimum((1.0 + 30.0 * img[:, :, 0] / 255.0) * 2.0, 40.0)
    np.testing.assert_allclose(depth.metres, want, rtol=1e-5)
    assert depth.fit is None and depth.relative is None
    with pytest.raises(ValueError, match="max_depth_m"):
        DepthEstimator(path, "metric", max_depth_m=0)


def test_dense_defaults_pad_to_multiples_of_14(tmp_path):
    dep = DepthEstimator(relative_model(tmp_path), "relative")
    assert dep.preprocess.multiple == 14 and dep.preprocess.target == (518, 518)
    box = dep.preprocess.plan(480, 640)
    assert box.pad_h % 14 == 0 and box.pad_w % 14 == 0 and box.new_w == 518


def test_zoo_depth_takes_the_lidar_channel():
    from dynnet_ros.zoo import ensure_model

    dep = DepthEstimator(str(ensure_model("depth")))
    assert dep.format_name == "zoo" and "lidar_depth" in dep.format_reason
    img = np.random.default_rng(2).integers(0, 256, (120, 160, 3), dtype=np.uint8)
    k = np.array([[100.0, 0, 79.5], [0, 100.0, 59.5], [0, 0, 1]])
    rng = np.random.default_rng(4)
    points = np.stack([rng.uniform(-3, 3, 500), rng.uniform(-1, 1, 500), np.full(500, 8.0)], axis=1)
    with_lidar = dep(img, points, k)
    without = dep(img)
    assert without.lidar_points == 0 and with_lidar.lidar_points > 100
    assert with_lidar.metres.shape == (120, 160)
    # the zoo model fuses the returns: the map moves towards 8 m where the points are
    u = np.round(100 * points[:, 0] / 8 + 79.5).astype(int)
    v = np.round(100 * points[:, 1] / 8 + 59.5).astype(int)
    inside = (u >= 0) & (u < 160) & (v >= 0) & (v < 120)
    near = np.abs(with_lidar.metres[v[inside], u[inside]] - 8.0).mean()
    assert near < np.abs(without.metres[v[inside], u[inside]] - 8.0).mean()
