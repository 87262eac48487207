"""ONNX analysis, planning and execution. No ROS imports anywhere below this package.

``from dynnet_ros.engine import Engine`` is the public entry point, with ``BudgetExceeded`` (a
frame refused under ``Engine(over_budget="raise")``) and ``OverBudget`` (what
``engine_stats().over_budget`` reports). They are re-exported lazily (PEP 562): the facade sits
above this package's lower layers (``modelio``, ``rdp``, ``plan``, ``runtime``, ``backends``, and
``swap``, ``budget`` and ``mapper`` that import them through this ``__init__``), so importing it
here would make every first import of a lower module run the whole engine and close an import
cycle.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dynnet_ros.engine.engine import Engine
    from dynnet_ros.engine.runtime.base import BudgetExceeded, OverBudget

__all__ = ["BudgetExceeded", "Engine", "OverBudget"]


def __getattr__(name: str) -> object:
    if name == "Engine":
        # lazy re-export: the facade imports swap/, which imports this package's lower layers
        from dynnet_ros.engine.engine import Engine
        return Engine
    if name in ("BudgetExceeded", "OverBudget"):
        # lazy re-export, like the facade whose budget policy raises and reports them
        from dynnet_ros.engine.runtime import base
        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
