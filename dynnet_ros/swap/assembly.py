"""Assembly by reference: an executable atom = weightless skeleton + pointers into the arena.

SwapNet §5 keeps only the model *skeleton* and points it at the parameters in memory instead
of instantiating a dummy model and copying weights in.  With onnxruntime 1.32 we found (see
docs/swap.md, "Assembly by reference", and ``test_swap_assembly.py``):

* ``SessionOptions.add_external_initializers`` **copies** the data into the session
  (RSS grows by the weight bytes; mutating the source afterwards does not change outputs).
* ``SessionOptions.add_initializer`` over an ``OrtValue`` that views the arena is **by
  reference** — but only with ``session.disable_prepacking=1`` (otherwise MatMul/Gemm/Conv
  prepack a private copy) and only for weights no graph rewrite touches at session creation
  (Conv+BatchNorm fusion and the NCHWc layout transform write new tensors).  The store applies
  all of those rewrites offline, per atom, and keeps their outputs as the stored weights; the
  sessions then run with optimisation disabled.

So each atom gets one session, created once, bound to a *fixed* arena address.  Swapping a
block in is a direct read into that address; swapping out drops the pages.  Re-assembly after
a swap costs nothing (no new session, no pointer rewrites), and repartitioning to another
budget regroups atoms without touching a session.

TensorRT: ``TrtAtom`` builds a weight-stripped plan (``BuilderFlag.STRIP_PLAN``, refittable
with ``REFIT_IDENTICAL``) once per atom and refits it from arena pointers on every swap-in
(``trt.Refitter.set_named_weights``).  Only used with ``backend="tensorrt"`` when tensorrt and
pycuda are importable.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnxruntime as ort

from dynnet_ros.swap.store import AtomEntry, Store
from dynnet_ros.swap.swapin import HostArena, huge_page_empty


def atom_session_options(threads: int | None = None, *, pre_optimized: bool = False) -> ort.SessionOptions:
    """Options under which onnxruntime keeps bound weights by reference (verified in tests).

    ``pre_optimized``: the skeleton already carries level-ALL rewrites (store optimised "all"),
    so the session must not rewrite again; otherwise EXTENDED (fusions that keep references).
    """
    options = ort.SessionOptions()
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_DISABLE_ALL if pre_optimized
                                        else ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)
    options.add_session_config_entry("session.disable_prepacking", "1")
    # Per-session arenas would each keep their high-water mark: K atoms would hold K arenas.
    options.enable_cpu_mem_arena = False
    # Each atom has its own intra-op pool; idle pools must not spin-wait and steal the cores the
    # running atom needs.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.intra_op_num_threads = threads or max(1, len(os.sched_getaffinity(0)))
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return options


def arena_views(arena: HostArena, entry: AtomEntry, arena_offset: int | None = None) -> dict[str, np.ndarray]:
    """numpy views of the atom's tensors at their fixed arena addresses (default: the file layout)."""
    shift = (entry.span_offset if arena_offset is None else arena_offset) - entry.span_offset
    views = {}
    for tensor in entry.tensors:
        start = tensor.offset + shift
        raw = arena.array[start:start + tensor.nbytes]
        views[tensor.name] = raw.view(np.dtype(tensor.dtype)).reshape(tensor.shape)
    return views


