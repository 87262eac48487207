"""Every ``DYNNET_*`` environment variable, parsed once into typed, frozen settings.

Why one module: deployment settings travel in the environment (a launch file, a shell, a
container), while the code that uses them sits deep in the engine. Reading the environment in
one place gives one spelling, one default and one error message per variable, and lets every
other module take plain typed values. ``VARIABLES`` is the README's table (``markdown_table()``
prints it; a test keeps the two equal).

Modules call ``settings()`` when they need a value, never at import time, so a variable set
before the call (by a test's ``monkeypatch.setenv`` or a parent process) is honoured.
``load_settings(env)`` parses any mapping, for callers and tests that pass their own.
"""
from __future__ import annotations

import math
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

PREFIX = "DYNNET_"
#: Planner profiles (the planned CPU backend maps each name to its planner options).
PLAN_PROFILES: tuple[str, ...] = ("auto", "memory", "balanced")
TRT_PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "fp16", "int8", "auto")
#: How a node process spins: rclpy's MultiThreadedExecutor, or its C++ EventsExecutor (one thread).
EXECUTORS: tuple[str, ...] = ("threads", "events")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _cache_home() -> Path:
    return Path.home() / ".cache" / "dynnet_ros"


@dataclass(frozen=True)
class Variable:
    """One documented variable: what the README table shows for it."""

    name: str
    kind: str      # path | text | int | number | bool | choice
    default: str   # as shown to users
    meaning: str


VARIABLES: tuple[Variable, ...] = (
    Variable("DYNNET_ZOO_DIR", "path", "`~/.cache/dynnet_ros/zoo`", "demo models built by `dynnet zoo build`"),
    Variable("DYNNET_LAYOUT_DIR", "path", "`~/.cache/dynnet_ros/layout`",
             "onnxruntime's blocked-layout rewrite of each model, and onnx-checker verdicts (`checked/`)"),
    Variable("DYNNET_SWAP_DIR", "path", "`~/.cache/dynnet_ros/swap`", "streamed weight files"),
    Variable("DYNNET_MAP_DIR", "path", "`~/.cache/dynnet_ros/map`",
             "`dynnet map profile` measurements; `dynnet map search` results for `mapping: auto`; runtime costs "
             "fitted by `dynnet map search --measure`, per hardware"),
    Variable("DYNNET_PLAN_PROFILE", "choice", "`auto`",
             "planner profile of the `cpu` backend: `auto` (least peak that runs within 1.05x onnxruntime's "
             "time, timed once per model file), `memory` (least peak, untimed) or `balanced` (fewer, larger "
             "sessions)"),
    Variable("DYNNET_RDP_STRICT", "bool", "`0`",
             "RDP: an internal error of a transfer function raises instead of making the node's outputs nac "
             "(the test suite sets it, so such a bug fails a test; a serving process keeps the lenient nac and "
             "logs a warning once per operator type)"),
    Variable("DYNNET_TRT_PRECISION", "choice", "`fp32`",
             "TensorRT precision: `fp32` (TF32 off), `tf32`, `fp16`, `int8` (Q/DQ models), `auto`"),
    Variable("DYNNET_TRT_DLA_CORE", "int", "unset", "`0`/`1`: ask for DLA0/DLA1 (Jetson); unset, `none` or `-1`: GPU"),
    Variable("DYNNET_TRT_GPU_FALLBACK", "bool", "`1`", "DLA: let unsupported layers run on the GPU"),
    Variable("DYNNET_TRT_SHAPES", "text", "model defaults",
             "shape distribution, e.g. `H=224:1280:32,W=224:1280:32` or `H=480\\|736,W=640`"),
    Variable("DYNNET_TRT_MAX_PROFILES", "int", "`4`", "upper bound on optimisation profiles per engine (1-64)"),
    Variable("DYNNET_TRT_BUDGET_MB", "number", "unset", "memory budget (MB) the TensorRT workspace is derived from"),
    Variable("DYNNET_TRT_WORKSPACE_MB", "number", "unset",
             "explicit TensorRT workspace (MB; overrides the budget rule)"),
    Variable("DYNNET_TRT_CACHE", "path", "`~/.cache/dynnet_ros/trt`", "TensorRT engine cache"),
    Variable("DYNNET_TRT_REBUILD", "bool", "`1`", "rebuild in the background when a shape misses every profile"),
    Variable("DYNNET_TRT_DEVICE", "int", "`0`", "CUDA device index"),
    Variable("DYNNET_EXECUTOR", "choice", "`threads`",
             "how a node process spins: `threads` (rclpy's MultiThreadedExecutor: a model load in a parameter "
             "change does not hold up frames) or `events` (rclpy's EventsExecutor: callbacks cost far less "
             "CPU and GIL, which a node serving several cameras needs; docs/ros.md)"),
    Variable("DYNNET_HOST_ID", "text", "host name + `/etc/machine-id`",
             "the host this process runs on, as its nodes' memory profiles name it: a budget manager splits "
             "only its own host's memory, among its own host's nodes"),
)


@dataclass(frozen=True)
class CacheSettings:
    """Where the on-disk caches live (each entry is keyed by content, so any folder is safe)."""

    zoo_dir: Path
    layout_dir: Path
    swap_dir: Path
    map_dir: Path


