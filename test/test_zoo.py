"""The demo model zoo: ONNX validity, dynamic shapes, determinism, cache, documented behaviour."""
from __future__ import annotations

import json
import multiprocessing
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from dynnet_ros import cli
from dynnet_ros.zoo import BUILDER_VERSION, MODEL_NAMES, build_all, build_model, ensure_model, zoo_dir
from dynnet_ros.zoo.gated import GATE_THRESHOLDS
from dynnet_ros.zoo.stats import layer_costs, model_stats

pytestmark = pytest.mark.graph

# (H, W) sizes, all multiples of 32: QVGA padded to 256x320, VGA, 720p padded to 736x1280
SIZES = [(256, 320), (480, 640), (736, 1280)]

#: models with a symbolic batch axis B (one run serves several cameras) -> their batch dim
BATCHED = {"lane": "B", "depth": "B"}

# Documented ranges (docs/zoo.md) at 640x480: params and GFLOPs (2 x MACs of Conv/Gemm/MatMul).
RANGES = {
    "lane": {"params": (1.5e6, 3e6), "gflops": (3.0, 6.0)},
    "pedestrian": {"params": (1.5e6, 3e6), "gflops": (2.0, 4.5)},
    "depth": {"params": (10.5e6, 16e6), "gflops": (3.5, 7.0)},
    "gated": {"params": (0.3e6, 0.6e6), "gflops": (3.0, 5.5)},
    "multiexit": {"params": (2.2e6, 4e6), "gflops": (3.0, 5.5)},
}


@pytest.fixture(scope="module")
def models() -> dict[str, onnx.ModelProto]:
    return {name: build_model(name) for name in MODEL_NAMES}


@pytest.fixture(scope="module")
def sessions(models) -> dict[str, ort.InferenceSession]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return {name: ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            for name, m in models.items()}


def _ped_feed(image: np.ndarray, score: float = 0.3, iou: float = 0.45, max_det: int = 100) -> dict:
    return {"image": image, "score_threshold": np.array([score], np.float32),
            "iou_threshold": np.array([iou], np.float32), "max_detections": np.array([max_det], np.int64)}


def _feed(name: str, h: int, w: int, rng: np.random.Generator) -> dict:
    image = rng.random((1, 3, h, w), dtype=np.float32)
    if name == "pedestrian":
        return _ped_feed(image)
    if name == "depth":
        lidar = np.where(rng.random((1, 1, h, w)) < 0.02, rng.uniform(1, 60, (1, 1, h, w)), 0).astype(np.float32)
        return {"image": image, "lidar_depth": lidar}
    return {"image": image}


def test_contract_names_and_inputs(models):
    assert MODEL_NAMES == ("lane", "pedestrian", "depth", "gated", "multiexit")
    expected_inputs = {
        "lane": ["image"], "gated": ["image"], "multiexit": ["image"],
        "pedestrian": ["image", "score_threshold", "iou_threshold", "max_detections"],
        "depth": ["image", "lidar_depth"],
    }
    expected_outputs = {"lane": ["lane_prob"], "pedestrian": ["boxes", "scores"], "depth": ["depth"],
                        "gated": ["logits"], "multiexit": ["exit0", "exit1", "exit2"]}
    for name, m in models.items():
        assert [i.name for i in m.graph.input] == expected_inputs[name]
        assert [o.name for o in m.graph.output] == expected_outputs[name]
        image = m.graph.input[0].type.tensor_type
        assert image.elem_type == onnx.TensorProto.FLOAT
        dims = [d.dim_value or d.dim_param for d in image.shape.dim]
        assert dims == [BATCHED.get(name, 1), 3, "H", "W"], name
        for out in m.graph.output:  # batching models keep the batch axis on every output
            if name in BATCHED:
                assert out.type.tensor_type.shape.dim[0].dim_param == "B", (name, out.name)
        assert m.opset_import[0].version == 17


