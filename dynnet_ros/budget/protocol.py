"""Wire format between model nodes and the budget manager (JSON in std_msgs/String).

Plain JSON keeps the package free of custom message types (no rosidl build step), and the same
dictionaries are what tests and tools read. Schemas are documented in docs/budget.md.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from dynnet_ros.budget.oom import OomAction

# Relative names: a graph started in a namespace (`dynnet up --namespace`) keeps its model nodes
# and its manager talking to each other, and to nobody else.
PROFILES_TOPIC = "dynnet/model_profiles"
BUDGETS_TOPIC = "dynnet/budgets"
#: a launcher's supervisor -> the budget manager: a node died (and whether memory killed it)
NODE_EVENTS_TOPIC = "dynnet/node_events"
BUDGET_PARAM = "memory_budget_mb"
#: a model node's parameter naming the budget manager that assigns its BUDGET_PARAM: the manager
#: sets both in one atomic call, and a hand-set budget is refused while that manager runs
OWNER_PARAM = "budget_owner"
PROTOCOL_VERSION = 1


def size_key(height: int, width: int) -> str:
    """The wire name of a model-input size class."""
    return f"{int(height)}x{int(width)}"


def _is_size(value: object) -> bool:
    if not isinstance(value, str):
        return False
    height, sep, width = value.partition("x")
    return bool(sep) and height.isdigit() and width.isdigit() and int(height) > 0 and int(width) > 0


def _json_object(text: str, what: str) -> dict:
    """A wire message's JSON object; ValueError saying ``what`` is malformed."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{what} must be a JSON object")
    return raw


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
    #: compute units the node's mapped stages may run on (``mapping: auto``): it asks for a share
    #: of each such unit's memory the manager is configured with
    units: tuple[str, ...] = ()
    #: the host the node runs on (``settings().host_id``); "" where the sender does not say
    host: str = ""
    version: int = PROTOCOL_VERSION

    def to_json(self) -> str:
        data = asdict(self)
        data["table"] = [list(p) for p in self.table]
        data["units"] = list(self.units)
        return json.dumps(data, separators=(",", ":"))

    def size_min_mb(self) -> float | None:
        """The largest minimum over the current and the announced size classes (None: none known)."""
        values = [v for v in (self.min_mb, *self.min_by_size.values()) if v is not None]
        return max(values) if values else None

    @classmethod
    def from_json(cls, text: str) -> ModelProfile:
        """Parse and validate; a malformed profile raises ValueError naming the field."""
        raw = _json_object(text, "profile")
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
        units = raw.get("units") or []
        if not isinstance(units, list) or not all(isinstance(u, str) and u.strip() for u in units):
            raise ValueError(f"profile field 'units' must be a list of unit names, got {units!r}")
        host = raw.get("host", "")
        if not isinstance(host, str):
            raise ValueError(f"profile field 'host' must be a string, got {host!r}")
        return cls(node=node if node.startswith("/") else "/" + node,
                   min_mb=_opt_number(raw, "min_mb"), full_mb=_opt_number(raw, "full_mb"),
                   table=tuple(sorted(table)), rss_mb=_opt_number(raw, "rss_mb"),
                   held_mb=_opt_number(raw, "held_mb"), budget_mb=_opt_number(raw, "budget_mb"),
                   anon_held_mb=_opt_number(raw, "anon_held_mb"), size=size,
                   min_by_size={k: v for k, v in min_by_size.items() if v is not None}, measured=measured,
                   units=tuple(u.strip() for u in units), host=host.strip(), version=version)


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
class OomReport:
    """One OOM cap in force, as /dynnet/budgets reports it (``event`` names the NodeEvent it answers)."""

    node: str
    cap_mb: float | None
    reserve_add_mb: float
    start_budget_mb: float | None
    reference_mb: float | None
    evidence: str
    remaining_s: float
    event: int | None = None

    @classmethod
    def from_action(cls, action: OomAction, now_s: float, event: int | None = None) -> OomReport:
        return cls(action.node, action.cap_mb, action.reserve_add_mb, action.start_budget_mb, action.reference_mb,
                   action.evidence, max(0.0, action.until_s - now_s), event)


