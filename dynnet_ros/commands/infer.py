"""`dynnet infer MODEL IMAGE…`: run a perception core on image files — check a model before a robot run.

Writes one annotated PNG per image into ``--out`` and a JSON report (the format decision and
its reason, the preprocessing, per-image results and latency). The task is read from the model
when only one task's formats fit it; otherwise ``--task`` says which.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from matplotlib import image as mpimg
from rich.progress import Progress

from dynnet_ros.commands import CommandError, annotate, arguments
from dynnet_ros.perception import Depth, DepthEstimator, Detections, Detector, Segmentation, Segmenter
from dynnet_ros.perception.formats.base import Format
from dynnet_ros.perception.formats.depth import DEPTH_FORMATS
from dynnet_ros.perception.formats.detection import DETECTION_FORMATS
from dynnet_ros.perception.formats.segmentation import segmentation_formats
from dynnet_ros.perception.labels import names_from_metadata, read_labels_file
from dynnet_ros.perception.model_info import ModelInfo, read_model_info
from dynnet_ros.zoo import resolve_model_spec

NAME = "infer"
HELP = "run a detector, segmenter or depth model on image files: annotated PNGs + JSON"
TASKS = ("detect", "segment", "depth")


def _task_formats(task: str, output_name: str | None) -> Mapping[str, Format]:
    if task == "detect":
        return DETECTION_FORMATS
    if task == "segment":
        return segmentation_formats(output_name)
    return DEPTH_FORMATS


def _names(text: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"{text!r}: give names or ids separated by commas")
    return items


def _triple(text: str) -> tuple[float, float, float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) != 3:
        raise argparse.ArgumentTypeError(f"{text!r}: expected three numbers R,G,B (e.g. 0.485,0.456,0.406)")
    return values[0], values[1], values[2]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=arguments.model_spec, help="path to an .onnx model, or zoo:NAME")
    parser.add_argument("images", nargs="*", type=arguments.existing_file, metavar="IMAGE",
                        help="image files (PNG, JPEG, ...), at least one")
    parser.add_argument("--task", choices=TASKS, default=None,
                        help="detect | segment | depth (default: read from the model when only one fits)")
    parser.add_argument("--model-format", default="auto", metavar="FORMAT",
                        help="the model's export format (default auto; docs/models.md lists them)")
    parser.add_argument("--out", type=arguments.output_dir, default=Path("infer-out"), metavar="DIR",
                        help="directory for the annotated PNGs (default ./infer-out)")
    parser.add_argument("--json", type=arguments.output_file, default=None, metavar="FILE",
                        help="JSON report (default DIR/results.json)")
    parser.add_argument("--classes", type=_names, default=[], metavar="A,B",
                        help="class names or ids to keep (detect) / that form the mask (segment)")
    parser.add_argument("--labels-file", type=arguments.existing_file, default=None, metavar="FILE",
                        help="class names, one per line (or a YAML/JSON names list)")
    parser.add_argument("--score-threshold", type=float, default=0.25, help="detect: minimum score (0.25)")
    parser.add_argument("--nms-iou", type=float, default=0.45, help="detect: NMS IoU threshold (0.45)")
    parser.add_argument("--output-name", default=None, help="segment: the output to decode (default: the first)")
    parser.add_argument("--input-size", type=arguments.positive_int, default=None, metavar="PX",
                        help="dynamic-input models: fit frames into PX x PX (default: metadata or format)")
    parser.add_argument("--mean", type=_triple, default=None, metavar="R,G,B", help="per-channel mean on [0, 1]")
    parser.add_argument("--std", type=_triple, default=None, metavar="R,G,B", help="per-channel std on [0, 1]")
    parser.add_argument("--channel-order", choices=("RGB", "BGR"), default=None, help="the model's channel order")
    parser.add_argument("--backend", default="cpu", help="engine backend (default cpu)")
    parser.add_argument("--repeat", type=arguments.positive_int, default=1, metavar="N",
                        help="run each image N times; latency_ms is the median of the runs after the first")


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


def build_core(task: str, model: str, args) -> Detector | Segmenter | DepthEstimator:
    common: dict[str, Any] = {"backend": args.backend, "mean": args.mean, "std": args.std,
                              "channel_order": args.channel_order, "input_size": args.input_size}
    if task == "detect":
        return Detector(model, args.model_format, classes=args.classes, score_threshold=args.score_threshold,
                        nms_iou=args.nms_iou, labels_file=args.labels_file, **common)
    if task == "segment":
        return Segmenter(model, args.model_format, classes=args.classes, output_name=args.output_name,
                         labels_file=args.labels_file, **common)
    if args.classes or args.labels_file:
        raise CommandError("--classes and --labels-file apply to detect and segment, not depth")
    return DepthEstimator(model, args.model_format, **common)


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


def run(args) -> int:
    if not args.images:
        raise CommandError("give at least one IMAGE file")
    model = resolve_model_spec(args.model)
    task = args.task
    if task is None:
        info = read_model_info(model, check=False)   # the core checks the model when it loads it
        names = read_labels_file(args.labels_file) if args.labels_file else names_from_metadata(info.metadata)
        task = infer_task(info, names, args.output_name, args.model_format)
    first = read_rgb(args.images[0])  # a wrong file is named before a model is built
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path: Path = args.json or out_dir / "results.json"
    core = build_core(task, model, args)
    report: dict[str, Any] = {**core.describe(), "task": task, "images": []}
    try:
        with Progress(transient=True) as progress:
            bar = progress.add_task(f"{task} {Path(model).name}", total=len(args.images))
            for number, path in enumerate(args.images):
                image = first if number == 0 else read_rgb(path)
                png = out_dir / f"{number:03d}_{path.stem}.{task}.png"
                entry = _infer_one(core, image, png, args.repeat)
                report["images"].append({"image": str(path), "width": image.shape[1], "height": image.shape[0],
                                         "annotated": str(png), **entry})
                progress.advance(bar)
    finally:
        core.close()
    json_path.write_text(json.dumps(report, indent=1))
    return 0
