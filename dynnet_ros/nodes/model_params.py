"""The parameters every model node declares, and how they become a serving core's options.

Why a module: the node module stays the ROS adapter; these are the parameter declarations
(``ParamSpec``: default, meaning, range, check) shared by the lane, pedestrian and depth nodes,
and the helpers their core factories (also what `dynnet up` measures footprints with) read them
through.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dynnet_ros.budget.protocol import BUDGET_PARAM, OWNER_PARAM
from dynnet_ros.compressed import TRANSPORTS
from dynnet_ros.engine.backends.registry import available_backends
from dynnet_ros.nodes.base import ParamSpec
from dynnet_ros.nodes.camera_inputs import check_cameras
from dynnet_ros.perception.mapped import check_mapping
from dynnet_ros.perception.model_info import ModelInfo, read_model_info
from dynnet_ros.sim.frames import parse_resolution


def fixed_input(info: ModelInfo) -> bool:
    """The model's image input has a fixed height and width (frames are letterboxed to it, so
    ``max_input_side`` does not apply)."""
    for spec in info.inputs:
        if spec.rank != 4:
            continue
        spatial = spec.dims[2:] if spec.dims[1] == 3 else spec.dims[1:3] if spec.dims[3] == 3 else ()
        if spatial and all(isinstance(d, int) for d in spatial):
            return True
    return False


#: ``max_input_side`` default: the model's own input size (see ``input_size``)
MODEL_INPUT_SIDE = -1


def input_size(path: str, params: dict[str, Any]) -> int | None:
    """The ``input_size`` option for a core: ``max_input_side`` for a dynamic-input model (frames
    fitted into a square of that side, 0 = as they come), None where the preprocessing decides:
    a fixed-input model's own size, or with ``max_input_side`` -1 the size the export recorded
    (its ``imgsz`` metadata), else its format's default (docs/models.md)."""
    side = int(params["max_input_side"])
    return None if side == MODEL_INPUT_SIDE or fixed_input(read_model_info(path)) else side


def class_list(values: list[str]) -> list[str]:
    """A ``classes`` parameter as the cores take it: blank entries dropped (a ROS string array
    cannot be declared or written in YAML empty, so [''] stands for "every class")."""
    return [v.strip() for v in values if v.strip()]


def format_spec(task: str, formats: Iterable[str], evidence: str = "signature") -> ParamSpec:
    """The ``model_format`` parameter of a node whose core decodes ``formats`` (names, or a
    mapping keyed by them): ``auto`` or one of them (whether the model fits it is checked when the
    core loads). ``evidence``: what ``auto`` decides from."""
    names = list(formats)
    choices = ["auto", *names]

    def check(value: str) -> str | None:
        return None if value in choices else f"model_format must be one of {choices}, got {value!r}"
    return ParamSpec("model_format", "auto", f"{task} export format: 'auto' (decided from the model's {evidence}; "
                     "the decision and its reason are logged and in /diagnostics) or one of "
                     f"{', '.join(names)} (docs/models.md). A change loads the model again.", check=check)


def classes_spec(meaning: str) -> ParamSpec:
    """The ``classes`` parameter (read with ``class_list``) of a node whose model may name classes."""
    return ParamSpec("classes", [""], f"{meaning} A change loads the model again.", kind="string_array")


def _backend_check(value: str) -> str | None:
    reasons = available_backends()
    if value not in reasons:
        return f"backend must be one of {sorted(reasons)}, got {value!r}"
    if reasons[value] is not None:
        return f"backend '{value}' is unavailable: {reasons[value]}"
    return None


def _check_camera_sizes(values: list[str]) -> str | None:
    try:
        for text in values:
            parse_resolution(text)
    except ValueError as exc:
        return f"camera_sizes: {exc}"
    return None


