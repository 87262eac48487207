"""Blocked (NCHWc) layout for the planned engine: onnxruntime's own rewrite, done once and cached.

Why: onnxruntime's NCHWc convolution kernels are 1.2-1.5x faster than its NCHW ones here, but
a session only uses them at ``ORT_ENABLE_ALL``, where it inserts reorders (and reorder buffers the
size of the tensors) at every session border — so per-segment sessions had to choose between
speed and memory. Letting onnxruntime lay out the *whole* graph once (its NchwcTransformer over
symbolic shapes), saving that graph, and planning it like any model makes the blocked tensors
ordinary boundary tensors in our arena: the segments then need no reorders at all.

The rewrite of a big model runs in a child process (its load-time memory never touches the
serving process) and is cached under ``$DYNNET_LAYOUT_DIR`` (default ``~/.cache/dynnet_ros/layout``) keyed by the
model's bytes, the onnxruntime version and the CPU's vector extensions — the saved graph is
specific to all three (onnxruntime warns about exactly that when saving it).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from dynnet_ros.bytesize import MB
from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.modelio.loader import load_skeleton, skeleton_bytes, source_path
from dynnet_ros.engine.modelio.model_check import file_digest
from dynnet_ros.engine.modelio.onnx_proto import (
    ModelProto,
    NodeProto,
    TensorProto,
    get_attribute_value,
    make_node,
    make_tensor,
)
from dynnet_ros.engine.rdp.ops.ort_contrib import set_nchwc_block_size
from dynnet_ros.hostcaps import host_caps
from dynnet_ros.settings import settings

log = logging.getLogger(__name__)

LAYOUT_VERSION = 4
_META = "layout.json"
# Models up to this size are rewritten in this process: a child process costs ~1 s of imports,
# while their rewrite's transient memory (a session over a few MB of weights) is small and is paid
# once per cache miss. Bigger models are rewritten in a child so the serving process never holds
# a full extra session of their weights.
IN_PROCESS_BYTES = 4 * MB


@dataclass(frozen=True)
class LaidOutModel:
    """A model file rewritten by onnxruntime for this machine's kernels."""

    path: Path
    block_size: int | None   # NCHWc channel block (None: the CPU has no NCHWc kernels)
    nchwc_nodes: int         # nodes onnxruntime moved to its blocked kernels


def cpu_block_size() -> int | None:
    """MLAS's NCHWc block: 16 floats with AVX-512F, 8 with AVX2/AVX; None on CPUs without NCHWc
    kernels (ARM, e.g. Jetson), where the engine plans the model as given (hostcaps.py)."""
    return host_caps().nchwc_block


def cache_root() -> Path:
    return settings().cache.layout_dir


def _digest(source: Path) -> str:
    key = f"{file_digest(source)}|ort={ort.__version__}|block={cpu_block_size()}|v={LAYOUT_VERSION}"
    return hashlib.sha256(key.encode()).hexdigest()[:20]


def nchwc_layout(source: str | os.PathLike, *, timeout_s: float = 600) -> LaidOutModel:
    """The cached blocked-layout rewrite of the model file ``source`` (made on first use).

    Raises ValueError if onnxruntime cannot load or rewrite the model.
    """
    source = Path(source)
    folder = cache_root() / _digest(source)
    cached = _read_cached(folder)
    if cached is not None:
        return cached
    folder.parent.mkdir(parents=True, exist_ok=True)
    log.info("building the NCHWc layout of %s in %s (first start)", source, folder)
    with tempfile.TemporaryDirectory(dir=folder.parent) as work:
        target = Path(work) / "model.onnx"
        if source.stat().st_size <= IN_PROCESS_BYTES:
            try:
                _rewrite(str(source), str(target))
            except Exception as exc:  # onnxruntime raises its own exception types
                raise ValueError(f"onnxruntime could not lay out {source} for NCHWc: {exc}") from exc
        else:
            proc = subprocess.run([sys.executable, "-m", "dynnet_ros.engine.plan.layout", str(source), str(target)],
                                  capture_output=True, text=True, timeout=timeout_s, check=False)
            if proc.returncode != 0 or not target.is_file():
                last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise ValueError(f"onnxruntime could not lay out {source} for NCHWc: {last}")
        # skeleton_bytes: weightless, never the weights in this process
        nodes = sum(1 for n in ModelProto.FromString(skeleton_bytes(str(target))).graph.node
                    if n.domain == "com.microsoft.nchwc")
        (Path(work) / _META).write_text(json.dumps({"source": str(source), "block_size": cpu_block_size(),
                                                    "nchwc_nodes": nodes, "onnxruntime": ort.__version__}))
        try:
            os.rename(work, folder)  # atomic: a concurrent builder's finished copy wins
        except OSError:
            pass
        else:
            os.mkdir(work)  # TemporaryDirectory cleans up a path that must exist
    cached = _read_cached(folder)
    if cached is None:
        raise ValueError(f"layout cache {folder} is unreadable")
    return cached


