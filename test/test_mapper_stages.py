"""Stages from ONNX: depth-wise cuts are exact, width splits keep their invariants, probes learn."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from dynnet_ros.commands.map_inputs import scene_feeds
from dynnet_ros.engine.rdp import analyze
from dynnet_ros.mapper.build import build_stages
from dynnet_ros.mapper.partition import Partition, parse_partition
from dynnet_ros.mapper.stages import StageSet, depth_stages, stage_parts
from dynnet_ros.mapper.width import run_chain, width_stages
from dynnet_ros.zoo import ensure_model, example_inputs

SIZES = [(96, 128), (224, 320)]
#: an encoder tensor of each vehicle model to cut at (they have one exit: their answer)
CUTS = {"lane": "relu_4", "pedestrian": "relu_9", "depth": "relu_5"}


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _chain(stage_set: StageSet, feed):
    return run_chain(stage_set, [_session(s.model) for s in stage_set.stages], feed)


def _checked(stage_set: StageSet) -> None:
    for stage in stage_set.stages:
        onnx.checker.check_model(stage.model, full_check=True)
        result = analyze(stage.model)
        assert result.to_json()["stats"]["nac"] == 0 or stage.index == len(stage_set.stages) - 1


@pytest.fixture(scope="module")
def multiexit():
    return onnx.load(ensure_model("multiexit"))


def test_multiexit_depth_stages_reproduce_every_exit_exactly(multiexit):
    stage_set = depth_stages(multiexit)
    assert [s.exit.outputs for s in stage_set.stages] == [("exit0",), ("exit1",), ("exit2",)]
    assert stage_set.stages[1].sources == {"relu_3": 0} and stage_set.stages[2].sources == {"relu_9": 1}
    _checked(stage_set)
    full = _session(multiexit)
    for height, width in SIZES:
        feed = example_inputs("multiexit", height, width)
        got = _chain(stage_set, feed)
        for name, ref in zip(["exit0", "exit1", "exit2"], full.run(None, feed)):
            assert np.array_equal(got[name], ref), name


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CUTS))
def test_vehicle_models_cut_depth_wise_are_exact_at_two_sizes(name):
    model = onnx.load(ensure_model(name))
    outputs = [o.name for o in model.graph.output]
    stage_set = depth_stages(model, [CUTS[name], {"outputs": outputs}])
    assert stage_set.stages[0].exit.answer == "none"        # a plain cut never answers
    assert stage_set.stages[1].sources[CUTS[name]] == 0
    _checked(stage_set)
    full = _session(model)
    for height, width in SIZES:
        feed = example_inputs(name, height, width)
        got = _chain(stage_set, feed)
        for out, ref in zip(outputs, full.run(outputs, feed)):
            assert np.array_equal(got[out], ref), (name, out, height, width)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CUTS))
def test_vehicle_models_own_exit_heads_cut_exactly_and_skip_in_a_plain_run(name):
    """Their exit heads are declared in metadata and feed no graph output: a plain run skips them."""
    model = onnx.load(ensure_model(name))
    outputs = [o.name for o in model.graph.output]
    assert all(not o.name.startswith(("lane_exit", "pedestrian_exit", "depth_exit")) for o in model.graph.output)
    stage_set = depth_stages(model)
    assert len(stage_set.stages) == 2 and stage_set.final_outputs == tuple(outputs)
    early = stage_set.stages[0].exit
    assert early.criterion in ("mean_confidence", "max_objectness") and early.answer in ("outputs", "empty")
    _checked(stage_set)
    full = _session(model)
    for height, width in SIZES:
        feed = example_inputs(name, height, width)
        got = _chain(stage_set, feed)
        for out, ref in zip(outputs, full.run(outputs, feed)):
            assert np.array_equal(got[out], ref), (name, out, height, width)
        assert 0.0 <= early.confidence(got) <= 1.0


def test_the_pedestrian_exit_is_confident_only_when_no_box_survives():
    """Its objectness bounds every box's score: 'nothing here' at 1 - score_threshold is never wrong."""
    model = onnx.load(ensure_model("pedestrian"))
    stage_set = depth_stages(model)
    sessions = [_session(s.model) for s in stage_set.stages]
    boxes_seen = 0
    for feed in scene_feeds(model, 10, 224, 320):
        values = run_chain(stage_set, sessions, feed)
        confident = stage_set.stages[0].exit.confidence(values) >= 1.0 - float(feed["score_threshold"][0])
        boxes_seen += len(values["scores"])
        if confident:
            assert len(values["scores"]) == 0
    assert boxes_seen > 0


