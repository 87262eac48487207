"""Lane segmentation node: /camera/image_raw -> /lane/mask (mono8, camera resolution) [+ /lane/labels].

An adapter over ``perception.Segmenter``: one-channel probability/logit maps (the zoo's lane
model, a binary road or lane export) and multi-class logits ``[1, C, H, W]`` both run here. The
mask is 255 where the lane probability (of the classes in ``classes`` for a multi-class model)
is >= ``lane_threshold``, else 0. A multi-class model also gets /lane/labels: the class map as a
colour-coded rgb8 image (one fixed colour per class id), for RViz or rqt_image_view.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
from rclpy.publisher import Publisher
from sensor_msgs.msg import Image

from dynnet_ros.graph_transport import use_image_profile
from dynnet_ros.nodes.base import ParamSpec, run_node
from dynnet_ros.nodes.camera_inputs import CameraInput
from dynnet_ros.nodes.convert import array_to_image
from dynnet_ros.nodes.model_node import OUTPUT_QOS, ModelNode, publish_all
from dynnet_ros.nodes.model_params import class_list, classes_spec, common_specs, format_spec, input_size
from dynnet_ros.perception import Segmenter
from dynnet_ros.perception.formats.segmentation import segmentation_formats
from dynnet_ros.perception.serving import FrameInfo, Publish, engine_runs

TASK_PARAMETERS = [
    format_spec("Segmentation", segmentation_formats()),
    classes_spec("Multi-class models: class names or ids that form the lane mask ([''] = every class but 0, "
                 "the background)."),
    ParamSpec("output_name", "", "The model output to decode when it has several (empty = the first). A change "
              "loads the model again."),
    ParamSpec("lane_threshold", 0.5, "Lane probability at or above which a pixel is marked 255.", low=0.0, high=1.0),
]
#: every parameter lane_node declares (also what `dynnet up` and the launch file check a config against)
PARAMETERS = common_specs("lane") + TASK_PARAMETERS


def make_segmenter(path: str, params: dict[str, Any], memory_budget_mb: float | None, **engine: Any) -> Segmenter:
    """The node's Segmenter for ``params`` (also what `dynnet up` measures footprints with)."""
    return Segmenter(path, model_format=params["model_format"], classes=class_list(params["classes"]),
                     output_name=params["output_name"] or None, threshold=float(params["lane_threshold"]),
                     backend=params["backend"], memory_budget_mb=memory_budget_mb,
                     threads=int(params["threads"]) or None, input_size=input_size(path, params), **engine)


def label_colours(class_map: np.ndarray) -> np.ndarray:
    """HxW class ids -> HxWx3 uint8: a fixed, well-spread colour per id (0 black), so the same
    class keeps its colour from frame to frame and run to run."""
    ids = class_map.astype(np.uint32)
    hue = (ids * 2654435761) & 0xFFFFFF  # Knuth's multiplicative hash spreads neighbouring ids
    rgb = np.stack([(hue >> 16) & 0xFF, (hue >> 8) & 0xFF, hue & 0xFF], axis=-1).astype(np.uint8)
    rgb |= np.uint8(0x40)  # no near-black class colours
    rgb[class_map == 0] = 0
    return rgb


@dataclass(frozen=True)
class LaneOutputs:
    """One camera's lane outputs."""

    mask: Publisher
    labels: Publisher


class LaneNode(ModelNode[Segmenter]):
    task = "lane"
    core_params = ("classes", "output_name")
    # probability (4 B/px), mask (1), mono8 mask (1) and its message copies (2) at camera size
    output_bytes_per_pixel = 8.0

    def __init__(self, **options: Any) -> None:
        self._lane_fraction = 0.0
        super().__init__("lane_node", TASK_PARAMETERS, **options)

    def create_outputs(self, camera: CameraInput) -> LaneOutputs:
        return LaneOutputs(self.create_publisher(Image, camera.output("lane/mask"), OUTPUT_QOS),
                           self.create_publisher(Image, camera.output("lane/labels"), OUTPUT_QOS))

    def build_core(self, path: str, params: dict[str, Any], memory_budget_mb: float | None) -> Segmenter:
        return make_segmenter(path, params, memory_budget_mb, swappable=True, concurrent_runs=engine_runs(params))

    def infer(self, frames: list[FrameInfo], rgbs: list[np.ndarray], core: Segmenter) -> Publish:
        threshold = np.float32(self.params["lane_threshold"])  # applies per frame, no reload
        messages: list[tuple[Publisher, Image]] = []
        for frame, result in zip(frames, core.batch(rgbs)):
            if result.probability is not None:
                mask = np.greater_equal(result.probability, threshold).view(np.uint8)
            else:
                mask = result.mask.view(np.uint8)
            self._lane_fraction = float(np.count_nonzero(mask)) / mask.size
            outputs: LaneOutputs = self.outputs[frame.source]
            messages.append((outputs.mask, array_to_image(mask * np.uint8(255), "mono8", frame.header)))
            if result.class_map is not None:
                messages.append((outputs.labels, array_to_image(label_colours(result.class_map), "rgb8",
                                                                frame.header)))
        return publish_all(messages)

    def extra_diagnostics(self) -> dict:
        return {"lane_threshold": self.params["lane_threshold"], "lane_pixel_fraction": self._lane_fraction,
                "classes": ",".join(class_list(self.params["classes"])) or "(every class)",
                "output_name": getattr(self.core, "output_name", "")}


def main(args: list[str] | None = None) -> int:
    use_image_profile()  # it publishes images: the transport profile they need (graph_transport)
    return run_node(LaneNode, args)


if __name__ == "__main__":
    sys.exit(main())
