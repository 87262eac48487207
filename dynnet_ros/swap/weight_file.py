"""The weight file of a streamed model: every parameter of the planned graph, 4 KiB-aligned.

The planned engine runs a model in one of two layouts: onnxruntime's blocked-layout rewrite
(engine/plan/layout.py) where this CPU has the kernels for it, else the model as given. For
swapping, the weights of that graph are copied once into ``weights.bin`` with each tensor at a
4 KiB boundary, so a tensor can be read straight into its place in memory with ``O_DIRECT`` (no
page cache copy). Fully-connected weights above ``split_bytes`` are split by output columns first
(swap/gemm_split.py). The graph is kept as ``graph.onnx`` whose initializers reference the file.

``index.json`` records format, version, the layout and its source, per-tensor offset/length/CRC-32
and the file size. Opening checks all of it; a truncated or modified file, or an index from another
version, raises ``StoreError`` and ``ensure_weight_file`` rebuilds it — never used silently.
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
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dynnet_ros.bytesize import MB
from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.modelio.loader import EXTERNAL_DIR_KEY, read_external, skeleton_proto
from dynnet_ros.engine.modelio.onnx_proto import ModelProto, TensorProto, to_array
from dynnet_ros.engine.plan.graph import all_graphs
from dynnet_ros.settings import settings
from dynnet_ros.swap.gemm_split import split_large_gemms
from dynnet_ros.swap.swapin import ALIGN, HostArena, WeightReader, align_up

LOG = logging.getLogger(__name__)

FORMAT = "dynnet-stream-weights"
VERSION = 3
LAYOUTS = ("nchwc", "as-given")
WEIGHTS_FILE = "weights.bin"
GRAPH_FILE = "graph.onnx"
INDEX_FILE = "index.json"
_MIN_BYTES = 1024  # smaller initializers stay embedded in the graph (shape constants, biases of tiny layers)
_CHUNK = 4 * MB


class StoreError(Exception):
    """The weight file is missing, stale or corrupt; ``reason`` says which."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"weight file {path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class StreamTensor:
    name: str
    offset: int   # in weights.bin, a multiple of ALIGN
    nbytes: int
    crc32: int

    @property
    def span(self) -> int:
        """Bytes the tensor occupies in memory when read with direct I/O (whole pages)."""
        return align_up(self.nbytes, ALIGN)


class WeightFile:
    """An opened, verified weight file and its graph."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        try:
            self.index = json.loads((self.directory / INDEX_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise StoreError(self.directory, f"unreadable index: {exc}") from exc
        if self.index.get("format") != FORMAT or self.index.get("version") != VERSION:
            raise StoreError(self.directory, f"index is {self.index.get('format')} v{self.index.get('version')}, "
                             f"expected {FORMAT} v{VERSION}")
        if self.index.get("layout") not in LAYOUTS:
            raise StoreError(self.directory, f"unknown layout {self.index.get('layout')!r}")
        self.tensors = {t["name"]: StreamTensor(t["name"], int(t["offset"]), int(t["nbytes"]), int(t["crc32"]))
                        for t in self.index["tensors"]}
        self.size = int(self.index["size"])
        self.weights_path = self.directory / WEIGHTS_FILE
        self.graph_path = self.directory / GRAPH_FILE

    @property
    def layout(self) -> str:
        """The layout of ``graph.onnx``: "nchwc" (onnxruntime's blocked rewrite) or "as-given"."""
        return str(self.index["layout"])

    @property
    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def verify(self) -> None:
        """Size and every tensor's CRC-32, read with direct I/O through a 4 MiB window."""
        try:
            actual = self.weights_path.stat().st_size
        except OSError as exc:
            raise StoreError(self.directory, f"weight file missing: {exc}") from exc
        if actual != self.size:
            raise StoreError(self.directory,
                             f"weight file is {actual} bytes, index says {self.size} (truncated or replaced)")
        if not self.graph_path.is_file():
            raise StoreError(self.directory, "graph.onnx missing")
        scratch = HostArena(_CHUNK)
        reader = WeightReader(self.weights_path)
        try:
            for tensor in sorted(self.tensors.values(), key=lambda t: t.offset):
                crc = 0
                for start in range(0, tensor.span, _CHUNK):
                    length = min(_CHUNK, tensor.span - start)
                    reader.read_into(scratch.view(0, length), tensor.offset + start)
                    used = min(length, tensor.nbytes - start)
                    crc = zlib.crc32(scratch.view(0, used), crc)
                if crc != tensor.crc32:
                    raise StoreError(self.directory,
                                     f"checksum mismatch in tensor {tensor.name!r} (corrupted weight file)")
        finally:
            reader.close()
            scratch.close()

    def graph(self) -> ModelProto:
        """The weightless graph (initializers reference weights.bin)."""
        try:
            model = onnx_proto.load(str(self.graph_path), load_external_data=False)
        except Exception as exc:  # a damaged protobuf
            raise StoreError(self.directory, f"graph.onnx unreadable: {exc}") from exc
        # onnxruntime checks that external data exists even for initializers it is handed by
        # reference (and then never reads them): resolve "weights.bin" against this directory
        entry = model.metadata_props.add()
        entry.key, entry.value = EXTERNAL_DIR_KEY, str(self.directory.resolve())
        return model


def _is_weight(tensor: TensorProto) -> bool:
    if tensor.data_location == TensorProto.EXTERNAL:
        return True
    if tensor.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE):
        return False  # integer initializers are shapes/indices: tiny, read by shape logic
    return int(np.prod(tensor.dims, dtype=np.int64)) * 4 >= _MIN_BYTES


def build(laid_out_path: str | os.PathLike, directory: str | os.PathLike, *, split_bytes: int,
          layout: str) -> WeightFile:
    """Write the weight file of the model file ``laid_out_path`` (in ``layout``) into ``directory``
    (atomically replaced)."""
    laid_out_path = Path(laid_out_path)
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    model = skeleton_proto(str(laid_out_path))
    base_dir = str(laid_out_path.parent)
    sources = {t.name: _copy(t) for t in model.graph.initializer}
    slices = split_large_gemms(model, split_bytes)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=directory.parent))
    try:
        entries, seen, offset = [], set(), 0
        cache: dict[str, np.ndarray] = {}
        with open(work / WEIGHTS_FILE, "wb") as out:
            for graph in all_graphs(model.graph):
                for tensor in graph.initializer:
                    if tensor.name in seen or not _is_weight(tensor):
                        continue
                    array = _values(tensor, slices, sources, base_dir, cache)
                    data = np.ascontiguousarray(array).tobytes()
                    out.seek(offset)
                    out.write(data)
                    entries.append({"name": tensor.name, "offset": offset, "nbytes": len(data),
                                    "crc32": zlib.crc32(data)})
                    _point_at_file(tensor, offset, len(data))
                    seen.add(tensor.name)
                    offset = align_up(offset + len(data), ALIGN)
            out.truncate(offset)
            out.flush()
            os.fsync(out.fileno())
            size = offset
            os.posix_fadvise(out.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # writing must not leave a page-cache copy
        cache.clear()
        model.metadata_props.clear()  # the laid-out file's location; the graph now lives here
        onnx_proto.save(model, str(work / GRAPH_FILE))
        index = {"format": FORMAT, "version": VERSION, "layout": layout, "source": str(laid_out_path),
                 "split_bytes": int(split_bytes), "size": size, "tensors": entries}
        (work / INDEX_FILE).write_text(json.dumps(index, indent=1))
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(work, directory)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return WeightFile(directory)


def _copy(tensor: TensorProto) -> TensorProto:
    out = TensorProto()
    out.CopyFrom(tensor)
    return out


def _values(tensor, slices, sources, base_dir: str, cache: dict[str, np.ndarray]) -> np.ndarray:
    piece = slices.get(tensor.name)
    if piece is not None:
        if piece.source not in cache:
            cache.clear()  # one source tensor in memory at a time (pieces of a source are adjacent)
            cache[piece.source] = _values(sources[piece.source], {}, sources, base_dir, {})
        index = [slice(None)] * cache[piece.source].ndim
        index[piece.axis] = slice(piece.start, piece.stop)
        return cache[piece.source][tuple(index)]
    if tensor.data_location == TensorProto.EXTERNAL:
        array = read_external(tensor, base_dir)
        if array is None:
            raise StoreError(Path(base_dir), f"weight {tensor.name!r} cannot be read from the laid-out model")
        return array
    return to_array(tensor)


def _point_at_file(tensor: TensorProto, offset: int, nbytes: int) -> None:
    for field in ("raw_data", "float_data", "double_data", "int32_data", "int64_data"):
        tensor.ClearField(field)
    del tensor.external_data[:]
    for key, value in (("location", WEIGHTS_FILE), ("offset", str(offset)), ("length", str(nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = TensorProto.EXTERNAL


def default_root() -> Path:
    return settings().cache.swap_dir


def ensure_weight_file(laid_out_path: str | os.PathLike, *, source_key: str, layout: str, split_bytes: int,
                       root: str | os.PathLike | None = None) -> tuple[WeightFile, str | None]:
    """The verified weight file of the model file ``laid_out_path``, built if missing; (file,
    rebuild reason). ``source_key`` names that file's content (the layout cache entry, or the
    model's digest for the as-given layout)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r} ({' | '.join(LAYOUTS)})")
    laid_out_path = Path(laid_out_path)
    key = hashlib.sha256(f"{source_key}:{layout}:{split_bytes}:{VERSION}".encode()).hexdigest()[:20]
    directory = Path(root or default_root()) / "stream" / key
    reason = None
    if directory.exists():
        try:
            weights = WeightFile(directory)
            weights.verify()
            return weights, None
        except StoreError as exc:
            reason = str(exc)
    LOG.info("building the weight file of %s in %s (%s)", laid_out_path, directory,
             "first start" if reason is None else f"replacing a damaged or stale one: {reason}")
    _build_in_child(laid_out_path, directory, split_bytes, layout)
    weights = WeightFile(directory)
    weights.verify()
    return weights, reason


def _build_in_child(laid_out_path: Path, directory: Path, split_bytes: int, layout: str,
                    timeout_s: float = 600) -> None:
    """Build in a child process: reading and cutting the weights (a 24 MB FC at a time) must not
    grow the serving process, which may already be running other models under their budgets."""
    proc = subprocess.run([sys.executable, "-m", "dynnet_ros.swap.weight_file", str(laid_out_path), str(directory),
                           str(split_bytes), layout], capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise StoreError(directory, f"building the weight file for {laid_out_path} failed: {last}")


if __name__ == "__main__":
    build(sys.argv[1], sys.argv[2], split_bytes=int(sys.argv[3]), layout=sys.argv[4])
