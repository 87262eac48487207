"""`dynnet infer MODEL IMAGE…`: run a perception core on image files — check a model before a robot run.

It runs what the task's node runs: the core is built by the node's own factory
(``make_detector``, ``make_segmenter``, ``make_depth_estimator``) from parameter values
resolved against the node's parameter table (``PARAMETERS``): the table's defaults, then the
node's parameters in a graph config (``--config``), then the flags, each checked as the node
checks it. The same model and frame therefore give the same answer here and from the node.

Prints one line per image and writes one annotated PNG per image into ``--out`` and a JSON
report (the parameters, the format decision and its reason, the preprocessing, per-image results
and latency; ``--json -`` prints the report instead of the lines). The task is read from the
model when only one task's formats fit it; otherwise ``--task`` says which.
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import image as mpimg

from dynnet_ros.commands import CommandError, annotate, arguments
from dynnet_ros.commands.parsers.infer import TASKS
from dynnet_ros.graph_config import load_graph
from dynnet_ros.nodes import depth_node, lane_node, pedestrian_node
from dynnet_ros.nodes.base import ParamSpec
from dynnet_ros.perception import Depth, DepthEstimator, Detections, Detector, Segmentation, Segmenter
from dynnet_ros.perception.formats.base import Format
from dynnet_ros.perception.formats.depth import DEPTH_FORMATS
from dynnet_ros.perception.formats.detection import DETECTION_FORMATS
from dynnet_ros.perception.formats.segmentation import segmentation_formats
from dynnet_ros.perception.labels import names_from_metadata, read_labels_file
from dynnet_ros.perception.model_info import ModelInfo, read_model_info
from dynnet_ros.zoo import resolve_model_spec


@dataclass(frozen=True)
class TaskNode:
    """The node that runs a task: its executable, parameter table and core factory."""

    executable: str
    parameters: list[ParamSpec]
    make_core: Callable[..., Detector | Segmenter | DepthEstimator]


NODES = {"detect": TaskNode("pedestrian_node", pedestrian_node.PARAMETERS, pedestrian_node.make_detector),
         "segment": TaskNode("lane_node", lane_node.PARAMETERS, lane_node.make_segmenter),
         "depth": TaskNode("depth_node", depth_node.PARAMETERS, depth_node.make_depth_estimator)}
#: flags that set a node parameter (flag destination -> parameter), each defaulting to the table's
FLAG_PARAMETERS = {"model_format": "model_format", "classes": "classes", "labels_file": "labels_file",
                   "score_threshold": "score_threshold", "nms_iou": "nms_iou", "max_detections": "max_detections",
                   "output_name": "output_name", "input_size": "max_input_side", "backend": "backend",
                   "threads": "threads"}


def _task_formats(task: str, output_name: str | None) -> Mapping[str, Format]:
    if task == "detect":
        return DETECTION_FORMATS
    if task == "segment":
        return segmentation_formats(output_name)
    return DEPTH_FORMATS


def node_parameters(task: str, args) -> dict[str, Any]:
    """The task node's parameter values for this run: its table's defaults, the node's
    parameters in ``--config``, then the flags and ``--param`` (CommandError naming a value the
    node would refuse, as the node would word it)."""
    node = NODES[task]
    specs = {spec.name: spec for spec in node.parameters}
    values: dict[str, tuple[Any, str]] = {name: (spec.default, "default") for name, spec in specs.items()}
    if args.config is not None:
        try:
            graph = load_graph(args.config)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        configured = [n for n in graph.nodes if n.executable == node.executable]
        if not configured:
            raise CommandError(f"{args.config} has no {node.executable} (the {task} node)")
        values.update({name: (value, f"{args.config}") for name, value in configured[0].parameters.items()
                       if name in specs})
    for dest, name in FLAG_PARAMETERS.items():
        value = getattr(args, dest)
        if value is None:
            continue
        if name not in specs:
            raise CommandError(f"--{dest.replace('_', '-')} does not apply to {task} ({node.executable} has no "
                               f"parameter {name})")
        values[name] = (str(value) if isinstance(value, Path) else value, f"--{dest.replace('_', '-')}")
    for name, value in args.param:
        if name == "model_path":
            raise CommandError("--param model_path: the model is the MODEL argument")
        if name not in specs:
            raise CommandError(f"--param {name}: {node.executable} declares no such parameter "
                               f"(it has {', '.join(sorted(specs))})")
        values[name] = (value, "--param")
    out: dict[str, Any] = {}
    for name, (value, source) in values.items():
        spec = specs[name]
        if spec.type_key is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)   # a flag's or --param's 1 means 1.0 (a parameter file's would not)
        if spec.type_key == "string_array" and isinstance(value, (list, tuple)):
            value = [str(v) for v in value]
        reason = spec.check_file_value(value)
        if reason is not None:
            raise CommandError(f"{source}: {reason}")
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def read_rgb(path: Path) -> np.ndarray:
    """An image file as HxWx3 uint8 RGB (grey repeated, alpha dropped); OSError when unreadable."""
    try:
        img = np.asarray(mpimg.imread(path))
    except (OSError, ValueError, SyntaxError) as exc:  # Pillow: UnidentifiedImageError is an OSError
        raise OSError(f"{path}: not a readable image ({exc})") from None
    if img.dtype != np.uint8:  # PNGs come back as floats in [0, 1]
        img = np.round(np.clip(img, 0.0, 1.0) * 255.0).astype(np.uint8)
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    if img.ndim != 3 or img.shape[2] not in (3, 4):
        raise OSError(f"{path}: expected a grey, RGB or RGBA image, got shape {list(img.shape)}")
    return np.ascontiguousarray(img[:, :, :3])


def infer_task(info: ModelInfo, names: list[str] | None, output_name: str | None, model_format: str) -> str:
    """The one task with a format that fits the model (``model_format``, or any for auto, even
    ambiguously); CommandError otherwise."""
    if info.metadata.get("task", "").strip() == "detect":  # Ultralytics writes the task into the metadata
        return "detect"
    fitting: dict[str, str] = {}
    for task in TASKS:
        formats = _task_formats(task, output_name)
        fits = [name for name, fmt in formats.items()
                if model_format in ("auto", name) and fmt.fit(info, names).ok]
        if fits:
            fitting[task] = ", ".join(fits)
    if len(fitting) == 1:
        return next(iter(fitting))
    if not fitting:
        which = "format" if model_format == "auto" else f"format named {model_format!r}"
        raise CommandError(f"{info.path} fits no detect, segment or depth {which} ({info.describe()}); "
                           "give --task to see why")
    listed = "; ".join(f"{task} ({formats})" for task, formats in fitting.items())
    raise CommandError(f"{info.path} fits several tasks: {listed}; give --task")


def build_core(task: str, model: str, params: dict[str, Any], args) -> Detector | Segmenter | DepthEstimator:
    """The task node's core for ``params``, built by the node's own factory (its budget aside:
    a node's budget bounds its memory, never its answers)."""
    preprocessing = {key: value for key, value in (("mean", args.mean), ("std", args.std),
                                                   ("channel_order", args.channel_order)) if value is not None}
    return NODES[task].make_core(model, params, None, **preprocessing)


def _infer_one(core: Detector | Segmenter | DepthEstimator, image: np.ndarray, png: Path,
               repeat: int) -> dict[str, Any]:
    """Run ``core`` on one image ``repeat`` times, draw the result into ``png``; the JSON entry.

    The first run of a new input size plans it; with repeats the reported latency is the median
    of the others (per-frame cost in steady state) and the first is reported beside it."""
    times: list[float] = []
    result: Detections | Segmentation | Depth | None = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = core(image)
        times.append((time.perf_counter() - start) * 1e3)
    steady = times[1:] or times
    entry: dict[str, Any] = {"latency_ms": round(float(np.median(steady)), 2), "first_run_ms": round(times[0], 2)}
    if isinstance(result, Detections):
        annotate.detections_png(image, result, png)
        entry["detections"] = result.to_json()
    elif isinstance(result, Segmentation):
        annotate.segmentation_png(image, result, png)
        entry["segmentation"] = result.to_json()
    elif isinstance(result, Depth):
        annotate.depth_png(image, result, png)
        entry["depth"] = result.to_json()
    return entry


#: detections named on an image's line; the rest are counted
LINE_DETECTIONS = 5


def summary(name: str, image: np.ndarray, entry: dict[str, Any]) -> str:
    """One line for one image: what the model found and how long it took."""
    head = f"{name} {image.shape[1]}x{image.shape[0]}:"
    timing = f"({entry['latency_ms']:.1f} ms)"
    if "detections" in entry:
        found = entry["detections"]
        shown = ", ".join(f"{d['class_name'] or d['class_id']} {d['score']:.2f} "
                          f"[{','.join(str(round(v)) for v in d['box_xyxy'])}]" for d in found[:LINE_DETECTIONS])
        more = f", +{len(found) - LINE_DETECTIONS} more" if len(found) > LINE_DETECTIONS else ""
        what = f"{len(found)} detection{'s' if len(found) != 1 else ''}" + (f": {shown}{more}" if found else "")
    elif "segmentation" in entry:
        what = f"mask {100.0 * entry['segmentation']['mask_fraction']:.1f} % of the pixels"
    else:
        depth = entry["depth"]
        what = "no valid depth" if depth["median_m"] is None else \
            (f"depth {depth['min_m']:.2f}..{depth['max_m']:.2f} m, median {depth['median_m']:.2f} m on "
             f"{100.0 * depth['valid_fraction']:.0f} % of the pixels")
    return f"{head} {what} {timing}"


def run(args) -> int:
    if not args.images:
        raise CommandError("give at least one IMAGE file")
    to_stdout = args.json == "-"
    json_path: Path | None = None
    if args.json is not None and not to_stdout:
        try:
            json_path = arguments.output_file(args.json)
        except argparse.ArgumentTypeError as exc:
            raise CommandError(f"--json: {exc}") from None
    model = resolve_model_spec(args.model)
    task = args.task
    if task is None:
        info = read_model_info(model, check=False)   # the core checks the model when it loads it
        names = read_labels_file(args.labels_file) if args.labels_file else names_from_metadata(info.metadata)
        task = infer_task(info, names, args.output_name, args.model_format or "auto")
    if task == "depth" and (args.classes is not None or args.labels_file is not None):
        raise CommandError("--classes and --labels-file apply to detect and segment, not depth")
    params = {**node_parameters(task, args), "model_path": model}   # MODEL, whatever --config names
    first = read_rgb(args.images[0])  # a wrong file is named before a model is built
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = json_path or out_dir / "results.json"
    core = build_core(task, model, params, args)
    report: dict[str, Any] = {**core.describe(), "task": task, "node": NODES[task].executable,
                              "parameters": params, "images": []}
    try:
        for number, path in enumerate(args.images):
            image = first if number == 0 else read_rgb(path)
            png = out_dir / f"{number:03d}_{path.stem}.{task}.png"
            entry = _infer_one(core, image, png, args.repeat)
            report["images"].append({"image": str(path), "width": image.shape[1], "height": image.shape[0],
                                     "annotated": str(png), **entry})
            if not to_stdout:
                print(summary(path.name, image, entry), flush=True)
    finally:
        core.close()
    text = json.dumps(report, indent=1)
    if to_stdout:
        print(text)
    else:
        json_path.write_text(text)
        print(f"{len(args.images)} image{'s' if len(args.images) != 1 else ''} ({task}, {core.format_name}, "
              f"{core.preprocess.describe()}): report {json_path}, annotated PNGs in {out_dir}")
    return 0
