"""What the installed onnxruntime does, found by trying it on tiny models (once per process).

Why probes and not version numbers: the package runs on onnxruntime 1.17 (where JetPack 6's
onnxruntime-gpu builds start) up to the newest, and what differs between them is behaviour, not
API: an older runtime ignores a session config key it does not know, or computes a fused op
differently in one optimisation pass. Each feature the planned engine relies on is checked
against a reference computed without it, and the code falls back where a probe fails
(docs/engine.md, "onnxruntime versions"). The probes take a few milliseconds together.
"""
from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import onnxruntime as ort

from dynnet_ros.engine.modelio.onnx_proto import (
    ModelProto,
    NodeProto,
    TensorProto,
    from_array,
    make_graph,
    make_model,
    make_node,
    make_opsetid,
    make_tensor_value_info,
)

log = logging.getLogger(__name__)

#: The session config key that tells onnxruntime where a model given as bytes keeps its weights.
EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"


@dataclass(frozen=True)
class OrtFeatures:
    """Probe results for the onnxruntime in this process (True = behaves as the engine needs)."""

    version: str
    #: a model given as bytes finds its external-data weights through ``EXTERNAL_FOLDER_KEY``.
    #: Fallback: segments get those weights as read-only memory maps of the model file
    #: (``add_external_initializers``), so nothing is copied into the process either way.
    external_data_folder: bool
    #: ``add_initializer`` (prepacking off) computes with the caller's buffer as it is at run
    #: time, which the streamed weights need. Fallback: budgets are refused with this reason.
    initializer_by_reference: bool
    #: a ``com.microsoft`` FusedConv with a sum input Z gives the same values after the
    #: ORT_ENABLE_ALL (NCHWc) optimisations as without them. Fallback: such segments run at
    #: ORT_ENABLE_EXTENDED (segments.py).
    nchwc_fused_conv_sum: bool

    def to_json(self) -> dict:
        return asdict(self)


def _model(nodes: list[NodeProto], inputs: list[str], output: str,
           initializers: list[TensorProto]) -> ModelProto:
    graph = make_graph(nodes, "probe",
                              [make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs],
                              [make_tensor_value_info(output, TensorProto.FLOAT, None)], initializers)
    model = make_model(graph, opset_imports=[make_opsetid("", 17),
                                                    make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


def _options(level: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.intra_op_num_threads = 1
    options.log_severity_level = 4
    return options


def _run(model: ModelProto, options: ort.SessionOptions, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def probe_external_data_folder() -> bool:
    """Load a model from bytes whose weight is in a file of the folder the config key names."""
    weight = np.arange(6, dtype=np.float32).reshape(2, 3)
    with tempfile.TemporaryDirectory() as folder:
        weight.tofile(os.path.join(folder, "w.bin"))
        tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 3])
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", "w.bin"), ("offset", "0"), ("length", str(weight.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        model = _model([make_node("Add", ["x", "w"], ["y"])], ["x"], "y", [tensor])
        options = _options()
        options.add_session_config_entry(EXTERNAL_FOLDER_KEY, folder)
        try:
            got = _run(model, options, {"x": np.zeros((2, 3), np.float32)})
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types: the key is not honoured
            log.debug("onnxruntime does not honour %s: %s", EXTERNAL_FOLDER_KEY, exc)
            return False
    return bool(np.array_equal(got, weight))


def probe_initializer_by_reference() -> bool:
    """A weight added with ``add_initializer`` and changed after session creation: the run sees it."""
    weight = np.ones((2, 3), dtype=np.float32)
    model = _model([make_node("Add", ["x", "w"], ["y"])], ["x"], "y",
                   [from_array(np.zeros((2, 3), np.float32), "w")])
    options = _options()
    options.add_session_config_entry("session.disable_prepacking", "1")
    value = ort.OrtValue.ortvalue_from_numpy(weight)
    options.add_initializer("w", value)
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        weight[:] = 5.0
        got = session.run(None, {"x": np.zeros((2, 3), np.float32)})[0]
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types
        log.debug("onnxruntime refuses an initializer by reference: %s", exc)
        return False
    return bool(np.all(got == 5.0))


def probe_nchwc_fused_conv_sum() -> bool:
    """FusedConv(X, W, B, Z) at ORT_ENABLE_ALL against Conv + Add with every optimisation off."""
    rng = np.random.default_rng(0)
    w = from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), "w")
    b = from_array(rng.standard_normal(16).astype(np.float32), "b")
    feeds = {"x": rng.standard_normal((1, 8, 12, 10)).astype(np.float32),
             "z": rng.standard_normal((1, 16, 12, 10)).astype(np.float32)}
    fused = _model([make_node("FusedConv", ["x", "w", "b", "z"], ["y"], domain="com.microsoft",
                                     pads=[1, 1, 1, 1], activation="Relu")], ["x", "z"], "y", [w, b])
    plain = _model([make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                    make_node("Add", ["c", "z"], ["s"]), make_node("Relu", ["s"], ["y"])],
                   ["x", "z"], "y", [w, b])
    try:
        want = _run(plain, _options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL), feeds)
        got = _run(fused, _options(ort.GraphOptimizationLevel.ORT_ENABLE_ALL), feeds)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types
        log.debug("onnxruntime cannot run FusedConv with a sum input: %s", exc)
        return False
    return bool(np.allclose(got, want, rtol=1e-4, atol=1e-4))


def probe() -> OrtFeatures:
    """Run every probe now (``ort_features`` keeps the result for the process)."""
    return OrtFeatures(version=ort.__version__, external_data_folder=probe_external_data_folder(),
                       initializer_by_reference=probe_initializer_by_reference(),
                       nchwc_fused_conv_sum=probe_nchwc_fused_conv_sum())


_lock = threading.Lock()
_features: OrtFeatures | None = None


_override: OrtFeatures | None = None


def ort_features() -> OrtFeatures:
    """The installed onnxruntime's features, probed on first use (or the active ``override``)."""
    global _features
    if _override is not None:
        return _override
    with _lock:
        if _features is None:
            _features = probe()
        return _features


@contextmanager
def override(**changes: Any) -> Iterator[OrtFeatures]:
    """Within the block, ``ort_features()`` reports ``changes`` over the probed values, so a test
    runs a fallback on a runtime that does not need it, e.g. ``override(external_data_folder=False)``.
    Process-wide, like the runtime it stands for."""
    global _override
    previous = _override
    _override = replace(ort_features(), **changes)
    try:
        yield _override
    finally:
        _override = previous
