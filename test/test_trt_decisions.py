"""TensorRT backend decisions, all plain Python (no GPU, TensorRT or pycuda needed):
profile bucketing, cache keys, DLA placement, workspace and precision, the rebuild/fallback
switch, and the registry's answer where TensorRT is missing."""
from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import threading
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dynnet_ros.bytesize import MB
from dynnet_ros.engine import Engine
from dynnet_ros.engine.backends.registry import available_backends, create_executor
from dynnet_ros.engine.backends.trt_cache import EngineCache, EngineKey, model_sha256
from dynnet_ros.engine.backends.trt_config import (
    MIN_WORKSPACE,
    TrtOptions,
    activation_bytes,
    choose_precision,
    choose_workspace,
    fast_precisions,
    quantise_workspace,
)
from dynnet_ros.engine.backends.trt_dla import (
    MAX_LOADABLES_PER_CORE,
    decide_placement,
    engine_layer_placement,
    op_verdicts,
)
from dynnet_ros.engine.backends.trt_env import probe
from dynnet_ros.engine.backends.trt_plan import DeviceInfo, initial_samples, plan_engine
from dynnet_ros.engine.backends.trt_profiles import (
    InputRange,
    Profile,
    ProfileSet,
    as_signature,
    default_symbol_values,
    grid_samples,
    parse_shape_spec,
    plan_profiles,
    plan_static_profiles,
    waste_of,
    work,
)
from dynnet_ros.engine.backends.trt_switch import EngineSwitch, NotServable
from dynnet_ros.engine.modelio.models import InputSpec
from dynnet_ros.engine.runtime.ort_executor import OrtExecutor

pytestmark = pytest.mark.graph

F32 = np.dtype("float32")
IMAGE = [InputSpec("image", F32, (1, 3, "H", "W"))]
ORIN = DeviceInfo("Orin", (8, 7), "10.3.0", dla_cores=2, sm_count=16, free_bytes=16 << 30)
RTX = DeviceInfo("NVIDIA GeForce RTX 3060", (8, 6), "10.3.0", dla_cores=0, sm_count=28, free_bytes=8 << 30)


def image_sig(h: int, w: int):
    return as_signature({"image": (1, 3, h, w)})


# ----------------------------------------------------------------------------- models
def conv_model(*, dynamic: bool = True, extra: list[onnx.NodeProto] | None = None, kernel: int = 3,
               pool: int = 2, channels: int = 8, repeat_softmax: int = 0,
               consts: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """Conv -> Relu -> MaxPool (DLA-capable), optional tail ops."""
    dims = [1, 3, "H", "W"] if dynamic else [1, 3, 64, 64]
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((channels, 3, kernel, kernel)).astype(np.float32), "w")]
    inits += [numpy_helper.from_array(value, name) for name, value in (consts or {}).items()]
    pad = kernel // 2
    nodes = [helper.make_node("Conv", ["image", "w"], ["c"], name="conv", pads=[pad] * 4),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["out" if not extra and not repeat_softmax else "p"], name="pool",
                              kernel_shape=[pool, pool], strides=[pool, pool])]
    last = "p"
    for i in range(repeat_softmax):  # alternate DLA / non-DLA layers: one loadable per Conv
        weight = rng.standard_normal((channels, channels, 1, 1)).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, f"w{i}"))
        nodes += [helper.make_node("Softmax", [last], [f"s{i}"], name=f"softmax{i}", axis=1),
                  helper.make_node("Conv", [f"s{i}", f"w{i}"], [f"k{i}"], name=f"conv{i}")]
        last = f"k{i}"
    for node in extra or []:
        nodes.append(node)
        last = node.output[0]
    if extra or repeat_softmax:
        nodes.append(helper.make_node("Identity", [last], ["out"], name="identity"))
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("image", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["o0", "o1", "o2", "o3"])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def static_profiles(*shapes) -> ProfileSet:
    return plan_static_profiles([image_sig(h, w) for h, w in shapes], len(shapes)).profiles


