"""The TensorRT backend (desktop GPU or Jetson GPU/DLA), written to TensorRT 10's Python API.

    Engine("model.onnx", backend="tensorrt")     # options from DYNNET_TRT_* (see docs/tensorrt.md)

Every decision (profiles, precision, DLA placement, workspace, cache key) is made in plain Python
by ``trt_plan.plan_engine`` and unit-tested without a GPU; this module only executes them:

* build: ``trt.Builder`` -> ``create_network(0)`` (TensorRT 10 networks are explicit-batch) ->
  ``trt.OnnxParser`` -> builder config (workspace pool, precision flags, one optimisation profile
  per planned bucket, DLA device type/core + GPU fallback) -> ``build_serialized_network``;
  plans are cached on disk under the ``EngineKey`` and rebuilt when any part of the key changes;
* run: ``set_optimization_profile_async`` when the profile changes, ``set_input_shape`` +
  ``set_tensor_address`` per input (shape-tensor inputs from host memory), every output through an
  ``IOutputAllocator`` (so data-dependent shapes such as NonMaxSuppression's work), then
  ``execute_async_v3`` on a pycuda stream;
* a shape outside every profile runs on onnxruntime (CPU) while a new engine builds in the
  background (``trt_switch.EngineSwitch``) — never a build stall inside ``run``.

NOT VERIFIED HERE: the project's machines have no GPU, TensorRT or pycuda, so this file has never
executed; test/test_trt_gpu.py runs it against onnxruntime wherever they exist.
"""
from __future__ import annotations

import contextlib
import logging
import math
from typing import Callable, Mapping

import numpy as np
import onnx
from onnx import helper

from dynnet_ros.engine.backends.base import Executor
from dynnet_ros.engine.backends.trt_cache import EngineCache, model_sha256
from dynnet_ros.engine.backends.trt_config import TrtOptions
from dynnet_ros.engine.backends.trt_plan import DeviceInfo, EnginePlan, initial_samples, plan_engine
from dynnet_ros.engine.backends.trt_switch import EngineSwitch, NotServable
from dynnet_ros.engine.model_io import output_names

LOG = logging.getLogger(__name__)
#: value range (min, opt, max) built for shape-tensor inputs, e.g. NonMaxSuppression's
#: max_output_boxes_per_class fed from a graph input; values outside run on the fallback
SHAPE_INPUT_VALUES = (1, 100, 4096)


def _output_allocator(trt, cuda):
    """An IOutputAllocator that grows one device buffer per output and records its shape."""

    class OutputAllocator(trt.IOutputAllocator):
        def __init__(self) -> None:
            trt.IOutputAllocator.__init__(self)
            self.buffers: dict = {}
            self.sizes: dict[str, int] = {}
            self.shapes: dict[str, tuple[int, ...]] = {}

        def reallocate_output(self, tensor_name, memory, size, alignment):
            size = max(int(size), 1)  # an empty output (no detections) still needs an address
            if self.sizes.get(tensor_name, 0) < size:
                old = self.buffers.pop(tensor_name, None)
                if old is not None:
                    old.free()
                self.buffers[tensor_name] = cuda.mem_alloc(size)  # 256-byte aligned
                self.sizes[tensor_name] = size
            return int(self.buffers[tensor_name])

        def reallocate_output_async(self, tensor_name, memory, size, alignment, stream):
            return self.reallocate_output(tensor_name, memory, size, alignment)

        def notify_shape(self, tensor_name, shape):
            self.shapes[tensor_name] = tuple(int(d) for d in shape)

        def free(self) -> None:
            for buffer in self.buffers.values():
                buffer.free()
            self.buffers.clear()
            self.sizes.clear()

    return OutputAllocator()


