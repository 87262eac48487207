"""Simulated stage costs on a board described only by its hardware file (no board, no profile).

Why: the paper's comparison (the search's pick against GPU-only and DLA-only on a Jetson) needs
per-unit costs, and without the board they can only come from a model of it. This module prices a
stage on a GPU or DLA from the hardware file's peak throughput (``tops`` of each DVFS level), its
active power and its exchange cost, over the stage's own layers (FLOPs and bytes from ONNX shape
inference). Every figure made from it is *simulated* and must be labelled so.

The model, per layer on a unit at a level:

    ms = max(FLOPs / (tops x PRECISION x EFFICIENCY[kind]),  bytes x exchange ms/MB x PRECISION)
         + LAUNCH_MS[kind]

a roofline over the level's peak (the runtime runs GPU and DLA stages in FP16: half the INT8
peak, half the float32 bytes) and the DRAM cost the hardware file gives for handing features over
(its default exchange), plus a fixed per-layer launch. On a DLA, the layers the DLA pre-screen
(``engine/backends/trt_dla.py``) refuses run on the GPU at its default level — the TensorRT
backend's GPU fallback — and each switch between DLA and GPU layers pays the file's exchange cost
between them for the tensor crossing. A stage whose layers mostly fail the pre-screen may not go
to a DLA at all (``model_search.dla_screen``). Energy: each layer's time × its unit level's power.
Units without ``tops`` (the CPU complexes of the presets) are not simulated.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dynnet_ros.engine.backends.trt_dla import NO_OPS, op_verdicts
from dynnet_ros.mapper.hardware import ComputeUnit, Hardware
from dynnet_ros.mapper.model_search import Calibration, costs_of, screened_units
from dynnet_ros.mapper.profiler import node_features, shapes_at
from dynnet_ros.mapper.search import StageCosts
from dynnet_ros.mapper.stages import StageSet

#: FP16 against the INT8 peak the files give: half the ops per second, half the bytes of float32.
PRECISION = 0.5
#: Share of the peak a convolution network's layers reach (assumed: small layers keep a GPU's
#: SMs partly idle; a DLA's fixed-function pipeline stays busier).
EFFICIENCY: Mapping[str, float] = {"gpu": 0.35, "dla": 0.6}
#: Fixed cost per layer (assumed: a kernel launch on the GPU, a layer's setup on the DLA).
LAUNCH_MS: Mapping[str, float] = {"gpu": 0.01, "dla": 0.02}


@dataclass(frozen=True)
class LayerCost:
    """One layer of a stage: its work and whether a DLA runs it."""

    name: str
    flops: float
    bytes: float            # float32 bytes read and written, weights included
    in_bytes: float         # float32 bytes of its data input (what crosses when the unit switches before it)
    dla_ok: bool


def simulated_units(hardware: Hardware) -> tuple[str, ...]:
    """The GPU and DLA units that have ``tops`` at every DVFS level."""
    return tuple(u.name for u in hardware.units if u.kind in EFFICIENCY and all(lv.tops for lv in u.dvfs))


def stage_layers(stage_set: StageSet, stage_inputs: Sequence[Mapping[str, np.ndarray]]) -> list[list[LayerCost]]:
    """Per stage: its layers' FLOPs, bytes and DLA verdicts at the inputs' static shapes."""
    out = []
    for stage, inputs in zip(stage_set.stages, stage_inputs):
        shapes = shapes_at(stage.model, inputs)
        verdicts = op_verdicts(stage.model, {name: tuple(array.shape) for name, array in inputs.items()})
        layers = []
        for node, verdict in zip(stage.model.graph.node, verdicts):
            if node.op_type in NO_OPS:
                continue
            features = node_features(node, shapes)
            if features is None:
                continue
            layers.append(LayerCost(verdict.node, features.flops,
                                    features.in_bytes + features.out_bytes + features.weight_bytes,
                                    features.in_bytes, verdict.supported))
        out.append(layers)
    return out


def layer_ms(layer: LayerCost, unit: ComputeUnit, level: str, hardware: Hardware) -> float:
    """The roofline time of one layer on ``unit`` at ``level`` (module docstring)."""
    tops = unit.level(level).tops
    if tops is None:
        raise ValueError(f"unit {unit.name} has no 'tops' at level {level!r}: it cannot be simulated")
    compute = layer.flops / (tops * 1e12 * PRECISION * EFFICIENCY[unit.kind]) * 1e3
    memory = layer.bytes * PRECISION / (1 << 20) * hardware.exchange_cost(unit.name, _other(hardware, unit)).ms_per_mb
    return max(compute, memory) + LAUNCH_MS[unit.kind]


def _other(hardware: Hardware, unit: ComputeUnit) -> str:
    """Any other unit (the default exchange's DRAM cost prices a layer's memory traffic)."""
    return next(u.name for u in hardware.units if u.name != unit.name)


def stage_cost(layers: Sequence[LayerCost], unit_name: str, level: str, hardware: Hardware) -> tuple[float, float]:
    """(latency ms, energy mJ) of a stage's layers on a unit; on a DLA the refused layers fall
    back to the GPU (its default level) and every switch between the two pays the exchange of the
    tensor crossing (the input of the first layer on the other unit)."""
    unit = hardware.unit(unit_name)
    power = unit.level(level).power_w
    gpu = next((u for u in hardware.units if u.kind == "gpu"), None)
    latency = energy = 0.0
    on_dla = True
    for layer in layers:
        if unit.kind != "dla" or layer.dla_ok:
            ms = layer_ms(layer, unit, level, hardware)
            if unit.kind == "dla" and not on_dla and gpu is not None:
                latency += hardware.exchange_cost(gpu.name, unit.name).cost_ms(int(layer.in_bytes * PRECISION))
            on_dla = True
            latency += ms
            energy += ms * power
            continue
        if gpu is None:
            raise ValueError(f"{layer.name} needs the GPU fallback, but {hardware.name} has no GPU")
        if on_dla:
            latency += hardware.exchange_cost(unit.name, gpu.name).cost_ms(int(layer.in_bytes * PRECISION))
        on_dla = False
        ms = layer_ms(layer, gpu, gpu.default_dvfs, hardware)
        latency += ms
        energy += ms * gpu.level().power_w
    return latency, energy


def simulated_costs(stage_set: StageSet, calibration: Calibration, stage_inputs: Sequence[Mapping[str, np.ndarray]],
                    hardware: Hardware) -> StageCosts:
    """StageCosts for the search from the simulation: each stage may go to every simulated GPU
    and to every simulated DLA whose pre-screen passes at these static shapes."""
    units = simulated_units(hardware)
    if not units:
        raise ValueError(f"hardware {hardware.name} has no GPU or DLA with 'tops' at every level: nothing to simulate")
    layers = stage_layers(stage_set, stage_inputs)
    allowed, why_not = screened_units(stage_set, stage_inputs, units, hardware)

    def cost(stage: int, unit: str, dvfs: str) -> tuple[float, float]:
        return stage_cost(layers[stage], unit, dvfs or hardware.unit(unit).default_dvfs, hardware)

    return costs_of(stage_set, calibration, allowed, why_not, cost)