def common_specs(task: str) -> list[ParamSpec]:
    return [
        ParamSpec("model_path", "", f"ONNX model file; empty = the zoo's '{task}' model (built on first use). "
                  "Changing it loads the new model first; a file that does not load is rejected and the "
                  "old model keeps serving."),
        ParamSpec("backend", "cpu", "Engine backend (see Engine); 'tensorrt' is rejected where unavailable.",
                  check=_backend_check),
        ParamSpec("threads", 0, "Inference threads for the engine (0 = one per CPU this process may run on, "
                  "os.sched_getaffinity). Several model nodes sharing few cores each take a share; a node "
                  "serving several cameras is the only model process on its cores and keeps the default.",
                  low=0, high=256),
        ParamSpec(BUDGET_PARAM, 0.0, "Memory budget for this model in MiB (0 = unlimited); passed to "
                  "Engine.set_memory_budget. Assigned by the budget manager named in budget_owner while it "
                  "runs (a value set by hand is then refused with the reason; docs/budget.md).",
                  low=0.0, high=1.0e6),
        ParamSpec(OWNER_PARAM, "", "The budget manager (fully qualified node name) that assigns memory_budget_mb; "
                  "'' = nobody, the value set by hand or in the parameter file holds. Written by the manager "
                  "together with each budget it pushes, not on its own."),
        ParamSpec("image_transport", "raw", "Camera transport, as image_transport names it: 'raw' subscribes to "
                  "camera/image_raw (sensor_msgs/Image), 'compressed' to camera/image_raw/compressed "
                  "(sensor_msgs/CompressedImage, JPEG or PNG; a remapped camera topic keeps the suffix). "
                  "Read-only: set it at start.", choices=TRANSPORTS, read_only=True),
        ParamSpec("enabled", True, "Process frames; false stops inference and output (diagnostics continue)."),
        ParamSpec("max_rate_hz", 0.0, "Run the model on at most this many frames per second (0 = on every "
                  "frame the worker can take). Frames arriving within a period wait in the one-frame mailbox, "
                  "a newer one replacing (and dropping) the older, so the node answers the newest frame once "
                  "the period is over and leaves the CPU to the rest of the robot meanwhile.",
                  low=0.0, high=1000.0),
        ParamSpec("max_input_side", MODEL_INPUT_SIDE, "Dynamic-input models: fit camera frames into a square of "
                  "this side (the zoo's models only shrink, exports such as Ultralytics' also enlarge) before "
                  "padding to the model's stride; -1 = the model's own size (the imgsz an export recorded in its "
                  "metadata, else its format's default: 640 for the zoo's and most formats); 0 = the camera "
                  "size. Fixed-input models are letterboxed to their size and ignore it.", low=-1, high=8192),
        ParamSpec("mapping", "", "Mapped mode (docs/mapper.md): a mapping file that cuts the model into stages "
                  "run on compute units, answering at the first confident exit; empty = unmapped. A file that "
                  "does not load is rejected and the previous mapping keeps serving. 'auto' (this machine) or "
                  "'auto:HARDWARE': the pick of the search cached by `dynnet map search`, re-picked when the "
                  "budget manager changes the node's per-unit memory.", check=check_mapping),
        ParamSpec("exit_threshold", -1.0, "Mapped mode: the confidence every early exit needs to answer "
                  "(< 0 = the mapping file's thresholds).", low=-1.0, high=1.0),
        ParamSpec("deadline_ms", 0.0, "Mapped mode: answer by this time with the deepest exit done "
                  "(0 = the mapping file's deadline, or none).", low=0.0, high=1.0e5),
        ParamSpec("camera_sizes", ["320x240", "640x480", "1280x720"], "Camera resolutions (WIDTHxHEIGHT) "
                  "whose minimum budgets the node announces to the budget manager before such a frame "
                  "arrives; sizes not listed are announced once seen.", kind="string_array",
                  check=_check_camera_sizes),
        ParamSpec("cameras", [], "The cameras this node serves with its one model: each a camera namespace "
                  "('front': front/image_raw, front/camera_info, outputs under front/) or an image topic "
                  "('/cams/left/image_color': its parent is the namespace). [] = one camera, camera/image_raw, "
                  "outputs unprefixed. Each camera's name (namespace without slashes, inner ones as '_') keys "
                  "its diagnostics and per-camera parameters. Read-only: set it at start.",
                  kind="string_array", check=check_cameras, read_only=True),
        ParamSpec("batch_window_ms", 5.0, "Several cameras: once the worker takes a frame it waits up to this "
                  "long for the other cameras' frames and runs them as one batch (0 = no batching: one frame "
                  "per model run).", low=0.0, high=1000.0),
        ParamSpec("max_batch", 0, "The largest batch the node forms (0 = the cameras shared between the batches "
                  "in flight: one frame per camera with one batch in flight, half the cameras, rounded up, with "
                  "two); the model's own limit and the memory budget may lower it (diagnostics: batch_limit).",
                  low=0, high=64),
        ParamSpec("max_latency_ms", 100.0, "A batch never waits for more frames past the oldest waiting frame's "
                  "arrival plus this (nor past batch_window_ms after its first frame).", low=0.0, high=1.0e4),
        ParamSpec("batches_in_flight", 1, "Several cameras: batches served at once, each on a worker thread of its "
                  "own, and engine runs at once, each with activations of its own and (threads 0) its share of "
                  "the CPUs (outputs still in the order the frames were taken). With 2 the two batches keep two "
                  "cores busy where one run's threads leave them idle; runs overlap only while no memory budget "
                  "holds the engine, and take turns under one (docs/ros.md). Read-only: set it at start.",
                  low=1, high=4, read_only=True),
    ]
