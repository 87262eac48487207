"""Where a TensorRT engine runs on a Jetson: a DLA core (DLA0/DLA1) or the GPU.

The DLA is a fixed-function CNN accelerator: FP16/INT8 only, static shapes only (a profile's
min = opt = max), a restricted set of layers with per-layer limits, at most 16 loadables per core
(every stretch of DLA layers between GPU-fallback layers is one loadable). TensorRT's build has
the final word, and ``engine_layer_placement`` reads where each built layer runs from the engine
inspector; this module's ``decide_placement`` is the conservative *pre-screen* that decides
whether asking for the DLA is worthwhile, on ONNX, from NVIDIA's "DLA Supported Layers and
Restrictions" (TensorRT 10). Anything not positively known to be supported counts as
unsupported. Every decision carries a reason string.
"""
from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dynnet_ros.engine.backends.trt_profiles import ProfileSet
from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.modelio.onnx_proto import ModelProto, NodeProto, TensorProto, get_attribute_value, to_array

log = logging.getLogger(__name__)

MAX_LOADABLES_PER_CORE = 16
MAX_DIM = 8192          # largest non-batch dimension on DLA
NO_OPS = {"Identity", "Dropout", "Constant"}      # vanish at parse time
ACTIVATIONS = {"Relu", "Sigmoid", "Tanh", "LeakyRelu"}
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"}


@dataclass(frozen=True)
class OpVerdict:
    node: str
    op_type: str
    supported: bool
    why: str


@dataclass(frozen=True)
class Placement:
    device: str                 # "GPU" | "DLA"
    dla_core: int | None
    gpu_fallback: bool
    reason: str
    verdicts: tuple[OpVerdict, ...] = ()
    loadables: int = 0

    @property
    def unsupported(self) -> tuple[OpVerdict, ...]:
        return tuple(v for v in self.verdicts if not v.supported)


def _gpu(reason: str, verdicts=(), loadables: int = 0) -> Placement:
    return Placement("GPU", None, False, reason, tuple(verdicts), loadables)


