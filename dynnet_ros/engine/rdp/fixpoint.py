"""Alg. 1 driver: forward transfer over a topological worklist, backward transfer as
equality constraints between dimensions, iterated to a fixpoint.

Backward transfer works on what the model *requires* to run (MatMul inner dims
equal, Concat non-axis dims equal, Reshape keeps the element count, ...).  When a
requirement reads ``symbol == expression`` the symbol is substituted everywhere
and the forward pass is repeated; each round eliminates a symbol, so the loop
terminates.  ``AnalysisResult.bind`` re-checks the requirements on real shapes.
"""
from __future__ import annotations

import heapq
import logging
import threading
import warnings
from collections import ChainMap
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field

import numpy as np

from dynnet_ros.engine.modelio.onnx_proto import GraphProto, NodeProto, TensorProto, to_array

from . import ops  # noqa: F401 - registers every transfer function
from .expr import Dim, Expr, Sym, exact_div, mul, sub, substitute
from .lattice import MAX_VALUE_ELEMS, TensorInfo, nac, shaped
from .registry import REGISTRY, Ctx, ShapeError, custom_op
from .types import with_types

log = logging.getLogger(__name__)


_GENERIC = {None, "unknown dimension", "input rank unknown", "missing input", "unknown"}


class RDPWarning(UserWarning):
    """An operator RDP does not know (its outputs are nac)."""


class TransferError(RuntimeError):
    """A transfer function failed on its own (not a ``ShapeError`` about the model): a bug in RDP.

    Raised only in strict mode (``analyze(strict=True)``, ``DYNNET_RDP_STRICT=1``); otherwise the
    node's outputs become nac, which stays sound but hides the bug."""


#: op types whose transfer failure was logged at WARNING in this process (lenient mode logs each
#: op type once: a model with a thousand such nodes must not flood a serving node's log)
_failed_ops: set[str] = set()
_failed_lock = threading.Lock()


def _first_failure(op_key: str) -> bool:
    with _failed_lock:
        if op_key in _failed_ops:
            return False
        _failed_ops.add(op_key)
        return True


@dataclass
class NodeRecord:
    name: str
    op_type: str
    domain: str
    category: str
    inputs: list[str]
    outputs: list[str]
    subgraph: bool = False


@dataclass
class GraphResult:
    state: dict[str, TensorInfo]
    nodes: list[NodeRecord]
    constraints: list = field(default_factory=list)
    order: list[int] = field(default_factory=list)  # topological order of ``nodes``


_FLOAT_INIT_VALUES = 64  # float constants worth tracking are scales/thresholds, not weights


def initializer_info(init: TensorProto) -> TensorInfo:
    n = 1
    for d in init.dims:
        n *= d
    is_float = init.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)
    limit = _FLOAT_INIT_VALUES if is_float else MAX_VALUE_ELEMS
    if n <= limit and init.data_type != TensorProto.STRING:
        try:
            arr: np.ndarray | None = to_array(init)
            if arr is not None and arr.dtype.kind not in "biuf":
                try:
                    arr = arr.astype(np.float64)
                except (TypeError, ValueError):
                    arr = None
            vals = tuple(x.item() if isinstance(x, np.generic) else x for x in arr.reshape(-1).tolist()) \
                if arr is not None else None
            if vals is not None and arr is not None and arr.dtype.kind == "b":
                vals = tuple(bool(x) for x in vals)
            return shaped(tuple(init.dims), init.data_type, vals)
        except (ValueError, TypeError, KeyError, OSError) as exc:
            # weights stored outside the model (not loaded) or malformed: the shape is still known
            log.debug("no values for initializer %s: %s", init.name, exc)
    return shaped(tuple(init.dims), init.data_type)


def node_names(nodes) -> list[str]:
    """Stable unique names: the node's own or f"{op_type}_{index}"."""
    seen: set[str] = set()
    out = []
    for i, n in enumerate(nodes):
        base = n.name or f"{n.op_type}_{i}"
        name = base
        k = 1
        while name in seen:
            name = f"{base}_{k}"
            k += 1
        seen.add(name)
        out.append(name)
    return out


