"""OOM kills: tell one from any other SIGKILL, and decide how the budget manager answers it.

Why here (no ROS): the kernel's OOM killer ends a process with SIGKILL, the same signal a user's
``kill -9`` sends, so the exit status alone cannot say whether memory ran out. The evidence is
in kernel counters read around the death; the supervisor (`dynnet up`) reads them, and the
budget manager, told about an OOM kill, takes memory away from the DNNs before the node returns.
Parsers take file text (unit-tested on fixtures); ``read_signals`` touches the files.

Evidence, most definite first:

1. the OOM-kill counter of the memory cgroup the process was in rose (v2 ``memory.events``,
   v1 ``memory.oom_control``): a container or cgroup limit was hit;
2. the system's OOM-kill counter (``/proc/vmstat`` ``oom_kill``) rose: the kernel killed
   something for memory at that moment;
3. memory pressure (``/proc/pressure/memory``): tasks stalled on memory ("full" avg10 at or above
   ``OomRule.full_avg10_pct``, or ``full`` stall time grew by ``stall_ms`` since the last reading);
4. almost no memory available (``MemAvailable`` below ``low_available_fraction`` of the total).
"""
from __future__ import annotations

import math
import signal
from dataclasses import dataclass
from pathlib import Path

from dynnet_ros.budget.cgroup import CgroupPaths, find_cgroup
from dynnet_ros.procmem import parse_kb_fields

# --------------------------------------------------------------------------- parsers


@dataclass(frozen=True)
class Pressure:
    """``/proc/pressure/memory`` (PSI): share of time (%) tasks stalled on memory, and totals (µs)."""

    some_avg10: float
    full_avg10: float
    some_total_us: int
    full_total_us: int


def parse_psi(text: str) -> Pressure:
    """Parse PSI text (``some avg10=… total=…`` / ``full …``); ValueError if a line is missing."""
    lines: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        kind, _, rest = line.strip().partition(" ")
        if kind in ("some", "full"):
            lines[kind] = dict(item.split("=", 1) for item in rest.split() if "=" in item)
    try:
        return Pressure(float(lines["some"]["avg10"]), float(lines["full"]["avg10"]),
                        int(lines["some"]["total"]), int(lines["full"]["total"]))
    except (KeyError, ValueError) as exc:
        raise ValueError(f"unparseable memory pressure (PSI) text: {text.strip()[:120]!r}") from exc


def parse_oom_kills(text: str) -> int | None:
    """The ``oom_kill N`` line of a cgroup's memory.events / memory.oom_control or of /proc/vmstat
    (None where the kernel does not count OOM kills there)."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "oom_kill":
            try:
                return int(parts[1])
            except ValueError:
                return None
    return None


def oom_counter_file(paths: CgroupPaths) -> Path:
    """Where a memory cgroup counts its OOM kills."""
    return paths.directory / ("memory.events" if paths.version == 2 else "memory.oom_control")


# --------------------------------------------------------------------------- readings

@dataclass(frozen=True)
class MemorySignals:
    """One reading of everything that can show an OOM kill (None = not available here)."""

    cgroup: CgroupPaths | None = None        # the process's memory cgroup when it was last seen
    cgroup_oom_kills: int | None = None
    system_oom_kills: int | None = None
    pressure: Pressure | None = None
    available_fraction: float | None = None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def process_cgroup(pid: int) -> CgroupPaths | None:
    """The memory cgroup of a live process on this machine (None once it is gone, or without one).

    Always the real /proc: where a process's memory is limited is a fact about that process,
    whatever tree ``read_signals`` reads the system-wide counters from.
    """
    cgroup, mountinfo = _read(Path(f"/proc/{pid}/cgroup")), _read(Path("/proc/self/mountinfo"))
    if cgroup is None or mountinfo is None:
        return None
    return find_cgroup(cgroup, mountinfo)


def read_signals(root: Path = Path("/"), cgroup: CgroupPaths | None = None) -> MemorySignals:
    """Read the counters below ``root`` (``/``, or a prepared tree), and ``cgroup``'s OOM count."""
    cgroup_kills = None
    if cgroup is not None:
        text = _read(oom_counter_file(cgroup))
        cgroup_kills = None if text is None else parse_oom_kills(text)
    vmstat = _read(root / "proc/vmstat")
    psi_text = _read(root / "proc/pressure/memory")
    try:
        pressure = None if psi_text is None else parse_psi(psi_text)
    except ValueError:
        pressure = None
    fraction = None
    meminfo = _read(root / "proc/meminfo")
    if meminfo is not None:
        info = parse_kb_fields(meminfo)
        if info.get("MemTotal") and "MemAvailable" in info:
            fraction = info["MemAvailable"] / info["MemTotal"]
    return MemorySignals(cgroup, cgroup_kills, None if vmstat is None else parse_oom_kills(vmstat), pressure,
                         fraction)


