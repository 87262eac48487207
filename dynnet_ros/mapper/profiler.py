"""Measuring what the cost model learns from: layers and stages on each unit, sizes and widths.

Why two granularities: the search prices whole stages, and a stage measured as a whole on its
unit (its pinned onnxruntime session, or its TensorRT engine) is the exact figure the runtime will
see — the surrogate returns it unchanged. The single layers, each run alone at several input
sizes and channel fractions (a Conv keeping the first f of its output channels, as a width split
does), give the surrogate the spread of shapes it needs to price what was not measured.

Units: a CPU group runs through ``units.plan_unit`` / ``open_stage`` (the runtime's own pinned
sessions); a GPU or DLA needs TensorRT and is skipped with the reason where it is absent. DVFS is
not switched here (nvpmodel / cpufreq need root and change the whole board): rows carry the level
the unit is configured at (its default in the hardware file).

Power: on a Jetson the INA3221 monitors are read through hwmon or iio sysfs while a unit runs
(``PowerRails``); the energy is then *measured*. Xavier's rails: GPU, CPU, SOC, CV (the CV rail
is the DLAs' and the PVA's own); Orin's: VDD_GPU_SOC, VDD_CPU_CV (the DLAs share it with the
CPU), VIN_SYS_5V0. Elsewhere energy is *modelled*: the hardware file's power × time, and the rows
leave ``power_w`` empty so every consumer labels it so.
"""
from __future__ import annotations

import hashlib
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort

from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.modelio.onnx_proto import (
    ModelProto,
    NodeProto,
    TensorProto,
    from_array,
    make_graph,
    make_model,
    make_tensor_value_info,
    to_array,
)
from dynnet_ros.mapper.hardware import ComputeUnit, Hardware
from dynnet_ros.mapper.profile_io import Measurement, Profile
from dynnet_ros.mapper.stages import StageSet
from dynnet_ros.mapper.surrogate import LayerFeatures
from dynnet_ros.mapper.units import UnitPlan, open_stage, pin_current_thread, plan_unit, trt_reason

#: Channel fractions a Conv is measured at (a width split's shares).
FRACTIONS: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
#: Ops measured alone; others (shape arithmetic, Constant) cost nothing measurable on their own.
MEASURED_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "Relu", "Add", "Mul", "BatchNormalization",
                          "GlobalAveragePool", "AveragePool", "MaxPool", "Sigmoid", "Clip", "Concat", "Resize",
                          "Flatten", "Softmax"})
#: Rail names per unit kind on Jetson boards (first found wins) and what they include.
RAILS: dict[str, tuple[str, ...]] = {"gpu": ("GPU", "VDD_GPU_SOC"), "dla": ("CV", "VDD_CPU_CV"),
                                     "cpu": ("CPU", "VDD_CPU_CV")}
RAIL_NOTES: dict[str, str] = {"VDD_CPU_CV": "Orin's VDD_CPU_CV rail mixes the CPU and the DLAs: a DLA's power "
                                            "read there includes the CPU's",
                              "CV": "Xavier's CV rail is the DLAs' (and PVA's) own"}

Progress = Callable[[str], None]


# ------------------------------------------------------------------------------------ power
@dataclass(frozen=True)
class PowerRails:
    """INA3221 rails readable through sysfs: name -> (voltage file mV, current file mA) or power file mW."""

    rails: Mapping[str, tuple[Path, ...]]

    @classmethod
    def discover(cls, root: Path = Path("/sys/bus/i2c/drivers")) -> PowerRails | None:
        """The board's rails, or None where no INA3221 is exposed (not a Jetson, or no access)."""
        rails: dict[str, tuple[Path, ...]] = {}
        for label in sorted(root.glob("ina3221*/*/hwmon/hwmon*/in*_label")):
            channel = label.name.split("_")[0][2:]
            volt, curr = label.parent / f"in{channel}_input", label.parent / f"curr{channel}_input"
            if volt.exists() and curr.exists():
                rails[label.read_text().strip()] = (volt, curr)
        for name_file in sorted(root.glob("ina3221x/*/iio:device*/rail_name_*")):
            channel = name_file.name.rsplit("_", 1)[1]
            power = name_file.parent / f"in_power{channel}_input"
            if power.exists():
                rails[name_file.read_text().strip()] = (power,)
        return cls(rails) if rails else None

    def rail_for(self, unit: ComputeUnit) -> str | None:
        return next((r for r in RAILS.get(unit.kind, ()) if r in self.rails), None)

    def read_w(self, rail: str) -> float:
        files = self.rails[rail]
        values = [float(f.read_text().split()[0]) for f in files]
        return values[0] / 1000.0 if len(values) == 1 else values[0] * values[1] / 1e6