def topo_order(nodes, available) -> list[int]:
    """Kahn's algorithm; nodes whose inputs never appear come last in file order."""
    produced_by: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            if o:
                produced_by[o] = i
    indeg = [0] * len(nodes)
    users: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        deps = set()
        for x in list(n.input) + _implicit_inputs(n):
            if x and x not in available and x in produced_by and produced_by[x] != i:
                deps.add(produced_by[x])
        indeg[i] = len(deps)
        for d in deps:
            users.setdefault(d, []).append(i)
    ready = [i for i in range(len(nodes)) if indeg[i] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, u)
    if len(order) < len(nodes):
        done = set(order)
        order += [i for i in range(len(nodes)) if i not in done]
    return order


def _implicit_inputs(node: NodeProto) -> list[str]:
    """Outer-scope names a node's subgraphs read (so they are ordered after producers)."""
    names: list[str] = []
    for a in node.attribute:
        gs = [a.g] if a.type == a.GRAPH else (list(a.graphs) if a.type == a.GRAPHS else [])
        for g in gs:
            local = {i.name for i in g.input} | {i.name for i in g.initializer}
            for n in g.node:
                local.update(n.output)
            for n in g.node:
                for x in list(n.input) + _implicit_inputs(n):
                    if x and x not in local:
                        names.append(x)
    return names


class GraphAnalyzer:
    """Forward transfer of one (sub)graph; reused for If/Loop/Scan bodies."""

    def __init__(self, opset: int, warned: set[str] | None = None, subst: Mapping[str, Dim] | None = None,
                 *, strict: bool = False):
        """``strict``: a transfer function's internal error raises ``TransferError`` instead of
        making the node's outputs nac."""
        self.opset = opset
        self.strict = strict
        self.warned = warned if warned is not None else set()
        self.subst = dict(subst or {})
        self.unknown_ops: dict[str, int] = {}
        self.subgraph_results: dict[str, GraphResult] = {}

    def run(self, graph: GraphProto, inputs: Mapping[str, TensorInfo],
            outer: MutableMapping[str, TensorInfo] | None = None, prefix: str = "") -> GraphResult:
        local: dict[str, TensorInfo] = {}
        for init in graph.initializer:
            local[init.name] = initializer_info(init)
        for sp in getattr(graph, "sparse_initializer", []):
            local[sp.values.name] = shaped(tuple(sp.dims), sp.values.data_type)
        local.update(inputs)
        state = ChainMap(local, outer) if outer is not None else ChainMap(local)
        names = node_names(graph.node)
        order = topo_order(graph.node, state)
        records: dict[int, NodeRecord] = {}  # by node index; the order covers every node
        constraints: list = []
        for i in order:
            node = graph.node[i]
            name = prefix + names[i]
            outs, opdef_cat = self.eval_node(node, name, state, constraints)
            for o, info in zip(node.output, outs):
                if o:
                    local[o] = info
            records[i] = NodeRecord(name, node.op_type, node.domain, opdef_cat, list(node.input),
                                    list(node.output), any(a.type in (a.GRAPH, a.GRAPHS) for a in node.attribute))
        return GraphResult(local, [records[i] for i in range(len(graph.node))], constraints, order)

    def eval_node(self, node: NodeProto, name: str, state, constraints: list) -> tuple[list, str]:
        op = node.op_type
        domain = node.domain
        opdef = REGISTRY.get(op) if domain in ("", "ai.onnx") else custom_op(domain, op)
        ins: list = []
        for x in node.input:
            if not x:
                ins.append(None)
            elif x in state:
                ins.append(state[x])
            else:
                ins.append(nac(f"input {x!r} is never produced"))
        n_out = len(node.output)
        if opdef is None:
            key = f"{domain or 'ai.onnx'}::{op}"
            self.unknown_ops[key] = self.unknown_ops.get(key, 0) + 1
            if key not in self.warned:
                self.warned.add(key)
                warnings.warn(f"RDP: unknown operator {key}; its outputs are nac", RDPWarning, stacklevel=3)
            return with_types(node, [nac(f"unknown operator {key}") for _ in range(n_out)], ins, self.opset), "EDO"
        ctx = Ctx(node=node, name=name, inputs=ins, opset=self.opset, analyzer=self, scope=state,
                  constraints=constraints)
        try:
            outs = list(opdef.fn(ctx))
        except ShapeError as exc:
            outs = [nac(f"{op} is invalid for the inferred shapes: {exc}") for _ in range(n_out)]
        except TransferError:
            raise  # a subgraph's node failed under strict mode: already names that node
        except Exception as exc:  # soundness: an internal failure is nac, never a crash (unless strict)
            if self.strict:
                raise TransferError(f"RDP transfer function of {op} failed on node {name}: "
                                    f"{type(exc).__name__}: {exc}") from exc
            key = f"{domain or 'ai.onnx'}::{op}"
            if _first_failure(key):
                log.warning("RDP transfer function of %s failed (node %s; its outputs are nac, later failures "
                            "of %s are logged at debug level): %s: %s", key, name, key, type(exc).__name__, exc)
            log.debug("RDP transfer of %s failed", name, exc_info=True)
            outs = [nac(f"{op} transfer failed: {type(exc).__name__}: {exc}") for _ in range(n_out)]
        outs = [self._sanitize(o, op) for o in outs[:n_out]]
        while len(outs) < n_out:
            outs.append(nac(f"{op} output {len(outs)} not inferred"))
        outs = with_types(node, outs, ins, self.opset)  # a rule that gave up on the shape may leave the type
        # a nac that only echoes a nac input keeps the root cause as its reason
        if any(o.reason in _GENERIC for o in outs if o.kind == "nac"):
            root = next(((x, t) for x, t in zip(node.input, ins) if t is not None and t.kind == "nac"), None)
            if root is not None:
                why = root[1].reason or "unknown"
                why = why if why.startswith("from ") else f"from {root[0]}: {why}"
                outs = [o.with_reason(why) if o.kind == "nac" and o.reason in _GENERIC else o for o in outs]
        return outs, opdef.category_at(self.opset)

    @staticmethod
    def _sanitize(t: TensorInfo | None, op: str) -> TensorInfo:
        if t is None:
            return nac(f"{op} output not inferred")
        if t.is_seq or t.dims is None:
            return t
        dims = list(t.dims)
        bad = False
        for i, d in enumerate(dims):
            if isinstance(d, (int, np.integer)) and not isinstance(d, Expr):
                d = int(d)
                dims[i] = d
                if d < 0:
                    dims[i] = None
                    bad = True
        value = t.value
        if value is not None:
            c = [d for d in dims]
            if not all(isinstance(d, int) for d in c) or int(np.prod(c, dtype=np.int64)) != len(value):
                value = None
        if bad:
            return TensorInfo(tuple(dims), t.dtype, None, f"{op} produced a negative dimension")
        return TensorInfo(tuple(dims), t.dtype, value, t.reason if any(d is None for d in dims) else None,
                          False, None, None)

    # used by control-flow transfer functions
    def run_subgraph(self, graph: GraphProto, input_infos: list, outer, name: str) -> GraphResult:
        inputs = {}
        for gi, info in zip(graph.input, input_infos):
            inputs[gi.name] = info if info is not None else nac("subgraph input not provided")
        for gi in list(graph.input)[len(input_infos):]:
            inputs[gi.name] = nac("subgraph input not provided")
        res = self.run(graph, inputs, outer, prefix=name + "/")
        self.subgraph_results[name + "/" + graph.name] = res
        return res


