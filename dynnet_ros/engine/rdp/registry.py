"""Operator registry: ONNX op type -> dynamism category + forward transfer function.

Categories (SoD² §3): ISDO (input shape determines output), ISDOS (input shape
determines output shape), ISVDOS (input shape and values determine output shape),
EDO (execution determines output).  A transfer function takes a :class:`Ctx` and
returns the output :class:`TensorInfo` list (missing trailing entries become nac).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dynnet_ros.engine.modelio.onnx_proto import NodeProto, get_attribute_value, to_array

from .expr import Dim, Expr, bounds
from .lattice import TensorInfo

CATEGORIES = ("ISDO", "ISDOS", "ISVDOS", "EDO")


@dataclass(frozen=True)
class OpDef:
    op_type: str
    category: str
    family: str
    fn: Callable[[Ctx], list]
    note: str = ""
    values_since: int = 0  # opset from which a shape-defining attribute became an input (ISVDOS)

    def category_at(self, opset: int) -> str:
        """Before ``values_since`` the op read its shape parameters from attributes: ISDOS."""
        if self.category == "ISVDOS" and opset < self.values_since:
            return "ISDOS"
        return self.category


REGISTRY: dict[str, OpDef] = {}
# custom-domain ops understood by name (the paper's Switch/Combine pair), or by "domain:name"
# where an op type exists in several domains (onnxruntime's com.microsoft.nchwc Conv)
CUSTOM: dict[str, OpDef] = {}


def custom_op(domain: str, op_type: str) -> OpDef | None:
    """The rule for a non-default-domain op: a domain-specific one first, then by name."""
    return CUSTOM.get(f"{domain}:{op_type}") or CUSTOM.get(op_type)


def register(names: str | list[str], category: str, family: str, note: str = "",
             custom: bool = False, values_since: int | dict = 0, domain: str | None = None):
    """Decorator: register ``fn`` for every op type in ``names`` (``domain``: only in that domain)."""
    assert category in CATEGORIES
    if isinstance(names, str):
        names = names.split()

    def deco(fn):
        for n in names:
            since = values_since.get(n, 0) if isinstance(values_since, dict) else values_since
            key = f"{domain}:{n}" if domain else n
            (CUSTOM if custom or domain else REGISTRY)[key] = OpDef(n, category, family, fn, note, since)
        return fn

    return deco


class ShapeError(Exception):
    """The node is invalid for the shapes seen (the model could not run)."""


@dataclass
class Ctx:
    """Everything a transfer function may look at for one node."""

    node: NodeProto
    name: str
    inputs: list  # TensorInfo | None (None = absent optional input)
    opset: int
    analyzer: Any = None  # fixpoint.GraphAnalyzer, for subgraphs
    scope: Any = None  # outer-scope lookup for subgraphs
    constraints: list = field(default_factory=list)
    _attrs: dict | None = None

    @property
    def attrs(self) -> dict:
        if self._attrs is None:
            d = {}
            for a in self.node.attribute:
                if a.type == a.GRAPH:
                    d[a.name] = a.g
                elif a.type == a.GRAPHS:
                    d[a.name] = list(a.graphs)
                elif a.type == a.TENSOR:
                    d[a.name] = to_array(a.t)
                else:
                    v = get_attribute_value(a)
                    if isinstance(v, bytes):
                        v = v.decode("utf-8", "replace")
                    elif isinstance(v, list) and v and isinstance(v[0], bytes):
                        v = [x.decode("utf-8", "replace") for x in v]
                    d[a.name] = v
            self._attrs = d
        return self._attrs

    def attr(self, name: str, default=None):
        return self.attrs.get(name, default)

    @property
    def n_out(self) -> int:
        return len(self.node.output)

    def inp(self, i: int) -> TensorInfo | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def values(self, i: int) -> tuple | None:
        t = self.inp(i)
        return None if t is None else t.value

    def int_values(self, i: int) -> list[int] | None:
        """Fully known integer values of input i, else None."""
        v = self.values(i)
        if v is None or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v):
            if v is not None and all(isinstance(x, bool) for x in v):
                return [int(x) for x in v]
            return None
        return [int(x) for x in v]

    def dim_values(self, i: int) -> list[Dim] | None:
        """Values of an integer input as dims (ints / Exprs / None per element)."""
        v = self.values(i)
        if v is None:
            return None
        out: list[Dim] = []
        for x in v:
            if isinstance(x, bool):
                out.append(int(x))
            elif isinstance(x, (int, Expr)) or x is None:
                out.append(x)
            elif isinstance(x, (float, np.floating)) and float(x).is_integer():
                out.append(int(x))
            else:
                out.append(None)
        return out

    def float_values(self, i: int) -> list[float] | None:
        v = self.values(i)
        if v is None or not all(isinstance(x, (int, float)) and not isinstance(x, bool) or isinstance(x, bool)
                                for x in v):
            return None
        return [float(x) for x in v]

    def constrain(self, a: Dim, b: Dim, why: str) -> None:
        """Record a runtime equality the model needs (backward transfer)."""
        if a is None or b is None or a == b:
            return
        self.constraints.append((a, b, f"{self.name}: {why}"))

    def require_nonneg(self, e: Dim, why: str) -> None:
        """Record ``e >= 0`` as a requirement of the inputs RDP's answer is valid for."""

        if e is None:
            return
        lo, _ = bounds(e)
        if lo >= 0:
            return
        if isinstance(e, int):
            raise ShapeError(f"{why} ({e} < 0)")
        self.constraints.append((e, None, f"{self.name}: {why}"))

    def fail(self, why: str) -> list:
        raise ShapeError(why)