# --------------------------------------------------------------------------- the verdict

@dataclass(frozen=True)
class OomRule:
    """Thresholds for the pressure evidence (see the module docstring)."""

    full_avg10_pct: float = 10.0
    stall_ms: float = 100.0
    low_available_fraction: float = 0.05


def oom_evidence(exit_code: int, before: MemorySignals, after: MemorySignals,
                 rule: OomRule = OomRule()) -> str | None:
    """Why a process that exited with ``exit_code`` was killed for memory, or None.

    ``before`` is a reading taken while the process was alive (its cgroup known), ``after``
    one taken when its death was noticed. Only a SIGKILL can be an OOM kill.
    """
    if exit_code != -signal.SIGKILL:
        return None
    if before.cgroup_oom_kills is not None and after.cgroup_oom_kills is not None \
            and after.cgroup_oom_kills > before.cgroup_oom_kills:
        where = "" if before.cgroup is None else f" {before.cgroup.directory}"
        return (f"its memory cgroup{where} counted {after.cgroup_oom_kills - before.cgroup_oom_kills} "
                f"OOM kill(s)")
    if before.system_oom_kills is not None and after.system_oom_kills is not None \
            and after.system_oom_kills > before.system_oom_kills:
        return f"the kernel counted {after.system_oom_kills - before.system_oom_kills} OOM kill(s) (/proc/vmstat)"
    if after.pressure is not None:
        if after.pressure.full_avg10 >= rule.full_avg10_pct:
            return f"memory pressure: tasks fully stalled on memory {after.pressure.full_avg10:.1f}% of the last 10 s"
        if before.pressure is not None:
            stalled_ms = (after.pressure.full_total_us - before.pressure.full_total_us) / 1e3
            if stalled_ms >= rule.stall_ms:
                return f"memory pressure: tasks fully stalled on memory for {stalled_ms:.0f} ms just before"
    if after.available_fraction is not None and after.available_fraction < rule.low_available_fraction:
        return f"only {100 * after.available_fraction:.1f}% of memory available"
    return None


# --------------------------------------------------------------------------- the answer

@dataclass(frozen=True)
class OomPolicy:
    """How much memory an OOM kill takes away from the DNNs, and for how long.

    The killed node's budget at its death (what it held, when it ran without one) is cut by
    ``shrink_frac``: its budget is capped there. Where the node's minimum stops the cut, the
    rest is added to the reserve instead, so every OOM kill frees the same share whatever the
    node's minimum. Without any figure for the node, the reserve grows by ``unknown_mb``. A cap
    and its reserve are lifted ``hold_s`` after the node's last OOM kill (memory needs move).
    """

    shrink_frac: float = 0.25
    unknown_mb: float = 64.0
    hold_s: float = 600.0

    def __post_init__(self) -> None:
        if not (0.0 < self.shrink_frac < 1.0):
            raise ValueError(f"shrink_frac must be in (0, 1), got {self.shrink_frac!r}")
        for name in ("unknown_mb", "hold_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class OomAction:
    """The budget manager's answer to one OOM kill of ``node``."""

    node: str
    cap_mb: float | None        # the node's budget from now on is at most this (None: no figure)
    reserve_add_mb: float       # added to the reserve while the cap holds
    start_budget_mb: float | None  # the budget the respawned node starts with
    reference_mb: float | None  # the node's budget (else what it held) at its death: the cut's base
    evidence: str
    until_s: float              # when cap and reserve are lifted (planner clock)


def oom_action(node: str, now_s: float, evidence: str, *, budget_mb: float | None, held_mb: float | None,
               min_mb: float, policy: OomPolicy = OomPolicy()) -> OomAction:
    """Cap ``node`` below what it had when it was killed (see OomPolicy)."""
    until = now_s + policy.hold_s
    reference = budget_mb if budget_mb else held_mb
    if not reference or reference <= 0:
        return OomAction(node, None, policy.unknown_mb, None, None, evidence, until)
    cut = policy.shrink_frac * reference
    cap = max(min_mb, reference - cut)
    reserve_add = max(0.0, cut - (reference - cap))
    return OomAction(node, cap, reserve_add, cap, reference, evidence, until)
