"""`dynnet infer`'s arguments; its implementation is dynnet_ros.commands.infer."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from dynnet_ros.commands import arguments

NAME = "infer"
HELP = "run a detector, segmenter or depth model on image files: annotated PNGs + JSON"
TASKS = ("detect", "segment", "depth")


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


def _param(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE (a YAML value, e.g. lane_threshold=0.6)")
    try:
        return name.strip(), yaml.safe_load(value)
    except yaml.YAMLError:
        raise argparse.ArgumentTypeError(f"{text!r}: VALUE is not a YAML value") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=arguments.model_spec, help="path to an .onnx model, or zoo:NAME")
    parser.add_argument("images", nargs="*", type=arguments.existing_file, metavar="IMAGE",
                        help="image files (PNG, JPEG, ...), at least one")
    parser.add_argument("--task", choices=TASKS, default=None,
                        help="detect | segment | depth (default: read from the model when only one fits)")
    parser.add_argument("--out", type=arguments.output_dir, default=Path("infer-out"), metavar="DIR",
                        help="directory for the annotated PNGs (default ./infer-out)")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="JSON report (default DIR/results.json); '-' prints it instead of the per-image lines")
    parser.add_argument("--repeat", type=arguments.positive_int, default=1, metavar="N",
                        help="run each image N times; latency_ms is the median of the runs after the first")
    node = parser.add_argument_group(
        "node parameters", "what the task's node (pedestrian_node, lane_node, depth_node) takes, with its "
        "defaults (docs/ros.md, Parameters); unset flags keep the node's default or --config's value")
    node.add_argument("--config", type=arguments.existing_file, default=None, metavar="FILE",
                      help="a graph config (config/vehicle.yaml): the task node's parameters in it apply")
    node.add_argument("--model-format", default=None, metavar="FORMAT",
                      help="model_format: the model's export format (auto; docs/models.md lists them)")
    node.add_argument("--classes", type=_names, default=None, metavar="A,B",
                      help="classes: class names or ids to keep (detect) / that form the mask (segment)")
    node.add_argument("--labels-file", type=arguments.existing_file, default=None, metavar="FILE",
                      help="labels_file: class names, one per line (or a YAML/JSON names list)")
    node.add_argument("--score-threshold", type=float, default=None, help="score_threshold (detect; node: 0.3)")
    node.add_argument("--nms-iou", type=float, default=None, help="nms_iou (detect; node: 0.45)")
    node.add_argument("--max-detections", type=int, default=None, help="max_detections (detect; node: 50)")
    node.add_argument("--output-name", default=None, help="output_name (segment): the output to decode")
    node.add_argument("--input-size", type=int, default=None, metavar="PX",
                      help="max_input_side: dynamic-input models fit frames into PX x PX (node: -1 = the "
                      "model's own size, its imgsz metadata or its format's default; 0 = the image size)")
    node.add_argument("--backend", default=None, help="backend (node: cpu)")
    node.add_argument("--threads", type=int, default=None, help="threads (node: 0 = onnxruntime's default)")
    node.add_argument("--param", type=_param, action="append", default=[], metavar="NAME=VALUE",
                      help="any other parameter of the node, e.g. lane_threshold=0.6 (repeatable)")
    extra = parser.add_argument_group("preprocessing", "not node parameters: the node reads these from the "
                                      "model's metadata or its format; set them here to try a model without any")
    extra.add_argument("--mean", type=_triple, default=None, metavar="R,G,B", help="per-channel mean on [0, 1]")
    extra.add_argument("--std", type=_triple, default=None, metavar="R,G,B", help="per-channel std on [0, 1]")
    extra.add_argument("--channel-order", choices=("RGB", "BGR"), default=None, help="the model's channel order")
