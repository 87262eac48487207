"""The TensorRT backend on a real GPU, compared with onnxruntime on the zoo models.

Skipped wherever TensorRT, pycuda or a CUDA device is missing — which includes every machine this
project has been developed and tested on, so these tests have never run (see docs/tensorrt.md).
The numbered tests check, per binding rule in docs/tensorrt.md ("What was checked how"), what the
stand-in of test/test_trt_glue.py cannot: that the real bindings behave as the stand-in assumes.
"""
from __future__ import annotations

import gc
import importlib.util
import logging
import os
import subprocess
import sys
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dynnet_ros.engine.backends.trt_env import tensorrt_unavailable_reason


def _skip_reason() -> str | None:
    if any(importlib.util.find_spec(name) is None for name in ("tensorrt", "pycuda")):
        return "tensorrt/pycuda not importable"
    return tensorrt_unavailable_reason()


REASON = _skip_reason()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=REASON or ""), pytest.mark.graph]

if REASON is None:  # pragma: no cover - GPU machines only
    from dynnet_ros.engine import Engine
    from dynnet_ros.engine.backends.tensorrt import TensorRTExecutor
    from dynnet_ros.engine.backends.trt_config import TrtOptions, fast_precisions
    from dynnet_ros.engine.modelio.models import load_model
    from dynnet_ros.engine.runtime.ort_executor import OrtExecutor
    from dynnet_ros.zoo import MODEL_NAMES, ensure_model, example_inputs
else:
    MODEL_NAMES = ("lane", "pedestrian", "depth", "gated", "multiexit")


def _close(got: dict, want: dict, rtol: float = 1e-3, atol: float = 1e-4) -> None:
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_zoo_model_matches_onnxruntime_and_rebuilds_on_a_new_shape(name, tmp_path):
    model = load_model(ensure_model(name))
    options = TrtOptions(precision="fp32", shapes="H=256|320,W=320", max_profiles=2, cache_dir=tmp_path)
    reference = OrtExecutor(model, threads=2)
    executor = TensorRTExecutor(model, options=options)
    try:
        for height in (256, 320):
            feeds = example_inputs(name, height, 320)
            _close(executor.run(feeds), reference.run(feeds))
        assert executor.stats()["engine_runs"] == 2 and executor.stats()["fallback_runs"] == 0
        outside = example_inputs(name, 384, 320)  # outside every profile: CPU now, engine after rebuild
        _close(executor.run(outside), reference.run(outside))
        assert executor.stats()["fallback_runs"] == 1
        assert executor.wait_idle(timeout=900)
        _close(executor.run(outside), reference.run(outside))
        assert executor.stats()["engine_runs"] == 3, executor.stats()
    finally:
        executor.close()
    again = TensorRTExecutor(model, options=options)  # the rebuilt plan is on disk: loads, no build
    try:
        assert all(path.endswith(".engine") for path in again.stats()["cache_files"])
        feeds = example_inputs(name, 384, 320)
        _close(again.run(feeds), reference.run(feeds))
    finally:
        again.close()


def test_engine_facade_with_the_tensorrt_backend(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNNET_TRT_CACHE", str(tmp_path))
    monkeypatch.setenv("DYNNET_TRT_SHAPES", "H=480,W=640")
    path = ensure_model("lane")
    feeds = example_inputs("lane", 480, 640)
    with Engine(path, backend="tensorrt") as engine:
        got = engine.run(feeds)
        assert engine.stats()["executor"] == "tensorrt"
    _close(got, OrtExecutor(load_model(path), threads=2).run(feeds))


def test_dla_engine_on_a_jetson(tmp_path):
    model = load_model(ensure_model("lane"))
    options = TrtOptions(precision="fp16", dla_core=0, shapes="H=256,W=320", cache_dir=tmp_path)
    executor = TensorRTExecutor(model, options=options)
    try:
        if executor.device.dla_cores == 0:
            pytest.skip(f"{executor.device.name} has no DLA cores")
        assert executor.plan.placement.device == "DLA", executor.plan.placement.reason
        feeds = example_inputs("lane", 256, 320)
        _close(executor.run(feeds), OrtExecutor(model, threads=2).run(feeds), rtol=2e-2, atol=2e-2)
    finally:
        executor.close()


# ============================================================================ per binding rule
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _conv() -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, "H", "W"])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _x(h: int, w: int = 64) -> dict:
    return {"x": np.random.default_rng(h).random((1, 3, h, w), dtype=np.float32)}


def test_1_device_info_matches_the_builder_it_replaces(tmp_path):
    import tensorrt as trt

    executor = TensorRTExecutor(_conv(), options=TrtOptions(shapes="H=32,W=64", cache_dir=tmp_path))
    try:
        info = executor.device
        assert (info.fast_fp16, info.fast_int8) == fast_precisions(info.compute_capability)
        builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
        assert info.dla_cores == builder.num_DLA_cores and info.sm_count > 0
        if hasattr(builder, "platform_has_fast_fp16"):  # TensorRT 10: the deprecated answers agree
            assert info.fast_fp16 == builder.platform_has_fast_fp16
            assert info.fast_int8 == builder.platform_has_fast_int8
    finally:
        executor.close()


