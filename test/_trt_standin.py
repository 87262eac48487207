"""A stand-in for ``tensorrt`` and ``pycuda.driver`` that enforces the binding rules the TensorRT
backend depends on, and computes with onnxruntime.

It implements exactly the calls ``dynnet_ros/engine/backends/tensorrt.py`` makes. Where a rule
matters to the glue, the stand-in enforces it as the real binding does; each rule names its source:

* pycuda ``src/cpp/cuda.hpp`` (``context``, ``context_push``, ``context::pop``,
  ``scoped_context_activation``, ``explicit_context_dependent``, ``stream``,
  ``device_allocation``):
  - a context object remembers the thread that created it; pushes go on a per-thread stack;
  - a stream or device allocation needs a current context when created and remembers it;
  - releasing one switches to its context when that is not current, which pycuda does only on the
    context's creating thread; elsewhere the object leaks ("<kind> in out-of-thread context could
    not be cleaned up") — recorded in ``record["leaks"]``;
  - ``detach`` invalidates the context; CUDA work in a dead context fails — recorded in
    ``record["cuda_errors"]`` and raised as ``LogicError``.
* TensorRT ``python/src/infer/pyCore.cpp`` (10.x / 11.x):
  - ``set_optimization_profile_async`` raises ``RuntimeError("Error in set optimization profile
    async.")`` where ``setOptimizationProfileAsync`` returns false (``PY_ASSERT_RUNTIME_ERROR``);
  - ``add_optimization_profile`` returns the new profile's index, -1 for an invalid profile
    (``IBuilderConfig::addOptimizationProfile``); ``record["invalid_profiles"]`` injects one;
  - ``ICudaEngine.num_optimization_profiles``, ``get_tensor_location`` (``TensorLocation.HOST`` /
    ``DEVICE``; where an input's address must point), ``is_shape_inference_io``,
    ``create_engine_inspector`` / ``get_layer_information``, ``num_layers``;
  - ``Runtime.num_DLA_cores``; ``IBuilderConfig.create_timing_cache(bytes)`` /
    ``set_timing_cache(cache, ignore_mismatch) -> bool`` / ``get_timing_cache()``;
    ``ITimingCache.serialize()``; ``init_libnvinfer_plugins(logger, namespace)``;
  - ``create_execution_context(strategy)``: ``STATIC`` allocates activation memory once for the
    largest profile, ``ON_PROFILE_CHANGE`` again at every profile change
    (``ExecutionContextAllocationStrategy`` docs) — counted in ``record["activation_allocations"]``;
  - TensorRT 11 (``version="11.x"``): no ``Builder.platform_has_fast_fp16/int8`` and no
    ``BuilderFlag.FP16/INT8`` (NVIDIA's "Removed Python APIs" for 11.x); ``TF32`` stays.
* TensorRT runtime behaviour:
  - the first logger given to a builder or runtime is kept; a different one later is ignored with
    the warning "The logger passed into createInferRuntime differs from one already provided" —
    counted in ``record["ignored_loggers"]``;
  - onnx-tensorrt resolves an op it does not implement through the plugin registry by name, which
    holds the standard plugins only after ``init_libnvinfer_plugins``; the stand-in treats op
    types ending in ``_TRT`` as plugin ops;
  - a build times every tactic (here: every ONNX node) missing from the timing cache it was given
    (``record["timed"]``); without a cache set, nothing persists between builds;
  - an enqueue fails unless every input shape lies in the *active* profile and every input's
    address is in the memory its tensor location names.
* Not confirmed by NVIDIA, refused here because the backend does not rely on it: a DLA engine with
  more than one optimisation profile. ``can_run_on_DLA`` is False for the one layer the parser
  inserts (a constant the builder folds away), so a strict per-layer count refuses a network the
  build accepts.
"""
from __future__ import annotations

import ctypes
import itertools
import json
import threading
import types
import warnings

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