def derive_substitutions(constraints: list, eliminable: Mapping[str, int]) -> tuple[dict, list]:
    """Turn ``a == b`` requirements into symbol substitutions.

    ``eliminable`` maps input symbols to their declaration order; the latest
    declared symbol of a linear equation is replaced.  Returns (substitutions,
    contradictions).
    """
    subst: dict[str, Dim] = {}
    bad: list = []
    for a, b, why in constraints:
        if b is None:  # an inequality requirement (a >= 0), checked by bind()
            continue
        a2 = substitute(a, subst)
        b2 = substitute(b, subst)
        if a2 is None or b2 is None:
            continue
        diff = sub(a2, b2)
        if diff == 0:
            continue
        if isinstance(diff, int):
            bad.append((a, b, why))
            continue
        if diff is None:  # a2 and b2 are dims, and a difference of dims is a dim
            raise TypeError(f"difference of {a2} and {b2} is not a dimension")
        cands = []
        for m, c in diff.terms:
            if len(m) == 1 and isinstance(m[0], Sym) and m[0].name in eliminable:
                s = m[0].name
                rest = sub(diff, mul(c, Expr((((m[0],), 1),))))
                if rest is not None and (not isinstance(rest, Expr) or s not in rest.symbols()):
                    val = exact_div(mul(rest, -1), c)
                    if val is not None and (isinstance(val, int) and val >= 0 or isinstance(val, Expr)):
                        cands.append((eliminable[s], s, val))
        if not cands:
            continue
        _, s, val = max(cands, key=lambda t: t[0])
        subst = {k: substitute(v, {s: val}) for k, v in subst.items()}
        subst[s] = val
    return subst, bad