def test_stage_sets_round_trip_through_a_directory(multiexit, tmp_path):
    stage_set = depth_stages(multiexit)
    stage_set.save(tmp_path)
    loaded = StageSet.load(tmp_path)
    assert [s.sources for s in loaded.stages] == [s.sources for s in stage_set.stages]
    assert loaded.dims == stage_set.dims and loaded.final_outputs == ("exit2",)
    with pytest.raises(ValueError, match="no readable stages.json"):
        StageSet.load(tmp_path / "missing")


def test_an_exit_that_adds_nothing_is_refused(multiexit):
    with pytest.raises(ValueError, match="adds no computation"):
        depth_stages(multiexit, ["relu_9", "relu_3", "exit2"])
    with pytest.raises(ValueError, match="not an output of the model nor a tensor"):
        depth_stages(multiexit, ["nosuch", "exit2"])


@pytest.mark.parametrize("spec", [{"stages": 1, "P": [1.0]},
                                  {"stages": 2, "P": [1.0, 0.0], "I": [1, 0]}])
def test_width_split_with_everything_in_one_stage_is_exact(multiexit, spec):
    """multiexit's trunk has residual blocks: their Add ties the branch and the shortcut."""
    stage_set = width_stages(multiexit, parse_partition({"width": spec}).width)
    _checked(stage_set)
    full = _session(multiexit)
    for height, width in SIZES:
        feed = example_inputs("multiexit", height, width)
        assert np.array_equal(_chain(stage_set, feed)["exit2"], full.run(["exit2"], feed)[0])


def test_a_real_width_split_of_residual_blocks_runs_and_reuses_as_told(multiexit):
    reuse = width_stages(multiexit, parse_partition({"width": {"stages": 2, "P": [0.25, 0.75], "I": [1, 0]}}).width)
    alone = width_stages(multiexit, parse_partition({"width": {"stages": 2, "P": [0.5, 0.5], "I": [0, 0]}}).width)
    _checked(reuse)
    _checked(alone)
    # with reuse, stage 1 reads stage 0's features at every layer; without, only at the head
    assert len(reuse.stages[1].sources) > 10
    assert set(alone.stages[1].sources) == {"image", next(n for n in alone.stages[1].sources if n != "image")}
    assert len(stage_parts(alone.stages[1])) == 2       # its trunk runs before stage 0 finishes
    spaces = alone.notes["spaces"]
    assert all(v["bounds"][1] == v["channels"] // 2 for v in spaces.values())
    feed = example_inputs("multiexit", 96, 128)
    got = _chain(alone, feed)
    assert got["exit2"].shape == (1, 10) and np.isfinite(got["exit2"]).all()


def test_width_split_refuses_models_it_cannot_split():
    with pytest.raises(ValueError, match="not a Conv/Gemm/BatchNorm"):
        width_stages(ensure_model("lane"), parse_partition({"width": {"stages": 2, "P": [0.5, 0.5]}}).width)
    inits = [numpy_helper.from_array(np.ones((4, 2, 3, 3), np.float32), "w"),
             numpy_helper.from_array(np.ones((2, 4), np.float32), "hw")]
    nodes = [helper.make_node("Conv", ["image", "w"], ["c"], name="grouped", group=2, pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "hw"], ["y"], name="head", transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], initializer=inits)
    grouped = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(ValueError, match="grouped convolution"):
        width_stages(grouped, parse_partition({"width": {"stages": 2, "P": [0.5, 0.5]}}).width)