def test_2_two_processes_build_one_engine(tmp_path):
    code = ("import logging, sys, onnx\nlogging.basicConfig(level=logging.INFO)\n"
            "from dynnet_ros.engine.backends.tensorrt import TensorRTExecutor\n"
            "from dynnet_ros.engine.backends.trt_config import TrtOptions\n"
            "from dynnet_ros.zoo import ensure_model\n"
            "e = TensorRTExecutor(onnx.load(ensure_model('lane')), options=TrtOptions(shapes='H=256,W=320', "
            "cache_dir=sys.argv[1]))\ne.close()\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    logs = [p.communicate(timeout=1200)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    assert sum(log.count("building a TensorRT engine") for log in logs) == 1, logs
    assert len(list(tmp_path.glob("*.engine"))) == 1


def test_3_4_close_during_a_build_and_rebuilds_leak_nothing(tmp_path):
    model = _conv()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        executor = TensorRTExecutor(model, options=TrtOptions(shapes="H=32,W=64", cache_dir=tmp_path))
        executor.run(_x(48))  # rebuild in the background
        assert executor.wait_idle(timeout=900)
        outputs = executor.run(_x(48))
        executor.run(_x(80))  # another rebuild, closed while it runs
        executor.close()
        gc.collect()
    assert outputs["y"].shape == (1, 8, 48, 64)
    assert not [w for w in caught if "out-of-thread context" in str(w.message)]


def test_5_a_profile_held_by_another_context_serves_on_the_cpu(tmp_path):
    import tensorrt as trt

    model = _conv()
    executor = TensorRTExecutor(model, options=TrtOptions(shapes="H=32|48,W=64", max_profiles=2, cache_dir=tmp_path))
    try:
        runner = executor._switch._runner.runners[0]
        with executor._activate():
            other = runner.engine.create_execution_context(trt.ExecutionContextAllocationStrategy.STATIC)
            other.set_optimization_profile_async(1, runner.stream.handle)  # a profile serves one context
        _close(executor.run(_x(48)), OrtExecutor(model, threads=2).run(_x(48)))
        assert executor.stats()["fallback_runs"] == 1
    finally:
        executor.close()


def test_6_the_engine_holds_every_planned_profile(tmp_path):
    executor = TensorRTExecutor(_conv(), options=TrtOptions(shapes="H=32|48|64,W=64", max_profiles=3,
                                                            cache_dir=tmp_path))
    try:
        runner = executor._switch._runner.runners[0]
        assert runner.engine.num_optimization_profiles == len(executor.plan.profiles) == 3
    finally:
        executor.close()


def test_7_dla_engines_per_static_shape_report_their_layers(tmp_path):
    model = _conv()
    options = TrtOptions(precision="fp16", dla_core=0, allow_gpu_fallback=False, shapes="H=32|48,W=64",
                         cache_dir=tmp_path)
    executor = TensorRTExecutor(model, options=options)
    try:
        if executor.device.dla_cores == 0:
            pytest.skip(f"{executor.device.name} has no DLA cores")
        assert len(executor.plan.parts) == 2 and executor.layers.on_dla, executor.stats()
        for height in (32, 48):
            _close(executor.run(_x(height)), OrtExecutor(model, threads=2).run(_x(height)), rtol=2e-2, atol=2e-2)
    finally:
        executor.close()


def test_8_the_timing_cache_is_accepted_again_and_sizes_alternate(tmp_path, caplog):
    model = _conv()
    options = TrtOptions(shapes="H=32|48,W=64", max_profiles=2, cache_dir=tmp_path)
    TensorRTExecutor(model, options=options).close()
    (timing,) = tmp_path.glob("timing-*.cache")
    assert timing.stat().st_size > 0
    for engine in tmp_path.glob("*.engine"):
        engine.unlink()
    with caplog.at_level(logging.WARNING):
        executor = TensorRTExecutor(model, options=options)
    try:
        assert "refused the stored timing cache" not in caplog.text
        for height in (32, 48, 32, 48):  # STATIC context memory: alternating profiles just run
            _close(executor.run(_x(height)), OrtExecutor(model, threads=2).run(_x(height)))
        assert executor.stats()["engine_runs"] == 4
    finally:
        executor.close()


def test_9_one_logger_and_host_shape_inputs(tmp_path, capfd):
    graph = helper.make_graph(  # "shape" is a shape tensor: TensorRT reads it from host memory
        [helper.make_node("ConstantOfShape", ["shape"], ["y"],
                          value=helper.make_tensor("v", TensorProto.FLOAT, [1], [2.0]))],
        "g", [helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    first = TensorRTExecutor(model, options=TrtOptions(cache_dir=tmp_path))
    second = TensorRTExecutor(_conv(), options=TrtOptions(shapes="H=32,W=64", cache_dir=tmp_path))
    try:
        feeds = {"shape": np.array([3, 4], np.int64)}
        _close(first.run(feeds), OrtExecutor(model, threads=2).run(feeds))
        assert first._switch._runner.runners[0].host_inputs == {"shape"}
    finally:
        first.close()
        second.close()
    assert "differs from one already provided" not in capfd.readouterr().err