# ============================================================================ profiles
@pytest.fixture(scope="module")
def paper_grid():
    """The paper's distribution: image sides 224..1280 in steps of 32 (34 x 34 = 1156 shapes)."""
    return grid_samples(IMAGE, default_symbol_values(IMAGE))


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_profiles_cover_the_paper_distribution_with_bounded_count(paper_grid, count):
    plan = plan_profiles(paper_grid, count)
    assert 1 <= len(plan.profiles) <= count
    assert all(plan.profiles.select(sig) is not None for sig in paper_grid)
    # the waste is what the runtime rule (select) really spends, recomputed independently
    spent = sum(plan.profiles.profiles[plan.profiles.select(s)].max_work() for s in paper_grid)
    useful = sum(work(s) for s in paper_grid)
    assert plan.waste == pytest.approx(spent / useful - 1)
    assert plan.covered == 1.0
    for profile in plan.profiles.profiles:
        r = profile.range("image")
        assert r.min[:2] == r.max[:2] == (1, 3) and r.contains(r.opt)


def test_more_profiles_waste_less(paper_grid):
    wastes = {n: plan_profiles(paper_grid, n).waste for n in (1, 4, 8)}
    one = plan_profiles(paper_grid, 1)
    assert wastes[1] == pytest.approx(one.baseline_waste)
    # one 224..1280 box wastes ~190%; four profiles less than half of that, eight less again
    assert wastes[8] < wastes[4] < 0.5 * wastes[1]


def _partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        yield [[first]] + part
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]


def _optimum(weights: dict, groups: int) -> float:
    """Least waste over *all* set partitions into <= groups bounding boxes (brute force)."""
    useful = sum(w * work(s) for s, w in weights.items())
    best = np.inf
    for part in _partitions(sorted(weights)):
        if len(part) <= groups:
            cost = sum(sum(weights[s] for s in g) * np.prod([max(s[0][1][k] for s in g) for k in range(4)])
                       - sum(weights[s] * work(s) for s in g) for g in part)
            best = min(best, cost)
    return best / useful


@pytest.mark.parametrize("seed", range(6))
def test_profile_planner_is_optimal_on_small_instances(seed):
    rng = random.Random(seed)
    sides = list(range(224, 1281, 32))
    one_d = {image_sig(h, 640): float(rng.randint(1, 5)) for h in rng.sample(sides, 7)}
    points = set()
    while len(points) < 7:
        points.add((rng.choice(sides), rng.choice(sides)))
    two_d = {image_sig(h, w): float(rng.randint(1, 5)) for h, w in points}
    for weights in (one_d, two_d):
        for groups in (2, 3):
            plan = plan_profiles(weights, groups)
            assert plan.waste == pytest.approx(_optimum(weights, groups), rel=1e-9, abs=1e-12)


def test_select_prefers_the_tightest_profile_and_rejects_outside():
    small = Profile((("image", InputRange((1, 3, 224, 224), (1, 3, 320, 320), (1, 3, 480, 480))),))
    big = Profile((("image", InputRange((1, 3, 224, 224), (1, 3, 640, 640), (1, 3, 1280, 1280))),))
    profiles = ProfileSet((big, small))
    assert profiles.select(image_sig(480, 320)) == 1
    assert profiles.select({"image": (1, 3, 481, 320)}) == 0
    assert profiles.select(image_sig(1312, 320)) is None
    assert profiles.select({"image": (1, 3, 480)}) is None  # wrong rank


def test_static_profiles_cover_the_heaviest_shapes_only():
    samples = [image_sig(480, 640)] * 5 + [image_sig(736, 1280)] * 3 + [image_sig(224, 224)]
    plan = plan_static_profiles(samples, 2)
    assert plan.profiles.static and len(plan.profiles) == 2
    assert plan.covered == pytest.approx(8 / 9)
    assert plan.profiles.select(image_sig(224, 224)) is None and plan.waste == 0.0
    assert waste_of(plan.profiles, samples) == (0.0, pytest.approx(8 / 9))
    assert waste_of(plan_profiles(samples, 1).profiles, samples)[1] == 1.0


def test_shared_symbols_stay_tied_across_inputs():
    specs = [InputSpec("image", F32, (1, 3, "H", "W")), InputSpec("lidar", F32, (1, 1, "H", "W"))]
    samples = grid_samples(specs, {"H": (256, 480), "W": (640,)})
    assert {dict(s)["image"][2] == dict(s)["lidar"][2] for s in samples} == {True}
    plan = plan_profiles(samples, 1)
    assert plan.profiles.profiles[0].range("lidar").max == (1, 1, 480, 640)


