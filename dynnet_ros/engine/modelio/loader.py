"""Load a model file as a *weightless* graph whose big initializers point back into the file.

Why: ``onnx.load`` materialises every weight in a Python protobuf (after reading the whole
file into a bytes object first), and ``onnx.checker.check_model(path)`` loads it once more —
for a 54 MB model the load alone peaks near 160 MB, more than onnxruntime's whole run. Here
the file is memory-mapped and its protobuf wire format scanned; each big ``raw_data`` field
becomes a standard ONNX *external data* reference (``location`` = the file itself, ``offset``
= where the bytes are), so onnxruntime reads each weight straight from the file into its own
buffer, exactly once, and no Python copy ever exists.
"""
from __future__ import annotations

import mmap
import os
import sys

import numpy as np

from dynnet_ros.engine.modelio.model_check import INVALID_MODEL_EXIT, check_model_file
from dynnet_ros.engine.modelio.models import clear_negative_dims, load_model
from dynnet_ros.engine.modelio.onnx_proto import (
    AttributeProto,
    ModelProto,
    TensorProto,
    make_tensor_value_info,
    tensor_dtype_to_np_dtype,
)

EXTERNAL_DIR_KEY = "dynnet_ros.external_data_dir"
SOURCE_PATH_KEY = "dynnet_ros.source_path"  # the file a weightless skeleton was loaded from
_MIN_BYTES = 1024
_INT_TYPES = {TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8,
              TensorProto.UINT8, TensorProto.BOOL}


def stays_embedded(data_type: int, nbytes: int) -> bool:
    """Whether a tensor is too small to count as a weight: small tensors (and shape-like
    integers) stay inside the graph; everything else is held and streamed as a weight."""
    return nbytes < _MIN_BYTES or (data_type in _INT_TYPES and nbytes <= 4096 * 8)


def hoist_weight_constants(proto: ModelProto) -> ModelProto:
    """A copy of ``proto`` whose top-level ``Constant`` nodes holding a weight-sized ``value``
    tensor are initializers of the same name, by the rule ``skeleton_bytes`` applies to files:
    the same values under the same name, counted and streamed like any other weight. Constants
    that are graph outputs, live inside ``If``/``Loop`` bodies or sit in an IR < 4 model (whose
    initializers must be graph inputs) stay as they are."""
    out = ModelProto()
    out.CopyFrom(proto)
    if out.ir_version < 4:
        return out
    outputs = {o.name for o in out.graph.output}
    kept = []
    for node in out.graph.node:
        value = next((a.t for a in node.attribute if a.name == "value" and a.type == AttributeProto.TENSOR),
                     None)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and value is not None \
                and len(node.output) == 1 and node.output[0] not in outputs and len(node.attribute) == 1:
            nbytes = int(np.prod(value.dims, dtype=np.int64)) * \
                np.dtype(tensor_dtype_to_np_dtype(value.data_type)).itemsize
            if not stays_embedded(value.data_type, nbytes):
                tensor = out.graph.initializer.add()
                tensor.CopyFrom(value)
                tensor.name = node.output[0]
                continue
        kept.append(node)
    if len(kept) != len(out.graph.node):
        del out.graph.node[:]
        out.graph.node.extend(kept)
    return out


def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _fields(buf, start: int, end: int):
    """Yield (field number, wire type, field start, payload start, payload end) in buf[start:end]."""
    pos = start
    while pos < end:
        field_start = pos
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, after = _varint(buf, pos)
            yield number, wire, field_start, pos, after
            pos = after
        elif wire == 1:
            yield number, wire, field_start, pos, pos + 8
            pos += 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            yield number, wire, field_start, pos, pos + length
            pos += length
        elif wire == 5:
            yield number, wire, field_start, pos, pos + 4
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} at byte {field_start}")


def _len_field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def _string_entry(key: str, value: str) -> bytes:
    return _len_field(1, key.encode()) + _len_field(2, value.encode())


#: packed TensorProto fields whose payload is the tensor's little-endian bytes, as raw_data would
#: hold them: float_data of a FLOAT tensor, double_data of a DOUBLE one (PaddlePaddle's exporter
#: writes its weights as float_data)
_PACKED_AS_RAW = {4: TensorProto.FLOAT, 10: TensorProto.DOUBLE}


