"""``analyze()``: the RDP entry point (Alg. 1 over the whole model)."""
from __future__ import annotations

import gc
import json
import os
import re
import time
import warnings
from collections.abc import Mapping, Sequence

from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.modelio.models import ModelLike, is_dim_symbol, load_model
from dynnet_ros.engine.modelio.onnx_proto import ModelProto
from dynnet_ros.settings import settings

from .expr import Dim, Expr, floordiv, mul, substitute, sym
from .fixpoint import GraphAnalyzer, derive_substitutions
from .lattice import TensorInfo, nac, shaped
from .regions import find_regions
from .result import AnalysisResult, SymbolInfo

_usable = is_dim_symbol


def _gen_name(inp: str, axis: int, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_]", "_", inp) or "x"
    if base[0].isdigit():
        base = "_" + base
    name = f"{base}_d{axis}"
    k = 1
    while name in taken:
        name = f"{base}_d{axis}_{k}"
        k += 1
    return name


def _label(model_or_path: ModelLike) -> str:
    if isinstance(model_or_path, ModelProto):
        return model_or_path.graph.name or "<model>"
    return os.fspath(model_or_path)


def default_opset(model: ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 1


DIVISORS_KEY = "dynnet.rdp.divisors"


def analyze(model_or_path, input_shapes: Mapping[str, Sequence[int]] | None = None,
            divisors: Mapping[str, int] | None = None, *, strict: bool | None = None) -> AnalysisResult:
    """Rank/dimension propagation over an ONNX model.

    ``input_shapes`` pins input dims (``{"x": [1, 3, 480, 640]}``); other dims become
    symbols named after their ``dim_param`` (or generated).  ``divisors``
    (``{"H": 32}``; also read from the model metadata key ``dynnet.rdp.divisors`` as
    JSON) declares that a symbol is always a multiple of an int: RDP then writes the
    input dim as ``32*(H//32)`` so that floor and ceil divisions agree, and
    ``bind`` rejects sizes that break the promise.

    ``strict``: a transfer function that fails on its own (a bug in RDP, not an invalid model)
    raises ``TransferError``; lenient (the default where ``DYNNET_RDP_STRICT`` is unset), its
    node's outputs are nac and the first failure per operator type is logged as a warning.
    None: ``DYNNET_RDP_STRICT`` decides.
    """
    # the analysis allocates many small acyclic objects: the cyclic GC would only
    # re-scan them (half the time on 50k-node graphs), so pause it for the call
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _analyze(model_or_path, input_shapes, divisors,
                        settings().planner.rdp_strict if strict is None else strict)
    finally:
        if was_enabled:
            gc.enable()


def _analyze(model_or_path, input_shapes, divisors, strict: bool) -> AnalysisResult:
    t0 = time.perf_counter()
    model = load_model(model_or_path, check=False, external_data=False)  # the graph, not the weights
    label = _label(model_or_path)
    if len(model.functions):
        # model-local functions (e.g. torch.onnx dynamo exports): analyse their bodies
        try:
            model = onnx_proto.onnx_library().inliner.inline_local_functions(model)
        except Exception as exc:  # noqa: BLE001 - calls stay unknown ops (nac + warning)
            warnings.warn(f"RDP: could not inline model-local functions: {exc}", RuntimeWarning, stacklevel=3)
    g = model.graph
    init_names = {i.name for i in g.initializer}
    pins = dict(input_shapes or {})
    graph_inputs = [i for i in g.input if i.name not in init_names]
    names = {i.name for i in graph_inputs}
    for k in pins:
        if k not in names:
            raise ValueError(f"input_shapes names {k!r}, which is not a model input (inputs: {sorted(names)})")

    symbols: dict[str, SymbolInfo] = {}
    order: dict[str, int] = {}
    raw_inputs: dict[str, tuple | None] = {}
    input_types: dict[str, int] = {}
    taken: set[str] = set()
    for i in graph_inputs:
        for d in (i.type.tensor_type.shape.dim if i.type.HasField("tensor_type") else []):
            if d.HasField("dim_param") and _usable(d.dim_param):
                taken.add(d.dim_param)
    pin_subst: dict[str, int] = {}
    for i in graph_inputs:
        tt = i.type.tensor_type if i.type.HasField("tensor_type") else None
        if tt is None or not tt.HasField("shape"):
            raw_inputs[i.name] = None
            input_types[i.name] = tt.elem_type if tt is not None else 0
            if i.name in pins:
                raw_inputs[i.name] = tuple(int(x) for x in pins[i.name])
            continue
        input_types[i.name] = tt.elem_type
        pin = pins.get(i.name)
        if pin is not None and len(pin) != len(tt.shape.dim):
            raise ValueError(f"input_shapes[{i.name!r}] has rank {len(pin)}, the model input has rank "
                             f"{len(tt.shape.dim)}")
        dims: list[Dim] = []
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value >= 0 and not d.HasField("dim_param"):
                dim: Dim = int(d.dim_value)
                if pin is not None and int(pin[axis]) != dim:
                    raise ValueError(f"input_shapes[{i.name!r}] axis {axis} = {pin[axis]} but the model fixes it "
                                     f"to {dim}")
            else:
                original = d.dim_param if d.HasField("dim_param") else "?"
                sname = original if _usable(original) else _gen_name(i.name, axis, taken)
                taken.add(sname)
                if sname not in symbols:
                    symbols[sname] = SymbolInfo(i.name, axis, original)
                    order[sname] = len(order)
                dim = sym(sname)
                if pin is not None:
                    v = int(pin[axis])
                    if v < 0:
                        raise ValueError(f"input_shapes[{i.name!r}] axis {axis}: negative size {v}")
                    if sname in pin_subst and pin_subst[sname] != v:
                        raise ValueError(f"input_shapes bind symbol {sname} to {pin_subst[sname]} and {v}")
                    pin_subst[sname] = v
            dims.append(dim)
        raw_inputs[i.name] = tuple(dims)

    divs: dict[str, int] = {}
    for prop in model.metadata_props:
        if prop.key == DIVISORS_KEY:
            try:
                divs.update({str(k): int(v) for k, v in json.loads(prop.value).items()})
            except (ValueError, AttributeError) as exc:
                raise ValueError(f"metadata {DIVISORS_KEY} is not a JSON object of ints: {exc}") from exc
    divs.update(divisors or {})
    div_subst: dict[str, Dim] = {}
    for sname, m in divs.items():
        if sname not in symbols:
            if divisors and sname in divisors:
                raise ValueError(f"divisors names {sname!r}, which is not an input symbol ({sorted(symbols)})")
            continue
        if int(m) < 1:
            raise ValueError(f"divisor of {sname} must be a positive int, got {m}")
        if sname in pin_subst:
            if pin_subst[sname] % int(m):
                raise ValueError(f"input_shapes bind {sname} to {pin_subst[sname]}, not a multiple of {m}")
            continue
        if int(m) > 1:
            div_subst[sname] = mul(int(m), floordiv(sym(sname), int(m)))
    raw_inputs = {k: None if v is None else tuple(substitute(d, div_subst) for d in v) for k, v in raw_inputs.items()}

    opset = default_opset(model)
    subst: dict[str, Dim] = dict(pin_subst)
    warned: set[str] = set()
    rounds = 0
    constraints: list = []
    while True:
        rounds += 1
        inputs: dict[str, TensorInfo] = {}
        for name, in_dims in raw_inputs.items():
            if in_dims is None:
                inputs[name] = nac("model input without a shape", input_types[name])
            else:
                inputs[name] = shaped(tuple(substitute(d, subst) for d in in_dims), input_types[name])
        analyzer = GraphAnalyzer(opset, warned, strict=strict)
        res = analyzer.run(g, inputs)
        eliminable = {s: o for s, o in order.items() if s not in subst}
        new, _bad = derive_substitutions(res.constraints, eliminable)
        constraints = res.constraints
        if not new or rounds > len(order) + 1:
            break
        subst = {k: substitute(v, new) for k, v in subst.items()}
        subst.update(new)

    # tensors: graph inputs then node outputs (initializers are constants, left out)
    tensors: dict[str, TensorInfo] = {}
    for name in raw_inputs:
        tensors[name] = res.state[name]
    for rec in res.nodes:
        for o in rec.outputs:
            if o and o in res.state:
                tensors[o] = res.state[o]
    kinds = {k: v.kind for k, v in tensors.items()}
    recs = [res.nodes[i] for i in res.order]
    regions, node_region = find_regions(recs, kinds)
    aliases = {s: v for s, v in subst.items() if s in symbols and s not in pin_subst}
    alias_info = {s: symbols[s] for s in aliases}
    live_symbols = {s: info for s, info in symbols.items() if s not in aliases and s not in pin_subst}
    # remaining requirements (after substitution) are re-checked by bind()
    remaining: list[tuple[Dim, Dim, str]] = []
    for a, b, why in constraints:
        a2 = substitute(a, subst)
        if b is None:  # requirement a >= 0
            if a2 is not None and not (isinstance(a2, int) and a2 >= 0):
                remaining.append((a2, None, why))
            continue
        b2 = substitute(b, subst)
        if a2 is not None and b2 is not None and a2 != b2:
            remaining.append((a2, b2, why))
    input_dims: dict[str, list[Dim] | None] = {}
    for name, raw in raw_inputs.items():
        final = tensors[name].dims
        input_dims[name] = None if raw is None or final is None else list(final)
    return AnalysisResult(
        model=label,
        seconds=time.perf_counter() - t0,
        symbols=live_symbols,
        inputs=input_dims,
        tensors=tensors,
        nodes=recs,
        regions=regions,
        node_region=node_region,
        constraints=remaining,
        aliases=aliases,
        alias_info=alias_info,
        unknown_ops=dict(analyzer.unknown_ops),
        rounds=rounds,
        divisors={k: int(v) for k, v in divs.items() if k in div_subst},
        constants={i.name: res.state[i.name] for i in g.initializer if i.name in res.state
                   and i.name not in tensors},
    )


__all__ = ["analyze", "Expr"]
