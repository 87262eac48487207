"""ONNX's protobuf classes and the few helpers the engine needs, without importing the ``onnx`` package.

Why: ``import onnx`` loads onnx's C++ extension and, unconditionally, ``ml_dtypes``' extension
(onnx.helper -> onnx._mapping -> ml_dtypes): most of a model node's import time and ~15 MiB of
every serving process, for what serving uses of onnx — its generated protobuf classes (pure
protobuf) and a few tensor/attribute helpers. This module loads onnx's generated
``onnx/onnx_ml_pb2.py`` under its own name, ``onnx.onnx_ml_pb2``, and registers it in
``sys.modules``: a later ``import onnx`` reuses that module, so both see the same classes and the
same descriptor pool (``isinstance`` holds across them), in either import order.

The helpers follow ``onnx.helper`` / ``onnx.numpy_helper`` / ``onnx.load`` / ``onnx.save`` for
the tensor types numpy has natively. What needs onnx itself — tensor types numpy lacks
(bfloat16, float8, int4: ``ml_dtypes``), external data, a model without an explicit opset —
goes to the real ``onnx`` package, imported there.
"""
from __future__ import annotations

import importlib.util
import numbers
import os
import sys
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any

import numpy as np

#: the generated module's name, as onnx itself imports it
PB2_NAME = "onnx.onnx_ml_pb2"
#: protobuf's limit on one serialized message
MAX_PROTO_BYTES = 2**31


