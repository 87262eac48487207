"""`dynnet map exits`: heads learned from the user's frames on real corpus models, cut into
stages the stage runtime runs; at threshold 1.0 the stages reproduce the model exactly."""
from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from _corpus import by_name, photos, resize, text_page
from matplotlib import image as mpimg

from dynnet_ros import cli
from dynnet_ros.bags.scenes import record_scenes
from dynnet_ros.commands.exit_frames import exit_inputs, read_frames
from dynnet_ros.mapper.advice import never_early, no_early_exit, no_exit_taken, one_stage_guard
from dynnet_ros.mapper.build import build_stages
from dynnet_ros.mapper.exit_heads import (
    CutPoint,
    ExitTask,
    agrees,
    choose_points,
    logistic,
    model_task,
    ridge,
    threshold_for,
)
from dynnet_ros.mapper.exits import model_exits
from dynnet_ros.mapper.mapping import parse_mapping
from dynnet_ros.mapper.model_search import calibrate
from dynnet_ros.mapper.partition import Partition
from dynnet_ros.mapper.runtime import StageExecutor
from dynnet_ros.mapper.search import Candidate
from dynnet_ros.perception.mapped import MappedSettings, open_mapped
from dynnet_ros.perception.model_info import model_info
from dynnet_ros.sim.frames import SimSettings
from dynnet_ros.zoo import ensure_model


def _photo_dir(tmp: Path, count: int) -> Path:
    """``count`` crops of the bundled photographs and the scanned page, as PNG files."""
    shots = [img for _, img in photos()] + ([text_page()] if text_page() is not None else [])
    if not shots:
        pytest.skip("scikit-image's bundled photographs are not installed")
    rng = np.random.default_rng(0)
    folder = tmp / "frames"
    folder.mkdir()
    for k in range(count):
        img = shots[k % len(shots)]
        h, w = img.shape[:2]
        ch, cw = int(h * rng.uniform(0.5, 0.9)), int(w * rng.uniform(0.5, 0.9))
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        mpimg.imsave(folder / f"frame_{k:02d}.png", resize(img[y:y + ch, x:x + cw], 96, 128))
    return folder


def _model(name: str) -> Path:
    corpus = by_name(name)
    if not corpus.available():
        pytest.skip(corpus.skip_reason)
    path = corpus.path()
    assert path is not None
    return path


def _learn(tmp_path: Path, name: str, frames: int = 8, size: str = "128x128") -> tuple[Path, Path, dict]:
    model = _model(name)
    out, report = tmp_path / "exits.onnx", tmp_path / "exits.json"
    assert cli.main(["map", "exits", str(model), "--frames", str(_photo_dir(tmp_path, frames)), "--size", size,
                     "--out", str(out), "--json", str(report)]) == 0
    return model, out, json.loads(report.read_text())


def _feeds(model: onnx.ModelProto, folder: Path, size: tuple[int, int] = (128, 128)) -> list[dict[str, np.ndarray]]:
    inputs = exit_inputs(model_info(model), "auto", size, 0.25)
    return [inputs.feed(frame) for frame in read_frames(folder)]


def _run_mapped(exits_model: Path, feeds, threshold: float) -> list[tuple[int, dict[str, np.ndarray]]]:
    stage_set = build_stages(onnx.load(str(exits_model)), Partition())
    mapping = parse_mapping({"hardware": "this-machine", "stages": [{"unit": "cpu0", "threshold": threshold},
                                                                   "cpu1"]})
    executor = StageExecutor(stage_set, mapping)
    try:
        got = []
        for feed in feeds:
            out = executor.run(feed)
            assert executor.last_result is not None
            got.append((executor.last_result.exit_index, out))
        return got
    finally:
        executor.close()


