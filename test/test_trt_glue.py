"""The TensorRT executor's glue, run against a stand-in for ``tensorrt`` and ``pycuda.driver``.

This is NOT a TensorRT test (test_trt_gpu.py is, and it is skipped without a GPU). The stand-in
(test/_trt_standin.py) implements exactly the calls tensorrt.py makes, enforces the binding rules
the glue depends on (each documented there with its source in the TensorRT and pycuda bindings),
and computes with onnxruntime. It checks what never ran on real hardware here: call order, byte
copies, dtype conversions, data-dependent output shapes, profile switching, the on-disk cache and
its lock, the background rebuild, and the CUDA context rules of pycuda.
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading

import numpy as np
import onnx
import pytest
from _trt_standin import fake_modules
from onnx import TensorProto, helper, numpy_helper

from dynnet_ros.engine.backends.trt_config import TrtOptions
from dynnet_ros.engine.runtime.ort_executor import OrtExecutor
from dynnet_ros.zoo import ensure_model, example_inputs

pytestmark = pytest.mark.graph

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def fake_trt(monkeypatch):
    def install(dla_cores: int = 0, version: str = "10.3.0"):
        trt, pycuda, driver, record = fake_modules(dla_cores, version)
        monkeypatch.setitem(sys.modules, "tensorrt", trt)
        monkeypatch.setitem(sys.modules, "pycuda", pycuda)
        monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
        return record

    return install


def _executor(options, model=None):
    from dynnet_ros.engine.backends.tensorrt import TensorRTExecutor

    return TensorRTExecutor(model if model is not None else onnx.load(ensure_model("pedestrian")), options=options)


def _conv_model(extra: list | None = None, domains: tuple[str, ...] = ()) -> onnx.ModelProto:
    """x[1,3,H,W] -> Conv -> Relu -> y (every layer DLA-capable)."""
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y" if not extra else "r"])] + list(extra or [])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "H", "W"])], [weight])
    opsets = [helper.make_opsetid("", 17)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def _image(h: int, w: int = 64) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(h).random((1, 3, h, w), dtype=np.float32)}


def _check(got: dict, model: onnx.ModelProto, feeds: dict, rtol: float = 1e-6) -> None:
    want = OrtExecutor(model, threads=1).run(feeds)
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=1e-6)


def test_runs_profiles_rebuilds_and_caches(fake_trt, tmp_path):
    record = fake_trt()
    model = onnx.load(ensure_model("pedestrian"))
    reference = OrtExecutor(model, threads=1)
    options = TrtOptions(shapes="H=256|320,W=320", max_profiles=2, cache_dir=tmp_path)
    executor = _executor(options)
    assert record["builds"] == 1 and len(record["configs"][0].profiles) == 2
    assert "TF32" not in record["configs"][0].flags  # fp32 really means fp32
    assert record["configs"][0].pool["WORKSPACE"] == 1 << 30
    for height in (256, 320, 256):  # two profiles, switched back and forth
        feeds = example_inputs("pedestrian", height, 320)
        got, want = executor.run(feeds), reference.run(feeds)
        assert list(got) == list(want)
        for name in want:  # boxes [N, 4] / scores [N]: shapes decided during the run
            assert got[name].dtype == want[name].dtype
            np.testing.assert_array_equal(got[name], want[name])
    assert record["profile_switches"] == 3 and executor.stats()["engine_runs"] == 3
    outside = example_inputs("pedestrian", 448, 320)
    np.testing.assert_array_equal(executor.run(outside)["boxes"], reference.run(outside)["boxes"])
    assert executor.stats()["fallback_runs"] == 1
    assert executor.wait_idle(timeout=120) and record["builds"] == 2
    np.testing.assert_array_equal(executor.run(outside)["scores"], reference.run(outside)["scores"])
    assert executor.stats()["engine_runs"] == 4 and executor.stats()["last_error"] is None
    assert len(list(tmp_path.glob("*.engine"))) == 2
    executor.close()
    assert record["detached"]

    again = _executor(options)  # same key: loaded from the cache, no build
    assert record["builds"] == 2
    np.testing.assert_array_equal(again.run(example_inputs("pedestrian", 256, 320))["boxes"],
                                  reference.run(example_inputs("pedestrian", 256, 320))["boxes"])
    again.close()
    for engine_file in tmp_path.glob("*.engine"):  # a corrupt plan is deleted and rebuilt
        engine_file.write_bytes(b"garbage")
    rebuilt = _executor(options)
    assert record["builds"] == 3 and rebuilt.stats()["engine_runs"] == 0
    rebuilt.close()


def test_dla_plan_configures_the_builder(fake_trt, tmp_path):
    record = fake_trt(dla_cores=2)
    model = _conv_model()
    executor = _executor(TrtOptions(precision="fp16", dla_core=1, shapes="H=32,W=64", cache_dir=tmp_path), model)
    config = record["configs"][0]
    assert (config.default_device_type, config.DLA_core) == ("DLA", 1)
    assert {"FP16", "GPU_FALLBACK"} <= config.flags and "TF32" not in config.flags
    assert executor.plan.placement.device == "DLA" and executor.plan.profiles.static
    _check(executor.run(_image(32)), model, _image(32))
    executor.close()


# ============================================================================ 1. TensorRT 11, no builder at start
def test_tensorrt_11_starts_and_a_cached_start_creates_no_builder(fake_trt, tmp_path):
    record = fake_trt(version="11.1.0")  # no platform_has_fast_*, no FP16/INT8 flags
    model = _conv_model()
    options = TrtOptions(precision="tf32", shapes="H=32,W=64", cache_dir=tmp_path)
    executor = _executor(options, model)
    assert record["builders"] == 1 and "TF32" in record["configs"][0].flags
    _check(executor.run(_image(32)), model, _image(32), rtol=1e-5)
    executor.close()
    again = _executor(options, model)  # cache hit: the device info needs no builder
    assert record["builders"] == 1 and record["builds"] == 1
    again.close()


# ============================================================================ 2. cache key, cross-process lock
def test_cache_key_ignores_free_memory_jitter_and_follows_the_sm_count(fake_trt, tmp_path):
    record = fake_trt()
    model = _conv_model()
    options = TrtOptions(shapes="H=32,W=64", cache_dir=tmp_path)
    for free in (3000 << 20, (3000 << 20) - (64 << 10), 3100 << 20):  # a quarter of each: 512 MiB
        record["free_bytes"] = free
        _executor(options, model).close()
    assert record["builds"] == 1 and record["configs"][0].pool["WORKSPACE"] == 512 << 20
    record["sm_count"] = 8  # an Orin NX: also "Orin" 8.7, another engine
    _executor(options, model).close()
    assert record["builds"] == 2 and len(list(tmp_path.glob("*.engine"))) == 2


def test_a_build_waits_for_the_process_building_the_same_engine(fake_trt, tmp_path, monkeypatch):
    record = fake_trt()
    model = _conv_model()
    first = _executor(TrtOptions(shapes="H=32,W=64", cache_dir=tmp_path / "a"), model)
    first.close()
    (engine,) = (tmp_path / "a").glob("*.engine")
    code = ("import sys\n"
            "from dynnet_ros.engine.backends.trt_cache import EngineCache, EngineKey\n"
            "cache, key = EngineCache(sys.argv[1]), EngineKey.from_json(open(sys.argv[2]).read())\n"
            "with cache.lock(key):\n"
            "    print('locked', flush=True)\n"
            "    sys.stdin.readline()\n"
            "    cache.store(key, open(sys.argv[3], 'rb').read())\n")
    other = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "b"), str(engine.with_suffix(".json")),
                              str(engine)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=ROOT))
    assert other.stdout.readline().strip() == "locked"
    real_flock = fcntl.flock

    def flock(fd, operation):  # a blocking lock request: this process now waits for the other one
        if operation == fcntl.LOCK_EX:
            record["build_started"].set()
        return real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    record["build_started"].clear()
    result: list = []
    starter = threading.Thread(target=lambda: result.append(
        _executor(TrtOptions(shapes="H=32,W=64", cache_dir=tmp_path / "b"), model)))
    starter.start()
    assert record["build_started"].wait(60)  # waiting for the lock, or (without one) building
    other.communicate("go\n", timeout=60)
    starter.join(60)
    assert other.returncode == 0 and record["builds"] == 1  # loaded what the other process built
    _check(result[0].run(_image(32)), model, _image(32))
    result[0].close()


# ============================================================================ 3./4. threads and the CUDA context
def test_close_waits_for_a_background_build(fake_trt, tmp_path):
    record = fake_trt()
    model = _conv_model()
    executor = _executor(TrtOptions(shapes="H=32,W=64", cache_dir=tmp_path), model)
    gate = record["build_gate"] = threading.Event()
    record["build_started"].clear()
    _check(executor.run(_image(48)), model, _image(48))  # outside every profile: CPU, rebuild starts
    assert record["build_started"].wait(60)
    closer = threading.Thread(target=executor.close)
    closer.start()
    closer.join(timeout=2)  # close() must still be waiting: the build holds the CUDA context
    returned_while_building = not closer.is_alive()
    gate.set()
    closer.join(60)
    assert not returned_while_building and not closer.is_alive()
    assert record["cuda_errors"] == [] and record["leaks"] == [] and record["detached"]


def test_a_rebuild_releases_the_old_engine_inside_its_context(fake_trt, tmp_path):
    record = fake_trt()
    model = _conv_model()
    executor = _executor(TrtOptions(shapes="H=32,W=64", cache_dir=tmp_path), model)
    executor.run(_image(48))
    assert executor.wait_idle(timeout=60) and record["builds"] == 2
    _check(executor.run(_image(48)), model, _image(48))
    assert executor.stats()["engine_runs"] == 1
    assert record["leaks"] == []  # the old engine's stream was destroyed, not leaked
    executor.close()
    assert record["leaks"] == [] and record["cuda_errors"] == []


# ============================================================================ 5./6. profiles
def test_a_refused_profile_switch_runs_on_the_cpu(fake_trt, tmp_path):
    record = fake_trt()
    model = _conv_model()
    executor = _executor(TrtOptions(shapes="H=32,W=64", cache_dir=tmp_path), model)
    record["refuse_profile_switch"] = True  # the binding raises RuntimeError, never returns False
    _check(executor.run(_image(32)), model, _image(32))
    assert executor.stats()["fallback_runs"] == 1 and executor.stats()["engine_runs"] == 0
    record["refuse_profile_switch"] = False
    _check(executor.run(_image(32)), model, _image(32))
    assert executor.stats()["engine_runs"] == 1
    executor.close()


def test_a_profile_the_builder_rejects_fails_the_build(fake_trt, tmp_path):
    record = fake_trt()
    record["invalid_profiles"] = {1}
    with pytest.raises(RuntimeError, match="rejected optimisation profile 1"):
        _executor(TrtOptions(shapes="H=32|48,W=64", max_profiles=2, cache_dir=tmp_path), _conv_model())
    assert record["detached"]


def test_an_engine_with_the_wrong_profile_count_is_rebuilt(fake_trt, tmp_path):
    record = fake_trt()
    model = _conv_model()
    options = TrtOptions(shapes="H=32|48,W=64", max_profiles=2, cache_dir=tmp_path)
    _executor(options, model).close()
    (engine,) = tmp_path.glob("*.engine")
    blob = engine.read_bytes()  # keep the sidecar, drop the engine's last profile
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + size])
    header["profiles"] = header["profiles"][:1]
    text = json.dumps(header).encode()
    engine.write_bytes(len(text).to_bytes(8, "little") + text + blob[8 + size:])
    executor = _executor(options, model)
    assert record["builds"] == 2
    for height in (32, 48):
        _check(executor.run(_image(height)), model, _image(height))
    assert executor.stats()["engine_runs"] == 2
    executor.close()


# ============================================================================ 7. DLA
def test_dla_builds_one_engine_per_static_shape(fake_trt, tmp_path):
    record = fake_trt(dla_cores=2)
    model = _conv_model()
    executor = _executor(TrtOptions(precision="fp16", dla_core=0, shapes="H=32|48,W=64", cache_dir=tmp_path), model)
    assert record["builds"] == 2 and [len(c.profiles) for c in record["configs"]] == [1, 1]
    assert len(executor.plan.parts) == 2 and len(list(tmp_path.glob("*.engine"))) == 2
    for height in (48, 32, 48):
        _check(executor.run(_image(height)), model, _image(height))
    assert executor.stats()["engine_runs"] == 3
    executor.close()


def test_dla_without_gpu_fallback_lets_the_build_decide(fake_trt, tmp_path):
    record = fake_trt(dla_cores=2)  # the parser's extra constant layer answers can_run_on_DLA False
    model = _conv_model()
    executor = _executor(TrtOptions(precision="fp16", dla_core=1, allow_gpu_fallback=False, shapes="H=32,W=64",
                                    cache_dir=tmp_path), model)
    assert record["builds"] == 1 and "GPU_FALLBACK" not in record["configs"][0].flags
    assert executor.layers.on_dla == ("{ForeignNode[Conv...Relu]}",)
    assert executor.stats()["dla_layers"].startswith("1 of 1 engine layers on the DLA")
    executor.close()


# ============================================================================ 8. performance
def test_a_rebuild_reuses_the_persisted_timing_cache(fake_trt, tmp_path):
    record = fake_trt()
    model = _conv_model()
    options = TrtOptions(shapes="H=32,W=64", cache_dir=tmp_path)
    _executor(options, model).close()
    assert record["timed"] == 2 and len(list(tmp_path.glob("timing-*.cache"))) == 1
    for path in tmp_path.glob("*.engine"):
        path.unlink()
    _executor(options, model).close()
    assert record["builds"] == 2 and record["timed"] == 2  # every tactic's timing came from the cache


def test_alternating_profiles_never_reallocate_activation_memory(fake_trt, tmp_path):
    record = fake_trt()
    model = _conv_model()
    executor = _executor(TrtOptions(shapes="H=32|48,W=64", max_profiles=2, cache_dir=tmp_path), model)
    for height in (32, 48, 32, 48, 32):
        _check(executor.run(_image(height)), model, _image(height))
    assert executor.stats()["engine_runs"] == 5 and record["profile_switches"] == 5
    assert record["activation_allocations"] == 1
    executor.close()


# ============================================================================ 9. logger, plugins, tensor locations
def test_one_logger_per_process_and_plugins_before_parsing(fake_trt, tmp_path):
    record = fake_trt()
    plugin = helper.make_node("ScaleShift_TRT", ["r"], ["y"], domain="trt.plugins")
    model = _conv_model(extra=[plugin], domains=("trt.plugins",))
    first = _executor(TrtOptions(shapes="H=32,W=64", cache_dir=tmp_path), model)  # parses: plugins registered
    second = _executor(TrtOptions(shapes="H=32,W=64", cache_dir=tmp_path / "other"), model)
    assert record["builds"] == 2 and record["loggers"] == 1 and record["ignored_loggers"] == 0
    first.close()
    second.close()


def test_input_memory_follows_the_tensor_location(fake_trt, tmp_path):
    record = fake_trt()
    record["shape_io_inputs"] = {"x"}  # needed for shape calculations, yet a device tensor
    model = _conv_model()
    executor = _executor(TrtOptions(shapes="H=32,W=64", cache_dir=tmp_path), model)
    _check(executor.run(_image(32)), model, _image(32))
    assert executor.stats()["engine_runs"] == 1
    executor.close()