def laid_out_skeleton(model: ModelProto) -> tuple[ModelProto, LaidOutModel]:
    """The weightless skeleton of ``model``'s blocked-layout rewrite (ValueError if there is none).

    ``model`` is a skeleton from ``load_skeleton`` (its source file is rewritten) or a full
    in-memory model (written to a temporary file for the child process first).
    """
    if cpu_block_size() is None:  # nothing to rewrite for: skip onnxruntime's whole-model session
        raise ValueError(f"this CPU ({host_caps().machine}) has no onnxruntime NCHWc kernels")
    source = source_path(model)
    with tempfile.TemporaryDirectory() as work:
        if source is None:
            source = str(Path(work) / "model.onnx")
            onnx_proto.save(model, source)
        laid = nchwc_layout(source)
        if laid.nchwc_nodes == 0:
            raise ValueError("onnxruntime uses no NCHWc kernels for this model on this CPU")
        try:
            skeleton = load_skeleton(laid.path, check=False)  # written by onnxruntime for us
        except ValueError as exc:  # a damaged cache entry (truncated copy, disk full): rebuild it once
            log.warning("layout cache %s is unreadable (%s); rebuilding it", laid.path.parent, exc)
            shutil.rmtree(laid.path.parent, ignore_errors=True)
            laid = nchwc_layout(source)
            skeleton = load_skeleton(laid.path, check=False)  # written by onnxruntime for us
    set_nchwc_block_size(laid.block_size)
    return skeleton, laid


def prepare(path: str | os.PathLike) -> LaidOutModel | None:
    """Check a model file and lay it out ahead of serving (``dynnet zoo build``), so a node's first
    start finds the checker verdict and the rewrite cached. None where no NCHWc layout applies."""
    try:
        return laid_out_skeleton(load_skeleton(path))[1]
    except ValueError:
        return None


def _read_cached(folder: Path) -> LaidOutModel | None:
    try:
        meta = json.loads((folder / _META).read_text())
    except (OSError, ValueError):
        return None
    path = folder / "model.onnx"
    if not path.is_file():
        return None
    return LaidOutModel(path, meta.get("block_size"), int(meta.get("nchwc_nodes", 0)))


def narrow_padded_upsamples(model: ModelProto, block_size: int | None) -> int:
    """Upsample a blocked tensor *after* dropping its channel padding, not before.

    Why: NCHWc pads channels to the block size, so a 1-channel head map becomes 16 channels; when
    onnxruntime upsamples that map in blocked layout right before converting it back (lane's
    4x-upsampled probability map), the upsampled tensor is 16x the real one (25 MB instead of
    1.6 MB at 640x640). Converting back first and resizing the narrow NCHW map with ONNX Resize
    (same mode, coordinate transform and, for nearest, floor rounding as the NCHWc kernel)
    gives the same values from a tensor 1/16 the size. Returns the number of rewrites.
    """
    graph = model.graph
    consumers: dict[str, list[NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {v.name for v in graph.output}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 11:
        return 0
    rewritten = 0
    for up in list(graph.node):
        if up.domain != "com.microsoft.nchwc" or up.op_type != "Upsample" or up.output[0] in outputs:
            continue
        users = consumers.get(up.output[0], [])
        if len(users) != 1 or users[0].op_type != "ReorderOutput":
            continue
        back = users[0]
        attrs = {a.name: get_attribute_value(a) for a in back.attribute}
        channels = int(attrs.get("channels", 0))
        if attrs.get("channels_last", 0) or not channels or block_size is None or channels % block_size == 0:
            continue
        up_attrs = {a.name: get_attribute_value(a) for a in up.attribute}
        mode = up_attrs.get("mode", b"nearest").decode()
        transform = up_attrs.get("coordinate_transformation_mode", b"asymmetric").decode()
        scales = [float(v) for v in up_attrs.get("scales", [])]
        narrow = f"{up.output[0]}_narrow"
        scales_name = f"{up.output[0]}_scales"
        graph.initializer.append(make_tensor(scales_name, TensorProto.FLOAT, [len(scales)], scales))
        extra = {"nearest_mode": "floor"} if mode == "nearest" else {}
        resize = make_node("Resize", [narrow, "", scales_name], list(back.output), name=f"{up.name}_narrow",
                                       mode=mode, coordinate_transformation_mode=transform, **extra)
        back.input[0] = up.input[0]
        del back.output[:]
        back.output.append(narrow)
        position = list(graph.node).index(up)
        graph.node.remove(up)
        graph.node.insert(position, resize)
        # keep topological order: the Resize must follow the ReorderOutput that now feeds it
        graph.node.remove(back)
        graph.node.insert(position, back)
        rewritten += 1
    return rewritten


def _rewrite(source: str, target: str) -> None:
    """Child process: let onnxruntime optimise at ORT_ENABLE_ALL and save the graph (weights inline;
    the engine's weightless loader references them in place), then narrow padded upsamples."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = target
    options.log_severity_level = 3
    ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    model = onnx_proto.load(target)
    keep_interface(model, onnx_proto.load(source, load_external_data=False))
    narrow_padded_upsamples(model, cpu_block_size())
    onnx_proto.save(model, target)


def keep_interface(model: ModelProto, source: ModelProto) -> None:
    """Graph inputs/outputs exactly as the source declares them: onnxruntime writes its own view
    (e.g. an output without a shape field, which onnx's checker rejects)."""
    for mine, theirs in ((model.graph.input, source.graph.input), (model.graph.output, source.graph.output)):
        declared = {v.name: v for v in theirs}
        for value in mine:
            if value.name in declared:
                value.CopyFrom(declared[value.name])


if __name__ == "__main__":
    _rewrite(sys.argv[1], sys.argv[2])
