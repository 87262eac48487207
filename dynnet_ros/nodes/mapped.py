"""A model node's mapped mode: its model's stages on compute units, answering at the first
confident exit (dynnet_ros.mapper), behind the node's ``mapping``, ``exit_threshold`` and
``deadline_ms`` parameters.

Why a module: the node stays a thin adapter. This turns the three parameters into a running
``StageExecutor`` (or None: unmapped, the Engine runs frames) and its diagnostics; the node swaps
it in between two frames, so a change drops at most the frame in flight, and a mapping that does
not load is refused with its reason while the previous one keeps serving.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dynnet_ros.mapper.build import build_stages
from dynnet_ros.mapper.mapping import load_mapping
from dynnet_ros.mapper.runtime import StageExecutor
from dynnet_ros.units import MB

MAPPING_PARAMS = ("mapping", "exit_threshold", "deadline_ms")


@dataclass(frozen=True)
class MappedSettings:
    """The node parameters of mapped mode."""

    mapping: str            # mapping file; "" = unmapped
    exit_threshold: float   # < 0: the mapping file's thresholds; else every early exit's
    deadline_ms: float      # 0: the mapping file's (off when it has none); > 0: anytime mode

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "MappedSettings":
        return cls(str(params["mapping"]), float(params["exit_threshold"]), float(params["deadline_ms"]))


def open_mapped(model_path: str, settings: MappedSettings, budget_mb: float | None) -> StageExecutor | None:
    """The mapped executor for ``model_path`` (None when ``settings.mapping`` is empty); ValueError
    with the reason when the mapping file, its partition or its units do not fit the model."""
    if not settings.mapping:
        return None
    mapping = load_mapping(settings.mapping)
    stage_set = build_stages(model_path, mapping.partition)
    executor = StageExecutor(stage_set, mapping, budget_bytes=None if not budget_mb else int(budget_mb * MB))
    try:
        tune(executor, settings)
    except ValueError:
        executor.close()
        raise
    return executor


def tune(executor: StageExecutor, settings: MappedSettings) -> None:
    """Apply ``exit_threshold`` and ``deadline_ms`` to a running executor (from the next frame)."""
    file_thresholds = executor.mapping.thresholds
    if settings.exit_threshold >= 0:
        executor.set_thresholds([settings.exit_threshold] * (len(file_thresholds) - 1) + [None])
    else:
        executor.set_thresholds(list(file_thresholds))
    executor.set_deadline(settings.deadline_ms if settings.deadline_ms > 0 else executor.mapping.deadline_ms)


def mapped_diagnostics(executor: StageExecutor | None, mapping: str) -> dict[str, Any]:
    """The /diagnostics values of mapped mode: the exit histogram, each unit's busy fraction, the
    stages' times, measured mean latency beside the mapping file's prediction (0: none given) and
    whether the last published output came from an early exit."""
    if executor is None:
        return {"mapping": mapping, "mapped": False}
    details = executor.details()
    values: dict[str, Any] = {"mapping": mapping, "mapped": True,
                              "mapped.units": ",".join(details["mapping"]),
                              "mapped.thresholds": ",".join("-" if t is None else f"{t:g}"
                                                            for t in details["thresholds"]),
                              "mapped.deadline_ms": details["deadline_ms"] or 0.0,
                              "mapped.frames": details["frames"],
                              "mapped.measured_latency_ms": details["mean_latency_ms"] or 0.0,
                              "mapped.predicted_latency_ms": details["predicted_latency_ms"] or 0.0,
                              "mapped.last_exit": -1 if details["last_exit"] is None else details["last_exit"],
                              "mapped.last_early_exit": bool(details["last_early"]),
                              "mapped.last_deadline_hit": bool(details["last_deadline_hit"])}
    for index, count in details["exit_histogram"].items():
        values[f"mapped.exit_histogram.{index}"] = count
    for unit, busy in details["busy_fraction"].items():
        values[f"mapped.busy_fraction.{unit}"] = busy
    for index, ms in details["stage_ms"].items():
        values[f"mapped.stage_ms.{index}"] = ms
    return values