def _tensor_without_data(buf, start: int, end: int, location: str) -> bytes:
    """Re-encode one TensorProto with its big raw_data replaced by an external-data reference."""
    fields = list(_fields(buf, start, end))
    data_type = next((_varint(buf, pstart)[0] for number, wire, _, pstart, _ in fields
                      if number == 2 and wire == 0), 0)
    kept = bytearray()
    raw = None
    for number, wire, fstart, pstart, pend in fields:
        if wire == 2 and (number == 9 or _PACKED_AS_RAW.get(number) == data_type):
            raw = (pstart, pend)
            continue
        kept += buf[fstart:pend]
    if raw is None:
        return bytes(buf[start:end])
    length = raw[1] - raw[0]
    if stays_embedded(data_type, length):
        return bytes(buf[start:end])
    for key, value in (("location", location), ("offset", str(raw[0])), ("length", str(length))):
        kept += _len_field(13, _string_entry(key, value))
    kept += _encode_varint(14 << 3 | 0) + _encode_varint(TensorProto.EXTERNAL)
    return bytes(kept)


def _constant_tensor(buf, start: int, end: int) -> tuple[str, tuple[int, int]] | None:
    """(output name, TensorProto span) of a NodeProto that is an ONNX ``Constant`` with a ``value``
    tensor of one output; None for any other node."""
    outputs, op_type, domain, tensor = [], b"", b"", None
    for number, wire, _, pstart, pend in _fields(buf, start, end):
        if wire != 2:
            continue
        if number == 2:
            outputs.append(bytes(buf[pstart:pend]).decode())
        elif number == 4:
            op_type = bytes(buf[pstart:pend])
        elif number == 7:
            domain = bytes(buf[pstart:pend])
        elif number == 5:  # AttributeProto: name (1), t (5)
            name, span = b"", None
            for anum, awire, _, apstart, apend in _fields(buf, pstart, pend):
                if anum == 1 and awire == 2:
                    name = bytes(buf[apstart:apend])
                elif anum == 5 and awire == 2:
                    span = (apstart, apend)
            if name != b"value" or span is None:
                return None  # a Constant given by value_float(s)/ints/string/sparse_value: small
            tensor = span
    if op_type != b"Constant" or domain not in (b"", b"ai.onnx") or tensor is None or len(outputs) != 1:
        return None
    return outputs[0], tensor


def _graph_outputs(buf, start: int, end: int) -> set[str]:
    names = set()
    for number, wire, _, pstart, pend in _fields(buf, start, end):
        if number == 12 and wire == 2:  # GraphProto.output: ValueInfoProto, name (1)
            names |= {bytes(buf[s:e]).decode() for n, w, _, s, e in _fields(buf, pstart, pend) if n == 1 and w == 2}
    return names


def _ir_version(buf) -> int:
    return next((_varint(buf, pstart)[0] for number, wire, _, pstart, _ in _fields(buf, 0, len(buf))
                 if number == 1 and wire == 0), 0)


def skeleton_bytes(path: str) -> bytes:
    """The model file's bytes with big initializer payloads replaced by references into ``path``.

    Top-level ``Constant`` nodes holding a big tensor (how paddle2onnx stores weights) become
    initializers with the same reference: the same values under the same name, held by no Python
    object, and weights the planner and the streamed-weights store treat like any other. Inside
    ``If``/``Loop`` bodies they stay as they are: the streamed-weights store writes subgraphs
    as they come, and a reference there would point beside its own file."""
    location = os.path.basename(path)
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        hoist = _ir_version(buf) >= 4  # older IR versions require every initializer to be a graph input
        out = bytearray()
        for number, wire, fstart, pstart, pend in _fields(buf, 0, len(buf)):
            if number == 7 and wire == 2:  # ModelProto.graph
                out += _len_field(7, _graph_skeleton(buf, pstart, pend, location, hoist))
            else:
                out += buf[fstart:pend]
        return bytes(out)


def _graph_skeleton(buf, start: int, end: int, location: str, hoist: bool) -> bytes:
    """The top-level GraphProto with its big tensors as references (see ``skeleton_bytes``)."""
    graph = bytearray()
    outputs = _graph_outputs(buf, start, end)
    for number, wire, fstart, pstart, pend in _fields(buf, start, end):
        constant = _constant_tensor(buf, pstart, pend) if hoist and number == 1 and wire == 2 else None
        if constant is not None and constant[0] not in outputs:
            name, (tstart, tend) = constant
            tensor = _tensor_without_data(buf, tstart, tend, location)
            if tensor != bytes(buf[tstart:tend]):  # externalised: big enough to be a weight
                graph += _len_field(5, tensor + _len_field(8, name.encode()))  # TensorProto.name: last wins
                continue
        if number == 5 and wire == 2:  # GraphProto.initializer
            graph += _len_field(5, _tensor_without_data(buf, pstart, pend, location))
        else:
            graph += buf[fstart:pend]
    return bytes(graph)