def test_shape_spec_parsing_and_defaults():
    assert parse_shape_spec("H=224:288:32, W=480|640") == {"H": (224, 256, 288), "W": (480, 640)}
    for bad in ("H", "H=0", "H=5:1:1", "H=a", "1H=3", ""):
        with pytest.raises(ValueError):
            parse_shape_spec(bad)
    with pytest.raises(ValueError, match="'C'"):
        default_symbol_values([InputSpec("x", F32, (1, "C", 8))])
    with pytest.raises(ValueError, match="without a name"):
        default_symbol_values([InputSpec("x", F32, (1, None, 8, 8))])
    with pytest.raises(ValueError, match="Q"):
        default_symbol_values(IMAGE, {"Q": (1,)})
    assert default_symbol_values([InputSpec("x", F32, ("N", 3, "H", "W"))])["N"] == (1,)


def test_profile_validation_errors():
    with pytest.raises(ValueError, match="min <= opt <= max"):
        InputRange((1, 3, 480, 640), (1, 3, 224, 640), (1, 3, 640, 640))
    with pytest.raises(ValueError, match="positive"):
        plan_profiles([image_sig(224, 224)], 0)
    with pytest.raises(ValueError, match="disagree"):
        plan_profiles([image_sig(224, 224), as_signature({"x": (1, 3, 8, 8)})], 2)


# ============================================================================ cache keys
def _key(**change) -> EngineKey:
    fields = dict(model_sha256="a" * 64, tensorrt_version="10.3.0", device_name="Orin", compute_capability=(8, 7),
                  sm_count=16, precision="fp16", flags=("FP16",), profiles=static_profiles((480, 640)).to_json(),
                  dla_core=None, gpu_fallback=False, workspace_bytes=256 * MB)
    fields.update(change)
    return EngineKey(**fields)


def test_cache_key_is_stable_and_every_field_invalidates():
    assert _key().filename() == _key().filename()
    assert _key(flags=("FP16",)).digest() == _key(flags=("FP16",)).digest()
    changes = dict(model_sha256="b" * 64, tensorrt_version="10.4.0", device_name="NVIDIA A100",
                   compute_capability=(8, 0), sm_count=8, precision="fp32", flags=(), dla_core=1, gpu_fallback=True,
                   profiles=static_profiles((480, 640), (736, 1280)).to_json(), workspace_bytes=512 * MB,
                   build_logic=99)
    names = {_key().filename()}
    for field, value in changes.items():
        changed = _key(**{field: value})
        names.add(changed.filename())
        assert changed.differences(_key()) == [field]
    assert len(names) == len(changes) + 1
    assert _key().filename().startswith("a" * 16 + "-") and _key().filename().endswith(".engine")
    assert EngineKey.from_json(_key().to_json()) == _key()
    assert _key().timing_cache_name() == _key(model_sha256="b" * 64, profiles="[]").timing_cache_name()
    assert _key().timing_cache_name() != _key(sm_count=8).timing_cache_name()


def test_cache_key_is_stable_across_processes():
    here = Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here.parent), str(here)]), PYTHONHASHSEED="123")
    code = "from test_trt_decisions import _key; print(_key().filename())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=here, env=env)
    assert out.stdout.strip() == _key().filename()


def test_model_hash_follows_the_weights():
    model = conv_model()
    assert model_sha256(model) == model_sha256(onnx.load_from_string(model.SerializeToString()))
    other = onnx.ModelProto()
    other.CopyFrom(model)
    weight = numpy_helper.to_array(other.graph.initializer[0]).copy()
    weight.flat[0] += 1
    other.graph.initializer[0].CopyFrom(numpy_helper.from_array(weight, "w"))
    assert model_sha256(other) != model_sha256(model)


def test_engine_cache_round_trip_staleness_and_eviction(tmp_path):
    cache = EngineCache(tmp_path, keep_per_model=2)
    key = _key()
    assert cache.load(key) is None and cache.stale_reason(key) == "no cached engine for this model"
    cache.store(key, b"plan-bytes")
    assert cache.load(key) == b"plan-bytes"
    newer = _key(tensorrt_version="10.4.0", workspace_bytes=128 * MB)
    assert cache.load(newer) is None
    assert cache.stale_reason(newer) == "cached engine is stale: tensorrt_version, workspace_bytes changed"
    cache.path(key).with_suffix(".json").write_text('{"tampered": true}')
    assert cache.load(key) is None  # sidecar disagrees: never trust the file
    for version in ("10.5", "10.6", "10.7"):
        cache.store(_key(tensorrt_version=version), b"x")
    assert len(list(tmp_path.glob("*.engine"))) == 2 and not list(tmp_path.glob(".tmp-*"))
    assert cache.load_timing_cache(key) == b""
    cache.store_timing_cache(key, b"timings")
    assert cache.load_timing_cache(_key(model_sha256="c" * 64)) == b"timings"  # per TensorRT + GPU, any model


