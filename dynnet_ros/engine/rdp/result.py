"""The analysis result: the JSON of docs/rdp.md and run-time binding."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dynnet_ros.engine.modelio.onnx_proto import TensorProto

from .expr import Dim, Expr, FDiv, Sym, evaluate, to_json_dim
from .lattice import TensorInfo, value_json
from .regions import Region

_INTLIKE = {TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8, TensorProto.UINT8,
            TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64, TensorProto.BOOL}
JSON_VALUE_MAX = 64


def _multiple_of_symbol(d) -> tuple[str, int] | None:
    """``m*(s//m)`` (a symbol declared a multiple of m) -> (s, m)."""

    if not isinstance(d, Expr) or len(d.terms) != 1:
        return None
    mono, c = d.terms[0]
    if len(mono) == 1 and isinstance(mono[0], FDiv) and mono[0].den == c:
        num = mono[0].num
        if len(num.terms) == 1 and num.terms[0][1] == 1 and len(num.terms[0][0]) == 1 \
                and isinstance(num.terms[0][0][0], Sym):
            return num.terms[0][0][0].name, c
    return None


@dataclass(frozen=True)
class SymbolInfo:
    input: str
    axis: int
    original: str


@dataclass
class AnalysisResult:
    model: str
    seconds: float
    symbols: dict[str, SymbolInfo]
    inputs: dict[str, list | None]
    tensors: dict[str, TensorInfo]
    nodes: list  # NodeRecord, topological order
    regions: list[Region]
    node_region: dict[str, int]
    constraints: list = field(default_factory=list)  # (a, b, why) requirements not turned into substitutions
    aliases: dict[str, Dim] = field(default_factory=dict)  # eliminated symbol -> its expression
    alias_info: dict[str, SymbolInfo] = field(default_factory=dict)
    unknown_ops: dict[str, int] = field(default_factory=dict)
    rounds: int = 1
    divisors: dict[str, int] = field(default_factory=dict)
    constants: dict[str, TensorInfo] = field(default_factory=dict)  # initializers (not in the JSON)

    # ------------------------------------------------------------ queries
    @property
    def partitions(self) -> list[Region]:
        return self.regions

    def tensor_info(self, name: str) -> TensorInfo:
        t = self.tensors.get(name) or self.constants.get(name)
        if t is None:
            raise KeyError(f"no tensor named {name!r} in the analysed graph")
        return t

    def tensor_dims(self, name: str) -> list | None:
        """Dims (int | Expr | None each), None when the rank is unknown; KeyError if no such tensor."""
        t = self.tensor_info(name)
        return None if t.dims is None else list(t.dims)

    def tensor_shape(self, name: str, bindings: Mapping[str, int]) -> tuple[int, ...] | None:
        """Concrete shape at these symbol values, None when RDP does not know it (or the name)."""
        try:
            dims = self.tensor_dims(name)
        except KeyError:
            return None
        if dims is None:
            return None
        known = [d for d in dims if d is not None]
        if len(known) != len(dims):
            return None
        try:
            return tuple(evaluate(d, bindings) for d in known)
        except KeyError as exc:
            raise ValueError(f"symbol {exc.args[0]!r} is not bound") from None

    def node_category(self, node_name: str) -> str:
        for r in self.nodes:
            if r.name == node_name:
                return r.category
        raise KeyError(f"no node named {node_name!r}")

    # ------------------------------------------------------------ binding
    def bind(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
        """Input shapes -> symbol values; ValueError on any violated requirement."""
        env: dict[str, int] = {}
        deferred: list = []
        for name, shape in shapes.items():
            if name not in self.inputs:
                raise ValueError(f"{name!r} is not an input of the model (inputs: {sorted(self.inputs)})")
            dims = self.inputs[name]
            shape = tuple(int(s) for s in shape)
            if dims is None:
                continue
            if len(dims) != len(shape):
                raise ValueError(f"input {name!r} has rank {len(dims)}, got shape {shape}")
            for axis, (d, s) in enumerate(zip(dims, shape)):
                if s < 0:
                    raise ValueError(f"input {name!r} axis {axis}: negative size {s}")
                if isinstance(d, int):
                    if d != s:
                        raise ValueError(f"input {name!r} axis {axis} must be {d}, got {s}")
                elif isinstance(d, Expr) and len(d.terms) == 1 and d.terms[0][1] == 1 \
                        and len(d.terms[0][0]) == 1 and isinstance(d.terms[0][0][0], Sym):
                    sname = d.terms[0][0][0].name
                    if sname in env and env[sname] != s:
                        raise ValueError(f"symbol {sname} bound to {env[sname]} and to {s} "
                                         f"(input {name!r} axis {axis})")
                    env[sname] = s
                elif (multiple := _multiple_of_symbol(d)) is not None:
                    sname, m = multiple
                    if s % m:
                        raise ValueError(f"input {name!r} axis {axis}: {sname} = {s} is not a multiple of {m}")
                    if sname in env and env[sname] != s:
                        raise ValueError(f"symbol {sname} bound to {env[sname]} and to {s} "
                                         f"(input {name!r} axis {axis})")
                    env[sname] = s
                elif d is not None:
                    deferred.append((name, axis, d, s))
        for name, axis, d, s in deferred:
            try:
                v = evaluate(d, env)
            except KeyError:
                continue
            if v != s:
                raise ValueError(f"input {name!r} axis {axis} must equal {d} = {v}, got {s}")
        for a, b, why in self.constraints:
            try:
                va = evaluate(a, env)
                if b is None:
                    if va is not None and va < 0:
                        raise ValueError(f"shape requirement violated: {a} >= 0 ({why}); got {va}")
                    continue
                vb = evaluate(b, env)
            except KeyError:
                continue
            if va is not None and vb is not None and va != vb:
                raise ValueError(f"shape requirement violated: {a} == {b} ({why}); got {va} != {vb}")
        return env

    # ------------------------------------------------------------ JSON
    def to_json(self) -> dict:
        tensors = {}
        counts = {"known": 0, "symbolic": 0, "nac": 0}
        for name, t in self.tensors.items():
            k = t.kind
            counts[k] += 1
            value = None
            if t.value is not None and t.dtype in _INTLIKE and len(t.value) <= JSON_VALUE_MAX:
                value = [value_json(v) for v in t.value]
            entry = {"rank": t.rank, "dims": None if t.dims is None else [to_json_dim(d) for d in t.dims],
                     "kind": k, "value": value}
            if k == "nac":
                entry["reason"] = t.reason or ("sequence value" if t.is_seq else "unknown")
            tensors[name] = entry
        return {
            "model": self.model,
            "seconds": round(self.seconds, 6),
            "symbols": {k: {"input": v.input, "axis": v.axis, "original": v.original} for k, v in self.symbols.items()},
            "inputs": {k: None if v is None else [to_json_dim(d) for d in v] for k, v in self.inputs.items()},
            "tensors": tensors,
            "nodes": {r.name: {"op_type": r.op_type, "category": r.category, "partition": self.node_region[r.name]}
                      for r in self.nodes},
            "stats": {"tensors": len(tensors), **counts},
            "regions": [r.to_json() for r in self.regions],
            "aliases": {k: to_json_dim(v) for k, v in self.aliases.items()},
            "constraints": [[to_json_dim(a), "==", to_json_dim(b), why] if b is not None
                            else [to_json_dim(a), ">=", 0, why] for a, b, why in self.constraints],
            "unknown_ops": dict(self.unknown_ops),
            "divisors": dict(self.divisors),
        }

    def unresolved(self, limit: int = 10) -> list[tuple[str, str]]:
        out = []
        for name, t in self.tensors.items():
            if t.kind == "nac":
                out.append((name, t.reason or "unknown"))
        return out[:limit]