@pytest.mark.parametrize("name", sorted(BATCHED))
def test_a_batch_gives_each_frame_its_own_result(sessions, name):
    """Nothing in a batching model mixes frames: a batch of two equals two runs of one."""
    rng = np.random.default_rng(11)
    first, second = _feed(name, 96, 128, rng), _feed(name, 96, 128, rng)
    both = {key: np.concatenate([first[key], second[key]]) for key in first}
    batched = sessions[name].run(None, both)
    for i, feed in enumerate((first, second)):
        for value, alone in zip(batched, sessions[name].run(None, feed)):
            np.testing.assert_allclose(value[i: i + 1], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_full_onnx_check(models, name):
    onnx.checker.check_model(models[name], full_check=True)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_runs_at_three_sizes_with_documented_shapes(sessions, name):
    rng = np.random.default_rng(7)
    for h, w in SIZES:
        outs = dict(zip([o.name for o in sessions[name].get_outputs()],
                        sessions[name].run(None, _feed(name, h, w, rng))))
        for value in outs.values():
            assert value.dtype == np.float32
            assert np.all(np.isfinite(value)), (name, h, w)
        if name == "lane":
            assert outs["lane_prob"].shape == (1, 1, h, w)
            assert outs["lane_prob"].min() >= 0 and outs["lane_prob"].max() <= 1
        elif name == "depth":
            assert outs["depth"].shape == (1, 1, h, w)
            assert outs["depth"].min() > 0
        elif name == "pedestrian":
            n = outs["scores"].shape[0]
            assert outs["boxes"].shape == (n, 4)
            if n:
                b = outs["boxes"]
                assert (b[:, 0] <= b[:, 2]).all() and (b[:, 1] <= b[:, 3]).all()
                assert b.min() >= 0 and b[:, 0::2].max() <= w and b[:, 1::2].max() <= h
        elif name == "gated":
            assert outs["logits"].shape == (1, 10)
        else:
            assert [outs[f"exit{i}"].shape for i in range(3)] == [(1, 10)] * 3


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_build_is_byte_identical(models, name):
    assert build_model(name).SerializeToString() == models[name].SerializeToString()


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_params_and_flops_in_documented_range(models, name):
    stats = model_stats(models[name], 480, 640)
    lo, hi = RANGES[name]["params"]
    assert lo <= stats.params <= hi, stats
    lo, hi = RANGES[name]["gflops"]
    assert lo <= stats.gflops <= hi, stats
    # compute follows the input area (all models are fully convolutional up to pooling)
    small = model_stats(models[name], 256, 320)
    assert 0.15 < small.macs / stats.macs < 0.35


def test_depth_is_heaviest_and_weights_live_at_low_resolution(models):
    sizes = {n: model_stats(m).weight_mb for n, m in models.items()}
    assert sizes["depth"] >= 40 and sizes["depth"] == max(sizes.values())
    costs = layer_costs(models["depth"], 480, 640)
    total = sum(c.params for c in costs)
    deep = sum(c.params for c in costs if len(c.out_shape) == 2 or c.out_shape[2] * c.out_shape[3] <= 30 * 40)
    assert deep / total > 0.9   # >90% of the weights sit at 1/16 resolution or below


def test_depth_tracks_lidar_and_stays_positive(sessions):
    rng = np.random.default_rng(3)
    h, w = 256, 320
    image = rng.random((1, 3, h, w), dtype=np.float32)
    truth = np.broadcast_to(np.linspace(60, 3, h, dtype=np.float32)[:, None], (h, w))
    hits = rng.random((h, w)) < 0.05
    lidar = np.where(hits, truth, 0).astype(np.float32)[None, None]
    lidar[0, 0, 0, 0] = -5.0                       # invalid (negative) returns count as no return
    depth = sessions["depth"].run(None, {"image": image, "lidar_depth": lidar})[0][0, 0]
    assert depth.min() > 0
    np.testing.assert_allclose(depth[hits], truth[hits], rtol=1e-5)
    near = ~hits
    rel = np.abs(depth[near] - truth[near]) / truth[near]
    assert np.median(rel) < 0.1                     # densified LiDAR between hits
    no_lidar = sessions["depth"].run(None, {"image": image, "lidar_depth": np.zeros((1, 1, h, w), np.float32)})[0]
    assert np.median(np.abs(no_lidar[0, 0] - truth) / truth) > 0.3   # so the LiDAR is what helped


def _gated_with_gate_output(model: onnx.ModelProto) -> onnx.ModelProto:
    gate = next(n for n in model.graph.node if n.op_type == "Greater").output[0]
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.output.append(onnx.helper.make_tensor_value_info(gate, onnx.TensorProto.BOOL, [1, len(GATE_THRESHOLDS)]))
    return m


def _executed_nodes(model: onnx.ModelProto, image: np.ndarray, tmp_path, tag: str) -> tuple[set[str], list]:
    opts = ort.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(tmp_path / tag)
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL   # keep node names
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    outs = sess.run(None, {"image": image})
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    return {e["args"]["op_name"] + ":" + e["name"] for e in events if e.get("cat") == "Node"}, outs


def test_gated_takes_both_branches(models, tmp_path):
    """Documented: block i runs iff the image's mean intensity < GATE_THRESHOLDS[i]."""
    model = _gated_with_gate_output(models["gated"])
    then_convs = [b.name for n in model.graph.node if n.op_type == "If"
                  for a in n.attribute if a.name == "then_branch" for b in a.g.node if b.op_type == "Conv"]
    assert len(then_convs) == 2 * len(GATE_THRESHOLDS)
    expected = {0.05: [True] * 4, 0.45: [True, True, False, False], 0.9: [False] * 4}
    rng = np.random.default_rng(1)
    executed = {}
    for level, gates in expected.items():
        image = np.clip(level + rng.normal(0, 0.02, (1, 3, 128, 160)), 0, 1).astype(np.float32)
        ran, outs = _executed_nodes(model, image, tmp_path, f"gate{level}")
        assert outs[1][0].tolist() == gates, level
        executed[level] = ran
    def conv_runs(ran: set[str]) -> int:
        return sum(1 for entry in ran if entry.split(":")[1].removesuffix("_kernel_time") in then_convs)
    assert conv_runs(executed[0.05]) > conv_runs(executed[0.45]) > conv_runs(executed[0.9]) == 0


def _road_scene(h: int, w: int, people: list[tuple[int, int, int, int, tuple]]) -> np.ndarray:
    """Sky, grass, grey road with white lane lines, and solid-colour upright 'pedestrians'."""
    rng = np.random.default_rng(5)
    img = np.empty((h, w, 3), np.float32)
    horizon = h // 2
    img[:horizon] = (0.55, 0.7, 0.95)
    img[horizon:] = (0.25, 0.55, 0.2)
    ys = np.arange(horizon, h)
    half = (ys - horizon) / (h - horizon) * w * 0.8
    for y, hw in zip(ys, half):
        lo, hi = int(max(0, w / 2 - hw)), int(min(w, w / 2 + hw))
        img[y, lo:hi] = (0.3, 0.3, 0.32)
        for frac in (-0.45, 0.45):
            x = int(w / 2 + frac * hw)
            img[y, max(0, x - 1 - (y - horizon) // 40): x + 2 + (y - horizon) // 40] = (0.95, 0.95, 0.92)
    for x1, y1, x2, y2, color in people:
        img[y1:y2, x1:x2] = color
    img += rng.normal(0, 0.015, img.shape).astype(np.float32)
    return np.clip(img, 0, 1).transpose(2, 0, 1)[None].astype(np.float32)


def _iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def test_pedestrian_detects_synthetic_people_and_threshold_changes_n(sessions):
    people = [(100, 200, 135, 300, (0.85, 0.25, 0.2)), (400, 215, 420, 275, (0.2, 0.45, 0.85)),
              (520, 180, 570, 330, (0.9, 0.75, 0.15))]
    scene = _road_scene(480, 640, people)
    ped = sessions["pedestrian"]
    counts = {}
    for thr in (0.2, 0.5, 0.8):
        boxes, scores = ped.run(None, _ped_feed(scene, score=thr))
        counts[thr] = len(scores)
        assert (scores >= thr).all() and np.all(np.diff(scores) <= 0)   # NMS returns best first
    assert counts[0.2] > counts[0.8] >= 1
    boxes, scores = ped.run(None, _ped_feed(scene, score=0.5))
    for person in people:                                   # each person has a box on it
        assert max(_iou(person[:4], b) for b in boxes) > 0.3, person
    assert ped.run(None, _ped_feed(scene, score=0.2, max_det=2))[1].shape == (2,)
    empty = _road_scene(480, 640, [])                       # no people: (almost) no detections
    assert len(ped.run(None, _ped_feed(empty, score=0.5))[1]) <= 1


def test_lane_prob_fires_on_paint(sessions):
    scene = _road_scene(480, 640, [])
    prob = sessions["lane"].run(None, {"image": scene})[0][0, 0]
    paint = scene[0].min(axis=0) > 0.85
    assert prob[paint].mean() > 0.3 and prob[~paint].mean() < 0.05


# ---------------------------------------------------------------------------- cache + CLI
def test_zoo_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("DYNNET_ZOO_DIR", str(tmp_path / "z"))
    assert zoo_dir() == tmp_path / "z"
    monkeypatch.delenv("DYNNET_ZOO_DIR")
    assert zoo_dir() == __import__("pathlib").Path.home() / ".cache" / "dynnet_ros" / "zoo"


def test_ensure_model_caches_and_rebuilds_on_version_change(monkeypatch, tmp_path):
    monkeypatch.setenv("DYNNET_ZOO_DIR", str(tmp_path))
    path = ensure_model("gated")
    assert path == tmp_path / "gated.onnx" and path.is_file()
    meta = {p.key: p.value for p in onnx.load(path).metadata_props}
    assert meta["dynnet_zoo_version"] == BUILDER_VERSION
    mtime = path.stat().st_mtime_ns
    os.utime(path, ns=(mtime - 10**9, mtime - 10**9))
    assert ensure_model("gated").stat().st_mtime_ns == mtime - 10**9        # cached: not rewritten
    path.with_suffix(".stamp").write_text("0+old\n")                        # builder changed
    assert ensure_model("gated").stat().st_mtime_ns != mtime - 10**9
    assert path.with_suffix(".stamp").read_text().strip() == BUILDER_VERSION
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    with pytest.raises(ValueError, match="unknown zoo model 'nope'"):
        ensure_model("nope")


def _build_in_child(directory: str) -> None:
    ensure_model("multiexit", directory, force=True)


def test_concurrent_builds_leave_a_valid_file(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_build_in_child, args=(str(tmp_path),)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    onnx.checker.check_model(str(tmp_path / "multiexit.onnx"))
    assert (tmp_path / "multiexit.onnx").read_bytes() == build_model("multiexit").SerializeToString()


def test_cli_build_and_info(tmp_path, capsys):
    out = tmp_path / "zoo"
    assert cli.main(["zoo", "build", "--out", str(out), "--json", str(tmp_path / "z.json")]) == 0
    report = json.loads((tmp_path / "z.json").read_text())
    assert [m["model"] for m in report["models"]] == list(MODEL_NAMES)
    assert all((out / f"{n}.onnx").is_file() for n in MODEL_NAMES)
    depth = next(m for m in report["models"] if m["model"] == "depth")
    assert depth["weight_mb"] >= 40
    assert build_all(out) == {n: out / f"{n}.onnx" for n in MODEL_NAMES}
    assert cli.main(["zoo", "info"]) == 0
    assert "GFLOPs" in capsys.readouterr().out
    (tmp_path / "file").write_text("x")
    assert cli.main(["zoo", "build", "--out", str(tmp_path / "file")]) == 2


def test_example_inputs_and_latency_helper(models):
    from dynnet_ros.zoo import example_inputs
    from dynnet_ros.zoo.samples import measure_latency

    feed = example_inputs("depth", 64, 96)
    assert feed["image"].shape == (1, 3, 64, 96) and feed["lidar_depth"].shape == (1, 1, 64, 96)
    assert set(example_inputs("pedestrian", 32, 32)) == {"image", "score_threshold", "iou_threshold",
                                                          "max_detections"}
    with pytest.raises(ValueError, match="multiples of 32"):
        example_inputs("lane", 100, 64)
    with pytest.raises(ValueError, match="unknown zoo model"):
        example_inputs("resnet", 64, 64)
    lat = measure_latency(models["gated"], "gated", 64, 96, threads=1, runs=2, warmup=1)
    assert lat.runs == 2 and 0 < lat.min_ms <= lat.median_ms and lat.cpu_ms > 0