class _Graph:
    """Constants, ranks and dims of a model at one static input shape."""

    def __init__(self, model: ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.consts: dict[str, np.ndarray] = {i.name: to_array(i) for i in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "Constant" and node.output:
                for attr in node.attribute:
                    if attr.name == "value":
                        self.consts[node.output[0]] = to_array(attr.t)
        fixed = ModelProto()
        fixed.CopyFrom(model)
        for value in fixed.graph.input:
            if value.name in shapes:
                for dim, size in zip(value.type.tensor_type.shape.dim, shapes[value.name]):
                    dim.ClearField("dim_param")
                    dim.dim_value = int(size)
        try:
            fixed = onnx_proto.onnx_library().shape_inference.infer_shapes(fixed, data_prop=True)
        except Exception as exc:  # noqa: BLE001 - onnx's C++ inference raises several unrelated types
            log.info("onnx shape inference failed (%s); DLA checks see the declared shapes only", exc)
        self.dims: dict[str, list[int | None]] = {}
        self.types: dict[str, int] = {}
        for value in list(fixed.graph.input) + list(fixed.graph.value_info) + list(fixed.graph.output):
            t = value.type.tensor_type
            if t.HasField("shape"):
                self.dims[value.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            self.types[value.name] = t.elem_type
        for name, array in self.consts.items():
            self.dims[name] = list(array.shape)

    def rank(self, name: str) -> int | None:
        dims = self.dims.get(name)
        return None if dims is None else len(dims)


def _attrs(node: NodeProto) -> dict:
    return {a.name: get_attribute_value(a) for a in node.attribute}


def _in_range(values, low: int, high: int) -> bool:
    return all(low <= int(v) <= high for v in values)


def _check(node: NodeProto, g: _Graph) -> str | None:
    """None when the node is DLA-capable under the allow-list, else why not."""
    op, a = node.op_type, _attrs(node)
    inputs = [i for i in node.input if i]

    def arg(k: int) -> str | None:  # positional input, None when absent or skipped ("")
        return node.input[k] if k < len(node.input) and node.input[k] else None
    def constant(k: int) -> np.ndarray | None:  # positional input's build-time constant
        name = arg(k)
        return None if name is None else g.consts.get(name)
    data = inputs[0] if inputs else None
    floaty = {TensorProto.FLOAT, TensorProto.FLOAT16}
    for name in inputs:
        if name not in g.consts and g.types.get(name) not in floaty:
            return f"input '{name}' is not a float tensor (DLA computes FP16/INT8 on float data)"
    for name in list(inputs) + [o for o in node.output if o]:
        dims = g.dims.get(name)
        if dims is None or any(d is None for d in dims):
            return f"shape of '{name}' unknown at the profile's static shape"
        if any(d is not None and d > MAX_DIM for d in dims[1:]):
            return f"'{name}' has a dimension above {MAX_DIM}"
    if op in NO_OPS:
        return None
    rank = None if data is None else g.rank(data)
    if rank != 4:
        return f"input rank {rank}; DLA layers are 2D (rank-4 NCHW) only"
    if op in ("Conv", "ConvTranspose"):
        if len(inputs) < 2 or inputs[1] not in g.consts:
            return "weights are not a build-time constant"
        weight = g.consts[inputs[1]]
        kernel = a.get("kernel_shape", list(weight.shape[2:]))
        strides = a.get("strides", [1, 1])
        dilations = a.get("dilations", [1, 1])
        pads = a.get("pads", [0, 0, 0, 0])
        group = a.get("group", 1)
        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
            return "auto_pad SAME_* (explicit pads only)"
        if not _in_range(kernel, 1, 32):
            return f"kernel {list(kernel)} outside [1, 32]"
        if op == "Conv":
            if not _in_range(strides, 1, 8):
                return f"stride {list(strides)} outside [1, 8]"
            if not _in_range(dilations, 1, 32):
                return f"dilation {list(dilations)} outside [1, 32]"
            if not _in_range(pads, 0, 31) or any(p >= k for p, k in zip(pads, list(kernel) * 2)):
                return f"padding {list(pads)} outside [0, 31] or not below the kernel size"
            if weight.shape[0] > MAX_DIM or weight.shape[1] * group > MAX_DIM:
                return "more than 8192 channels"
            return None
        if group != 1 or any(d != 1 for d in dilations):
            return "grouped or dilated deconvolution"
        if any(p != 0 for p in pads) or any(p != 0 for p in a.get("output_padding", [])):
            return "deconvolution padding must be 0"
        if not _in_range(strides, 1, 32):
            return f"stride {list(strides)} outside [1, 32]"
        return None
    if op in ("MaxPool", "AveragePool"):
        kernel, strides = a.get("kernel_shape", []), a.get("strides", [1, 1])
        pads = a.get("pads", [0, 0, 0, 0])
        if len(kernel) != 2 or not _in_range(kernel, 1, 8):
            return f"pooling window {list(kernel)} outside [1, 8]"
        if not _in_range(strides, 1, 16):
            return f"pooling stride {list(strides)} outside [1, 16]"
        if not _in_range(pads, 0, 7) or any(p >= k for p, k in zip(pads, list(kernel) * 2)):
            return f"pooling padding {list(pads)} outside [0, 7] or not below the window"
        dilated = any(d != 1 for d in a.get("dilations", []))
        if a.get("ceil_mode", 0) or len([o for o in node.output if o]) > 1 or dilated:
            return "ceil_mode, dilation or an indices output"
        if op == "AveragePool" and any(pads) and not a.get("count_include_pad", 0):
            return "average pooling with exclusive padding"
        return None
    if op in ACTIVATIONS:
        return None
    if op == "Clip":
        low = constant(1) if arg(1) else a.get("min")
        high = constant(2) if arg(2) else a.get("max")
        if low is None or float(np.asarray(low)) != 0.0 or high is None:
            return "only Clip(0, constant max) maps to DLA's clipped ReLU"
        return None
    if op == "PRelu":
        return None if arg(1) in g.consts else "slope is not a build-time constant"
    if op == "BatchNormalization":
        return None if all(i in g.consts for i in inputs[1:5]) else "statistics are not constants"
    if op in ELEMENTWISE:
        if len(inputs) != 2:
            return f"{op} with {len(inputs)} inputs (DLA ElementWise takes 2)"
        shapes = [list(g.dims[i]) for i in inputs]
        if shapes[0] == shapes[1]:
            return None
        for const, other in ((0, 1), (1, 0)):
            if inputs[const] in g.consts and len(shapes[other]) == 4:
                padded = [1] * (4 - len(shapes[const])) + shapes[const]
                if padded in ([1, 1, 1, 1], [1, shapes[other][1], 1, 1]):
                    return None
        return f"broadcast between {shapes[0]} and {shapes[1]} (only same shapes or scalar/per-channel constants)"
    if op == "Concat":
        axis = a.get("axis")
        if axis not in (1, -3) or len(inputs) < 2:
            return f"concatenation on axis {axis} (channel axis only, >= 2 inputs)"
        return None
    if op == "Resize":
        scales = constant(2)
        if scales is None or scales.size != 4:
            return "scales are not a 4-element build-time constant (sizes-based resize not screened)"
        mode = a.get("mode", b"nearest")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        s = [float(v) for v in scales]
        if s[0] != 1 or s[1] != 1 or any(v != int(v) for v in s[2:]):
            return f"scales {s}: batch/channel must be 1 and H/W integers"
        limit = 32 if mode == "nearest" else 4 if mode == "linear" else 0
        if not limit or not _in_range(s[2:], 1, limit):
            return f"{mode} resize by {s[2:]} (nearest: integer [1, 32]; linear: integer [1, 4])"
        return None
    return "not in the DLA allow-list"


def op_verdicts(model: ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> list[OpVerdict]:
    """Per node: DLA-capable or not (and why) at one static input shape."""
    g = _Graph(model, shapes)
    out = []
    for index, node in enumerate(model.graph.node):
        why = _check(node, g)
        out.append(OpVerdict(node.name or f"{node.op_type}_{index}", node.op_type, why is None, why or "ok"))
    return out


def count_loadables(model: ModelProto, verdicts: list[OpVerdict]) -> int:
    """Connected stretches of DLA-capable nodes (each becomes one DLA loadable)."""
    supported = [v.supported and v.op_type not in NO_OPS for v in verdicts]
    producer = {out: i for i, node in enumerate(model.graph.node) for out in node.output if out}
    parent = list(range(len(verdicts)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, node in enumerate(model.graph.node):
        if not supported[i]:
            continue
        for name in node.input:
            j = producer.get(name)
            if j is not None and supported[j]:
                parent[find(i)] = find(j)
    return len({find(i) for i in range(len(verdicts)) if supported[i]})


def dla_capable_version(version: str) -> bool:
    """TensorRT 10.0 .. 10.7: DLA with builder precision flags (NVIDIA's release notes)."""
    try:
        major, minor = (int(p) for p in version.split(".")[:2])
    except ValueError:
        return False
    return major == 10 and minor <= 7


def decide_placement(model: ModelProto, profiles: ProfileSet, *, requested_core: int | None,
                     dla_cores: int, precision: str, allow_gpu_fallback: bool = True,
                     min_dla_fraction: float = 0.5, tensorrt_version: str | None = None) -> Placement:
    """DLA ``requested_core`` when it exists, the precision and shapes allow it and enough of the
    model is DLA-capable; otherwise the GPU. The reason says which rule decided."""
    if requested_core is None:
        return _gpu("GPU: DLA not requested")
    if dla_cores <= 0:
        return _gpu(f"GPU: DLA{requested_core} requested but this device has no DLA cores")
    if requested_core >= dla_cores:
        return _gpu(f"GPU: DLA{requested_core} requested but this device has {dla_cores} "
                    f"(DLA0..DLA{dla_cores - 1})")
    if tensorrt_version is not None and not dla_capable_version(tensorrt_version):
        return _gpu(f"GPU: TensorRT {tensorrt_version} is outside 10.0-10.7, the releases whose DLA path "
                    "(builder precision flags + GPU fallback) this backend targets (10.7 was the last 10.x "
                    "with DLA; 11.x DLA needs strongly typed networks)")
    if precision not in ("fp16", "int8"):
        return _gpu(f"GPU: DLA runs FP16/INT8 only and the precision is {precision} "
                    "(set DYNNET_TRT_PRECISION=fp16)")
    dynamic = [f"#{i} {p.describe()}" for i, p in enumerate(profiles.profiles) if not p.static]
    if dynamic:
        return _gpu("GPU: DLA needs static shapes (profile min = opt = max) but " + "; ".join(dynamic[:3])
                    + (" ..." if len(dynamic) > 3 else ""))
    verdicts: list[OpVerdict] | None = None
    for profile in profiles.profiles:  # a node must pass at every profile's shape
        shapes = {name: r.max for name, r in profile.inputs}
        current = op_verdicts(model, shapes)
        verdicts = current if verdicts is None else [v if not v.supported else c for v, c in zip(verdicts, current)]
    assert verdicts is not None
    real = [v for v in verdicts if v.op_type not in NO_OPS]
    bad = [v for v in real if not v.supported]
    loadables = count_loadables(model, verdicts)
    if not real:
        return _gpu("GPU: the model has no layers to place", verdicts)
    fraction = 1 - len(bad) / len(real)
    if not bad:
        return Placement("DLA", requested_core, allow_gpu_fallback,
                         f"DLA{requested_core}: all {len(real)} layers pass the DLA allow-list at "
                         f"{len(profiles)} static profile(s)", tuple(verdicts), loadables)
    summary = ", ".join(f"{op} x{n}" for op, n in sorted(Counter(v.op_type for v in bad).items()))
    first = bad[0]
    detail = f"{summary}; e.g. {first.node} ({first.op_type}): {first.why}"
    if not allow_gpu_fallback:
        return _gpu(f"GPU: {len(bad)} of {len(real)} layers are not DLA-capable ({detail}) and GPU fallback "
                    "is disabled", verdicts, loadables)
    if loadables > MAX_LOADABLES_PER_CORE:
        return _gpu(f"GPU: GPU fallback would split the model into {loadables} DLA loadables "
                    f"(at most {MAX_LOADABLES_PER_CORE} per core); not DLA-capable: {detail}", verdicts, loadables)
    if fraction < min_dla_fraction:
        return _gpu(f"GPU: only {fraction:.0%} of layers are DLA-capable (< {min_dla_fraction:.0%}); "
                    f"transfers would dominate; not DLA-capable: {detail}", verdicts, loadables)
    return Placement("DLA", requested_core, True,
                     f"DLA{requested_core} with GPU fallback: {fraction:.0%} of {len(real)} layers DLA-capable in "
                     f"{loadables} loadable(s); on the GPU: {detail}", tuple(verdicts), loadables)


@dataclass(frozen=True)
class LayerPlacement:
    """Where a built engine's layers run, as its ``IEngineInspector`` reports them."""

    layers: int
    on_dla: tuple[str, ...]     # names of the engine layers that run on the DLA

    def describe(self) -> str:
        shown = ", ".join(self.on_dla[:3]) + (" ..." if len(self.on_dla) > 3 else "")
        return f"{len(self.on_dla)} of {self.layers} engine layers on the DLA" + (f" ({shown})" if shown else "")


def engine_layer_placement(layer_infos: Sequence[str]) -> LayerPlacement:
    """Summarise ``inspector.get_layer_information(i, LayerInformationFormat.JSON)`` for every
    engine layer. TensorRT fuses each stretch of DLA layers into one engine layer named
    ``{ForeignNode[first...last]}`` (its build log's "Layers Running on DLA"); a layer whose JSON
    ``LayerType`` names the DLA counts too. Non-JSON text (``ONELINE`` format, or a name only
    under ``ProfilingVerbosity.LAYER_NAMES_ONLY``) is read as the layer's name."""
    on_dla = []
    for info in layer_infos:
        try:
            data = json.loads(info)
        except ValueError:
            data = info
        if isinstance(data, dict):
            name, kind = str(data.get("Name", "")), str(data.get("LayerType", ""))
        else:
            name, kind = str(data), ""
        if "ForeignNode" in name or "DLA" in kind.upper():
            on_dla.append(name)
    return LayerPlacement(len(layer_infos), tuple(on_dla))
