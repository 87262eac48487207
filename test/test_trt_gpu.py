"""The TensorRT backend on a real GPU, compared with onnxruntime on the zoo models.

Skipped wherever TensorRT, pycuda or a CUDA device is missing — which includes every machine this
project has been developed and tested on, so these tests have never run (see docs/tensorrt.md).
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from dynnet_ros.engine.backends.trt_env import tensorrt_unavailable_reason


def _skip_reason() -> str | None:
    if any(importlib.util.find_spec(name) is None for name in ("tensorrt", "pycuda")):
        return "tensorrt/pycuda not importable"
    return tensorrt_unavailable_reason()


REASON = _skip_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

if REASON is None:  # pragma: no cover - GPU machines only
    from dynnet_ros.engine import Engine
    from dynnet_ros.engine.backends.cpu import OrtExecutor
    from dynnet_ros.engine.backends.tensorrt import TensorRTExecutor
    from dynnet_ros.engine.backends.trt_config import TrtOptions
    from dynnet_ros.engine.model_io import load_model
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
        assert again.stats()["cache_file"].endswith(".engine")
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