@dataclass(frozen=True)
class NodeEvent:
    """What a supervisor tells the budget manager about a node's process (JSON on NODE_EVENTS_TOPIC).

    ``kind`` is ``oom_kill`` (killed for memory; ``evidence`` says how that is known) or ``exit``
    (any other death). ``event`` numbers the supervisor's events so an answer can name the one it
    answers (BudgetReport.oom_kills[].event).
    """

    node: str                      # fully qualified, e.g. "/robot1/depth_node"
    kind: str
    event: int
    exit_code: int
    pid: int
    evidence: str = ""
    restart_in_s: float | None = None  # None: the node is not restarted
    version: int = PROTOCOL_VERSION

    KINDS = ("oom_kill", "exit")

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> NodeEvent:
        """Parse and validate; ValueError naming the field at fault."""
        raw = _json_object(text, "node event")
        node, kind = raw.get("node"), raw.get("kind")
        if not isinstance(node, str) or not node.startswith("/"):
            raise ValueError(f"node event field 'node' must be a fully qualified node name, got {node!r}")
        if kind not in cls.KINDS:
            raise ValueError(f"node event field 'kind' must be one of {list(cls.KINDS)}, got {kind!r}")
        for key in ("event", "exit_code", "pid"):
            if isinstance(raw.get(key), bool) or not isinstance(raw.get(key), int):
                raise ValueError(f"node event field {key!r} must be an integer, got {raw.get(key)!r}")
        restart = raw.get("restart_in_s")
        if restart is not None and (isinstance(restart, bool) or not isinstance(restart, (int, float))
                                    or not math.isfinite(restart) or restart < 0):
            raise ValueError(f"node event field 'restart_in_s' must be a number >= 0 or null, got {restart!r}")
        evidence = raw.get("evidence", "")
        if not isinstance(evidence, str):
            raise ValueError(f"node event field 'evidence' must be a string, got {evidence!r}")
        return cls(node, kind, raw["event"], raw["exit_code"], raw["pid"], evidence,
                   None if restart is None else float(restart))


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
    #: OOM caps in force: nodes killed for memory and what the manager took away (budget/oom.py)
    oom_kills: list[OomReport] = field(default_factory=list)
    #: memory of each compute unit the manager is configured to share among mapped stages (MB)
    unit_memory_mb: dict[str, float] = field(default_factory=dict)
    #: per node that asked for units (ModelProfile.units): its share of each unit's memory (MB)
    unit_budgets: dict[str, dict[str, float]] = field(default_factory=dict)
    version: int = PROTOCOL_VERSION

    def to_json(self) -> str:
        def clean(value):
            if isinstance(value, float):
                return None if not math.isfinite(value) else round(value, 3)
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            if isinstance(value, list):
                return [clean(v) for v in value]
            return value
        return json.dumps(clean(asdict(self)), separators=(",", ":"))


def unit_budget(text: str, node: str) -> dict[str, float] | None:
    """``node``'s per-unit memory limits in a budget report (JSON on BUDGETS_TOPIC): {unit: MB},
    None when the report has no entry for the node; ValueError when the report is malformed."""
    raw = _json_object(text, "budget report")
    budgets = raw.get("unit_budgets", {})
    if not isinstance(budgets, dict):
        raise ValueError(f"budget report field 'unit_budgets' must map nodes to units, got {budgets!r}")
    mine = budgets.get(node)
    if mine is None:
        return None
    if not isinstance(mine, dict):
        raise ValueError(f"budget report: unit_budgets[{node!r}] must map units to MB, got {mine!r}")
    for unit, mb in mine.items():
        if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not math.isfinite(mb) or mb < 0:
            raise ValueError(f"budget report: unit_budgets[{node!r}][{unit!r}] must be a finite number >= 0, "
                             f"got {mb!r}")
    return {str(unit): float(mb) for unit, mb in mine.items()}
