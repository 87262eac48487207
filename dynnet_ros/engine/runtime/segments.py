"""One segment of a planned model as an onnxruntime session over weights the executor shares.

A segment becomes a standalone model (its boundary tensors as inputs and outputs, its weights
as placeholders bound to the executor's buffers), compiled with session options that follow
from the planner's knobs and the segment's contents.
"""
from __future__ import annotations

from collections.abc import Mapping

import onnxruntime as ort

from dynnet_ros.engine.modelio.loader import external_data_dir, map_external
from dynnet_ros.engine.modelio.onnx_proto import (
    ModelProto,
    NodeProto,
    TensorProto,
    make_graph,
    make_model,
    make_tensor_value_info,
)
from dynnet_ros.engine.modelio.ort_features import EXTERNAL_FOLDER_KEY, ort_features
from dynnet_ros.engine.plan.graph import SHARED_WEIGHTS_LOCATION, GraphIndex, node_inputs
from dynnet_ros.engine.plan.options import LEVELS, PlannerOptions
from dynnet_ros.engine.plan.segmentation import Segment
from dynnet_ros.engine.runtime.ort_env import register_shared_arena, use_global_pool
from dynnet_ros.engine.runtime.ort_executor import default_threads

#: Ops whose kernels use a thread pool well; segments without them run on fewer threads.
HEAVY_OPS = {"Conv", "FusedConv", "ConvTranspose", "Gemm", "MatMul", "FusedMatMul", "Attention", "LSTM", "GRU"}