def skeleton_proto(path: str) -> ModelProto:
    """The weightless ModelProto of ``path``, not yet checked (ValueError if it is no protobuf)."""
    if not os.path.isfile(path):
        raise ValueError(f"model file not found: {path}")
    try:
        data = skeleton_bytes(path)
        proto = ModelProto.FromString(data)
    except Exception as exc:  # truncated / not a protobuf
        raise ValueError(f"{path} is not a readable ONNX model: {exc}") from exc
    entry = proto.metadata_props.add()
    entry.key, entry.value = EXTERNAL_DIR_KEY, os.path.dirname(os.path.abspath(path))
    entry = proto.metadata_props.add()
    entry.key, entry.value = SOURCE_PATH_KEY, os.path.abspath(path)
    return clear_negative_dims(proto)


def check_skeleton(proto: ModelProto) -> None:
    """onnx's checks (and messages) as for a full load; ValueError if the model is invalid."""
    load_model(_checkable(proto))


def load_skeleton(path: str | os.PathLike, *, check: bool = True) -> ModelProto:
    """A checked, weightless ModelProto for ``path`` (ValueError on unreadable / invalid models).

    The check runs once per file content, in a child process (modelio/model_check.py);
    ``check=False`` for files this package wrote itself (the layout cache)."""
    path = os.fspath(path)
    proto = skeleton_proto(path)
    if check:
        check_model_file(path, lambda: check_skeleton(proto), child_module=__name__)
    if not proto.graph.output:
        raise ValueError(f"{path} has no graph outputs")
    return proto


def _checkable(proto: ModelProto) -> ModelProto:
    """The checker resolves external data against the working directory; check a copy whose
    referenced weights are declared as graph inputs instead (the references point into the file
    that was just scanned, so they are valid by construction)."""
    copy = ModelProto()
    copy.CopyFrom(proto)
    external = [t for t in copy.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    declared = {v.name for v in copy.graph.input}
    for tensor in external:
        copy.graph.initializer.remove(tensor)
        if tensor.name not in declared:
            copy.graph.input.append(make_tensor_value_info(tensor.name, tensor.data_type,
                                                                      list(tensor.dims)))
    if copy.ir_version < 4:
        copy.ir_version = 4
    return copy


def source_path(model: ModelProto) -> str | None:
    """The model file a skeleton from ``load_skeleton`` came from (None for in-memory models)."""
    return next((e.value for e in model.metadata_props if e.key == SOURCE_PATH_KEY), None)


def external_data_dir(model: ModelProto) -> str | None:
    """Directory that the model's external-data locations are relative to, if it was loaded here."""
    for entry in model.metadata_props:
        if entry.key == EXTERNAL_DIR_KEY:
            return entry.value
    return None


def read_external(tensor: TensorProto, base_dir: str | None):
    """Values of an external-data initializer (a fresh array), or None if not readable here.

    Used by simplification passes that need weight values (BatchNormalization folding); the
    engine itself never reads weights — onnxruntime does.
    """
    span = _external_span(tensor, base_dir)
    if span is None:
        return None
    path, dtype, count, offset = span
    array = np.fromfile(path, dtype=dtype, count=count, offset=offset)
    if array.size != count:
        return None
    return array.reshape(tuple(tensor.dims)).astype(dtype.newbyteorder("="), copy=False)


def map_external(tensor: TensorProto, base_dir: str | None) -> np.ndarray | None:
    """A read-only memory map of an external-data initializer's bytes in its file (no copy), or
    None if not readable here or not stored little-endian-native.

    Used where onnxruntime cannot find a model's external data itself (ort_features.py): the
    session then computes straight from the file's pages, as it would have after reading them.
    """
    span = _external_span(tensor, base_dir)
    if span is None:
        return None
    path, dtype, count, offset = span
    if (not tensor.dims or count == 0 or dtype.newbyteorder("=") != dtype
            or offset + count * dtype.itemsize > os.path.getsize(path)):
        return None
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=tuple(int(d) for d in tensor.dims))


def _external_span(tensor: TensorProto, base_dir: str | None) -> tuple[str, np.dtype, int, int] | None:
    """(file, little-endian dtype, element count, byte offset) of an external-data initializer
    whose file lies inside ``base_dir``; None otherwise."""
    if tensor.data_location != TensorProto.EXTERNAL or base_dir is None:
        return None
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    path = os.path.join(base_dir, location)
    if not location or os.path.isabs(location) or ".." in location.split(os.sep) or not os.path.isfile(path):
        return None
    dtype = np.dtype(tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")
    count = 1
    for d in tensor.dims:
        count *= int(d)
    return path, dtype, count, int(info.get("offset", 0))


def _check_in_child(path: str) -> int:
    """Entry point of the checking child process (see ``model_check.check_model_file``)."""
    try:
        check_skeleton(skeleton_proto(path))
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return INVALID_MODEL_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(_check_in_child(sys.argv[1]))