@pytest.mark.slow
def test_map_exits_learns_a_mask_exit_for_the_text_detector_and_threshold_one_is_exact(tmp_path, capsys):
    model_path, exits_path, report = _learn(tmp_path, "ppocr-text-detector")
    assert "held-out frames" in capsys.readouterr().out
    assert report["task"]["kind"] == "mask" and report["held_out_frames"] >= 1
    (exit0,) = report["exits"]
    assert 0.0 < exit0["cost_fraction"] < 1.0 and exit0["crossing_mb"] > 0 and 0.0 <= exit0["agreement"] <= 1.0
    original = onnx.load(str(model_path))
    with_exits = onnx.load(str(exits_path))
    specs = model_exits(with_exits)
    assert len(specs) == 2 and specs[0].criterion == "mean_confidence"
    assert [o.name for o in with_exits.graph.output] == [o.name for o in original.graph.output]
    feeds = _feeds(original, tmp_path / "frames")
    full = ort.InferenceSession(original.SerializeToString(), providers=["CPUExecutionProvider"])
    output = original.graph.output[0].name
    for feed, (exit_index, out) in zip(feeds, _run_mapped(exits_path, feeds, 1.0)):
        assert exit_index == 1
        assert np.array_equal(out[output], full.run([output], feed)[0])
    # the search judges the learned exit by the task's own agreement (not an argmax of the mask)
    task = model_task(with_exits)
    assert task is not None and task.kind == "mask" and task.output == output
    table = calibrate(build_stages(with_exits, Partition()), feeds, agree=functools.partial(agrees, task)).exits
    assert table.correct[:, 1].all()
    # at threshold 0 the learned exit answers every frame with a coarse mask of the output's shape
    for feed, (exit_index, out) in zip(feeds, _run_mapped(exits_path, feeds, 0.0)):
        assert exit_index == 0
        ref = full.run([output], feed)[0]
        assert out[output].shape == ref.shape and 0.0 <= out[output].min() <= out[output].max() <= 1.0


@pytest.mark.slow
def test_map_exits_learns_a_no_box_exit_for_the_yolo_detector(tmp_path):
    model_path, exits_path, report = _learn(tmp_path, "yolov8n-detector")
    assert report["task"]["kind"] == "presence" and report["task"]["strides"] == [8, 16, 32]
    original = onnx.load(str(model_path))
    feeds = _feeds(original, tmp_path / "frames")
    full = ort.InferenceSession(original.SerializeToString(), providers=["CPUExecutionProvider"])
    output = original.graph.output[0].name
    for feed, (exit_index, out) in zip(feeds, _run_mapped(exits_path, feeds, 1.0)):
        assert exit_index == 1 and np.array_equal(out[output], full.run([output], feed)[0])
    for feed, (exit_index, out) in zip(feeds, _run_mapped(exits_path, feeds, 0.0)):
        ref = full.run([output], feed)[0]
        assert exit_index == 0 and out[output].shape == ref.shape and not out[output].any()   # no box
    # a model node's mapped mode: its mapping file and exit_threshold, unchanged
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text("hardware: this-machine\nstages: [{unit: cpu0, threshold: 0.5}, cpu1]\n")
    for threshold, expected in ((1.0, 1), (0.0, 0)):
        executor = open_mapped(str(exits_path), MappedSettings(str(mapping), threshold, 0.0), None)
        assert executor is not None
        try:
            for feed in feeds:
                out = executor.run(feed)
                assert executor.last_result is not None and executor.last_result.exit_index == expected
                if expected == 1:
                    assert np.array_equal(out[output], full.run([output], feed)[0])
        finally:
            executor.close()


def test_map_exits_learns_a_class_score_exit_for_the_direction_classifier(tmp_path):
    model_path, exits_path, report = _learn(tmp_path, "ppocr-direction-classifier", size="64x192")
    assert report["task"]["kind"] == "scores"
    original = onnx.load(str(model_path))
    feeds = _feeds(original, tmp_path / "frames", (64, 192))
    full = ort.InferenceSession(original.SerializeToString(), providers=["CPUExecutionProvider"])
    output = original.graph.output[0].name
    for feed, (exit_index, out) in zip(feeds, _run_mapped(exits_path, feeds, 1.0)):
        assert exit_index == 1 and np.array_equal(out[output], full.run([output], feed)[0])
    for feed, (exit_index, out) in zip(feeds, _run_mapped(exits_path, feeds, 0.0)):
        ref = full.run([output], feed)[0]             # the model's softmax scores: the exit gives them too
        assert exit_index == 0 and out[output].shape == ref.shape and np.allclose(out[output].sum(axis=1), 1.0)


def test_frames_come_from_a_recorded_bag(tmp_path):
    bag = tmp_path / "sim.mcap"
    record_scenes(bag, SimSettings(resolutions=("160x120",)), 3)
    frames = read_frames(bag, limit=2)
    assert len(frames) == 2 and all(f.shape == (120, 160, 3) and f.dtype == np.uint8 for f in frames)
    with pytest.raises(ValueError, match="no sensor_msgs/msg/Image topic /nope"):
        read_frames(bag, topic="/nope")


def test_a_model_no_head_fits_is_refused_with_the_reasons(tmp_path, capsys):
    model = _model("silero-vad")
    assert cli.main(["map", "exits", str(model), "--frames", str(tmp_path), "--out", str(tmp_path / "x.onnx")]) != 0
    assert "no exit head fits" in capsys.readouterr().err


