"""The block store: weightless skeletons, one aligned weight file, and a checksummed index.

Layout of a store directory::

    index.json       format/version, model hash, atoms (tensors, offsets, crc32), reference costs
    weights.bin      every swapped parameter, each starting on a 4096-byte boundary (O_DIRECT)
    graph.onnx       the whole ONNX-level graph, weightless (shape/cost estimates at new sizes)
    atom_NNN.onnx    one weightless skeleton per atom, weights as external data in weights.bin

The skeletons are valid ONNX with external data, so ``onnx.load(path)`` next to weights.bin
gives the real atom back; the swap executor instead binds each stub to arena memory.

A store is never used silently when it does not match: a changed model (hash), another format
version, a truncated weight file or a flipped byte raises :class:`StoreError` with the reason,
and :func:`ensure_store` rebuilds it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from dynnet_ros.engine.procmem import status_bytes
from dynnet_ros.engine.model_io import ModelLike, load_model
from dynnet_ros.swap import blocks
from dynnet_ros.swap.graphinfo import INLINE_LIMIT_BYTES, dtype_of, light_model, tensor_nbytes
from dynnet_ros.swap.swapin import ALIGN, HostArena, WeightReader, align_up

LOG = logging.getLogger(__name__)
STORE_FORMAT = "dynnet-swap-store"
STORE_VERSION = 2  # 2: activation calibration over several input sizes (measure_activations)
WEIGHTS_FILE = "weights.bin"
GRAPH_FILE = "graph.onnx"


class StoreError(Exception):
    """The store is missing, stale or corrupt; ``reason`` says which."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"swap store {path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int           # absolute offset in weights.bin (multiple of ALIGN)
    nbytes: int


@dataclass(frozen=True)
class AtomEntry:
    atom: blocks.Atom
    skeleton: str
    span_offset: int      # [span_offset, span_offset + span_bytes) of weights.bin holds the atom
    span_bytes: int
    crc32: int
    tensors: tuple[TensorEntry, ...]


def model_digest(model: ModelLike) -> str:
    """sha256 of the model file's bytes (or of the serialized proto for in-memory models)."""
    digest = hashlib.sha256()
    if isinstance(model, onnx.ModelProto):
        digest.update(model.SerializeToString())
    else:
        with open(os.fspath(model), "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def default_store_dir(digest: str, optimize: str = "all") -> Path:
    root = os.environ.get("DYNNET_SWAP_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "dynnet_ros", "swap")
    return Path(root) / (digest[:16] + ("" if optimize == "all" else f"-{optimize}"))


def optimize_offline(model: onnx.ModelProto, workdir: Path) -> onnx.ModelProto:
    """Apply onnxruntime's basic (ONNX-domain) rewrites once, before splitting.

    Why: ORT folds BatchNormalization into Conv and constant-folds at session creation, which
    writes *new* weight tensors — a copy of every bound weight.  Doing it here means the atom
    sessions only reference the arena.
    """
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(workdir / "optimized.onnx")
    options.log_severity_level = 3
    source = workdir / "source.onnx"
    onnx.save(model, source)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(options.optimized_model_filepath)
    source.unlink()
    os.unlink(options.optimized_model_filepath)
    # ORT lists every domain it knows; keep the ones the graph uses so the skeletons stay clean.
    used = {node.domain for node in optimized.graph.node} | {""}
    kept = [op for op in optimized.opset_import if op.domain in used]
    del optimized.opset_import[:]
    optimized.opset_import.extend(kept)
    # Branch-local weights are hoisted per atom *after* its level-ALL rewrite: ORT only re-lays
    # out Conv weights it sees as initializers of the branch itself.
    return optimized


def hoist_subgraph_weights(model: onnx.ModelProto) -> int:
    """Move large initializers out of control-flow branches into the top-level graph.

    Sub-graphs may read outer-scope names, so the branch still sees the tensor; hoisting makes
    it a weight of the atom holding the If/Loop node, i.e. swappable instead of always resident
    inside the skeleton.  Returns how many tensors moved.
    """
    top = model.graph
    taken = {i.name for i in top.initializer} | {i.name for i in top.input}
    for node in top.node:
        taken.update(node.output)
    moved = 0

    def visit(graph: onnx.GraphProto) -> None:
        nonlocal moved
        keep = []
        for init in graph.initializer:
            if tensor_nbytes(init) > INLINE_LIMIT_BYTES and init.name not in taken:
                top.initializer.append(init)
                taken.add(init.name)
                moved += 1
            else:
                keep.append(init)
        del graph.initializer[:]
        graph.initializer.extend(keep)
        for node in graph.node:
            for attr in node.attribute:
                for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                    visit(sub)

    for node in top.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                visit(sub)
    return moved


def cpu_identity() -> str:
    """What an ORT_ENABLE_ALL-optimised store depends on: architecture, ISA extensions, ORT.

    Level-ALL rewrites (NCHWc blocked layouts) are specific to the CPU's vector width, so a
    store optimised that way is stale on another CPU.
    """
    wanted = {"sse4_1", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx_vnni", "amx_tile", "asimd", "sve", "fphp", "asimdhp"}
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    flags = set(line.split(":", 1)[1].split()) & wanted
                    break
    except OSError:
        pass
    return f"{platform.machine()} ort-{ort.__version__} " + ",".join(sorted(flags))


def _rename_in_graph(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    """Apply ``mapping`` to every name used in ``graph`` and its nested graphs (no shadowing of
    outer names happens here: the mapped names are this graph's own definitions)."""
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in mapping:
                node.input[i] = mapping[name]
        for i, name in enumerate(node.output):
            if name in mapping:
                node.output[i] = mapping[name]
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                _rename_in_graph(sub, mapping)
    for value in list(graph.output) + list(graph.value_info):
        if value.name in mapping:
            value.name = mapping[value.name]


def make_ssa(model: onnx.ModelProto) -> int:
    """Give every tensor and initializer defined inside a control-flow branch a name unique
    across the model.

    Two reasons: onnxruntime's level-ALL rewrite names what it inserts (``reorder``,
    ``reorder_token_N``) per branch, so branches can define the same name, which ORT then
    refuses to load (SSA); and ``SessionOptions.add_initializer`` overrides an initializer *by
    name in every graph*, so a branch-local initializer sharing a name with a bound weight would
    silently read the wrong tensor.  Returns how many names were changed.
    """
    seen = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer}
    for node in model.graph.node:
        seen.update(node.output)
    changed = 0

    def visit(graph: onnx.GraphProto, path: str) -> None:
        nonlocal changed
        mapping = {}
        for value in list(graph.initializer) + list(graph.input):
            if value.name in seen and value.name not in mapping:
                fresh, k = f"{value.name}__{path}", 0
                while fresh in seen:
                    k += 1
                    fresh = f"{value.name}__{path}_{k}"
                mapping[value.name] = fresh
                seen.add(fresh)
                changed += 1
            else:
                seen.add(value.name)
        for value in list(graph.initializer) + list(graph.input):
            if value.name in mapping:
                value.name = mapping[value.name]
        for node in graph.node:
            for name in node.output:
                if name and name in seen:
                    fresh, k = f"{name}__{path}", 0
                    while fresh in seen:
                        k += 1
                        fresh = f"{name}__{path}_{k}"
                    mapping[name] = fresh
                    seen.add(fresh)
                    changed += 1
                elif name:
                    seen.add(name)
        if mapping:
            _rename_in_graph(graph, mapping)
        for index, node in enumerate(graph.node):
            for attr in node.attribute:
                subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
                for j, sub in enumerate(subs):
                    visit(sub, f"{path}_{index}{attr.name[:1]}{j}")

    for index, node in enumerate(model.graph.node):
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for j, sub in enumerate(subs):
                visit(sub, f"b{index}{attr.name[:1]}{j}")
    return changed


def optimize_atom(atom_model: onnx.ModelProto, workdir: Path) -> onnx.ModelProto:
    """onnxruntime's full (level ALL) rewrites of one atom, done once at prepare time.

    Why: at ALL level ORT re-lays Conv weights out in NCHWc blocks (1.2-1.9x faster here) but
    writes them as *new* tensors, i.e. a session-private copy.  Saving the optimised atom and
    storing those re-laid-out weights in the weight file keeps the speed and lets the session
    bind them from the arena by reference.  The atom's inputs/outputs stay plain NCHW tensors
    (ORT inserts reorders at its borders), so block boundaries and costs are unchanged.
    """
    source, target = workdir / "atom_source.onnx", workdir / "atom_optimized.onnx"
    onnx.save(atom_model, source)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(target)
    options.log_severity_level = 3
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(target))
    source.unlink()
    target.unlink()
    return optimized


OPTIMIZE_LEVELS = ("all", "basic")


#: Input sizes (H, W) the activation calibration measures besides the reference size, for
#: models whose image inputs have symbolic H and W: what the model nodes serve from the usual
#: cameras (320x240 -> 256x320; 1280x720 at max_input_side 640 -> 384x640; 640x480 is the
#: reference). Why: the measured/estimated ratio is not constant over sizes — lane's basic
#: atoms 2-3 took 1.05x their estimate at 480x640 but 1.38x at 384x640.
CALIBRATION_SIZES: tuple[tuple[int, int], ...] = ((256, 320), (384, 640))
#: Sizes whose ratio sets the calibration: at least this fraction of the reference's pixels.
#: Why not all: an atom's size-independent temporaries (level-ALL weight reorders: ~9 MB in
#: lane's last atom) make small sizes' ratios large (3.6x at 256x320 vs 1.9x at 480x640), and
#: one multiplicative factor (``Store._calibrated``) carried to the reference size would then
#: reserve 1.8x what that atom needs there. Smaller sizes are still measured (debug log).
CALIBRATION_MIN_PIXELS = 0.5
#: Headroom on the largest measured/estimated ratio (heap high-water-mark noise between runs:
#: up to ±0.4 MB per atom in repeated measurements here; the scheduler adds its own 1.1x).
CALIBRATION_MARGIN = 1.05


def calibration_shapes(graph: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> list[dict[str, tuple[int, ...]]]:
    """The reference ``shapes`` first, then one variant per ``CALIBRATION_SIZES`` entry with
    every 4-D input's symbolic H, W set to it (none for models with fixed sizes)."""
    out = [dict(shapes)]
    for height, width in CALIBRATION_SIZES:
        variant = dict(shapes)
        for value in graph.graph.input:
            dims = value.type.tensor_type.shape.dim
            shape = shapes.get(value.name)
            if shape is None or len(shape) != 4 or len(dims) != 4:
                continue
            if dims[2].dim_param and dims[3].dim_param:
                variant[value.name] = (shape[0], shape[1], height, width)
        if variant not in out:
            out.append(variant)
    return out


def _pixels(shapes: dict[str, tuple[int, ...]]) -> int:
    """Pixels of the largest 4-D input (the size that scales an image model's activations)."""
    return max((int(s[2]) * int(s[3]) for s in shapes.values() if len(s) == 4), default=1)


def _random_inputs(graph: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], rng) -> dict[str, np.ndarray]:
    env: dict[str, np.ndarray] = {}
    for value in graph.graph.input:
        if value.name in shapes:
            dtype = dtype_of(value.type.tensor_type.elem_type)
            shape = shapes[value.name]
            env[value.name] = (rng.random(shape).astype(dtype) if dtype.kind == "f" else np.ones(shape, dtype))
    return env


def _atom_peak_bytes(session: ort.InferenceSession, outputs: list[str], feeds: dict) -> tuple[int, list] | None:
    """(bytes the run added to the high-water mark, results), on a trimmed heap; None without clear_refs."""
    from dynnet_ros.engine.memtrim import release_memory

    # Freed but still-resident heap from earlier work (building the store, other atoms) would
    # absorb the atom's allocations unseen; a node trims its heap after loading, so measure so.
    release_memory()
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return None
    before = status_bytes("VmRSS")
    results = session.run(outputs, feeds)
    return max(0, status_bytes("VmHWM") - before), results


def measure_activations(graph: onnx.ModelProto, atoms: list[blocks.Atom], models: list[bytes],
                        shapes: dict[str, tuple[int, ...]], *, pre_optimized: bool) -> list[int] | None:
    """Per atom, calibrated activation bytes at the reference size: the activations alive at its
    entry plus the peak its session adds while it runs, measured at the reference size and at
    ``CALIBRATION_SIZES``; the largest measured/estimated ratio over the reference and the sizes
    of at least ``CALIBRATION_MIN_PIXELS`` of its pixels, times ``CALIBRATION_MARGIN``, times the
    reference estimate.  ``Store._calibrated`` scales the estimate at any size by this ratio
    (never below 1).  None where the peak cannot be reset (no /proc/self/clear_refs).

    Every atom's session is created once and run at each size, in order, on random inputs, with
    the same session options and thread count as the swap executor, on a trimmed heap.
    """
    from dynnet_ros.swap.assembly import atom_session_options
    from dynnet_ros.engine.memtrim import pin_mmap_threshold
    from dynnet_ros.swap.executor import MMAP_THRESHOLD

    pin_mmap_threshold(MMAP_THRESHOLD)
    sizes = calibration_shapes(graph, shapes)
    rng = np.random.default_rng(0)
    envs = [_random_inputs(graph, s, rng) for s in sizes]
    alive = [True] * len(sizes)  # a size the model rejects is dropped (the reference must work)
    last_reader = {}
    for atom in atoms:
        for name in atom.inputs:
            last_reader[name] = atom.index
    outputs = {o.name for o in graph.graph.output}
    measured = [[0] * len(atoms) for _ in sizes]
    for atom, model in zip(atoms, models):
        session = ort.InferenceSession(model, atom_session_options(pre_optimized=pre_optimized),
                                       providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        # One unmeasured run first: what a session allocates once and keeps (kernel state, the
        # runtime's per-thread buffers on the process's first run) is not activation memory.
        session.run(list(atom.outputs), {n: envs[0][n] for n in names})
        for k, env in enumerate(envs):
            if not alive[k]:
                continue
            entry = sum(v.nbytes for v in env.values())
            try:
                got = _atom_peak_bytes(session, list(atom.outputs), {n: env[n] for n in names})
            except Exception as exc:  # noqa: BLE001 — only the reference size is required
                if k == 0:
                    raise
                LOG.debug("activation calibration skips %s: %s", sizes[k], exc)
                alive[k] = False
                continue
            if got is None:
                return None
            peak, results = got
            measured[k][atom.index] = int(entry + peak)
            env.update(zip(atom.outputs, results))
            for name in [n for n, last in last_reader.items() if last == atom.index and n not in outputs]:
                env.pop(name, None)
            del results
        del session
    envs.clear()
    ratio = [0.0] * len(atoms)
    reference: tuple[int, ...] = ()
    for k, size in enumerate(sizes):
        if not alive[k]:
            continue
        estimate = blocks.atom_costs(graph, atoms, size).act_bytes
        reference = reference or estimate
        ratios = [m / max(e, 1) for m, e in zip(measured[k], estimate)]
        LOG.debug("activation calibration at %s: measured/estimated %s", size, [round(r, 2) for r in ratios])
        if k == 0 or _pixels(size) >= CALIBRATION_MIN_PIXELS * _pixels(sizes[0]):
            ratio = [max(a, b) for a, b in zip(ratio, ratios)]
    return [int(r * CALIBRATION_MARGIN * e) for r, e in zip(ratio, reference)]


def prepare(model: ModelLike, out_dir: str | os.PathLike, *, max_atoms: int = blocks.DEFAULT_MAX_ATOMS,
            input_shapes: dict[str, tuple[int, ...]] | None = None, optimize: str = "all") -> "Store":
    """Build a store for ``model`` in ``out_dir`` (written to a temp dir, then renamed in).

    ``optimize="all"``: atoms carry onnxruntime's CPU-specific level-ALL rewrites (fastest on
    CPU, tied to this CPU); ``"basic"``: ONNX-domain rewrites only (portable; TensorRT path).
    """
    if optimize not in OPTIMIZE_LEVELS:
        raise ValueError(f"optimize must be one of {OPTIMIZE_LEVELS}, got {optimize!r}")
    out = Path(out_dir)
    digest = model_digest(model)
    proto = load_model(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        graph = optimize_offline(proto, work)
        del proto
        shapes = dict(input_shapes or blocks.reference_shapes(graph))
        basic_atoms = blocks.split(graph, max_atoms=max_atoms, input_shapes=shapes)
        costs = blocks.atom_costs(graph, basic_atoms, shapes)
        types = blocks.symbolic_types(blocks_light(graph))
        entries = []
        calibration: list[bytes] = []
        inline_bytes = 0
        with open(work / WEIGHTS_FILE, "wb") as weights:
            offset = 0
            for atom in basic_atoms:
                atom_model = blocks.atom_skeleton(graph, atom, types, None, WEIGHTS_FILE)
                if optimize == "all":
                    atom_model = optimize_atom(atom_model, work)
                make_ssa(atom_model)                # unique names in every branch (see make_ssa)
                hoist_subgraph_weights(atom_model)  # branch weights become swappable atom weights
                swapped = [init for init in atom_model.graph.initializer if tensor_nbytes(init) > INLINE_LIMIT_BYTES]
                inline_bytes += sum(tensor_nbytes(i) for i in atom_model.graph.initializer) - \
                    sum(tensor_nbytes(i) for i in swapped)
                span_start = offset
                tensors, offsets = [], {}
                crc = 0
                for init in swapped:
                    array = onnx.numpy_helper.to_array(init)
                    data = np.ascontiguousarray(array).tobytes()
                    pad = align_up(offset) - offset
                    weights.write(b"\0" * pad)
                    crc = zlib.crc32(b"\0" * pad, crc)
                    offset += pad
                    offsets[init.name] = offset
                    tensors.append(TensorEntry(init.name, array.dtype.str, tuple(array.shape), offset, len(data)))
                    weights.write(data)
                    crc = zlib.crc32(data, crc)
                    offset += len(data)
                pad = align_up(offset) - offset
                weights.write(b"\0" * pad)
                crc = zlib.crc32(b"\0" * pad, crc)
                offset += pad
                calibration.append(atom_model.SerializeToString())  # with weights, for measuring
                for init in atom_model.graph.initializer:
                    if init.name in offsets:
                        init.CopyFrom(blocks.external_stub(init, WEIGHTS_FILE, offsets[init.name]))
                skeleton_name = f"atom_{atom.index:03d}.onnx"
                onnx.save(atom_model, work / skeleton_name)
                final = dataclasses.replace(atom, weights=tuple(t.name for t in tensors),
                                            weight_bytes=sum(t.nbytes for t in tensors),
                                            params=sum(int(np.prod(t.shape)) for t in tensors))
                entries.append(AtomEntry(final, skeleton_name, span_start, offset - span_start, crc, tuple(tensors)))
            # The store is read with direct I/O later; do not leave a cached copy behind.
            weights.flush()
            os.fsync(weights.fileno())
            os.posix_fadvise(weights.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        onnx.save(blocks_light(graph), work / GRAPH_FILE)  # weightless: shapes and costs only
        measured = measure_activations(graph, [e.atom for e in entries], calibration, shapes,
                                       pre_optimized=optimize == "all")
        del calibration
        index = {
            "format": STORE_FORMAT, "version": STORE_VERSION, "created": time.time(),
            "model_sha256": digest, "model_path": None if isinstance(model, onnx.ModelProto) else os.fspath(model),
            "onnxruntime": ort.__version__, "optimized": f"ort-{optimize}", "cpu": cpu_identity(),
            "alignment": ALIGN, "weights_file": WEIGHTS_FILE, "weights_bytes": offset,
            "inline_weight_bytes": inline_bytes,
            "graph": GRAPH_FILE, "reference_shapes": {k: list(v) for k, v in shapes.items()},
            "reference_costs": {"flops": list(costs.flops), "act_bytes": list(costs.act_bytes),
                                "cut_bytes": list(costs.cut_bytes), "act_bytes_measured": measured},
            "files": {name: _file_sha256(work / name) for name in [GRAPH_FILE] + [e.skeleton for e in entries]},
            "atoms": [_atom_json(e) for e in entries],
        }
        (work / "index.json").write_text(json.dumps(index, indent=1))
        if out.exists():
            shutil.rmtree(out)
        os.replace(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return Store.open(out, expected_digest=digest)


def blocks_light(graph: onnx.ModelProto, offsets: dict[str, int] | None = None,
                 location: str = WEIGHTS_FILE) -> onnx.ModelProto:
    """The whole graph with weights as stubs (pointing into weights.bin when offsets are given)."""
    light = light_model(graph)
    if offsets:
        for init in light.graph.initializer:
            if init.name in offsets:
                stub = blocks.external_stub(init, location, offsets[init.name])
                init.CopyFrom(stub)
    return light


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _atom_json(entry: AtomEntry) -> dict:
    atom = entry.atom
    return {"index": atom.index, "nodes": [atom.start, atom.end], "inputs": list(atom.inputs),
            "outputs": list(atom.outputs), "weight_bytes": atom.weight_bytes, "params": atom.params,
            "depth": atom.depth, "skeleton": entry.skeleton, "span": [entry.span_offset, entry.span_bytes],
            "crc32": entry.crc32,
            "tensors": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "offset": t.offset,
                         "nbytes": t.nbytes} for t in entry.tensors]}


class Store:
    """An opened, verified store."""

    def __init__(self, path: Path, index: dict) -> None:
        self.path = path
        self.index = index
        self.weights_path = path / index["weights_file"]
        self.atoms: list[AtomEntry] = []
        for item in index["atoms"]:
            atom = blocks.Atom(item["index"], item["nodes"][0], item["nodes"][1], tuple(item["inputs"]),
                               tuple(item["outputs"]), tuple(t["name"] for t in item["tensors"]),
                               item["weight_bytes"], item["params"])
            tensors = tuple(TensorEntry(t["name"], t["dtype"], tuple(t["shape"]), t["offset"], t["nbytes"])
                            for t in item["tensors"])
            self.atoms.append(AtomEntry(atom, item["skeleton"], item["span"][0], item["span"][1],
                                        item["crc32"], tensors))
        self._graph: onnx.ModelProto | None = None

    # ------------------------------------------------------------------ open & verify
    @classmethod
    def open(cls, path: str | os.PathLike, *, expected_digest: str | None = None, verify: bool = True) -> "Store":
        """Open ``path``; raise StoreError naming what is wrong.  ``verify`` checks every byte."""
        path = Path(path)
        index_path = path / "index.json"
        if not index_path.is_file():
            raise StoreError(path, "missing index.json (not a store, or an interrupted prepare)")
        try:
            index = json.loads(index_path.read_text())
        except (OSError, ValueError) as exc:
            raise StoreError(path, f"unreadable index.json: {exc}") from exc
        if not isinstance(index, dict) or index.get("format") != STORE_FORMAT:
            raise StoreError(path, "index.json is not a dynnet swap store index")
        if index.get("version") != STORE_VERSION:
            raise StoreError(path, f"stale: store format version {index.get('version')}, this code reads "
                                   f"{STORE_VERSION}")
        if expected_digest is not None and index.get("model_sha256") != expected_digest:
            raise StoreError(path, f"stale: built from model sha256 {str(index.get('model_sha256'))[:12]}…, "
                                   f"the model is now {expected_digest[:12]}…")
        if index.get("optimized") == "ort-all" and index.get("cpu") != cpu_identity():
            raise StoreError(path, f"stale: optimised for CPU '{index.get('cpu')}', this is '{cpu_identity()}'")
        weights = path / index["weights_file"]
        if not weights.is_file():
            raise StoreError(path, f"missing {index['weights_file']}")
        size = weights.stat().st_size
        if size != index["weights_bytes"]:
            raise StoreError(path, f"corrupt: {index['weights_file']} has {size} bytes, index says "
                                   f"{index['weights_bytes']} (truncated or overwritten)")
        for name, digest in index["files"].items():
            file = path / name
            if not file.is_file():
                raise StoreError(path, f"missing {name}")
            if verify and _file_sha256(file) != digest:
                raise StoreError(path, f"corrupt: {name} does not match its sha256 in the index")
        store = cls(path, index)
        if verify:
            store.verify_weights()
        return store

    def verify_weights(self) -> None:
        """crc32 of every atom span, read with direct I/O so verification does not fill the cache."""
        if not self.atoms:
            return
        largest = max(entry.span_bytes for entry in self.atoms)
        arena = HostArena(largest)
        reader = WeightReader(self.weights_path)
        try:
            for entry in self.atoms:
                if entry.span_bytes == 0:
                    continue
                view = arena.view(0, entry.span_bytes)
                reader.read_into(view, entry.span_offset)
                if zlib.crc32(view) != entry.crc32:
                    raise StoreError(self.path, f"corrupt: atom {entry.atom.index} ({entry.span_bytes} bytes at "
                                                f"offset {entry.span_offset}) fails its crc32 check")
                arena.release(0, entry.span_bytes)
        finally:
            reader.close()
            arena.close()

    # ------------------------------------------------------------------ accessors
    @property
    def digest(self) -> str:
        return self.index["model_sha256"]

    @property
    def weights_bytes(self) -> int:
        return int(self.index["weights_bytes"])

    def skeleton_path(self, atom_index: int) -> Path:
        return self.path / self.atoms[atom_index].skeleton

    def graph(self) -> onnx.ModelProto:
        """The weightless whole graph (for cost estimates at new input sizes)."""
        if self._graph is None:
            self._graph = onnx.load(str(self.path / self.index["graph"]), load_external_data=False)
        return self._graph

    def reference_costs(self) -> blocks.AtomCosts:
        """Costs at the reference input size; activation bytes as measured at prepare time."""
        ref = self.index["reference_costs"]
        return blocks.AtomCosts(tuple(ref["flops"]), tuple(self._calibrated(ref["act_bytes"])), tuple(ref["cut_bytes"]))

    def _calibrated(self, estimates) -> list[int]:
        ref = self.index["reference_costs"]
        measured = ref.get("act_bytes_measured")
        if not measured:
            return list(estimates)
        # Shape inference sees the ONNX-level graph; what the optimised sessions really allocate
        # (blocked layouts, reorders, kernel scratch) was measured once at the reference size.
        # Other sizes scale the estimate by that ratio (never below the estimate itself).
        return [int(e * max(1.0, m / max(r, 1))) for e, m, r in zip(estimates, measured, ref["act_bytes"])]

    def costs_at(self, shapes: dict[str, tuple[int, ...]]) -> blocks.AtomCosts:
        costs = blocks.atom_costs(self.graph(), [e.atom for e in self.atoms], shapes)
        return blocks.AtomCosts(costs.flops, tuple(self._calibrated(costs.act_bytes)), costs.cut_bytes)

    def tensor_dtype(self, entry: TensorEntry) -> np.dtype:
        return np.dtype(entry.dtype)


def ensure_store(model: ModelLike, out_dir: str | os.PathLike | None = None, *,
                 max_atoms: int = blocks.DEFAULT_MAX_ATOMS, verify: bool = True,
                 digest: str | None = None, optimize: str = "all") -> tuple[Store, str | None]:
    """Open the store for ``model`` or (re)build it. Returns (store, why it was rebuilt or None)."""
    digest = digest or model_digest(model)
    path = Path(out_dir) if out_dir is not None else default_store_dir(digest, optimize)
    try:
        store = Store.open(path, expected_digest=digest, verify=verify)
        if store.index.get("optimized") != f"ort-{optimize}":
            raise StoreError(path, f"stale: optimised as {store.index.get('optimized')}, wanted ort-{optimize}")
        return store, None
    except StoreError as exc:
        reason = exc.reason
        if path.exists():
            LOG.warning("rebuilding swap store %s: %s", path, reason)
        return prepare(model, path, max_atoms=max_atoms, optimize=optimize), reason


__all__ = ["Store", "StoreError", "ensure_store", "prepare", "model_digest", "default_store_dir",
           "dtype_of"]