class _Runner:
    """One deserialised engine + execution context; runs feeds on a chosen profile."""

    def __init__(self, trt, cuda, activate: Callable, blob: bytes, plan: EnginePlan, logger,
                 onnx_outputs: Mapping[str, np.dtype], order: list[str]) -> None:
        self.profiles = plan.profiles
        self._cuda, self._activate = cuda, activate
        self._onnx_outputs, self._order = dict(onnx_outputs), list(order)
        self._runtime = trt.Runtime(logger)
        if plan.placement.dla_core is not None:
            self._runtime.DLA_core = plan.placement.dla_core
        self.engine = self._runtime.deserialize_cuda_engine(blob)
        if self.engine is None:
            raise RuntimeError("TensorRT could not deserialise the engine (stale or corrupt plan)")
        strategy = getattr(trt, "ExecutionContextAllocationStrategy", None)
        # ON_PROFILE_CHANGE: activation memory for the active profile only, not the largest one
        self.context = (self.engine.create_execution_context(strategy.ON_PROFILE_CHANGE) if strategy is not None
                        else self.engine.create_execution_context())
        if self.context is None:
            raise RuntimeError("TensorRT could not create an execution context (device memory?)")
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self.dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        self.host_inputs = {n for n in self.inputs if self.engine.is_shape_inference_io(n)}
        missing = [n for n in self._order if n not in self.outputs]
        if missing:
            raise RuntimeError(f"the TensorRT engine lacks the model outputs {missing} (has {self.outputs})")
        self.stream = cuda.Stream()
        self.allocator = _output_allocator(trt, cuda)
        for name in self.outputs:
            if not self.context.set_output_allocator(name, self.allocator):
                raise RuntimeError(f"TensorRT refused an output allocator for '{name}'")
        self._buffers: dict[str, tuple[object, int]] = {}
        self._profile: int | None = None

    def _device_buffer(self, name: str, nbytes: int):
        buffer, size = self._buffers.get(name, (None, 0))
        if size < max(nbytes, 1):
            if buffer is not None:
                buffer.free()
            buffer, size = self._cuda.mem_alloc(max(nbytes, 1)), max(nbytes, 1)
            self._buffers[name] = (buffer, size)
        return buffer

    def _converted(self, name: str, value: np.ndarray) -> np.ndarray:
        want = self.dtypes[name]
        if value.dtype == want:
            return np.ascontiguousarray(value)
        converted = np.ascontiguousarray(value.astype(want))
        if not np.array_equal(converted.astype(value.dtype), value):  # e.g. int64 beyond int32
            raise NotServable(f"input '{name}' does not fit the engine's {want}")
        return converted

    def run(self, feeds: Mapping[str, np.ndarray], profile_index: int) -> dict[str, np.ndarray]:
        cuda = self._cuda
        with self._activate():
            if profile_index != self._profile:
                if not self.context.set_optimization_profile_async(profile_index, self.stream.handle):
                    raise RuntimeError(f"TensorRT rejected optimisation profile {profile_index}")
                self._profile = profile_index
            alive = []  # host arrays TensorRT reads during the run
            for name in self.inputs:
                value = self._converted(name, feeds[name])
                if not self.context.set_input_shape(name, value.shape):
                    raise NotServable(f"input '{name}' shape {value.shape} rejected by profile {profile_index}")
                alive.append(value)
                if name in self.host_inputs:
                    low, _, high = SHAPE_INPUT_VALUES
                    if value.size and (value.min() < low or value.max() > high):
                        raise NotServable(f"shape-tensor input '{name}' value outside the built {low}..{high}")
                    self.context.set_tensor_address(name, value.ctypes.data)
                else:
                    buffer = self._device_buffer(name, value.nbytes)
                    cuda.memcpy_htod(buffer, value)  # synchronous: ordered before the enqueue
                    self.context.set_tensor_address(name, int(buffer))
            self.allocator.shapes.clear()  # filled again by notify_shape during this run
            if not self.context.execute_async_v3(self.stream.handle):
                raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT log)")
            self.stream.synchronize()
            results = {}
            for name in self.outputs:
                shape = self.allocator.shapes.get(name) or tuple(self.context.get_tensor_shape(name))
                host = np.empty(shape, dtype=self.dtypes[name])
                if host.nbytes:
                    cuda.memcpy_dtoh(host, self.allocator.buffers[name])
                results[name] = host.astype(self._onnx_outputs.get(name, host.dtype), copy=False)
        return {name: results[name] for name in self._order}

    def close(self) -> None:
        with self._activate():
            for buffer, _ in self._buffers.values():
                buffer.free()
            self._buffers.clear()
            self.allocator.free()
            self.context = None  # context before engine before runtime
            self.engine = None
            self._runtime = None