def test_fits_recover_what_they_are_fitted_to():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 5))
    w_true = rng.standard_normal((5, 3))
    weight, bias = ridge(x, x @ w_true + 2.0, penalty=1e-9)
    assert np.allclose(weight, w_true, atol=1e-4) and np.allclose(bias, 2.0, atol=1e-4)
    labels = (x[:, 0] > 0.3).astype(float)
    w, b = logistic(x, labels)
    assert np.mean(((x @ w + b) > 0) == labels.astype(bool)) > 0.97
    w, b = logistic(x, np.zeros(200))             # one class: a constant, below one half
    assert not w.any() and b < 0


def test_thresholds_are_the_lowest_that_keep_the_agreement():
    conf = [0.2, 0.5, 0.6, 0.9, 0.95]
    ok = [False, False, True, True, True]
    assert threshold_for(conf, ok, 0.99) == (0.6, 0.6, 1.0)
    assert threshold_for(conf, ok, 0.80) == (0.5, 0.8, 0.8)
    assert threshold_for([0.5], [False], 0.99) == (1.0, 0.0, 1.0)   # never early


def test_cut_points_are_chosen_for_few_bytes_within_the_cost_band():
    points = [CutPoint("a", (1, 8, 4, 4), 0.05, ("a",), 10), CutPoint("b", (1, 8, 4, 4), 0.2, ("b",), 900),
              CutPoint("c", (1, 8, 4, 4), 0.3, ("c", "s"), 400), CutPoint("d", (1, 8, 4, 4), 0.7, ("d",), 1)]
    assert [p.tensor for p in choose_points(points)] == ["c"]
    with pytest.raises(ValueError, match="--at"):
        choose_points(points[:1])


def test_agreement_per_task():
    task = ExitTask("presence", "out", "images", 0.25, (8,))
    boxes = np.zeros((1, 6, 4), np.float32)
    assert agrees(task, np.zeros_like(boxes), boxes)
    boxes[0, 5, 2] = 0.3
    assert not agrees(task, np.zeros_like(boxes), boxes)
    mask = ExitTask("mask", "out", "x")
    final = np.zeros((1, 1, 10, 10), np.float32)
    answer = final.copy()
    answer[0, 0, 0, 0] = 0.9                      # 1 % of the pixels differ: still agrees
    assert agrees(mask, answer, final)
    answer[0, 0, 0, 1] = 0.9
    assert not agrees(mask, answer, final)


def _candidate(units: list[str], latency: float, rates: tuple[float, ...], label: str = "") -> Candidate:
    return Candidate(tuple((f"stage{k}", u) for k, u in enumerate(units)), tuple((u, "default") for u in set(units)),
                     (), latency, 1.0, 1.0, latency, rates, (), label)


def test_the_search_never_keeps_a_pick_slower_than_one_stage_on_the_fastest_unit():
    baselines = [_candidate(["cpu0", "cpu0"], 30.0, (0.0, 1.0), "cpu0-only"),
                 _candidate(["cpu1", "cpu1"], 25.0, (0.0, 1.0), "cpu1-only")]
    split = _candidate(["cpu0", "cpu1"], 40.0, (0.5, 0.5))
    chosen, advice = one_stage_guard(split, baselines + [split])
    assert chosen.label == "cpu1-only" and advice is not None and "do not pay" in advice
    fast = _candidate(["cpu0", "cpu1"], 20.0, (0.5, 0.5))
    assert one_stage_guard(fast, baselines + [fast]) == (fast, None)
    no_exit = _candidate(["cpu0", "cpu1"], 20.0, (0.0, 1.0))          # predicted faster: the profile's noise
    chosen, advice = one_stage_guard(no_exit, baselines)
    assert chosen.label == "cpu1-only" and advice is not None and "no early exit" in advice
    assert no_exit_taken(baselines[0]) is not None and no_exit_taken(split) is None
    # a single-unit mapping that loses too much accuracy is no alternative
    assert one_stage_guard(split, [replace(baselines[1], accuracy=0.5)], 1.0, 0.01) == (split, None)


def test_stages_without_an_early_exit_are_advised_against(tmp_path, capsys):
    partition = tmp_path / "p.yaml"
    partition.write_text("exits: [relu_4, lane_prob]\n")
    assert cli.main(["map", "stages", "zoo:lane", "--partition", str(partition), "--out", str(tmp_path / "s"),
                     "--json", str(tmp_path / "s.json")]) == 0
    assert "stages do not pay" in capsys.readouterr().out
    assert "one stage is faster" in json.loads((tmp_path / "s.json").read_text())["advice"]
    stage_set = build_stages(ensure_model("lane"), Partition())      # its own coarse exit can answer
    assert no_early_exit(stage_set) is None
    assert never_early(stage_set, {1: 3}, [0.9, None]) is not None   # ... but did not, on 3 frames
    assert never_early(stage_set, {0: 1, 1: 2}, [0.9, None]) is None
