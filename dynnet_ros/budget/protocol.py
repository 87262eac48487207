"""Wire format between model nodes and the budget manager (JSON in std_msgs/String).

Plain JSON keeps the package free of custom message types (no rosidl build step), and the same
dictionaries are what tests and tools read. Schemas are documented in docs/budget.md.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

# Relative names: a graph started in a namespace (`dynnet up --namespace`) keeps its model nodes
# and its manager talking to each other, and to nobody else.
PROFILES_TOPIC = "dynnet/model_profiles"
BUDGETS_TOPIC = "dynnet/budgets"
BUDGET_PARAM = "memory_budget_mb"
PROTOCOL_VERSION = 1


def size_key(height: int, width: int) -> str:
    """The wire name of a model-input size class."""
    return f"{int(height)}x{int(width)}"


def _is_size(value: object) -> bool:
    if not isinstance(value, str):
        return False
    height, sep, width = value.partition("x")
    return bool(sep) and height.isdigit() and width.isdigit() and int(height) > 0 and int(width) > 0


def _opt_number(raw: dict, key: str, *, allow_none: bool = True) -> float | None:
    value = raw.get(key)
    if value is None:
        if allow_none:
            return None
        raise ValueError(f"profile field {key!r} is required")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"profile field {key!r} must be a finite number >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ModelProfile:
    """What one model node tells the manager about itself, about once a second.

    ``held_mb`` is the engine's current footprint (RSS growth since before the model loaded) —
    the quantity a budget bounds. ``budget_mb`` is the budget in force (None = unlimited).
    """

    node: str                                  # fully qualified node name, e.g. "/lane_node"
    min_mb: float | None = None                # smallest budget the engine accepts
    full_mb: float | None = None               # budget that runs the whole model in memory
    table: tuple[tuple[float, float], ...] = ()  # ((budget_mb, predicted_ms), ...)
    rss_mb: float | None = None
    held_mb: float | None = None
    budget_mb: float | None = None
    anon_held_mb: float | None = None          # anonymous part of held_mb (what MemAvailable lacks)
    #: model-input size ("HxW") of the frame the engine last ran (None: no frame yet)
    size: str | None = None
    #: the node's minimum per input size class it serves ("HxW" -> MB, frame buffers included)
    min_by_size: dict[str, float] = field(default_factory=dict)
    #: False until the engine ran a frame: the bounds are estimates the manager does not budget against
    measured: bool = True
    version: int = PROTOCOL_VERSION

    def to_json(self) -> str:
        data = asdict(self)
        data["table"] = [list(p) for p in self.table]
        return json.dumps(data, separators=(",", ":"))

    def size_min_mb(self) -> float | None:
        """The largest minimum over the current and the announced size classes (None: none known)."""
        values = [v for v in (self.min_mb, *self.min_by_size.values()) if v is not None]
        return max(values) if values else None

    @classmethod
    def from_json(cls, text: str) -> "ModelProfile":
        """Parse and validate; a malformed profile raises ValueError naming the field."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"profile is not JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ValueError("profile must be a JSON object")
        node = raw.get("node")
        if not isinstance(node, str) or not node.strip():
            raise ValueError("profile field 'node' must be a non-empty string")
        table_raw = raw.get("table") or []
        if not isinstance(table_raw, list):
            raise ValueError("profile field 'table' must be a list of [mb, ms] pairs")
        table = []
        for point in table_raw:
            if (not isinstance(point, (list, tuple)) or len(point) != 2
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                               and math.isfinite(v) and v >= 0 for v in point)):
                raise ValueError(f"profile table entry {point!r} is not [mb >= 0, ms >= 0]")
            table.append((float(point[0]), float(point[1])))
        size = raw.get("size")
        if size is not None and not _is_size(size):
            raise ValueError(f"profile field 'size' must be an \"HxW\" string, got {size!r}")
        by_size_raw = raw.get("min_by_size") or {}
        if not isinstance(by_size_raw, dict) or not all(_is_size(k) for k in by_size_raw):
            raise ValueError(f"profile field 'min_by_size' must map \"HxW\" to MB, got {by_size_raw!r}")
        min_by_size = {k: _opt_number(by_size_raw, k, allow_none=False) for k in by_size_raw}
        measured = raw.get("measured", True)
        if not isinstance(measured, bool):
            raise ValueError(f"profile field 'measured' must be true or false, got {measured!r}")
        version = raw.get("version", PROTOCOL_VERSION)
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError(f"profile field 'version' must be an integer, got {version!r}")
        return cls(node=node if node.startswith("/") else "/" + node,
                   min_mb=_opt_number(raw, "min_mb"), full_mb=_opt_number(raw, "full_mb"),
                   table=tuple(sorted(table)), rss_mb=_opt_number(raw, "rss_mb"),
                   held_mb=_opt_number(raw, "held_mb"), budget_mb=_opt_number(raw, "budget_mb"),
                   anon_held_mb=_opt_number(raw, "anon_held_mb"), size=size,
                   min_by_size={k: v for k, v in min_by_size.items() if v is not None}, measured=measured,
                   version=version)


@dataclass(frozen=True)
class NodeBudgetReport:
    budget_mb: float | None        # value in force (acknowledged by the node's parameter service)
    target_mb: float               # what the policy wants (differs while hysteresis holds back)
    min_mb: float
    max_mb: float | None
    priority: float
    predicted_ms: float | None
    held_mb: float | None
    last_error: str | None = None  # the node's reason for the last rejected budget
    starved: bool = False          # the pool cannot cover this node's minimum (see BudgetReport.starved)


@dataclass(frozen=True)
class BudgetReport:
    """What the manager publishes on /dynnet/budgets after each evaluation."""

    stamp: float
    source: str
    available_mb: float
    held_mb: float
    reserve_mb: float
    total_mb: float
    pressure: bool
    infeasible: bool
    reason: str
    nodes: dict[str, NodeBudgetReport] = field(default_factory=dict)
    #: nodes whose minimum the pool cannot cover, by the priority rule (policy.allocate)
    starved: list[str] = field(default_factory=list)
    #: model nodes that published a profile but ran no frame yet: not budgeted until they have
    waiting: list[str] = field(default_factory=list)
    version: int = PROTOCOL_VERSION

    def to_json(self) -> str:
        def clean(value):
            if isinstance(value, float):
                return None if not math.isfinite(value) else round(value, 3)
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            return value
        return json.dumps(clean(asdict(self)), separators=(",", ":"))