def test_engine_cache_lock_excludes_other_processes(tmp_path):
    """The lock is an flock held by another process: a non-blocking attempt here must fail while it
    holds it and succeed once it has released it."""
    import fcntl

    cache, key = EngineCache(tmp_path), _key()
    here = Path(__file__).resolve().parent
    code = ("import sys\nfrom test_trt_decisions import _key\nfrom dynnet_ros.engine.backends.trt_cache import "
            "EngineCache\nwith EngineCache(sys.argv[1]).lock(_key()):\n    print('locked', flush=True)\n"
            "    sys.stdin.readline()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here.parent), str(here)]))
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=here, env=env)
    assert holder.stdout.readline().strip() == "locked"
    lock_path = cache.path(key).with_suffix(".lock")
    fd = os.open(lock_path, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        holder.communicate("done\n", timeout=60)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    with cache.lock(key):  # and this process's own lock is reentrant per call, released on exit
        pass


# ============================================================================ DLA placement
def test_dla_when_every_layer_is_supported():
    placement = decide_placement(conv_model(), static_profiles((64, 64)), requested_core=1, dla_cores=2,
                                 precision="fp16")
    assert placement.device == "DLA" and placement.dla_core == 1
    assert "all 3 layers" in placement.reason and placement.loadables == 1


@pytest.mark.parametrize("kwargs, expected", [
    (dict(requested_core=None), "not requested"),
    (dict(dla_cores=0), "no DLA cores"),
    (dict(requested_core=2), "has 2 (DLA0..DLA1)"),
    (dict(precision="fp32"), "FP16/INT8 only"),
    (dict(tensorrt_version="10.8.0"), "outside 10.0-10.7"),
    (dict(tensorrt_version="11.4.1"), "outside 10.0-10.7"),
])
def test_gpu_when_the_device_or_precision_rules_it_out(kwargs, expected):
    args = dict(requested_core=0, dla_cores=2, precision="fp16") | kwargs
    placement = decide_placement(conv_model(), static_profiles((64, 64)), **args)
    assert placement.device == "GPU" and expected in placement.reason


def test_dynamic_profiles_go_to_the_gpu():
    dynamic = plan_profiles([image_sig(224, 224), image_sig(480, 640)], 1).profiles
    placement = decide_placement(conv_model(), dynamic, requested_core=0, dla_cores=2, precision="int8")
    assert placement.device == "GPU" and "static shapes" in placement.reason and "224..480" in placement.reason


def test_unsupported_layers_fall_back_or_keep_the_model_on_the_gpu():
    tail = [helper.make_node("AveragePool", ["p"], ["a"], name="blur", kernel_shape=[15, 15], pads=[7] * 4)]
    model = conv_model(extra=tail)
    profiles = static_profiles((64, 64))
    verdicts = {v.node: v for v in op_verdicts(model, {"image": (1, 3, 64, 64)})}
    assert not verdicts["blur"].supported and "[15, 15]" in verdicts["blur"].why
    fallback = decide_placement(model, profiles, requested_core=0, dla_cores=2, precision="fp16")
    assert fallback.device == "DLA" and fallback.gpu_fallback and "AveragePool x1" in fallback.reason
    strict = decide_placement(model, profiles, requested_core=0, dla_cores=2, precision="fp16",
                              allow_gpu_fallback=False)
    assert strict.device == "GPU" and "GPU fallback is disabled" in strict.reason
    chain = ["p", "s0", "s1", "s2", "s3"]  # 3 DLA-capable layers, then 4 that are not
    mostly_unsupported = conv_model(extra=[helper.make_node("Softmax", [a], [b], name=f"sm{i}", axis=1)
                                           for i, (a, b) in enumerate(zip(chain, chain[1:]))])
    few = decide_placement(mostly_unsupported, profiles, requested_core=0, dla_cores=2, precision="fp16")
    assert few.device == "GPU" and "43% of layers" in few.reason


def test_too_many_dla_loadables_stay_on_the_gpu():
    model = conv_model(repeat_softmax=MAX_LOADABLES_PER_CORE)  # conv | softmax | conv | softmax ...
    placement = decide_placement(model, static_profiles((64, 64)), requested_core=0, dla_cores=2,
                                 precision="fp16", min_dla_fraction=0.0)
    assert placement.loadables == MAX_LOADABLES_PER_CORE + 1
    assert placement.device == "GPU" and "17 DLA loadables" in placement.reason


def test_engine_layer_placement_reads_the_inspector():
    infos = ['"{ForeignNode[conv...relu]}"', '{"Name": "softmax", "LayerType": "SoftMax"}',
             '{"Name": "blob", "LayerType": "DLA"}', "pool_on_gpu"]
    placement = engine_layer_placement(infos)
    assert placement.layers == 4 and placement.on_dla == ("{ForeignNode[conv...relu]}", "blob")
    assert placement.describe().startswith("2 of 4 engine layers on the DLA")
    assert engine_layer_placement([]).describe() == "0 of 0 engine layers on the DLA"


def test_layer_limits_are_checked_per_attribute():
    big_kernel = conv_model(kernel=33)
    verdict = op_verdicts(big_kernel, {"image": (1, 3, 64, 64)})[0]
    assert not verdict.supported and "kernel [33, 33]" in verdict.why
    big_pool = conv_model(pool=9)
    assert "window [9, 9]" in op_verdicts(big_pool, {"image": (1, 3, 64, 64)})[2].why
    for scales, mode, ok in (([1, 1, 2, 2], "nearest", True), ([1, 1, 1.5, 1.5], "nearest", False),
                             ([1, 1, 8, 8], "linear", False), ([1, 1, 2, 2], "linear", True)):
        resize = conv_model(extra=[helper.make_node("Resize", ["p", "", "scales"], ["z"], name="up", mode=mode)],
                            consts={"scales": np.array(scales, np.float32)})
        assert {v.node: v.supported for v in op_verdicts(resize, {"image": (1, 3, 64, 64)})}["up"] is ok


# ============================================================================ precision, workspace, memory
def test_fast_precisions_follow_the_compute_capability():
    assert fast_precisions((6, 1)) == (False, True)   # Pascal P4: INT8 (dp4a), no fast FP16
    assert fast_precisions((6, 2)) == (True, False)   # Jetson TX2
    assert fast_precisions((5, 3)) == (True, False)   # Jetson Nano
    assert fast_precisions((7, 2)) == (True, True) and fast_precisions((8, 7)) == (True, True)
    assert ORIN.fast_fp16 and not DeviceInfo("P4", (6, 1), "10.3.0").fast_fp16


def test_strongly_typed_tensorrt_keeps_tf32_and_maps_auto_to_fp32():
    assert choose_precision("tf32", fast_fp16=True, fast_int8=True, quantized=False,
                            strongly_typed=True).flags == ("TF32",)
    auto = choose_precision("auto", fast_fp16=True, fast_int8=True, quantized=False, strongly_typed=True)
    assert auto.precision == "fp32" and auto.flags == () and "strongly typed" in auto.reason
    for requested in ("fp16", "int8"):
        with pytest.raises(ValueError, match="strongly typed"):
            choose_precision(requested, fast_fp16=True, fast_int8=True, quantized=True, strongly_typed=True)


def test_precision_choices():
    assert choose_precision("fp32", fast_fp16=True, fast_int8=True, quantized=False).flags == ()
    assert choose_precision("auto", fast_fp16=True, fast_int8=False, quantized=False).precision == "fp16"
    assert choose_precision("auto", fast_fp16=False, fast_int8=False, quantized=False).precision == "fp32"
    assert choose_precision("tf32", fast_fp16=True, fast_int8=True, quantized=False).flags == ("TF32",)
    assert choose_precision("int8", fast_fp16=True, fast_int8=True, quantized=True).flags == ("INT8", "FP16")
    with pytest.raises(ValueError, match="Q/DQ"):
        choose_precision("int8", fast_fp16=True, fast_int8=True, quantized=False)
    with pytest.raises(ValueError, match="precision"):
        choose_precision("bf17", fast_fp16=True, fast_int8=True, quantized=False)


def test_workspace_from_budget():
    decision = choose_workspace(200, weight_bytes=100 * MB, activation_bytes=40 * MB, precision="fp16")
    assert decision.bytes == 64 * MB and "budget 200 MB" in decision.reason  # 120 MB left, power of two
    fp32 = choose_workspace(300, weight_bytes=100 * MB, activation_bytes=40 * MB, precision="fp32")
    assert fp32.bytes == 128 * MB  # 160 MB left
    with pytest.raises(ValueError, match=r"below the 156\.0 MB"):
        choose_workspace(150, weight_bytes=100 * MB, activation_bytes=40 * MB, precision="fp32")
    assert choose_workspace(None, weight_bytes=0, activation_bytes=0, precision="fp32").bytes == 1 << 30
    assert choose_workspace(None, weight_bytes=0, activation_bytes=0, precision="fp32",
                            free_device_bytes=400 * MB).bytes == 64 * MB
    jitter = {choose_workspace(None, weight_bytes=0, activation_bytes=0, precision="fp32",
                               free_device_bytes=free).bytes for free in range(3000 * MB, 3001 * MB, 4096)}
    assert jitter == {512 * MB}  # free memory a few KiB apart: one workspace, one cache key
    assert quantise_workspace(1) == MIN_WORKSPACE and quantise_workspace(3 << 30) == 2 << 30
    assert choose_workspace(10_000, weight_bytes=0, activation_bytes=0, precision="fp32").bytes == 4 << 30
    assert choose_workspace(None, weight_bytes=0, activation_bytes=0, precision="fp32",
                            explicit_mb=64).bytes == 64 * MB
    with pytest.raises(ValueError, match="minimum"):
        choose_workspace(None, weight_bytes=0, activation_bytes=0, precision="fp32", explicit_mb=1)
    assert MIN_WORKSPACE == 16 * MB


def test_activation_estimate_is_the_peak_of_live_tensors():
    model = conv_model(dynamic=True)
    peak, unknown = activation_bytes(model, {"image": (1, 3, 64, 64)})
    # conv output (8x64x64) and relu output live together; then relu + pool output (8x32x32)
    assert (peak, unknown) == (2 * 8 * 64 * 64 * 4, 0)


def test_options_from_environment():
    opts = TrtOptions.from_env({"DYNNET_TRT_PRECISION": "FP16", "DYNNET_TRT_DLA_CORE": "1",
                                "DYNNET_TRT_MAX_PROFILES": "6", "DYNNET_TRT_SHAPES": "H=480,W=640",
                                "DYNNET_TRT_BUDGET_MB": "300", "DYNNET_TRT_GPU_FALLBACK": "0",
                                "DYNNET_TRT_CACHE": "/tmp/x"})
    assert (opts.precision, opts.dla_core, opts.max_profiles, opts.memory_budget_mb) == ("fp16", 1, 6, 300.0)
    assert not opts.allow_gpu_fallback and str(opts.cache_dir) == "/tmp/x"
    assert TrtOptions.from_env({}).precision == "fp32" and TrtOptions.from_env({}).dla_core is None
    for env, match in (({"DYNNET_TRT_DLA_CORE": "x"}, "DYNNET_TRT_DLA_CORE"), ({"DYNNET_TRT_PRECISION": "fp8"}, "fp8"),
                       ({"DYNNET_TRT_MAX_PROFILES": "0"}, "max_profiles"), ({"DYNNET_TRT_BUDGET_MB": "-5"}, "budget")):
        with pytest.raises(ValueError, match=match):
            TrtOptions.from_env(env)


# ============================================================================ whole plans
def test_engine_plan_for_a_jetson_dla_and_a_desktop_gpu():
    model = conv_model()
    pinned = TrtOptions(precision="fp16", dla_core=0, shapes="H=480|736,W=640")
    plan = plan_engine(model, initial_samples(model, pinned), pinned, ORIN)
    assert plan.placement.device == "DLA" and plan.profiles.static and len(plan.profiles) == 2
    assert plan.profile_plan.waste == 0 and len(plan.parts) == 2  # one DLA engine per static shape
    assert all(p.key.dla_core == 0 and "FP16" in p.key.flags and len(p.profiles) == 1 for p in plan.parts)
    assert plan.parts[0].key.filename() != plan.parts[1].key.filename()
    desktop = plan_engine(model, initial_samples(model, pinned), pinned, RTX)
    assert desktop.placement.device == "GPU" and "no DLA cores" in desktop.placement.reason
    assert len(desktop.parts) == 1 and len(desktop.parts[0].profiles) == 2
    assert desktop.parts[0].key.filename() not in {p.key.filename() for p in plan.parts}
    nx = plan_engine(model, initial_samples(model, pinned), pinned,
                     DeviceInfo("Orin", (8, 7), "10.3.0", dla_cores=2, sm_count=8, free_bytes=16 << 30))
    assert nx.parts[0].key.differences(plan.parts[0].key) == ["sm_count"]
    unpinned = TrtOptions(precision="fp16", dla_core=0, max_profiles=3)
    dyn = plan_engine(model, initial_samples(model, unpinned), unpinned, ORIN)
    assert dyn.placement.device == "GPU" and "DYNNET_TRT_SHAPES" in dyn.placement.reason
    assert len(dyn.profiles) <= 3 and not dyn.profiles.static
    assert "waste" in dyn.explain() and "placement: GPU" in dyn.explain()
    thor = DeviceInfo("Thor", (11, 0), "11.4.0", dla_cores=0)
    with pytest.raises(ValueError, match="strongly typed"):
        plan_engine(model, initial_samples(model, pinned), pinned, thor)
    tf32 = TrtOptions(precision="tf32", shapes="H=480,W=640")
    assert plan_engine(model, initial_samples(model, tf32), tf32, thor).parts[0].key.flags == ("TF32",)
    with pytest.raises(ValueError, match="memory budget 1 MB"):
        plan_engine(model, initial_samples(model, pinned), TrtOptions(memory_budget_mb=1, shapes="H=480,W=640"), RTX)


# ============================================================================ rebuild / fallback switch
class _Runner:
    """A real (onnxruntime) engine standing in for a TensorRT one; records the profile used."""

    def __init__(self, model, profiles: ProfileSet) -> None:
        self.profiles, self.session, self.calls, self.closed = profiles, OrtExecutor(model, threads=1), [], False

    def run(self, feeds, index):
        self.calls.append(index)
        return self.session.run(feeds)

    def close(self):
        self.closed = True


def _switch(model, samples, **kwargs):
    built = []

    def build(profiles):
        if kwargs.get("fail") and built:
            raise RuntimeError("builder exploded")
        built.append(_Runner(model, profiles))
        return built[-1]

    fallbacks = []

    def fallback():
        fallbacks.append(OrtExecutor(model, threads=1))
        return fallbacks[-1]

    switch = EngineSwitch({s: 1.0 for s in samples}, plan=lambda weights: plan_profiles(weights, 2).profiles,
                          build=build, fallback=fallback)
    return switch, built, fallbacks


def test_switch_serves_inside_profiles_without_building():
    model = conv_model()
    switch, built, fallbacks = _switch(model, [image_sig(64, 64), image_sig(96, 128)])
    out = switch.run({"image": np.ones((1, 3, 96, 128), np.float32)})
    assert switch.engine_runs == 1 and switch.fallback_runs == 0 and len(built) == 1 and not fallbacks
    assert out["out"].shape == (1, 8, 48, 64) and not switch.building


def test_switch_falls_back_then_rebuilds_in_the_background():
    model = conv_model()
    switch, built, fallbacks = _switch(model, [image_sig(64, 64)])
    feeds = {"image": np.random.default_rng(1).random((1, 3, 128, 64), dtype=np.float32)}
    expected = OrtExecutor(model, threads=1).run(feeds)["out"]
    first = switch.run(feeds)  # outside every profile: CPU now, a new engine later
    np.testing.assert_allclose(first["out"], expected, rtol=1e-5)
    assert switch.fallback_runs == 1 and len(fallbacks) == 1
    assert switch.wait_idle(timeout=60)
    assert len(built) == 2 and built[0].closed and switch.profiles.select(image_sig(128, 64)) is not None
    second = switch.run(feeds)
    np.testing.assert_allclose(second["out"], expected, rtol=1e-5)
    assert switch.engine_runs == 1 and built[1].calls and switch.stats()["last_path"].startswith("tensorrt")
    switch.close()
    assert built[1].closed


def test_switch_keeps_serving_when_a_rebuild_fails():
    model = conv_model()
    switch, built, _ = _switch(model, [image_sig(64, 64)], fail=True)
    feeds = {"image": np.ones((1, 3, 128, 64), np.float32)}
    switch.run(feeds)
    assert switch.wait_idle(timeout=60)
    assert "builder exploded" in switch.last_error and len(built) == 1
    switch.run(feeds)  # known failure: fallback again, no rebuild loop
    assert not switch.building and switch.fallback_runs == 2
    assert switch.run({"image": np.ones((1, 3, 64, 64), np.float32)})["out"].shape == (1, 8, 32, 32)


def test_switch_uses_the_fallback_when_the_engine_cannot_serve():
    model = conv_model()
    switch, built, fallbacks = _switch(model, [image_sig(64, 64)])

    def refuse(feeds, index):
        raise NotServable("value outside the built range")

    built[0].run = refuse
    out = switch.run({"image": np.ones((1, 3, 64, 64), np.float32)})
    assert out["out"].shape == (1, 8, 32, 32) and switch.fallback_runs == 1 and not switch.building


def test_switch_close_waits_for_the_running_build():
    """A build holds the CUDA context; close() must not return (and let the caller release the
    context) before it ends. The build's engine is released, not installed."""
    model = conv_model()
    gate, started, close_returned = threading.Event(), threading.Event(), threading.Event()
    built, seen = [], []

    def build(profiles):
        if built:  # the background rebuild
            started.set()
            gate.wait()
            seen.append(close_returned.is_set())
        built.append(_Runner(model, profiles))
        return built[-1]

    switch = EngineSwitch({image_sig(64, 64): 1.0}, plan=lambda weights: plan_profiles(weights, 2).profiles,
                          build=build, fallback=lambda: OrtExecutor(model, threads=1))
    switch.run({"image": np.ones((1, 3, 128, 64), np.float32)})
    assert started.wait(60)
    closer = threading.Thread(target=lambda: (switch.close(), close_returned.set()))
    closer.start()
    closer.join(timeout=2)  # without waiting, close() returns well within this
    gate.set()
    closer.join(60)
    assert seen == [False] and close_returned.is_set()
    assert built[0].closed and built[1].closed and switch.profiles is None and not switch.building


# ============================================================================ registry / availability
def test_registry_reports_why_tensorrt_is_unavailable_here():
    reason = available_backends()["tensorrt"]
    if reason is None:
        pytest.skip("TensorRT is usable on this machine; the missing-package path cannot be shown")
    assert "tensorrt" in reason or "CUDA" in reason
    model = conv_model()
    with pytest.raises(ValueError, match=re.escape(f"backend 'tensorrt' is unavailable: {reason}")):
        Engine(model, backend="tensorrt")
    with pytest.raises(ValueError, match="unavailable"):
        create_executor("tensorrt", model)


def test_probe_explains_each_missing_piece():
    def spec(present):
        return lambda name: object() if name in present else None

    assert probe(find_spec=spec({"pycuda"})) == "needs the Python package(s) tensorrt, not importable here"
    assert "tensorrt, pycuda" in probe(find_spec=spec(set()))

    def broken(name):
        raise OSError("libnvinfer.so.10: cannot open shared object file")

    assert "libnvinfer" in probe(find_spec=spec({"tensorrt", "pycuda"}), import_module=broken)

    def fake(version: str, devices: int, init_error: Exception | None = None):
        driver = types.SimpleNamespace(Device=types.SimpleNamespace(count=lambda: devices))

        def init():
            if init_error:
                raise init_error

        driver.init = init
        modules = {"tensorrt": types.SimpleNamespace(__version__=version), "pycuda.driver": driver}
        return lambda name: modules[name]

    both = spec({"tensorrt", "pycuda"})
    assert "TensorRT >= 10" in probe(find_spec=both, import_module=fake("8.6.1", 1))
    assert probe(find_spec=both, import_module=fake("10.3.0", 0)) == "no CUDA device is present"
    assert "CUDA driver" in probe(find_spec=both, import_module=fake("10.3.0", 1, RuntimeError("cuInit failed")))
    assert probe(find_spec=both, import_module=fake("10.3.0", 1)) is None


def test_backend_module_imports_without_tensorrt():
    import dynnet_ros.engine.backends.tensorrt as trt_backend  # TensorRT/pycuda imported lazily

    assert trt_backend.TensorRTExecutor.name == "tensorrt"