@dataclass(frozen=True)
class PlannerSettings:
    profile: str         # one of PLAN_PROFILES
    rdp_strict: bool     # a transfer function's internal error raises (analyze(strict=None) reads it)


@dataclass(frozen=True)
class TensorRTSettings:
    """Raw TensorRT choices; ``TrtOptions`` checks their ranges and combinations."""

    precision: str               # one of TRT_PRECISIONS
    dla_core: int | None         # None: GPU only
    gpu_fallback: bool
    shapes: str | None           # None: the model's defaults
    max_profiles: int
    budget_mb: float | None
    workspace_mb: float | None
    cache_dir: Path
    rebuild_on_miss: bool
    device: int


@dataclass(frozen=True)
class Settings:
    cache: CacheSettings
    planner: PlannerSettings
    tensorrt: TensorRTSettings
    host_id: str   # this machine, as memory profiles name it (several computers share one ROS domain)
    executor: str  # threads | events (EXECUTORS)


def _machine_host_id(machine_id_file: Path = Path("/etc/machine-id")) -> str:
    """``hostname/<machine-id prefix>``: readable, and distinct where two computers share a host
    name (a fresh image's ``ubuntu``); the host name alone where there is no machine id."""
    try:
        machine = machine_id_file.read_text().strip()[:12]
    except OSError:
        machine = ""
    return f"{socket.gethostname()}/{machine}" if machine else socket.gethostname()


class _Reader:
    """Typed reads from an env mapping; an empty value counts as unset."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def raw(self, name: str) -> str | None:
        value = self.env.get(name)
        return value.strip() if value is not None and value.strip() else None

    def path(self, name: str, default: Path) -> Path:
        raw = self.raw(name)
        return Path(raw).expanduser() if raw is not None else default

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        raw = self.raw(name)
        value = default if raw is None else raw.lower()
        if value not in choices:
            raise ValueError(f"{name}={raw!r}: choose one of {', '.join(choices)}")
        return value

    def integer(self, name: str, default: int) -> int:
        value = self.optional_integer(name)
        return default if value is None else value

    def optional_integer(self, name: str) -> int | None:
        raw = self.raw(name)
        if raw is None:
            return None
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not an integer") from None

    def number(self, name: str) -> float | None:
        raw = self.raw(name)
        if raw is None:
            return None
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not a number") from None
        if not math.isfinite(value):
            raise ValueError(f"{name}={raw!r} is not a finite number")
        return value

    def flag(self, name: str, default: bool) -> bool:
        raw = self.raw(name)
        if raw is None:
            return default
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise ValueError(f"{name}={raw!r} must be 0 or 1")


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Parse ``env`` (default: ``os.environ``); ValueError naming the variable for a bad value."""
    read = _Reader(os.environ if env is None else env)
    home = _cache_home()
    dla = read.raw("DYNNET_TRT_DLA_CORE")
    return Settings(
        cache=CacheSettings(zoo_dir=read.path("DYNNET_ZOO_DIR", home / "zoo"),
                            layout_dir=read.path("DYNNET_LAYOUT_DIR", home / "layout"),
                            swap_dir=read.path("DYNNET_SWAP_DIR", home / "swap"),
                            map_dir=read.path("DYNNET_MAP_DIR", home / "map")),
        planner=PlannerSettings(profile=read.choice("DYNNET_PLAN_PROFILE", PLAN_PROFILES, "auto"),
                                rdp_strict=read.flag("DYNNET_RDP_STRICT", False)),
        tensorrt=TensorRTSettings(
            precision=read.choice("DYNNET_TRT_PRECISION", TRT_PRECISIONS, "fp32"),
            dla_core=None if dla is not None and dla.lower() in ("none", "-1")
            else read.optional_integer("DYNNET_TRT_DLA_CORE"),
            gpu_fallback=read.flag("DYNNET_TRT_GPU_FALLBACK", True),
            shapes=read.raw("DYNNET_TRT_SHAPES"),
            max_profiles=read.integer("DYNNET_TRT_MAX_PROFILES", 4),
            budget_mb=read.number("DYNNET_TRT_BUDGET_MB"),
            workspace_mb=read.number("DYNNET_TRT_WORKSPACE_MB"),
            cache_dir=read.path("DYNNET_TRT_CACHE", home / "trt"),
            rebuild_on_miss=read.flag("DYNNET_TRT_REBUILD", True),
            device=read.integer("DYNNET_TRT_DEVICE", 0),
        ),
        host_id=read.raw("DYNNET_HOST_ID") or _machine_host_id(),
        executor=read.choice("DYNNET_EXECUTOR", EXECUTORS, "threads"),
    )


@lru_cache(maxsize=8)
def _parsed(items: tuple[tuple[str, str], ...]) -> Settings:
    return load_settings(dict(items))


def settings() -> Settings:
    """This process's settings, parsed once per distinct set of ``DYNNET_*`` values."""
    return _parsed(tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(PREFIX))))


def markdown_table() -> str:
    """The README's table of variables (``python -m dynnet_ros.settings`` prints it)."""
    rows = ["| Variable | Type | Default | Meaning |", "|---|---|---|---|"]
    rows += [f"| `{v.name}` | {v.kind} | {v.default} | {v.meaning} |" for v in VARIABLES]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