class TensorRTExecutor:
    """Executor protocol (``run``/``close``/``name``) over TensorRT with a CPU fallback."""

    name = "tensorrt"

    def __init__(self, model: onnx.ModelProto, *, threads: int | None = None, options: TrtOptions | None = None,
                 fallback: Callable[[], Executor] | None = None) -> None:
        import pycuda.driver as cuda  # lazily: the package imports on machines without CUDA
        import tensorrt as trt

        from dynnet_ros.engine.backends.cpu import OrtExecutor

        self.options = options or TrtOptions.from_env()
        self._trt, self._cuda = trt, cuda
        cuda.init()
        self._device = cuda.Device(self.options.device)
        self._ctx = self._device.retain_primary_context()  # the context TensorRT's runtime API uses
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._model = model
        self._model_bytes = model.SerializeToString()
        self._sha = model_sha256(model)
        self._order = output_names(model)
        self._onnx_outputs = {o.name: np.dtype(helper.tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type))
                              for o in model.graph.output}
        self._cache = EngineCache(self.options.cache_dir)
        self.plan: EnginePlan | None = None
        self._switch: EngineSwitch | None = None
        try:
            with self._activate():
                self.device = self._device_info()
            self._switch = EngineSwitch(initial_samples(model, self.options), plan=self._plan, build=self._build,
                                        fallback=fallback or (lambda: OrtExecutor(model, threads=threads)),
                                        rebuild_on_miss=self.options.rebuild_on_miss)
        except BaseException:
            self.close()
            raise

    @contextlib.contextmanager
    def _activate(self):
        """Make the device's primary context current on this thread (runs and background builds
        happen on different threads)."""
        self._ctx.push()
        try:
            yield
        finally:
            self._cuda.Context.pop()

    def _device_info(self) -> DeviceInfo:
        builder = self._trt.Builder(self._logger)
        free, _total = self._cuda.mem_get_info()
        major, minor = self._device.compute_capability()
        return DeviceInfo(name=self._device.name(), compute_capability=(int(major), int(minor)),
                          tensorrt_version=self._trt.__version__, dla_cores=int(builder.num_DLA_cores),
                          fast_fp16=bool(builder.platform_has_fast_fp16),
                          fast_int8=bool(builder.platform_has_fast_int8), free_bytes=int(free))

    def _plan(self, samples: dict) -> EnginePlan:
        plan = plan_engine(self._model, samples, self.options, self.device, sha256=self._sha)
        LOG.info("TensorRT plan: %s", plan.explain())
        return plan

    def _build(self, plan: EnginePlan) -> _Runner:
        with self._activate():
            blob = self._cache.load(plan.key)
            if blob is not None:
                try:
                    runner = _Runner(self._trt, self._cuda, self._activate, blob, plan, self._logger,
                                     self._onnx_outputs, self._order)
                except RuntimeError as exc:
                    LOG.warning("cached TensorRT engine %s unusable (%s); rebuilding", self._cache.path(plan.key), exc)
                    self._cache.remove(plan.key)
                else:
                    self.plan = plan
                    return runner
            LOG.info("building a TensorRT engine (%s)", self._cache.stale_reason(plan.key))
            blob = self._build_serialized(plan)
            self._cache.store(plan.key, blob)
            runner = _Runner(self._trt, self._cuda, self._activate, blob, plan, self._logger,
                             self._onnx_outputs, self._order)
            self.plan = plan
            return runner

    def _build_serialized(self, plan: EnginePlan) -> bytes:
        trt = self._trt
        builder = trt.Builder(self._logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, self._logger)
        if not parser.parse(self._model_bytes):
            errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
            raise ValueError("TensorRT cannot parse the model: " + "; ".join(errors[:3]))
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, plan.workspace.bytes)
        tf32 = getattr(trt.BuilderFlag, "TF32", None)
        if tf32 is not None and "TF32" not in plan.key.flags:
            config.clear_flag(tf32)  # fp32 means fp32: outputs match onnxruntime
        for flag in plan.key.flags:
            config.set_flag(getattr(trt.BuilderFlag, flag))
        for profile in plan.profiles.profiles:
            optimisation = builder.create_optimization_profile()
            for i in range(network.num_inputs):
                tensor = network.get_input(i)
                r = profile.range(tensor.name)
                optimisation.set_shape(tensor.name, r.min, r.opt, r.max)
                if tensor.is_shape_tensor:
                    count = max(1, math.prod(r.max))
                    low, opt, high = SHAPE_INPUT_VALUES
                    optimisation.set_shape_input(tensor.name, [low] * count, [opt] * count, [high] * count)
            config.add_optimization_profile(optimisation)
        if plan.placement.device == "DLA":
            config.default_device_type = trt.DeviceType.DLA
            config.DLA_core = plan.placement.dla_core
            layers = [network.get_layer(i) for i in range(network.num_layers)]
            on_dla = sum(bool(config.can_run_on_DLA(layer)) for layer in layers)
            LOG.info("TensorRT: %d of %d layers can run on DLA%d (our pre-screen: %s)", on_dla, len(layers),
                     plan.placement.dla_core, plan.placement.reason)
            if on_dla < len(layers) and not plan.placement.gpu_fallback:
                raise ValueError(f"{len(layers) - on_dla} layers cannot run on DLA{plan.placement.dla_core} "
                                 "and GPU fallback is disabled (DYNNET_TRT_GPU_FALLBACK=0)")
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise RuntimeError("TensorRT failed to build the engine (the TensorRT log names the layer)")
        return bytes(serialized)

    # ------------------------------------------------------------------ executor protocol
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._switch.run(feeds)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait for a background rebuild (tests and tools)."""
        return self._switch.wait_idle(timeout)

    def stats(self) -> dict:
        info = self._switch.stats()
        if self.plan is not None:
            info.update(cache_file=str(self._cache.path(self.plan.key)), plan=self.plan.explain())
        return info

    def close(self) -> None:
        if self._switch is not None:
            self._switch.close()
            self._switch = None
        if self._ctx is not None:
            self._ctx.detach()
            self._ctx = None