def _scene_classifier(frames: int = 48):
    """A chain classifier whose class follows the scene (colour balance and brightness), and frames."""
    rng = np.random.default_rng(7)
    w1 = rng.standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.5
    w2 = rng.standard_normal((32, 16, 3, 3)).astype(np.float32) * 0.2
    feeds = []
    for _ in range(frames):
        tint = rng.random(3).astype(np.float32)
        image = np.clip(tint[:, None, None] + 0.2 * rng.standard_normal((3, 32, 32)), 0, 1).astype(np.float32)
        feeds.append({"image": image[None]})

    def build(head_w, head_b):
        inits = [numpy_helper.from_array(v, n) for n, v in
                 (("w1", w1), ("w2", w2), ("hw", head_w), ("hb", head_b))]
        nodes = [helper.make_node("Conv", ["image", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1], strides=[2, 2]),
                 helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
                 helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
                 helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
                 helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
                 helper.make_node("Flatten", ["g"], ["f"], name="flat", axis=1),
                 helper.make_node("Gemm", ["f", "hw", "hb"], ["logits"], name="head", transB=1)]
        graph = helper.make_graph(nodes, "scene", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                                                 [1, 3, "H", "W"])],
                                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])],
                                  initializer=inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    probe = build(np.zeros((4, 32), np.float32), np.zeros(4, np.float32))
    pooled = np.stack([_pooled(probe, f) for f in feeds])
    centred = pooled - pooled.mean(axis=0)
    head_w = rng.standard_normal((4, 32)).astype(np.float32) / (centred.std(axis=0) + 1e-6)
    head_b = -(head_w @ pooled.mean(axis=0)).astype(np.float32)
    return build(head_w.astype(np.float32), head_b), feeds


def _pooled(model, feed):
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.graph.output.append(helper.make_tensor_value_info("f", TensorProto.FLOAT, None))
    return _session(copy).run(["f"], feed)[0][0]


def test_linear_probe_exits_learn_the_final_argmax():
    model, feeds = _scene_classifier()
    full = _session(model)
    classes = [int(np.argmax(full.run(None, f)[0])) for f in feeds]
    assert len(set(classes)) >= 3, "the model's class must depend on the scene"
    spec = parse_partition({"width": {"stages": 2, "P": [0.5, 0.5], "I": [0, 0]}}).width
    train, held = feeds[:32], feeds[32:]
    probed = width_stages(model, spec, calibration=train)
    plain = width_stages(model, spec)
    assert probed.notes["agreement"]["argmax_agreement"][0] > 0.5
    got = [int(np.argmax(_chain(probed, f)["logits__exit0"])) for f in held]
    want = classes[32:]
    hits = sum(g == w for g, w in zip(got, want))
    assert hits > len(held) / 2, (got, want)
    sliced = [int(np.argmax(_chain(plain, f)["logits__exit0"])) for f in held]
    assert hits >= sum(s == w for s, w in zip(sliced, want))


def test_build_stages_dispatches_on_the_partition(multiexit):
    assert build_stages(multiexit, Partition()).kind == "depth"
    width = build_stages(multiexit, parse_partition({"width": {"stages": 1, "P": [1.0]}}))
    assert width.kind == "width" and width.final_outputs == ("exit2",)


@pytest.mark.parametrize("raw,reason", [
    ({"width": {"stages": 2, "P": [0.5, 0.6]}}, "must sum to 1"),
    ({"width": {"stages": 2, "P": [0.0, 1.0]}}, "first stage needs a share"),
    ({"width": {"stages": 2, "P": [0.5, 0.5], "I": [[0, 1], [0, 0]]}}, "features from later stage 1"),
    ({"width": {"stages": 2, "P": [0.5, 0.5], "I": [2, 0]}}, "entries must be 0 or 1"),
    ({"width": {"stages": 0, "P": [1.0]}}, "'stages' must be an integer >= 1"),
    ({"exits": ["a"], "width": {"stages": 1, "P": [1.0]}}, "not both"),
    ({"cuts": []}, "expected a mapping"),
])
def test_bad_partitions_are_refused(raw, reason):
    with pytest.raises(ValueError, match=reason):
        parse_partition(raw)


def test_weights_kept_in_constant_nodes_count_as_stage_weights():
    """A paddle2onnx export keeps its weights in Constant nodes: its stages hold them as
    initializers (counted in weight_bytes) and still compute the original outputs exactly."""
    from _corpus import by_name

    corpus = by_name("ppocr-text-detector")
    if not corpus.available():
        pytest.skip(corpus.skip_reason)
    model = onnx.load(str(corpus.path()))
    assert not model.graph.initializer      # every weight is a Constant node
    output = model.graph.output[0].name
    cut = next(n.output[0] for n in model.graph.node if n.name == "p2o.Conv.10")
    stage_set = depth_stages(model, [cut, {"outputs": [output]}])
    assert all(stage.weight_bytes > 0 for stage in stage_set.stages)
    assert sum(stage.weight_bytes for stage in stage_set.stages) >= 4 * 2**20
    feed = corpus.feeds(np.random.default_rng(0))[0]
    got = _chain(stage_set, feed)
    assert np.array_equal(got[output], _session(model).run([output], feed)[0])