# ------------------------------------------------------------------------------------ features
def shapes_at(model: ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, list[int]]:
    """Every tensor's static shape when ``model`` is fed ``feeds`` (ONNX shape inference)."""
    fixed = ModelProto()
    fixed.CopyFrom(model)
    for value in fixed.graph.input:
        if value.name in feeds:
            for dim, size in zip(value.type.tensor_type.shape.dim, feeds[value.name].shape):
                dim.ClearField("dim_param")
                dim.dim_value = int(size)
    inferred = onnx_proto.onnx_library().shape_inference.infer_shapes(fixed, data_prop=True)
    out: dict[str, list[int]] = {}
    for value in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in value.type.tensor_type.shape.dim]
        if value.type.tensor_type.HasField("shape") and all(d > 0 for d in dims):
            out[value.name] = dims
    for init in model.graph.initializer:
        out[init.name] = list(init.dims)
    return out


def node_features(node: NodeProto, shapes: Mapping[str, Sequence[int]], in_fraction: float = 1.0,
                  out_fraction: float = 1.0) -> LayerFeatures | None:
    """Features of one node at known shapes (None when a shape is unknown)."""
    ins = [shapes.get(name) for name in node.input if name]
    outs = [shapes.get(name) for name in node.output if name]
    if not ins or not outs or any(s is None for s in ins + outs):
        return None
    out = outs[0]
    assert out is not None
    elements = float(np.prod(out))
    if node.op_type in ("Conv", "ConvTranspose") and len(ins) > 1 and ins[1] is not None:
        weight = ins[1]
        flops = 2.0 * elements * float(np.prod(weight[1:]))
    elif node.op_type in ("Gemm", "MatMul") and ins[0] is not None:
        flops = 2.0 * elements * float(ins[0][-1])
    else:
        flops = elements * max(1, len(ins))
    data = ins[0]
    assert data is not None
    weight_bytes = 4.0 * sum(float(np.prod(s)) for s in ins[1:] if s is not None)
    return LayerFeatures(node.op_type, flops, 4.0 * sum(float(np.prod(s)) for s in ins[:1] if s is not None),
                         4.0 * elements, weight_bytes, float(data[1]) if len(data) > 1 else 1.0,
                         float(out[1]) if len(out) > 1 else 1.0, float(out[2]) if len(out) > 2 else 1.0,
                         float(out[3]) if len(out) > 3 else 1.0, in_fraction, out_fraction)


def stage_features(model: ModelProto, feeds: Mapping[str, np.ndarray]) -> LayerFeatures:
    """A stage's features: its nodes' FLOPs and weights summed, its inputs' and outputs' bytes."""
    shapes = shapes_at(model, feeds)
    flops = 0.0
    for node in model.graph.node:
        features = node_features(node, shapes)
        flops += features.flops if features is not None else 0.0
    inits = {i.name for i in model.graph.initializer}
    in_bytes = float(sum(np.asarray(v).nbytes for v in feeds.values()))
    out_bytes = 4.0 * sum(float(np.prod(shapes.get(o.name, [0]))) for o in model.graph.output)
    weights = float(sum(np.prod(i.dims) * 4 for i in model.graph.initializer))
    first = next(iter(feeds.values()))
    channels = float(first.shape[1]) if first.ndim > 1 else 1.0
    height = float(first.shape[2]) if first.ndim > 2 else 1.0
    width = float(first.shape[3]) if first.ndim > 3 else 1.0
    outs = [o.name for o in model.graph.output if o.name not in inits]
    out_channels = float(shapes.get(outs[-1], [1, 1])[1]) if outs and len(shapes.get(outs[-1], [])) > 1 else 1.0
    return LayerFeatures("stage", flops, in_bytes, out_bytes, weights, channels, out_channels, height, width)