class SegmentRunner:
    """One segment compiled into an onnxruntime session over shared weights."""

    def __init__(self, segment: Segment, graph: GraphIndex, skeleton: ModelProto,
                 weights: Mapping[str, ort.OrtValue], options: ort.SessionOptions,
                 input_shapes: Mapping[str, tuple[int, ...]] | None = None,
                 model: ModelProto | None = None,
                 shared: Mapping[str, ort.OrtValue] | None = None) -> None:
        self.segment = segment
        model = model or build_segment_model(segment, graph, skeleton, input_shapes)
        folder = external_data_dir(skeleton)
        by_reference = shared or {}
        #: weights mapped from the model file for onnxruntimes that cannot find them themselves
        self.file_weights: dict[str, ort.OrtValue] = {}
        if folder and ort_features().external_data_folder:
            # weights referenced in the model file itself: onnxruntime reads them from there
            options.add_session_config_entry(EXTERNAL_FOLDER_KEY, folder)
        elif folder:
            self.file_weights = mapped_file_weights(model, folder, skip=set(weights) | set(by_reference))
        used = [i.name for i in model.graph.initializer if i.name in weights]
        if used or self.file_weights:
            options.add_external_initializers(used + list(self.file_weights),
                                              [weights[n] for n in used] + list(self.file_weights.values()))
        for name in {i.name for i in model.graph.initializer if i.name in by_reference} - set(used):
            options.add_initializer(name, by_reference[name])  # by reference: the OrtValue's memory is used as is
        try:
            self.session = ort.InferenceSession(model.SerializeToString(), sess_options=options,
                                                providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own types: one ValueError naming the segment
            raise ValueError(f"onnxruntime cannot load segment {segment.index} "
                             f"({[graph.nodes[n].op_type for n in segment.nodes]}): "
                             f"{str(exc).strip().splitlines()[0]}") from exc


def mapped_file_weights(model: ModelProto, folder: str, skip: set[str]) -> dict[str, ort.OrtValue]:
    """The model's external-data weights as OrtValues over read-only maps of their file.

    Why: onnxruntime before the ``EXTERNAL_FOLDER_KEY`` config key (ort_features.py) looks for a
    model-from-bytes' external data in its working directory. Mapping the file hands it the same
    bytes without a copy in this process; a weight that cannot be mapped is left for
    onnxruntime to report."""
    values = {}
    for tensor in model.graph.initializer:
        if tensor.name in skip or tensor.data_location != TensorProto.EXTERNAL:
            continue
        if any(e.key == "location" and e.value == SHARED_WEIGHTS_LOCATION for e in tensor.external_data):
            continue
        array = map_external(tensor, folder)
        if array is not None:
            values[tensor.name] = ort.OrtValue.ortvalue_from_numpy(array)
    return values


def has_fused_sum(nodes: list[NodeProto]) -> bool:
    """A com.microsoft FusedConv with a sum input Z (what simplify.py fuses Conv + Add into)."""
    return any(n.op_type == "FusedConv" and n.domain == "com.microsoft" and len(n.input) > 3 and n.input[3]
               for n in nodes)


class NoSession:
    """Stands in for a segment whose work is done elsewhere (an If run by its branch plans)."""

    session = None

    def __init__(self, segment: Segment) -> None:
        self.segment = segment


def build_segment_model(segment: Segment, graph: GraphIndex, skeleton: ModelProto,
                        input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> ModelProto:
    """A standalone model for one segment: boundary tensors as inputs/outputs, weights as placeholders.

    ``input_shapes`` pins the inputs to concrete shapes (a specialised version); otherwise every
    input has an unknown shape and the session is generic.
    """
    return build_nodes_model([graph.nodes[n] for n in segment.nodes], segment, graph, skeleton, input_shapes)


def build_nodes_model(nodes: list[NodeProto], segment: Segment, graph: GraphIndex, skeleton: ModelProto,
                      input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> ModelProto:
    """A standalone model running ``nodes`` with ``segment``'s inputs and outputs."""
    weights_used: list[str] = []
    for node in nodes:
        for name in node_inputs(node):
            if graph.is_weight(name) and name not in weights_used:
                weights_used.append(name)
    skeleton_inits = {t.name: t for t in skeleton.graph.initializer}
    shapes = input_shapes or {}
    inputs = [make_tensor_value_info(name, graph.elem_types[name],
                                                 list(shapes[name]) if name in shapes else None)
              for name in segment.inputs]
    outputs = [make_tensor_value_info(name, graph.elem_types.get(name, 0), None)
               for name in segment.outputs]
    sub = make_graph(nodes, f"segment_{segment.index}", inputs, outputs,
                                 [skeleton_inits[w] for w in weights_used])
    model = make_model(sub, opset_imports=list(graph.model.opset_import))
    model.ir_version = graph.model.ir_version
    model.functions.extend(graph.model.functions)
    return model


def segment_session_options(opts: PlannerOptions, *, light: bool = False, nchwc: bool = False,
                            fused_sum: bool = False) -> ort.SessionOptions:
    """Session options for one segment: ``light`` when it has no heavy op (``HEAVY_OPS``),
    ``nchwc`` when its tensors are small enough for onnxruntime's blocked-layout kernels,
    ``fused_sum`` when it holds a FusedConv with a sum input (``has_fused_sum``)."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    threads = opts.threads or default_threads()
    if opts.global_threads and use_global_pool(threads):
        # one process-wide pool (sized once) instead of one pool per segment session
        so.use_per_session_threads = False
    else:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        if light and opts.light_segment_threads:
            # waking a thread pool costs more than memory-bound element-wise work gains from it
            so.intra_op_num_threads = min(threads, opts.light_segment_threads)
        if opts.spinning == "run":
            # spin between the ops of this segment's run (no futex wake per parallel op), stop
            # when the run ends so idle pools never steal the cores the next segment needs
            so.add_session_config_entry("session.force_spinning_stop", "1")
        elif not opts.spinning:
            # every segment session has its own pool; spinning workers of the segment that just
            # finished would steal the cores the next segment needs
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.graph_optimization_level = LEVELS[opts.optimization_level]
    if nchwc:
        # NCHWc kernels are faster but need reorder buffers the size of the segment's tensors:
        # worth it where tensors are small (deep, many-channel layers), not at full resolution
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if (fused_sum and so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            and not ort_features().nchwc_fused_conv_sum):
        # this onnxruntime's NCHWc rewrite of a FusedConv loses its sum input (ort_features.py)
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.enable_cpu_mem_arena = opts.segment_arena
    so.enable_mem_pattern = False  # patterns are per shape; our arena plans across shapes instead
    if opts.shared_arena or (nchwc and opts.nchwc_shared_arena):
        register_shared_arena(opts.shared_arena_strategy)
        so.add_session_config_entry("session.use_env_allocators", "1")
    if not opts.prepacking or opts.shared_weights is not None:
        so.add_session_config_entry("session.disable_prepacking", "1")
    return so