_ADDRESSES = itertools.count(1 << 40)  # fake device addresses, far from any host pointer


def fake_modules(dla_cores: int = 0, version: str = "10.3.0"):
    """(tensorrt, pycuda, pycuda.driver, record) stand-ins; ``record`` holds counters and knobs."""
    record: dict = {"builds": 0, "configs": [], "profile_switches": 0, "builders": 0, "loggers": 0,
                    "ignored_loggers": 0, "leaks": [], "cuda_errors": [], "timed": 0, "activation_allocations": 0,
                    "invalid_profiles": set(), "refuse_profile_switch": False, "free_bytes": 8 << 30,
                    "sm_count": 16, "shape_io_inputs": set(), "build_gate": None, "build_started": threading.Event()}
    memory: dict[int, bytearray] = {}
    eleven = int(version.split(".")[0]) >= 11

    # ------------------------------------------------------------------ pycuda.driver
    class LogicError(RuntimeError):
        pass

    local = threading.local()

    def stack() -> list:
        if not hasattr(local, "stack"):
            local.stack = []
        return local.stack

    def current():
        """cuda.hpp ``context::current_context``: the top valid context of this thread's stack."""
        for ctx in reversed(stack()):
            if ctx.valid:
                return ctx
        return None

    def need_context(what: str):
        ctx = current()
        if ctx is None:
            message = f"{what}: no currently active context (dead or never pushed)"
            record["cuda_errors"].append(message)
            raise LogicError(message)
        return ctx

    class Context:
        def __init__(self):
            self.thread = threading.get_ident()
            self.valid = True

        def push(self):
            stack().append(self)

        @staticmethod
        def pop():
            if not stack():
                raise LogicError("context::pop: cannot pop non-current context")
            popped = stack().pop()
            if not popped.valid:
                raise LogicError("context::pop: cannot pop a dead context")

        def detach(self):
            if not self.valid:
                raise LogicError("context::detach: cannot detach from invalid context")
            self.valid = False
            record["detached"] = True

    class _Dependent:
        """cuda.hpp ``explicit_context_dependent`` + ``scoped_context_activation``."""

        kind = "object"

        def __init__(self):
            self.live = False
            self.ward = need_context(self.kind)
            self.live = True

        def _release(self) -> None:
            if not self.live:
                return
            self.live = False
            if self.ward.valid and current() is not self.ward and threading.get_ident() != self.ward.thread:
                record["leaks"].append(self.kind)
                warnings.warn(f"{self.kind} in out-of-thread context could not be cleaned up", stacklevel=2)
                return
            self._destroy()

        def _destroy(self) -> None:
            pass

        def __del__(self):
            self._release()

    class DeviceAllocation(_Dependent):
        kind = "device_allocation"

        def __init__(self, size):
            super().__init__()
            self.address = next(_ADDRESSES)
            memory[self.address] = bytearray(size)

        def __int__(self):
            return self.address

        def free(self):
            if not self.live:
                raise LogicError("device_allocation::free: invalid handle")
            self._release()

        def _destroy(self):
            memory.pop(self.address, None)

    class Stream(_Dependent):
        kind = "stream"

        def __init__(self):
            super().__init__()
            self.handle = next(_ADDRESSES)

        def synchronize(self):
            need_context("cuStreamSynchronize")

    class Device:
        def __init__(self, index):
            self.index = index

        @staticmethod
        def count():
            return 1

        def name(self):
            return "FakeGPU"

        def compute_capability(self):
            return (8, 7)

        def get_attribute(self, attribute):
            assert attribute == "MULTIPROCESSOR_COUNT"
            return record["sm_count"]

        def retain_primary_context(self):
            return Context()

    def mem_alloc(size):
        return DeviceAllocation(size)

    def mem_get_info():
        need_context("cuMemGetInfo")
        return record["free_bytes"], 16 << 30

    def memcpy_htod(dest, src):
        need_context("cuMemcpyHtoD")
        memory[int(dest)][:src.nbytes] = src.tobytes()

    def memcpy_dtoh(dest, src):
        need_context("cuMemcpyDtoH")
        dest[...] = np.frombuffer(bytes(memory[int(src)][:dest.nbytes]), dtype=dest.dtype).reshape(dest.shape)

    driver = types.SimpleNamespace(init=lambda: None, Device=Device, Context=Context, Stream=Stream,
                                   LogicError=LogicError, mem_alloc=mem_alloc, mem_get_info=mem_get_info,
                                   memcpy_htod=memcpy_htod, memcpy_dtoh=memcpy_dtoh,
                                   device_attribute=types.SimpleNamespace(MULTIPROCESSOR_COUNT="MULTIPROCESSOR_COUNT"))
    pycuda = types.ModuleType("pycuda")
    pycuda.driver = driver

    # ------------------------------------------------------------------ tensorrt
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    first_logger: list = []
    plugins: list = []

    class Logger:
        WARNING = 2

        def __init__(self, level=2):
            record["loggers"] += 1

    def keep_first(logger):
        if not first_logger:
            first_logger.append(logger)
        elif first_logger[0] is not logger:
            record["ignored_loggers"] += 1  # "The logger passed into createInferRuntime differs ..."

    def init_libnvinfer_plugins(logger, namespace):
        plugins.append(namespace)
        return True

    flags = ("TF32", "GPU_FALLBACK") if eleven else ("FP16", "INT8", "TF32", "GPU_FALLBACK")
    trt.Logger, trt.init_libnvinfer_plugins = Logger, init_libnvinfer_plugins
    trt.TensorIOMode = types.SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT")
    trt.TensorLocation = types.SimpleNamespace(DEVICE="DEVICE", HOST="HOST")
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WORKSPACE")
    trt.BuilderFlag = types.SimpleNamespace(**{f: f for f in flags})
    trt.DeviceType = types.SimpleNamespace(GPU="GPU", DLA="DLA")
    trt.LayerInformationFormat = types.SimpleNamespace(ONELINE="ONELINE", JSON="JSON")
    trt.ExecutionContextAllocationStrategy = types.SimpleNamespace(STATIC="STATIC",
                                                                   ON_PROFILE_CHANGE="ON_PROFILE_CHANGE")
    trt.nptype = lambda dtype: np.dtype(dtype)  # data types are numpy dtype names here

    class IOutputAllocator:
        def __init__(self):
            pass

    trt.IOutputAllocator = IOutputAllocator

    class Layer:
        def __init__(self, name, inserted=False):
            self.name, self.inserted = name, inserted

    class Network:
        def __init__(self):
            self.model = None

        @property
        def num_inputs(self):
            return len(self.model.graph.input)

        def get_input(self, i):
            return types.SimpleNamespace(name=self.model.graph.input[i].name, is_shape_tensor=False)

        @property
        def num_layers(self):
            return len(self.model.graph.node) + 1

        def get_layer(self, i):  # the parser's extra layer: a constant the builder folds away
            nodes = self.model.graph.node
            return Layer(nodes[i].name or nodes[i].op_type) if i < len(nodes) else Layer("parser_constant", True)

    class OnnxParser:
        def __init__(self, network, logger):
            self.network, self.errors = network, []

        @property
        def num_errors(self):
            return len(self.errors)

        def get_error(self, i):
            return self.errors[i]

        def parse(self, data):
            model = onnx.load_from_string(data)
            missing = [n.op_type for n in model.graph.node if n.op_type.endswith("_TRT") and not plugins]
            if missing:
                self.errors = [f"Plugin not found, are the plugin name, version, and namespace correct? ({missing[0]})"]
                return False
            self.network.model = model
            return True

    class Profile:
        def __init__(self):
            self.shapes = {}

        def set_shape(self, name, low, opt, high):
            if not all(a <= b <= c for a, b, c in zip(low, opt, high)):
                raise RuntimeError("Shape provided for min is inconsistent with other shapes.")
            self.shapes[name] = (list(low), list(high))

    class TimingCache:
        def __init__(self, entries: dict, device: str):
            self.entries, self.device = dict(entries), device

        def serialize(self):
            return json.dumps({"device": self.device, "entries": self.entries}).encode()

    class Config:
        def __init__(self):
            self.flags, self.profiles, self.pool = {"TF32"}, [], {}
            self.default_device_type, self.DLA_core, self.timing = "GPU", -1, None

        def set_memory_pool_limit(self, pool, size):
            self.pool[pool] = size

        def set_flag(self, flag):
            self.flags.add(flag)

        def clear_flag(self, flag):
            self.flags.discard(flag)

        def add_optimization_profile(self, profile):
            if len(self.profiles) in record["invalid_profiles"]:
                record["invalid_profiles"].discard(len(self.profiles))
                return -1
            self.profiles.append(profile)
            return len(self.profiles) - 1

        def can_run_on_DLA(self, layer):
            return not layer.inserted

        def create_timing_cache(self, serialized):
            data = bytes(serialized)
            if not data:
                return TimingCache({}, "FakeGPU-8.7")
            stored = json.loads(data)
            return TimingCache(stored["entries"], stored["device"])

        def set_timing_cache(self, cache, ignore_mismatch):
            if cache.device != "FakeGPU-8.7" and not ignore_mismatch:
                return False
            self.timing = cache
            return True

        def get_timing_cache(self):
            return self.timing

    class Builder:
        def __init__(self, logger):
            keep_first(logger)
            record["builders"] += 1
            self.num_DLA_cores = dla_cores
            if not eleven:
                self.platform_has_fast_fp16 = self.platform_has_fast_int8 = True

        def create_network(self, flags):
            assert flags == 0
            return Network()

        def create_builder_config(self):
            return Config()

        def create_optimization_profile(self):
            return Profile()

        def build_serialized_network(self, network, config):
            need_context("buildSerializedNetwork")
            record["build_started"].set()
            if record["build_gate"] is not None:
                record["build_gate"].wait()
            need_context("buildSerializedNetwork")
            record["builds"] += 1
            record["configs"].append(config)
            if config.default_device_type == "DLA" and len(config.profiles) > 1:
                return None  # one static shape per DLA engine (see the module docstring)
            for node in network.model.graph.node:
                tactic = node.name or node.op_type
                if config.timing is None or tactic not in config.timing.entries:
                    record["timed"] += 1
                    if config.timing is not None:
                        config.timing.entries[tactic] = 1.0
            names = [network.get_layer(i).name for i in range(network.num_layers) if not network.get_layer(i).inserted]
            layers = ([f"{{ForeignNode[{names[0]}...{names[-1]}]}}"] if config.default_device_type == "DLA"
                      else names)
            header = json.dumps({"profiles": [p.shapes for p in config.profiles], "layers": layers,
                                 "shape_io": sorted(record["shape_io_inputs"])}).encode()
            return len(header).to_bytes(8, "little") + header + network.model.SerializeToString()

    trt.Builder, trt.OnnxParser = Builder, OnnxParser

    class ExecutionContext:
        def __init__(self, engine, strategy):
            self.engine, self.profile, self.shapes, self.addresses, self.allocators = engine, 0, {}, {}, {}
            self.strategy = strategy
            record["activation_allocations"] += 1  # STATIC: once, for the largest profile

        def set_optimization_profile_async(self, index, stream):
            record["profile_switches"] += 1
            if record["refuse_profile_switch"] or not 0 <= index < len(self.engine.profiles):
                raise RuntimeError("Error in set optimization profile async.")
            if index != self.profile and self.strategy == "ON_PROFILE_CHANGE":
                record["activation_allocations"] += 1
            self.profile = index
            return True

        def set_input_shape(self, name, shape):
            low, high = self.engine.profiles[self.profile][name]
            self.shapes[name] = tuple(shape)
            return all(a <= d <= b for a, d, b in zip(low, shape, high))

        def set_tensor_address(self, name, address):
            self.addresses[name] = int(address)
            return True

        def set_output_allocator(self, name, allocator):
            self.allocators[name] = allocator
            return True

        def get_tensor_shape(self, name):
            return self.shapes.get(name, ())

        def execute_async_v3(self, stream):
            need_context("enqueueV3")
            feeds = {}
            for name in self.engine.inputs:
                low, high = self.engine.profiles[self.profile][name]
                shape = self.shapes[name]
                if not all(a <= d <= b for a, d, b in zip(low, shape, high)):
                    return False
                dtype = self.engine.dtypes[name]
                nbytes = int(np.prod(shape)) * dtype.itemsize
                address = self.addresses[name]
                on_device = address in memory
                if on_device != (self.engine.get_tensor_location(name) == "DEVICE"):
                    return False  # the address is not in the memory the tensor location names
                data = bytes(memory[address][:nbytes]) if on_device else ctypes.string_at(address, nbytes)
                feeds[name] = np.frombuffer(data, dtype=dtype).reshape(shape)
            for name, value in zip(self.engine.outputs, self.engine.session().run(self.engine.outputs, feeds)):
                allocator = self.allocators[name]
                address = allocator.reallocate_output(name, 0, value.nbytes, 256)
                memory[int(address)][:value.nbytes] = value.tobytes()
                allocator.notify_shape(name, value.shape)
            return True

    class Inspector:
        def __init__(self, engine):
            self.engine = engine

        def get_layer_information(self, index, fmt):
            assert fmt == "JSON"
            return json.dumps(self.engine.layers[index])  # LAYER_NAMES_ONLY: the name as a JSON string

    class Engine:
        def __init__(self, blob):
            size = int.from_bytes(blob[:8], "little")
            header = json.loads(blob[8:8 + size])
            self.profiles, self.layers = header["profiles"], header["layers"]
            self.shape_io = set(header["shape_io"])
            self.model = onnx.load_from_string(blob[8 + size:])
            self._session = None
            self.inputs = [i.name for i in self.model.graph.input]
            self.outputs = [o.name for o in self.model.graph.output]
            self.dtypes = {v.name: np.dtype(helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type))
                           for v in list(self.model.graph.input) + list(self.model.graph.output)}
            self.num_io_tensors = len(self.inputs) + len(self.outputs)

        def session(self):
            if self._session is None:
                self._session = ort.InferenceSession(self.model.SerializeToString(),
                                                     providers=["CPUExecutionProvider"])
            return self._session

        @property
        def num_optimization_profiles(self):
            return len(self.profiles)

        @property
        def num_layers(self):
            return len(self.layers)

        def create_engine_inspector(self):
            return Inspector(self)

        def get_tensor_name(self, i):
            return (self.inputs + self.outputs)[i]

        def get_tensor_mode(self, name):
            return "INPUT" if name in self.inputs else "OUTPUT"

        def get_tensor_dtype(self, name):
            return self.dtypes[name].name

        def get_tensor_location(self, name):
            return "DEVICE"  # every input of these models is an execution tensor

        def is_shape_inference_io(self, name):
            return name in self.shape_io  # needed for shape calculations, yet located on the device

        def create_execution_context(self, strategy="STATIC"):
            need_context("createExecutionContext")
            return ExecutionContext(self, strategy)

    class Runtime:
        def __init__(self, logger):
            keep_first(logger)
            self.DLA_core, self.num_DLA_cores = -1, dla_cores

        def deserialize_cuda_engine(self, blob):
            try:
                return Engine(blob)
            except Exception:  # noqa: BLE001 - like TensorRT's: any unreadable blob deserializes to None
                return None

    trt.Runtime = Runtime
    return trt, pycuda, driver, record