# ------------------------------------------------------------------------------------ single nodes
def node_model(node: NodeProto, model: ModelProto, shapes: Mapping[str, Sequence[int]],
               out_fraction: float = 1.0) -> tuple[ModelProto, dict[str, np.ndarray]] | None:
    """A one-node model (float inputs fed at their shapes, initializers kept; a Conv's output
    channels cut to ``out_fraction``) and random feeds for it; None where it cannot stand alone."""
    inits = {i.name: i for i in model.graph.initializer}
    inputs, feeds, initializers = [], {}, []
    rng = np.random.default_rng(0)
    for k, name in enumerate(node.input):
        if not name:
            continue
        if name in inits:
            array = to_array(inits[name])
            if out_fraction < 1.0 and node.op_type == "Conv" and k in (1, 2):
                array = array[:max(1, int(round(array.shape[0] * out_fraction)))]
            initializers.append(from_array(array, name))
            continue
        shape = shapes.get(name)
        if shape is None:
            return None
        inputs.append(make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        feeds[name] = rng.random(shape, dtype=np.float32)
    outputs = [make_tensor_value_info(o, TensorProto.FLOAT, None) for o in node.output if o]
    graph = make_graph([node], f"node_{node.name}", inputs, outputs, initializers)
    single = make_model(graph, opset_imports=list(model.opset_import))
    single.ir_version = model.ir_version
    return single, feeds


def time_runs(run: Callable[[], object], repeats: int, warmup: int = 2,
              sample: Callable[[], float] | None = None) -> tuple[float, float | None]:
    """(median wall-clock ms of ``run`` over ``repeats`` calls after ``warmup``, mean of ``sample()``
    read after each call — a power rail — or None)."""
    for _ in range(warmup):
        run()
    samples, readings = [], []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        samples.append((time.perf_counter() - began) * 1000.0)
        if sample is not None:
            readings.append(sample())
    return statistics.median(samples), (statistics.fmean(readings) if readings else None)


# ------------------------------------------------------------------------------------ profiling
@dataclass(frozen=True)
class UnitSkip:
    unit: str
    reason: str


def runnable_units(hardware: Hardware) -> tuple[list[ComputeUnit], list[UnitSkip]]:
    """The units this process can run stages on, and why the others are skipped."""
    reason = trt_reason() if any(u.kind != "cpu" for u in hardware.units) else None
    dla_units = [u.name for u in hardware.units if u.kind == "dla"]
    ok, skipped = [], []
    for unit in hardware.units:
        try:
            plan_unit(unit, dla_units=dla_units, trt_reason=reason)
            ok.append(unit)
        except ValueError as exc:
            skipped.append(UnitSkip(unit.name, str(exc)))
    return ok, skipped


def stage_feeds(stage_set: StageSet, feeds: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Each stage's inputs for one frame, by running the stages in order on onnxruntime."""
    values: dict[str, np.ndarray] = dict(feeds)
    per_stage = []
    for stage in stage_set.stages:
        inputs = {name: values[name] for name in stage.inputs}
        per_stage.append(inputs)
        session = ort.InferenceSession(stage.model.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        values.update(zip(names, session.run(names, inputs)))
    return per_stage


def stage_row_name(stage: int, size: str) -> str:
    """The profile row of a whole stage at one input size."""
    return f"stage{stage}@{size}"


def _size_text(feeds: Mapping[str, np.ndarray]) -> str:
    first = next(iter(feeds.values()))
    return "x".join(str(d) for d in first.shape[2:]) or "scalar"


def profile_stage_set(stage_set: StageSet, hardware: Hardware, frames: Sequence[Mapping[str, np.ndarray]], *,
                      repeats: int = 10, layers: bool = True, fractions: Sequence[float] = FRACTIONS,
                      progress: Progress | None = None) -> tuple[Profile, list[UnitSkip], list[str]]:
    """Rows for every stage (``stage<k>``) and, with ``layers``, every measurable node (at each
    channel fraction for Conv) of every stage, on every runnable unit, at each frame's input size.

    Returns (profile, skipped units, notes on the power source)."""
    units, skipped = runnable_units(hardware)
    rails = PowerRails.discover()
    notes = []
    if rails is None:
        notes.append("no INA3221 rails readable: energy is modelled (hardware file power x time)")
    reason = trt_reason() if any(u.kind != "cpu" for u in units) else None
    dla_units = [u.name for u in hardware.units if u.kind == "dla"]
    plans = {u.name: plan_unit(u, dla_units=dla_units, trt_reason=reason) for u in units}
    rows: list[Measurement] = []
    original = os.sched_getaffinity(threading.get_native_id())
    try:
        for unit in units:
            rows.extend(_unit_rows(stage_set, unit, plans[unit.name], frames, rails, repeats, layers, fractions,
                                   notes, progress))
    finally:
        os.sched_setaffinity(threading.get_native_id(), original)
    return Profile(tuple(rows), source="profiler"), skipped, notes


def _unit_rows(stage_set: StageSet, unit: ComputeUnit, plan: UnitPlan, frames, rails: PowerRails | None,
               repeats: int, layers: bool, fractions: Sequence[float], notes: list[str],
               progress: Progress | None) -> list[Measurement]:
    rows: list[Measurement] = []
    rail = rails.rail_for(unit) if rails is not None else None
    if rail is not None and rail in RAIL_NOTES:
        notes.append(f"{unit.name}: rail {rail} — {RAIL_NOTES[rail]}")
    if unit.cores:
        pin_current_thread(unit.cores)
    for feeds in frames:
        size = _size_text(feeds)
        for k, (stage, inputs) in enumerate(zip(stage_set.stages, stage_feeds(stage_set, feeds))):
            if progress is not None:
                progress(f"{unit.name} {size} stage{k}")
            runner = open_stage(stage.model, plan)
            read = partial(rails.read_w, rail) if rails is not None and rail is not None else None
            try:
                latency, power = time_runs(partial(runner.run, inputs), repeats, sample=read)
            finally:
                runner.close()
            features = stage_features(stage.model, inputs).as_dict()
            rows.append(Measurement(stage_row_name(k, size), unit.name, unit.default_dvfs, latency, power, None,
                                    dict(features, size=size)))
            if layers:
                rows.extend(_layer_rows(stage.model, inputs, unit, plan, repeats, fractions, size, k))
    return rows


def measure_stages(stage_set: StageSet, hardware: Hardware, units: Sequence[str], feeds: Mapping[str, np.ndarray],
                   repeats: int = 5) -> dict[tuple[int, str], float]:
    """Median ms of every stage on every unit in ``units`` (pinned as the runtime pins it) for
    one frame: what a width split's search candidate costs, measured once per split."""
    per_stage = stage_feeds(stage_set, feeds)
    dla_units = [u.name for u in hardware.units if u.kind == "dla"]
    reason = trt_reason() if any(hardware.unit(u).kind != "cpu" for u in units) else None
    plans = {u: plan_unit(hardware.unit(u), dla_units=dla_units, trt_reason=reason) for u in units}
    out: dict[tuple[int, str], float] = {}
    original = os.sched_getaffinity(threading.get_native_id())
    try:
        for unit in units:
            pin_current_thread(hardware.unit(unit).cores)
            for k, (stage, inputs) in enumerate(zip(stage_set.stages, per_stage)):
                runner = open_stage(stage.model, plans[unit])
                try:
                    out[(k, unit)], _ = time_runs(partial(runner.run, inputs), repeats)
                finally:
                    runner.close()
    finally:
        os.sched_setaffinity(threading.get_native_id(), original)
    return out


def _layer_rows(model, inputs, unit: ComputeUnit, plan, repeats: int, fractions: Sequence[float], size: str,
                stage: int) -> list[Measurement]:
    shapes = shapes_at(model, inputs)
    rows = []
    for index, node in enumerate(model.graph.node):
        if node.op_type not in MEASURED_OPS:
            continue
        for fraction in (fractions if node.op_type == "Conv" else (1.0,)):
            built = node_model(node, model, shapes, fraction)
            if built is None:
                continue
            single, feeds = built
            runner = open_stage(single, plan)
            try:
                latency, _ = time_runs(partial(runner.run, feeds), repeats)
            finally:
                runner.close()
            sliced = dict(shapes)
            for out in node.output:
                if out in sliced and fraction < 1.0:
                    sliced[out] = [sliced[out][0], max(1, int(round(sliced[out][1] * fraction)))] + sliced[out][2:]
            if fraction < 1.0 and len(node.input) > 1:
                weight = list(shapes[node.input[1]])
                sliced[node.input[1]] = [max(1, int(round(weight[0] * fraction)))] + weight[1:]
            features = node_features(node, sliced, 1.0, fraction)
            if features is None:
                continue
            name = node.name or f"{node.op_type}_{index}"
            rows.append(Measurement(f"stage{stage}/{name}@{size}/w{fraction:g}", unit.name, unit.default_dvfs, latency,
                                    None, None, dict(features.as_dict(), size=size)))
    return rows


def cache_key(model_bytes: bytes, hardware: Hardware, sizes: Sequence[str], layers: bool, repeats: int) -> str:
    """Digest of what a profile depends on: the model, the hardware description, sizes, options."""
    digest = hashlib.sha256(model_bytes)
    digest.update(repr((hardware.to_json(), list(sizes), layers, repeats)).encode())
    return digest.hexdigest()[:20]