def _generated_module() -> ModuleType:
    """onnx's ``onnx_ml_pb2``: the one already imported, else loaded from onnx's package folder
    without running ``onnx/__init__.py``."""
    loaded = sys.modules.get(PB2_NAME)
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("onnx")  # finds the package folder; runs none of its code
    if package is None or not package.submodule_search_locations:
        raise ImportError("the onnx package is not installed")
    path = os.path.join(list(package.submodule_search_locations)[0], "onnx_ml_pb2.py")
    spec = importlib.util.spec_from_file_location(PB2_NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[PB2_NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:  # any failure, interrupts too: leave no half-run module for a later import to reuse
        del sys.modules[PB2_NAME]
        raise
    return module


if TYPE_CHECKING:
    from onnx.onnx_ml_pb2 import (
        AttributeProto,
        FunctionProto,
        GraphProto,
        ModelProto,
        NodeProto,
        OperatorSetIdProto,
        SparseTensorProto,
        StringStringEntryProto,
        TensorProto,
        TensorShapeProto,
        TypeProto,
        ValueInfoProto,
    )
else:
    _pb2 = _generated_module()
    AttributeProto = _pb2.AttributeProto
    FunctionProto = _pb2.FunctionProto
    GraphProto = _pb2.GraphProto
    ModelProto = _pb2.ModelProto
    NodeProto = _pb2.NodeProto
    OperatorSetIdProto = _pb2.OperatorSetIdProto
    SparseTensorProto = _pb2.SparseTensorProto
    StringStringEntryProto = _pb2.StringStringEntryProto
    TensorProto = _pb2.TensorProto
    TensorShapeProto = _pb2.TensorShapeProto
    TypeProto = _pb2.TypeProto
    ValueInfoProto = _pb2.ValueInfoProto

#: the IR version ``onnx.helper.make_model`` writes (``onnx.IR_VERSION``)
IR_VERSION: int = int(_generated_module().Version.Value("IR_VERSION"))

#: element type -> (numpy dtype, the TensorProto field its values are stored in when not raw)
NATIVE_TYPES: dict[int, tuple[np.dtype, str]] = {
    TensorProto.FLOAT: (np.dtype(np.float32), "float_data"),
    TensorProto.UINT8: (np.dtype(np.uint8), "int32_data"),
    TensorProto.INT8: (np.dtype(np.int8), "int32_data"),
    TensorProto.UINT16: (np.dtype(np.uint16), "int32_data"),
    TensorProto.INT16: (np.dtype(np.int16), "int32_data"),
    TensorProto.INT32: (np.dtype(np.int32), "int32_data"),
    TensorProto.INT64: (np.dtype(np.int64), "int64_data"),
    TensorProto.STRING: (np.dtype(object), "string_data"),
    TensorProto.BOOL: (np.dtype(np.bool_), "int32_data"),
    TensorProto.FLOAT16: (np.dtype(np.float16), "int32_data"),
    TensorProto.DOUBLE: (np.dtype(np.float64), "double_data"),
    TensorProto.UINT32: (np.dtype(np.uint32), "uint64_data"),
    TensorProto.UINT64: (np.dtype(np.uint64), "uint64_data"),
    TensorProto.COMPLEX64: (np.dtype(np.complex64), "float_data"),
    TensorProto.COMPLEX128: (np.dtype(np.complex128), "double_data"),
}
_TENSOR_TYPE_OF: dict[np.dtype, int] = {dtype: elem for elem, (dtype, _field) in NATIVE_TYPES.items()}
#: stored as 16-bit patterns in int32_data
_SIXTEEN_BIT = {TensorProto.FLOAT16, TensorProto.INT16, TensorProto.UINT16}


def onnx_library() -> ModuleType:
    """The ``onnx`` package itself, imported on first use: for what needs its C++ library (the
    checker, shape inference, the function inliner, operator schemas) or ``ml_dtypes``."""
    # onnx's C++ extension and ml_dtypes load here, in the processes and features that use them
    import onnx
    import onnx.inliner  # a submodule `import onnx` leaves out
    return onnx


def _onnx_numpy_helper() -> ModuleType:
    return onnx_library().numpy_helper


# --- tensor types ---------------------------------------------------------------------------------

def tensor_dtype_to_np_dtype(tensor_dtype: int) -> np.dtype:
    """The numpy dtype of an ONNX element type (``onnx.helper.tensor_dtype_to_np_dtype``)."""
    native = NATIVE_TYPES.get(tensor_dtype)
    if native is not None:
        return native[0]
    return onnx_library().helper.tensor_dtype_to_np_dtype(tensor_dtype)


def np_dtype_to_tensor_dtype(np_dtype: np.dtype | type) -> int:
    """The ONNX element type of a numpy dtype (``onnx.helper.np_dtype_to_tensor_dtype``)."""
    found = _TENSOR_TYPE_OF.get(np.dtype(np_dtype))
    if found is not None:
        return found
    return int(onnx_library().helper.np_dtype_to_tensor_dtype(np.dtype(np_dtype)))


def uses_external_data(tensor: TensorProto) -> bool:
    """Whether ``tensor``'s values live in a file beside the model."""
    return tensor.HasField("data_location") and tensor.data_location == TensorProto.EXTERNAL


def to_array(tensor: TensorProto, base_dir: str = "") -> np.ndarray:
    """``tensor``'s values as an array (``onnx.numpy_helper.to_array``); raw data is viewed, not copied.
    External data that cannot be read where the tensor says raises ValueError."""
    if tensor.HasField("segment"):
        raise ValueError("Currently not supporting loading segments.")
    if tensor.data_type == TensorProto.UNDEFINED:
        raise TypeError("The element type in the input tensor is UNDEFINED.")
    native = NATIVE_TYPES.get(tensor.data_type)
    if uses_external_data(tensor):
        try:
            return _onnx_numpy_helper().to_array(tensor, base_dir)
        except onnx_library().checker.ValidationError as exc:  # a location outside base_dir, or missing
            raise ValueError(str(exc)) from exc
    if native is None or sys.byteorder == "big":
        return _onnx_numpy_helper().to_array(tensor, base_dir)
    dtype, field = native
    dims = tuple(tensor.dims)
    if tensor.data_type == TensorProto.STRING:
        return np.asarray([s.decode("utf-8") for s in tensor.string_data]).astype(dtype).reshape(dims)
    if tensor.HasField("raw_data"):
        return np.frombuffer(tensor.raw_data, dtype=dtype).reshape(dims)
    data = getattr(tensor, field)
    if tensor.data_type in _SIXTEEN_BIT:
        return np.array(data, dtype=np.int32).view(np.uint32).astype(np.uint16).reshape(dims).view(dtype)
    if tensor.data_type == TensorProto.BOOL:
        return np.array(data, dtype=np.int32).view(np.uint32).astype(np.uint8).view(dtype).reshape(dims)
    if tensor.data_type == TensorProto.COMPLEX64:
        return np.array(data, dtype=np.float32).view(dtype).reshape(dims)
    if tensor.data_type == TensorProto.COMPLEX128:
        return np.array(data, dtype=np.float64).view(dtype).reshape(dims)
    storage = np.int32 if field == "int32_data" else dtype
    return np.asarray(data, dtype=storage).astype(dtype).reshape(dims)


def from_array(array: np.ndarray, /, name: str | None = None) -> TensorProto:
    """A tensor holding ``array`` as raw little-endian bytes (``onnx.numpy_helper.from_array``)."""
    if array.dtype == object or np.issubdtype(array.dtype, np.str_) or array.dtype not in _TENSOR_TYPE_OF \
            or sys.byteorder == "big" or array.dtype.byteorder == ">":
        return _onnx_numpy_helper().from_array(array, name)
    tensor = TensorProto()
    tensor.dims.extend(array.shape)
    if name:
        tensor.name = name
    tensor.raw_data = array.tobytes()
    tensor.data_type = _TENSOR_TYPE_OF[array.dtype]
    return tensor


def make_tensor(name: str, data_type: int, dims: Sequence[int], vals: Any, raw: bool = False) -> TensorProto:
    """A tensor from values (``onnx.helper.make_tensor``): ``raw`` stores bytes in ``raw_data``, else
    the values go to the element type's typed field."""
    native = NATIVE_TYPES.get(data_type)
    if native is None or data_type == TensorProto.STRING:
        return onnx_library().helper.make_tensor(name, data_type, dims, vals, raw)
    dtype, field = native
    tensor = TensorProto()
    tensor.data_type = data_type
    tensor.name = name
    tensor.dims.extend(dims)
    count = int(np.prod(dims, dtype=np.int64))
    if raw:
        raw_data = vals.tobytes() if isinstance(vals, np.ndarray) else vals
        if not isinstance(raw_data, bytes):
            raise TypeError(f"Raw data must be bytes or numpy.ndarray, but got {type(vals)}.")
        if len(raw_data) != count * dtype.itemsize:
            raise ValueError(f"Raw data size does not match tensor's size. Expected {count * dtype.itemsize} "
                             f"bytes, but got {len(raw_data)} bytes.")
        tensor.raw_data = raw_data
        return tensor
    values = np.asarray(vals, dtype=dtype).flatten()
    if len(values) != count:
        raise ValueError(f"Number of values ({len(values)}) does not match tensor dimensions "
                         f"requiring {count} elements.")
    if data_type == TensorProto.COMPLEX64:
        values = values.view(np.float32)
    elif data_type == TensorProto.COMPLEX128:
        values = values.view(np.float64)
    elif data_type == TensorProto.FLOAT16:
        values = values.view(np.uint16)
    elif data_type == TensorProto.BOOL:
        values = values.astype(np.uint8)
    getattr(tensor, field).extend(values)
    return tensor


# --- graph building -------------------------------------------------------------------------------

def _to_bytes(value: str | bytes) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value


#: element class -> the list attribute type, in the order onnx.helper infers it
_LIST_TYPES: tuple[tuple[Any, Any, str], ...] = (
    (numbers.Integral, AttributeProto.INTS, "ints"),
    (numbers.Real, AttributeProto.FLOATS, "floats"),
    ((str, bytes), AttributeProto.STRINGS, "strings"),
    (TensorProto, AttributeProto.TENSORS, "tensors"),
    (SparseTensorProto, AttributeProto.SPARSE_TENSORS, "sparse_tensors"),
    (GraphProto, AttributeProto.GRAPHS, "graphs"),
    (TypeProto, AttributeProto.TYPE_PROTOS, "type_protos"),
)
#: message class -> (attribute type, field)
_MESSAGE_TYPES: tuple[tuple[Any, Any, str], ...] = (
    (TensorProto, AttributeProto.TENSOR, "t"),
    (SparseTensorProto, AttributeProto.SPARSE_TENSOR, "sparse_tensor"),
    (GraphProto, AttributeProto.GRAPH, "g"),
    (TypeProto, AttributeProto.TYPE_PROTO, "tp"),
)


def make_attribute(key: str, value: Any, doc_string: str | None = None,
                   attr_type: int | None = None) -> AttributeProto:
    """An attribute whose type follows ``value``'s (``onnx.helper.make_attribute``)."""
    attr = AttributeProto()
    attr.name = key
    if doc_string:
        attr.doc_string = doc_string
    if isinstance(value, numbers.Integral):
        attr.i = int(value)
        attr.type = AttributeProto.INT
    elif isinstance(value, numbers.Real):
        attr.f = float(value)
        attr.type = AttributeProto.FLOAT
    elif isinstance(value, (str, bytes)):
        attr.s = _to_bytes(value)
        attr.type = AttributeProto.STRING
    elif isinstance(value, tuple(cls for cls, _type, _field in _MESSAGE_TYPES)):
        kind, field = next((kind, field) for cls, kind, field in _MESSAGE_TYPES if isinstance(value, cls))
        getattr(attr, field).CopyFrom(value)
        attr.type = kind
    elif isinstance(value, Iterable):
        items = list(value)
        if not items and attr_type is None:
            raise ValueError(f"Could not infer attribute `{key}` type from empty iterator")
        kinds = {type(v) for v in items}
        chosen = next(((kind, field) for cls, kind, field in _LIST_TYPES
                       if (attr_type is None and all(issubclass(t, cls) for t in kinds)) or kind == attr_type), None)
        if chosen is None:
            raise ValueError("Could not infer the attribute type from the elements of the passed Iterable value.")
        kind, field = chosen
        if kind == AttributeProto.STRINGS:
            items = [_to_bytes(v) for v in items]
        getattr(attr, field).extend(items)
        attr.type = kind
    else:
        raise TypeError(f"'{value}' is not an accepted attribute value.")
    if attr_type is not None and attr.type != attr_type:
        raise TypeError(f"Inferred attribute type {attr.type} mismatched with specified type {attr_type}")
    return attr


#: attribute type -> the field holding its value (a list for the plural types)
_VALUE_FIELDS: dict[int, str] = {
    AttributeProto.FLOAT: "f", AttributeProto.INT: "i", AttributeProto.STRING: "s",
    AttributeProto.TENSOR: "t", AttributeProto.SPARSE_TENSOR: "sparse_tensor", AttributeProto.GRAPH: "g",
    AttributeProto.TYPE_PROTO: "tp",
    **{kind: field for _cls, kind, field in _LIST_TYPES},
}


def get_attribute_value(attr: AttributeProto) -> Any:
    """The value an attribute holds (``onnx.helper.get_attribute_value``): lists for plural types,
    bytes for strings, None for an undefined one."""
    if attr.ref_attr_name:
        raise ValueError(f"Cannot get value of reference attribute: {attr}")
    if attr.type == AttributeProto.UNDEFINED:
        return None
    field = _VALUE_FIELDS.get(attr.type)
    if field is None:
        raise ValueError(f"Unsupported ONNX attribute: {attr}")
    value = getattr(attr, field)
    return list(value) if attr.type in {kind for _cls, kind, _field in _LIST_TYPES} else value


def make_node(op_type: str, inputs: Sequence[str], outputs: Sequence[str], name: str | None = None,
              doc_string: str | None = None, domain: str | None = None, overload: str | None = None,
              **kwargs: Any) -> NodeProto:
    """A node; keyword arguments are its attributes, sorted by name (``onnx.helper.make_node``)."""
    node = NodeProto()
    node.op_type = op_type
    node.input.extend(inputs)
    node.output.extend(outputs)
    if name:
        node.name = name
    if doc_string:
        node.doc_string = doc_string
    if domain is not None:
        node.domain = domain
    if overload is not None:
        node.overload = overload
    if kwargs:
        node.attribute.extend(make_attribute(key, value) for key, value in sorted(kwargs.items())
                              if value is not None)
    return node


def make_graph(nodes: Sequence[NodeProto], name: str, inputs: Sequence[ValueInfoProto],
               outputs: Sequence[ValueInfoProto], initializer: Sequence[TensorProto] | None = None,
               doc_string: str | None = None, value_info: Sequence[ValueInfoProto] | None = None,
               sparse_initializer: Sequence[SparseTensorProto] | None = None) -> GraphProto:
    """A graph (``onnx.helper.make_graph``)."""
    graph = GraphProto()
    graph.node.extend(nodes)
    graph.name = name
    graph.input.extend(inputs)
    graph.output.extend(outputs)
    graph.initializer.extend(initializer or [])
    graph.sparse_initializer.extend(sparse_initializer or [])
    graph.value_info.extend(value_info or [])
    if doc_string:
        graph.doc_string = doc_string
    return graph


def make_opsetid(domain: str, version: int) -> OperatorSetIdProto:
    """An opset import entry (``onnx.helper.make_opsetid``)."""
    opset = OperatorSetIdProto()
    opset.domain = domain
    opset.version = version
    return opset


def make_model(graph: GraphProto, **kwargs: Any) -> ModelProto:
    """A model around ``graph`` at onnx's IR version (``onnx.helper.make_model``); without
    ``opset_imports`` onnx's own helper adds its newest default-domain opset."""
    opset_imports = kwargs.pop("opset_imports", None)
    if opset_imports is None:
        return onnx_library().helper.make_model(graph, **kwargs)
    model = ModelProto()
    model.ir_version = IR_VERSION
    model.graph.CopyFrom(graph)
    model.opset_import.extend(opset_imports)
    functions = kwargs.pop("functions", None)
    if functions is not None:
        model.functions.extend(functions)
    for key, value in kwargs.items():
        setattr(model, key, value)
    return model


def make_tensor_type_proto(elem_type: int, shape: Sequence[int | str | None] | None) -> TypeProto:
    """A tensor type; a shape entry is a size, a symbolic name or None (unknown)
    (``onnx.helper.make_tensor_type_proto``)."""
    type_proto = TypeProto()
    tensor_type = type_proto.tensor_type
    tensor_type.elem_type = elem_type
    if shape is not None:
        tensor_type.shape.dim.extend([])  # an explicit empty shape: a scalar, not "unknown rank"
        for size in shape:
            dim = tensor_type.shape.dim.add()
            if size is None:
                continue
            if isinstance(size, int):
                dim.dim_value = size
            elif isinstance(size, str):
                dim.dim_param = size
            else:
                raise ValueError(f"Invalid item in shape: {size}. Needs to be of int or str.")
    return type_proto


def make_tensor_value_info(name: str, elem_type: int, shape: Sequence[int | str | None] | None,
                           doc_string: str = "") -> ValueInfoProto:
    """A graph input/output/value-info entry of tensor type (``onnx.helper.make_tensor_value_info``)."""
    return make_value_info(name, make_tensor_type_proto(elem_type, shape), doc_string)


def make_empty_tensor_value_info(name: str) -> ValueInfoProto:
    """A value-info entry with a name and no type (``onnx.helper.make_empty_tensor_value_info``)."""
    info = ValueInfoProto()
    info.name = name
    return info


def make_value_info(name: str, type_proto: TypeProto, doc_string: str = "") -> ValueInfoProto:
    """A value-info entry of any type (``onnx.helper.make_value_info``)."""
    info = ValueInfoProto()
    info.name = name
    if doc_string:
        info.doc_string = doc_string
    info.type.CopyFrom(type_proto)
    return info


# --- files ----------------------------------------------------------------------------------------

def _all_tensors(graph: GraphProto) -> Iterable[TensorProto]:
    """Every tensor of ``graph`` and its subgraphs: initializers and tensor attributes."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _all_tensors(attr.g)
            for sub in attr.graphs:
                yield from _all_tensors(sub)


def load(f: IO[bytes] | str | os.PathLike, load_external_data: bool = True) -> ModelProto:
    """A model from a file or a binary stream (``onnx.load``); weights stored beside the file are
    read in too unless ``load_external_data`` is False."""
    if hasattr(f, "read"):
        content = f.read()
    else:
        with open(f, "rb") as readable:
            content = readable.read()
    model = ModelProto.FromString(content)
    if load_external_data and any(uses_external_data(t) for t in _all_tensors(model.graph)):
        path = getattr(f, "name", None) if hasattr(f, "read") else f
        base_dir = os.path.dirname(os.fspath(path)) if path else ""
        onnx_library().external_data_helper.load_external_data_for_model(model, base_dir)
    return model


def save(model: ModelProto, f: IO[bytes] | str | os.PathLike) -> None:
    """Write ``model`` to a file or a binary stream (``onnx.save``). Tensors that are marked
    external but still hold their bytes are written beside it by onnx's own ``save``."""
    if any(uses_external_data(t) and t.HasField("raw_data") for t in _all_tensors(model.graph)):
        onnx_library().save(model, f)
        return
    content = model.SerializeToString()
    if len(content) >= MAX_PROTO_BYTES:
        raise ValueError("The proto size is larger than the 2 GB limit. "
                         "Please use save_as_external_data to save tensors separately from the model file.")
    if hasattr(f, "write"):
        f.write(content)
    else:
        with open(f, "wb") as writable:
            writable.write(content)
