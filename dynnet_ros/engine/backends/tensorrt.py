"""The TensorRT backend (desktop GPU or Jetson GPU/DLA), written to TensorRT 10/11's Python API.

    Engine("model.onnx", backend="tensorrt")     # options from DYNNET_TRT_* (see docs/tensorrt.md)

Every decision (profiles, precision, DLA placement, workspace, cache key) is made in plain Python
by ``trt_plan.plan_engine`` and unit-tested without a GPU; this module only executes them:

* build, per engine part of the plan (one GPU engine, or one DLA engine per static shape), under
  a cross-process lock on its cache entry: ``trt.Builder`` -> ``create_network(0)`` ->
  ``trt.OnnxParser`` (plugins registered first) -> builder config (workspace pool, precision
  flags, the persisted timing cache, one optimisation profile per planned bucket with each index
  checked, DLA device type/core + GPU fallback) -> ``build_serialized_network``; plans are cached
  on disk under their ``EngineKey`` and rebuilt when any part of the key changes;
* run: one execution context per engine with ``STATIC`` activation memory (sized to the largest
  profile, which the memory budget already charges, so alternating camera sizes never reallocate),
  ``set_optimization_profile_async`` when the profile changes (a refusal serves the run on the CPU),
  ``set_input_shape`` + ``set_tensor_address`` per input (host or device memory as
  ``get_tensor_location`` says), every output through an ``IOutputAllocator`` (so data-dependent
  shapes such as NonMaxSuppression's work), then ``execute_async_v3`` on a pycuda stream;
* a shape outside every profile runs on onnxruntime (CPU) while a new engine builds in the
  background (``trt_switch.EngineSwitch``) — never a build stall inside ``run``;
* every pycuda object (stream, device buffers) is created and released with the device's primary
  context current on the releasing thread: pycuda cannot release it otherwise and leaks it.

NOT VERIFIED HERE: the project's machines have no GPU, TensorRT or pycuda, so this file has never
executed against them; test/test_trt_glue.py runs it against a stand-in that enforces the binding
rules it depends on, and test/test_trt_gpu.py runs it against onnxruntime wherever they exist.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from dynnet_ros.engine.backends.trt_cache import EngineCache, model_sha256
from dynnet_ros.engine.backends.trt_config import TrtOptions
from dynnet_ros.engine.backends.trt_dla import LayerPlacement, engine_layer_placement
from dynnet_ros.engine.backends.trt_plan import DeviceInfo, EnginePart, EnginePlan, initial_samples, plan_engine
from dynnet_ros.engine.backends.trt_profiles import ProfileSet
from dynnet_ros.engine.backends.trt_switch import EngineSwitch, NotServable
from dynnet_ros.engine.modelio.models import output_names
from dynnet_ros.engine.modelio.onnx_proto import ModelProto, tensor_dtype_to_np_dtype
from dynnet_ros.engine.runtime.base import Executor, ExecutorStats
from dynnet_ros.engine.runtime.ort_executor import OrtExecutor

LOG = logging.getLogger(__name__)
#: value range (min, opt, max) built for shape-tensor inputs, e.g. NonMaxSuppression's
#: max_output_boxes_per_class fed from a graph input; values outside run on the fallback
SHAPE_INPUT_VALUES = (1, 100, 4096)


@functools.lru_cache(maxsize=1)
def process_logger(trt):
    """The process's one ``trt.Logger``: TensorRT keeps the logger of the first builder or runtime
    it creates, so later ones would be ignored. The standard plugins (NMS, ...) are registered with
    it before any parse, so the ONNX parser finds their creators. One tensorrt module per process
    in use, hence one cache entry."""
    logger = trt.Logger(trt.Logger.WARNING)
    if not trt.init_libnvinfer_plugins(logger, ""):
        LOG.warning("TensorRT: init_libnvinfer_plugins failed; models that need plugins will not parse")
    return logger


def _output_allocator(trt: ModuleType, cuda: ModuleType) -> Any:
    """An IOutputAllocator that grows one device buffer per output and records its shape."""

    base: Any = trt.IOutputAllocator  # a module passed in: a value, not a type mypy can name

    class OutputAllocator(base):
        def __init__(self) -> None:
            base.__init__(self)
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
    """One deserialised engine + execution context; runs feeds on one of its profiles."""

    def __init__(self, trt, cuda, activate: Callable, blob: bytes, profiles: ProfileSet, dla_core: int | None,
                 logger, onnx_outputs: Mapping[str, np.dtype], order: list[str]) -> None:
        self.profiles = profiles
        self._trt, self._cuda, self._activate = trt, cuda, activate
        self._onnx_outputs, self._order = dict(onnx_outputs), list(order)
        self._runtime = trt.Runtime(logger)
        if dla_core is not None:
            self._runtime.DLA_core = dla_core
        self.engine = self._runtime.deserialize_cuda_engine(blob)
        if self.engine is None:
            raise RuntimeError("TensorRT could not deserialise the engine (stale or corrupt plan)")
        if self.engine.num_optimization_profiles != len(profiles):
            raise RuntimeError(f"the engine holds {self.engine.num_optimization_profiles} optimisation profiles, "
                               f"the plan {len(profiles)}")
        # STATIC: activation memory for the largest profile, allocated once (see docs/tensorrt.md)
        self.context = self.engine.create_execution_context(trt.ExecutionContextAllocationStrategy.STATIC)
        if self.context is None:
            raise RuntimeError("TensorRT could not create an execution context (device memory?)")
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self.dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        self.host_inputs = {n for n in self.inputs if self.engine.get_tensor_location(n) == trt.TensorLocation.HOST}
        missing = [n for n in self._order if n not in self.outputs]
        if missing:
            raise RuntimeError(f"the TensorRT engine lacks the model outputs {missing} (has {self.outputs})")
        self.stream = cuda.Stream()
        self.allocator = _output_allocator(trt, cuda)
        for name in self.outputs:
            if not self.context.set_output_allocator(name, self.allocator):
                raise RuntimeError(f"TensorRT refused an output allocator for '{name}'")
        self._buffers: dict[str, tuple[Any, int]] = {}
        self._profile: int | None = None

    def layer_placement(self) -> LayerPlacement:
        """Where the built layers run, from the engine inspector (DLA engines are logged with it)."""
        inspector = self.engine.create_engine_inspector()
        fmt = self._trt.LayerInformationFormat.JSON
        return engine_layer_placement([inspector.get_layer_information(i, fmt) for i in range(self.engine.num_layers)])

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

    def _select_profile(self, profile_index: int) -> None:
        if profile_index == self._profile:
            return
        self._profile = None
        try:  # the binding raises RuntimeError where the C++ call returns false
            self.context.set_optimization_profile_async(profile_index, self.stream.handle)
        except RuntimeError as exc:
            raise NotServable(f"TensorRT refused optimisation profile {profile_index}: {exc}") from exc
        self._profile = profile_index

    def run(self, feeds: Mapping[str, np.ndarray], profile_index: int) -> dict[str, np.ndarray]:
        cuda = self._cuda
        with self._activate():
            self._select_profile(profile_index)
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
        """Release every device object with the context current on this thread: pycuda frees a
        stream or buffer from another thread only while its context is current there."""
        with self._activate():
            for buffer, _ in self._buffers.values():
                buffer.free()
            self._buffers.clear()
            self.allocator.free()
            self.stream = None      # the last reference: pycuda destroys the stream here
            self.context = None     # context before engine before runtime
            self.engine = None
            self._runtime = None


class _PartsRunner:
    """The engines of one plan behind the plan's profile indices (a GPU plan is one engine; a DLA
    plan one engine per static shape)."""

    def __init__(self, profiles: ProfileSet, runners: Sequence[_Runner]) -> None:
        self.profiles = profiles
        self.runners = list(runners)
        self._route = [(runner, local) for runner in self.runners for local in range(len(runner.profiles))]
        if len(self._route) != len(profiles):
            raise RuntimeError(f"the engines hold {len(self._route)} profiles, the plan {len(profiles)}")

    def run(self, feeds: Mapping[str, np.ndarray], profile_index: int) -> dict[str, np.ndarray]:
        runner, local = self._route[profile_index]
        return runner.run(feeds, local)

    def close(self) -> None:
        for runner in self.runners:
            runner.close()


class TensorRTExecutor:
    """Executor protocol (``run``/``close``/``name``) over TensorRT with a CPU fallback."""

    name = "tensorrt"

    def __init__(self, model: ModelProto, *, threads: int | None = None, options: TrtOptions | None = None,
                 fallback: Callable[[], Executor] | None = None) -> None:
        import pycuda.driver as cuda  # optional dependency: the package imports on machines without CUDA
        import tensorrt as trt  # optional dependency, as pycuda

        self.options = options or TrtOptions.from_env()
        self._trt, self._cuda = trt, cuda
        self._ctx = None
        self._switch: EngineSwitch | None = None
        cuda.init()
        self._device = cuda.Device(self.options.device)
        self._ctx = self._device.retain_primary_context()  # the context TensorRT's runtime API uses
        self._logger = process_logger(trt)
        self._model = model
        self._model_bytes = model.SerializeToString()
        self._sha = model_sha256(model)
        self._order = output_names(model)
        self._onnx_outputs = {o.name: np.dtype(tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type))
                              for o in model.graph.output}
        self._cache = EngineCache(self.options.cache_dir)
        self.plan: EnginePlan | None = None
        self.layers: LayerPlacement | None = None
        try:
            with self._activate():
                self.device = self._device_info()
            self._switch = EngineSwitch(initial_samples(model, self.options), plan=self._plan, build=self._build,
                                        fallback=fallback or (lambda: OrtExecutor(model, threads=threads)),
                                        rebuild_on_miss=self.options.rebuild_on_miss)
        except BaseException:  # any exit, interrupts included: device memory is freed; re-raised
            self.close()
            raise

    @contextlib.contextmanager
    def _activate(self):
        """Make the device's primary context current on this thread (runs and background builds
        happen on different threads)."""
        if self._ctx is None:
            raise RuntimeError("the TensorRT executor is closed")
        self._ctx.push()
        try:
            yield
        finally:
            self._cuda.Context.pop()

    def _device_info(self) -> DeviceInfo:
        """What the plan depends on, without creating a builder (slow, and its precision queries
        are gone from TensorRT 11): fast FP16/INT8 follow from the compute capability."""
        cuda = self._cuda
        free, _total = cuda.mem_get_info()
        major, minor = self._device.compute_capability()
        sms = self._device.get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT)
        dla = self._trt.Runtime(self._logger).num_DLA_cores
        return DeviceInfo(name=self._device.name(), compute_capability=(int(major), int(minor)),
                          tensorrt_version=self._trt.__version__, dla_cores=int(dla), sm_count=int(sms),
                          free_bytes=int(free))

    def _plan(self, samples: dict) -> EnginePlan:
        plan = plan_engine(self._model, samples, self.options, self.device, sha256=self._sha)
        LOG.info("TensorRT plan: %s", plan.explain())
        return plan

    def _build(self, plan: EnginePlan) -> _PartsRunner:
        runners: list[_Runner] = []
        layers = None
        try:
            with self._activate():
                for part in plan.parts:
                    runners.append(self._part_runner(plan, part))
                if plan.placement.device == "DLA":
                    layers = _merge([r.layer_placement() for r in runners])
                    LOG.info("TensorRT DLA%s: %s", plan.placement.dla_core, layers.describe())
            parts = _PartsRunner(plan.profiles, runners)
        except BaseException:  # any exit, interrupts included: device memory is freed; re-raised
            for runner in runners:
                runner.close()
            raise
        self.plan, self.layers = plan, layers
        return parts

    def _part_runner(self, plan: EnginePlan, part: EnginePart) -> _Runner:
        """The part's engine from the cache, else built under the entry's lock (another process
        may finish the same engine while this one waits; then it is loaded, not rebuilt)."""
        runner = self._load(plan, part)
        if runner is not None:
            return runner
        with self._cache.lock(part.key):
            runner = self._load(plan, part)
            if runner is not None:
                return runner
            LOG.info("building a TensorRT engine (%s)", self._cache.stale_reason(part.key))
            blob = self._build_serialized(plan, part)
            self._cache.store(part.key, blob)
        return self._runner(blob, plan, part)

    def _runner(self, blob: bytes, plan: EnginePlan, part: EnginePart) -> _Runner:
        return _Runner(self._trt, self._cuda, self._activate, blob, part.profiles, plan.placement.dla_core,
                       self._logger, self._onnx_outputs, self._order)

    def _load(self, plan: EnginePlan, part: EnginePart) -> _Runner | None:
        blob = self._cache.load(part.key)
        if blob is None:
            return None
        try:
            return self._runner(blob, plan, part)
        except RuntimeError as exc:
            LOG.warning("cached TensorRT engine %s unusable (%s); rebuilding", self._cache.path(part.key), exc)
            self._cache.remove(part.key)
            return None

    def _build_serialized(self, plan: EnginePlan, part: EnginePart) -> bytes:
        trt = self._trt
        builder = trt.Builder(self._logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, self._logger)
        if not parser.parse(self._model_bytes):
            errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
            raise ValueError("TensorRT cannot parse the model: " + "; ".join(errors[:3]))
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, plan.workspace.bytes)
        if "TF32" not in part.key.flags:
            config.clear_flag(trt.BuilderFlag.TF32)  # fp32 means fp32: outputs match onnxruntime
        for flag in part.key.flags:
            config.set_flag(getattr(trt.BuilderFlag, flag))
        timing = config.create_timing_cache(self._cache.load_timing_cache(part.key))
        if not config.set_timing_cache(timing, False):  # ignore_mismatch=False: another GPU's cache is refused
            LOG.warning("TensorRT refused the stored timing cache; timing every tactic again")
            timing = config.create_timing_cache(b"")
            config.set_timing_cache(timing, False)
        for index, profile in enumerate(part.profiles.profiles):
            optimisation = builder.create_optimization_profile()
            for i in range(network.num_inputs):
                tensor = network.get_input(i)
                r = profile.range(tensor.name)
                optimisation.set_shape(tensor.name, r.min, r.opt, r.max)
                if tensor.is_shape_tensor:
                    count = max(1, math.prod(r.max))
                    low, opt, high = SHAPE_INPUT_VALUES
                    optimisation.set_shape_input(tensor.name, [low] * count, [opt] * count, [high] * count)
            added = config.add_optimization_profile(optimisation)
            if added != index:  # -1: TensorRT found the profile invalid
                raise RuntimeError(f"TensorRT rejected optimisation profile {index} ({profile.describe()}): "
                                   f"add_optimization_profile returned {added}")
        if plan.placement.device == "DLA":  # the build decides per layer; the inspector reports it
            config.default_device_type = trt.DeviceType.DLA
            config.DLA_core = plan.placement.dla_core
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise RuntimeError("TensorRT failed to build the engine (the TensorRT log names the layer)")
        self._cache.store_timing_cache(part.key, bytes(config.get_timing_cache().serialize()))
        return bytes(serialized)

    # ------------------------------------------------------------------ executor protocol
    def _serving(self) -> EngineSwitch:
        if self._switch is None:
            raise ValueError("this TensorRT executor is closed")
        return self._switch

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._serving().run(feeds)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait for a background rebuild (tests and tools)."""
        return self._serving().wait_idle(timeout)

    def stats(self) -> dict:
        info = self._serving().stats()
        if self.plan is not None:
            info.update(cache_files=[str(self._cache.path(part.key)) for part in self.plan.parts],
                        plan=self.plan.explain())
        if self.layers is not None:
            info.update(dla_layers=self.layers.describe())
        return info

    def executor_stats(self) -> ExecutorStats:
        return ExecutorStats(details={"tensorrt": self.stats()})

    def arena_bytes_at(self, shapes: Mapping[str, tuple[int, ...]]) -> int | None:
        return None  # TensorRT sizes its own activation memory

    def close(self) -> None:
        """Engines first (waiting for a background build), then the CUDA context they use."""
        if self._switch is not None:
            self._switch.close()
            self._switch = None
        if self._ctx is not None:
            self._ctx.detach()
            self._ctx = None


def _merge(placements: Sequence[LayerPlacement]) -> LayerPlacement:
    return LayerPlacement(sum(p.layers for p in placements), tuple(n for p in placements for n in p.on_dla))
