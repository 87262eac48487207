"""Batches of frames: one engine run per batch gives what one run per frame gives, frame by frame."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from _perception_models import batch_fixed_inside, batched_end2end, constant_outputs, nhwc_uint8_map, pixel_map
from onnx import TensorProto, helper, numpy_helper

from dynnet_ros.engine import Engine
from dynnet_ros.perception import DepthEstimator, Detector, Segmenter
from dynnet_ros.perception.batch_capacity import UNBOUNDED_BATCH, batch_capacity
from dynnet_ros.perception.letterbox import plan_letterbox
from dynnet_ros.perception.model_info import read_model_info
from dynnet_ros.zoo import ensure_model

WEIGHTS = np.array([[1.0, -0.5, 0.25]], np.float32)


def frames(count: int, height: int = 96, width: int = 128, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        img = rng.integers(0, 120, (height, width, 3), dtype=np.uint8)
        row = int(rng.integers(0, height - 8))
        img[row: row + 4, :, :] = 250          # a bright line the lane model fires on
        out.append(img)
    return out


def runs(core) -> int:
    return core.engine.engine_stats().runs


@pytest.fixture(scope="module")
def lane():
    with Segmenter(str(ensure_model("lane"))) as core:
        yield core


@pytest.fixture(scope="module")
def depth():
    with DepthEstimator(str(ensure_model("depth"))) as core:
        yield core


@pytest.mark.parametrize("name", ["lane", "depth"])
def test_planned_engine_runs_batches_as_onnxruntime_does(name):
    """The planned executor (RDP shapes, one arena plan per signature) at batches 1, 2 and 4."""
    path = str(ensure_model(name))
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(15)
    with Engine(path, threads=1) as engine:
        for batch in (1, 2, 4):
            feeds = {"image": rng.random((batch, 3, 96, 128), dtype=np.float32)}
            if name == "depth":
                feeds["lidar_depth"] = (rng.random((batch, 1, 96, 128)) > 0.95).astype(np.float32) * 12.0
            got = engine.run(feeds)
            for out, want in zip(reference.get_outputs(), reference.run(None, feeds)):
                assert got[out.name].shape == want.shape
                np.testing.assert_allclose(got[out.name], want, rtol=1e-4, atol=1e-5)
        stats = engine.engine_stats()
        assert stats.executor == "cpu-planned" and stats.shape_signatures_seen == 3


def test_zoo_lane_batch_equals_frame_by_frame_in_one_run(lane):
    assert lane.max_batch == UNBOUNDED_BATCH
    batch = frames(3)
    one_by_one = [lane(f) for f in batch]
    before = runs(lane)
    together = lane.batch(batch)
    assert runs(lane) == before + 1
    assert len(together) == 3
    for alone, batched in zip(one_by_one, together):
        np.testing.assert_allclose(batched.probability, alone.probability, atol=1e-5)
        assert np.mean(batched.mask == alone.mask) > 0.999
    assert lane.engine.engine_stats().shape_signature == {"image": [3, 3, 96, 128]}


def test_mixed_sizes_share_the_largest_padded_size_and_come_back_per_frame(lane):
    batch = frames(1, 96, 128, seed=1) + frames(1, 64, 64, seed=2) + frames(1, 40, 100, seed=3)
    before = runs(lane)
    together = lane.batch(batch)
    assert runs(lane) == before + 1
    assert lane.engine.engine_stats().shape_signature == {"image": [3, 3, 96, 128]}
    assert [r.probability.shape for r in together] == [(96, 128), (64, 64), (40, 100)]
    # the largest frame has no extra padding: exactly its own run; the others see more padding
    # around the same pixels, which only convolutions reaching the border notice
    np.testing.assert_allclose(together[0].probability, lane(batch[0]).probability, atol=1e-5)
    for frame, batched in zip(batch[1:], together[1:]):
        assert np.mean(batched.mask == lane(frame).mask) > 0.9


def test_pixelwise_model_mixed_sizes_match_exactly(tmp_path):
    """A per-pixel model cannot see the padding: every frame of a mixed batch equals its own run."""
    path = pixel_map(tmp_path / "seg.onnx", WEIGHTS, np.zeros(1, np.float32), input_dims=("B", 3, "H", "W"),
                     sigmoid=True)
    with Segmenter(path, "binary", mean=(0, 0, 0), std=(1, 1, 1), input_size=0) as seg:
        assert seg.max_batch == UNBOUNDED_BATCH
        batch = frames(1, 64, 96, seed=4) + frames(1, 32, 160, seed=5) + frames(1, 64, 96, seed=6)
        together = seg.batch(batch)
        assert seg.engine.engine_stats().shape_signature == {"image": [3, 3, 64, 160]}
        for frame, batched in zip(batch, together):
            alone = seg(frame)
            assert batched.probability.shape == frame.shape[:2]
            np.testing.assert_allclose(batched.probability, alone.probability, atol=1e-6)
            np.testing.assert_array_equal(batched.mask, alone.mask)


def test_nhwc_uint8_batch(tmp_path):
    with Segmenter(nhwc_uint8_map(tmp_path / "nhwc.onnx", WEIGHTS), "binary", input_size=0) as seg:
        assert seg.preprocess.layout == "NHWC" and seg.max_batch == UNBOUNDED_BATCH
        batch = frames(2, 64, 96, seed=13) + frames(1, 32, 64, seed=14)
        together = seg.batch(batch)
        assert seg.engine.engine_stats().shape_signature == {"image": [3, 64, 96, 3]}
        for frame, batched in zip(batch, together):
            np.testing.assert_allclose(batched.probability, seg(frame).probability, atol=1e-6)


def test_zoo_depth_batch_with_and_without_lidar(depth):
    assert depth.max_batch == UNBOUNDED_BATCH
    k = np.array([[100.0, 0, 63.5], [0, 100.0, 47.5], [0, 0, 1]])
    rng = np.random.default_rng(4)
    points = np.stack([rng.uniform(-3, 3, 400), rng.uniform(-1, 1, 400), np.full(400, 8.0)], axis=1)
    batch = frames(3, seed=7)
    lidars = [(points, k), None, (points * [1, 1, 0.5], k)]
    one_by_one = [depth(f, *(item or (None, None))) for f, item in zip(batch, lidars)]
    before = runs(depth)
    together = depth.batch(batch, lidars)
    assert runs(depth) == before + 1
    assert depth.engine.engine_stats().shape_signature == {"image": [3, 3, 96, 128],
                                                          "lidar_depth": [3, 1, 96, 128]}
    for alone, batched in zip(one_by_one, together):
        np.testing.assert_allclose(batched.metres, alone.metres, rtol=1e-4, atol=1e-4)
        assert batched.lidar_points == alone.lidar_points
    assert together[0].lidar_points > 100 and together[1].lidar_points == 0


def test_depth_batch_refuses_bad_lidars(depth):
    with pytest.raises(ValueError, match="one .points, camera_matrix. or None per frame"):
        depth.batch(frames(2), [None])
    with pytest.raises(ValueError, match="must be .lidar_points, camera_matrix. or None"):
        depth.batch(frames(1), [np.zeros((4, 3))])


def test_batched_detector_maps_boxes_back_per_frame(tmp_path):
    boxes = np.array([[32, 16, 96, 80], [0, 0, 64, 64]], np.float32)
    with Detector(batched_end2end(tmp_path / "e2e.onnx", boxes), input_size=128, score_threshold=0.0) as det:
        assert det.format_name == "yolo-end2end" and det.max_batch == UNBOUNDED_BATCH
        dim, bright = np.full((128, 128, 3), 40, np.uint8), np.full((64, 128, 3), 200, np.uint8)
        batch = [dim, bright, dim.copy()]
        before = runs(det)
        together = det.batch(batch)
        assert runs(det) == before + 1
        for i in (0, 2):  # the frames of the batch's size: placed as they would be alone
            alone = det(batch[i])
            np.testing.assert_allclose(together[i].boxes_xyxy, alone.boxes_xyxy, atol=1e-4)
            np.testing.assert_allclose(together[i].scores, alone.scores, atol=1e-5)
        # the 64x128 frame sits centred in the 128x128 input, 32 rows down: its boxes come back
        # in its own pixels from there (clipped to its 64 rows)
        np.testing.assert_allclose(together[1].boxes_xyxy, [[32, 0, 96, 48], [0, 0, 64, 32]], atol=1e-4)
        # each frame is scored by its own pixels
        np.testing.assert_allclose(together[1].scores, [200 / 255] * 2, atol=1e-5)
        np.testing.assert_allclose(together[0].scores, [40 / 255] * 2, atol=1e-5)


def test_batch_1_model_runs_frame_by_frame():
    """The zoo pedestrian model (NMS inside, boxes [N, 4]) takes one frame per run."""
    with Detector(str(ensure_model("pedestrian")), score_threshold=0.05) as det:
        assert det.max_batch == 1
        batch = frames(3, seed=8)
        for frame in batch:
            frame[20:80, 50:62] = (240, 30, 30)
        one_by_one = [det(f) for f in batch]
        before = runs(det)
        together = det.batch(batch)
        assert runs(det) == before + 3
        for alone, batched in zip(one_by_one, together):
            np.testing.assert_allclose(batched.boxes_xyxy, alone.boxes_xyxy, atol=1e-4)
            np.testing.assert_allclose(batched.scores, alone.scores, atol=1e-5)
        assert det.input_shapes(480, 640)["image"] == (1, 3, 480, 640)
        with pytest.raises(ValueError, match="at most 1 frame"):
            det.input_shapes(480, 640, batch=2)


def test_chunks_of_max_batch(lane, monkeypatch):
    monkeypatch.setitem(lane.__dict__, "max_batch", 2)
    batch = frames(5, seed=9)
    before = runs(lane)
    together = lane.batch(batch)
    assert runs(lane) == before + 3  # 2 + 2 + 1
    for frame, batched in zip(batch, together):
        np.testing.assert_allclose(batched.probability, lane(frame).probability, atol=1e-5)


def test_empty_and_bad_batches(lane):
    assert lane.batch([]) == []
    with pytest.raises(ValueError, match="a batch must be a list of frames"):
        lane.batch(frames(1)[0])
    with pytest.raises(ValueError, match="HxWx3 uint8"):
        lane.batch([np.zeros((4, 4), np.uint8)])


def test_batch_reuses_its_tensor_buffer(lane):
    lane.batch(frames(3, seed=10))
    kept = lane._buffers.tensor
    lane.batch(frames(2, seed=11))    # fewer frames of the same size: the first rows of the same buffer
    assert lane._buffers.tensor is kept
    lane.batch(frames(1, seed=12))    # a lone frame: the first row, no buffer of its own
    assert lane._buffers.tensor is kept


def test_input_shapes_at_a_batch(lane, depth):
    assert lane.input_shapes(480, 640, batch=4) == {"image": (4, 3, 480, 640)}
    assert depth.input_shapes(480, 640, batch=2) == {"image": (2, 3, 480, 640), "lidar_depth": (2, 1, 480, 640)}
    with pytest.raises(ValueError, match="batch must be an int >= 1"):
        lane.input_shapes(480, 640, batch=0)


def test_min_budget_grows_with_the_batch(lane):
    one, four = lane.min_budget_mb_at(96, 128, 1), lane.min_budget_mb_at(96, 128, 4)
    assert four > one > 0


def test_max_batch_is_decided_from_the_graph(tmp_path):
    def capacity(path: str, layout: str = "NCHW") -> int:
        info = read_model_info(path)
        return batch_capacity(info, info.inputs[0], layout)

    symbolic = pixel_map(tmp_path / "b.onnx", WEIGHTS, np.zeros(1, np.float32), input_dims=("B", 3, "H", "W"))
    assert capacity(symbolic) == UNBOUNDED_BATCH
    assert capacity(pixel_map(tmp_path / "one.onnx", WEIGHTS, np.zeros(1, np.float32))) == 1
    assert capacity(symbolic, "CHW") == 1
    # declared [B, 1, K], but a Reshape fixes the batch to 1 inside: RDP sees it
    assert capacity(batch_fixed_inside(tmp_path / "inside.onnx")) == 1
    # an output without the batch axis (boxes of every frame in one list)
    flat = constant_outputs(tmp_path / "flat.onnx", {"boxes": np.zeros((3, 4), np.float32)},
                            input_dims=("B", 3, "H", "W"), output_dims={"boxes": ["N", 4]})
    assert capacity(flat) == 1
    # another input with the batch axis (per-frame sizes [B, 2]) that the cores feed as for one frame
    sized = helper.make_model(helper.make_graph(
        [helper.make_node("ReduceSum", ["sizes", "axis1"], ["total"], keepdims=1),
         helper.make_node("Unsqueeze", ["total", "axes23"], ["per_frame"]),
         helper.make_node("Mul", ["image", "per_frame"], ["out"])], "sized",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["B", 3, "H", "W"]),
         helper.make_tensor_value_info("sizes", TensorProto.FLOAT, ["B", 2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["B", 3, "H", "W"])],
        [numpy_helper.from_array(np.array([2, 3], np.int64), "axes23"),
         numpy_helper.from_array(np.array([1], np.int64), "axis1")]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(sized, tmp_path / "sized.onnx")
    assert capacity(str(tmp_path / "sized.onnx")) == 1


def test_mapped_stages_run_a_batch_frame_by_frame(lane):
    """A node's mapped stages decide their early exits per frame: a batch reaches them one by one."""
    fed = []

    def runner(feeds):
        fed.append(feeds["image"].shape[0])
        return lane.engine.run(feeds)

    lane.runner = runner
    try:
        assert lane.frames_per_run == 1
        assert len(lane.batch(frames(3, seed=12))) == 3
    finally:
        lane.runner = None
    assert fed == [1, 1, 1] and lane.frames_per_run == lane.max_batch


def test_padding_to_a_shared_size_keeps_the_scale():
    box = plan_letterbox(40, 100, target=(128, 128), multiple=32, center=True)   # 51x128 in 64x128
    assert (box.new_h, box.new_w, box.pad_h, box.pad_w, box.top) == (51, 128, 64, 128, 6)
    shared = box.padded_to(128, 160, center=True)
    assert (shared.new_h, shared.new_w, shared.top, shared.left) == (51, 128, 38, 16)
    np.testing.assert_allclose(shared.boxes_to_source([[16, 38, 144, 89]]), [[0, 0, 100, 40]], atol=1e-4)
    corner = box.padded_to(128, 160, center=False)
    assert (corner.top, corner.left) == (box.top, box.left)
    with pytest.raises(ValueError, match="cannot be padded"):
        box.padded_to(32, 128, center=True)