class OrtAtom:
    """One atom as an onnxruntime session whose weights live in the arena."""

    def __init__(self, store: Store, entry: AtomEntry, arena: HostArena, *, threads: int | None = None,
                 arena_offset: int | None = None) -> None:
        self.entry = entry
        self.atom = entry.atom
        options = atom_session_options(threads, pre_optimized=store.index.get("optimized") == "ort-all")
        self._values = []  # the OrtValues must outlive the session
        for name, view in arena_views(arena, entry, arena_offset).items():
            value = ort.OrtValue.ortvalue_from_numpy(view)
            options.add_initializer(name, value)
            self._values.append(value)
        self.session = ort.InferenceSession(str(store.skeleton_path(entry.atom.index)), options,
                                            providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = list(self.atom.outputs)

    def run(self, env: Mapping[str, np.ndarray],
            output_specs: Mapping[str, tuple[tuple[int, ...], np.dtype]] | None = None) -> dict[str, np.ndarray]:
        """Run the atom.  With ``output_specs`` (every output's shape and dtype at this input
        size) the outputs are written into huge-page-backed arrays we allocate (``IOBinding``):
        cheaper to fault in than onnxruntime's 4 KiB-page allocations, same bytes."""
        if not output_specs:
            feeds = {name: env[name] for name in self.inputs}
            return dict(zip(self.outputs, self.session.run(self.outputs, feeds)))
        binding = self.session.io_binding()
        for name in self.inputs:
            binding.bind_cpu_input(name, np.ascontiguousarray(env[name]))
        outputs = {}
        for name in self.outputs:
            shape, dtype = output_specs[name]
            array = huge_page_empty(shape, dtype)
            binding.bind_output(name, "cpu", 0, dtype, list(shape), array.ctypes.data)
            outputs[name] = array
        self.session.run_with_iobinding(binding)
        return outputs

    def close(self) -> None:
        self.session = None
        self._values = []


# ------------------------------------------------------------------------------ TensorRT path
@dataclass(frozen=True)
class TrtDecision:
    use: bool
    reason: str


def decide_tensorrt(requested: bool, *, tensorrt_importable: bool | None = None,
                    pycuda_importable: bool | None = None) -> TrtDecision:
    """Use the weightless-TensorRT path only when asked for and its packages import."""
    if not requested:
        return TrtDecision(False, "not requested (backend is not tensorrt)")
    if tensorrt_importable is None:
        tensorrt_importable = importlib.util.find_spec("tensorrt") is not None
    if pycuda_importable is None:
        pycuda_importable = importlib.util.find_spec("pycuda") is not None
    missing = [n for n, ok in (("tensorrt", tensorrt_importable), ("pycuda", pycuda_importable)) if not ok]
    if missing:
        return TrtDecision(False, f"needs {', '.join(missing)} (not importable here)")
    return TrtDecision(True, "weight-stripped plans refitted from the arena")


def trt_builder_flags(trt) -> list:
    """STRIP_PLAN drops weights from the plan; REFIT_IDENTICAL promises the refit brings the same
    values, which keeps the builder's weight-dependent optimisations legal."""
    return [trt.BuilderFlag.STRIP_PLAN, trt.BuilderFlag.REFIT_IDENTICAL]


class TrtAtom:  # pragma: no cover - needs a CUDA device and TensorRT
    """An atom as a weightless TensorRT engine, refitted from arena memory on swap-in."""

    def __init__(self, store: Store, entry: AtomEntry, shapes: Mapping[str, tuple], *, workspace: int = 1 << 28):
        import pycuda.autoinit  # noqa: F401
        import pycuda.driver as cuda
        import tensorrt as trt

        self._trt, self._cuda = trt, cuda
        self.entry = entry
        self.atom = entry.atom
        self.logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(self.logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, self.logger)
        # The skeleton's external data is real (it points into weights.bin), so the parser sees
        # the true weights for tactic selection; STRIP_PLAN leaves them out of the plan.
        if not parser.parse_from_file(str(store.skeleton_path(entry.atom.index))):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise ValueError(f"TensorRT cannot parse atom {entry.atom.index}: {errors}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace)
        for flag in trt_builder_flags(trt):
            config.set_flag(flag)
        profile = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            shape = tuple(shapes[tensor.name])
            profile.set_shape(tensor.name, shape, shape, shape)
        config.add_optimization_profile(profile)
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise ValueError(f"TensorRT failed to build atom {entry.atom.index}")
        self.engine = trt.Runtime(self.logger).deserialize_cuda_engine(plan)
        self.context = self.engine.create_execution_context()
        self.stream = cuda.Stream()

    def refit(self, device_pointers: Mapping[str, tuple[int, int]]) -> None:
        """Point the engine's weights at the arena: name -> (device pointer, element count)."""
        trt = self._trt
        refitter = trt.Refitter(self.engine, self.logger)
        for tensor in self.entry.tensors:
            pointer, count = device_pointers[tensor.name]
            weights = trt.Weights(trt.nptype_to_dtype(np.dtype(tensor.dtype)) if hasattr(trt, "nptype_to_dtype")
                                  else trt.DataType.FLOAT, pointer, count)
            if not refitter.set_named_weights(tensor.name, weights, trt.TensorLocation.DEVICE):
                raise ValueError(f"TensorRT refused weights '{tensor.name}' for atom {self.atom.index}")
        if not refitter.refit_cuda_engine():
            raise ValueError(f"TensorRT refit of atom {self.atom.index} failed; missing "
                             f"{refitter.get_missing_weights()}")

    def run(self, env: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        cuda = self._cuda
        buffers, outputs = [], {}
        for name in self.atom.inputs:
            array = np.ascontiguousarray(env[name])
            device = cuda.to_device(array)
            buffers.append(device)
            self.context.set_input_shape(name, array.shape)
            self.context.set_tensor_address(name, int(device))
        for name in self.atom.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            dtype = self._trt.nptype(self.engine.get_tensor_dtype(name))
            host = np.empty(shape, dtype)
            device = cuda.mem_alloc(max(host.nbytes, 1))
            buffers.append(device)
            self.context.set_tensor_address(name, int(device))
            outputs[name] = (host, device)
        self.context.execute_async_v3(self.stream.handle)
        for host, device in outputs.values():
            cuda.memcpy_dtoh_async(host, device, self.stream)
        self.stream.synchronize()
        return {name: host for name, (host, _) in outputs.items()}

    def close(self) -> None:
        self.context = None
        self.engine = None
