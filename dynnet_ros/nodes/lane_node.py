"""Lane segmentation node: /camera/image_raw -> /lane/mask (mono8, camera resolution).

The mask is 255 where the lane probability is >= `lane_threshold`, else 0.
"""
from __future__ import annotations

import sys

import numpy as np
from sensor_msgs.msg import Image

from dynnet_ros.engine import Engine
from dynnet_ros.nodes.base import ParamSpec, run_node
from dynnet_ros.nodes.convert import array_to_image
from dynnet_ros.nodes.frame_memory import to_source_lean
from dynnet_ros.nodes.geometry import Letterbox
from dynnet_ros.nodes.model_node import OUTPUT_QOS, FrameInfo, ModelInterface, ModelNode, common_specs

TASK_PARAMETERS = [
    ParamSpec("lane_threshold", 0.5, "Lane probability at or above which a pixel is marked 255.", low=0.0, high=1.0),
]
#: every parameter lane_node declares (also what `dynnet up` and the launch file check a config against)
PARAMETERS = common_specs("lane") + TASK_PARAMETERS


class LaneNode(ModelNode):
    task = "lane"
    # the mask (1 B/px) and its message copies (2 B/px); a downscaled frame's map back at camera size
    output_bytes_per_pixel = 3.0
    scaled_output_bytes_per_pixel = 4.0

    def __init__(self) -> None:
        super().__init__("lane_node", TASK_PARAMETERS)
        self.mask_pub = self.create_publisher(Image, "lane/mask", OUTPUT_QOS)
        self._lane_fraction = 0.0

    def check_model(self, engine: ModelInterface | Engine) -> None:
        names = sorted(s.name for s in engine.inputs)
        if names != ["image"] or "lane_prob" not in engine.outputs:
            raise ValueError(f"model has inputs {names} and outputs {engine.outputs}; a lane model takes 'image' "
                             f"only and returns 'lane_prob'")

    def infer(self, frame: FrameInfo, image: np.ndarray, letterbox: Letterbox, engine: Engine) -> None:
        prob = engine.run({"image": image})["lane_prob"]
        if prob.ndim != 4 or prob.shape[2:] != image.shape[2:]:
            raise ValueError(f"lane model returned shape {list(prob.shape)}, expected [1, 1, "
                             f"{image.shape[2]}, {image.shape[3]}]")
        full = to_source_lean(letterbox, prob[0, 0])  # a view of the output when not rescaled
        mask = np.greater_equal(full, np.float32(self.params["lane_threshold"])).view(np.uint8)
        del full, prob
        self._lane_fraction = float(np.count_nonzero(mask)) / mask.size
        mask *= 255  # in place: 1 -> 255
        self.mask_pub.publish(array_to_image(mask, "mono8", frame.header))

    def extra_diagnostics(self) -> dict:
        return {"lane_threshold": self.params["lane_threshold"], "lane_pixel_fraction": self._lane_fraction}


def main(args: list[str] | None = None) -> int:
    return run_node(LaneNode, args)


if __name__ == "__main__":
    sys.exit(main())
