"""Pedestrian detector node: /camera/image_raw -> /pedestrian/markers (+ /pedestrian/detections).

An adapter over ``perception.Detector``: any detector export the core decodes (YOLOv8/v5/X,
end-to-end, DETR/RT-DETR, SSD, the zoo's) runs here; ``classes`` picks the classes that count
(names or ids, empty = every class).

/pedestrian/markers (visualization_msgs/MarkerArray) is always published: a DELETEALL marker,
then per detection a LINE_STRIP box and a TEXT_VIEW_FACING label "<class> <score>". Boxes are
drawn on the plane 1 m in front of the camera (pixel corners back-projected with the CameraInfo
K; without a CameraInfo the camera is assumed to have a 70 degree horizontal field of view), so
they overlay the image in RViz. /pedestrian/detections (vision_msgs/Detection2DArray, boxes in
camera pixels, each hypothesis' class_id the class name, or its id when the model has no names)
is published only when vision_msgs is importable; otherwise the node says so once at startup
and in its diagnostics.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
from geometry_msgs.msg import Point
from rclpy.publisher import Publisher
from visualization_msgs.msg import Marker, MarkerArray

from dynnet_ros.nodes.base import ParamSpec, run_node
from dynnet_ros.nodes.camera_inputs import CameraInput
from dynnet_ros.nodes.model_node import OUTPUT_QOS, ModelNode, publish_all
from dynnet_ros.nodes.model_params import class_list, classes_spec, common_specs, format_spec, input_size
from dynnet_ros.perception import Detections, Detector
from dynnet_ros.perception.formats.detection import DETECTION_FORMATS
from dynnet_ros.perception.serving import FrameInfo, Publish, engine_runs
from dynnet_ros.sim.scene import camera_matrix

try:  # optional: not on PyPI as a wheel; present on robots with a system ROS 2
    from vision_msgs.msg import BoundingBox2D, Detection2D, Detection2DArray, ObjectHypothesisWithPose
    HAVE_VISION_MSGS = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_VISION_MSGS = False

BOX_NS = "pedestrian_boxes"
LABEL_NS = "pedestrian_labels"


TASK_PARAMETERS = [
    format_spec("Detector", DETECTION_FORMATS, "signature and metadata"),
    classes_spec("Class names or ids that count as pedestrians ([''] or [] = every class), e.g. ['person'] for a "
                 "COCO detector."),
    ParamSpec("labels_file", "", "Class names, one per line (or a YAML/JSON list or id->name map), overriding "
              "the model's metadata; empty = the model's own names. A change loads the model again."),
    ParamSpec("score_threshold", 0.3, "Minimum detection score.", low=0.0, high=1.0),
    ParamSpec("nms_iou", 0.45, "IoU above which class-aware NMS suppresses the weaker box (raw heads; "
              "exports with NMS inside get it as an input where they take one).", low=0.0, high=1.0),
    ParamSpec("max_detections", 50, "Most detections kept per frame.", low=1, high=1000),
]
#: every parameter pedestrian_node declares (also what `dynnet up` and the launch file check)
PARAMETERS = common_specs("pedestrian") + TASK_PARAMETERS


def make_detector(path: str, params: dict[str, Any], memory_budget_mb: float | None, **engine: Any) -> Detector:
    """The node's Detector for ``params`` (also what `dynnet up` measures footprints with)."""
    return Detector(path, model_format=params["model_format"], classes=class_list(params["classes"]),
                    score_threshold=float(params["score_threshold"]), nms_iou=float(params["nms_iou"]),
                    max_detections=int(params["max_detections"]), backend=params["backend"],
                    memory_budget_mb=memory_budget_mb, labels_file=params["labels_file"] or None,
                    threads=int(params["threads"]) or None, input_size=input_size(path, params), **engine)


@dataclass(frozen=True)
class PedestrianOutputs:
    """One camera's pedestrian outputs (no detections publisher without vision_msgs)."""

    markers: Publisher
    detections: Publisher | None


class PedestrianNode(ModelNode[Detector]):
    task = "pedestrian"
    core_params = ("classes", "labels_file")

    def __init__(self, **options: Any) -> None:
        self._last_count = 0
        super().__init__("pedestrian_node", TASK_PARAMETERS, **options)

    def create_outputs(self, camera: CameraInput) -> PedestrianOutputs:
        detections = None
        if HAVE_VISION_MSGS:
            detections = self.create_publisher(Detection2DArray, camera.output("pedestrian/detections"), OUTPUT_QOS)
        elif camera == self.cameras[0]:   # said once, for every camera
            self.get_logger().warning("vision_msgs is not importable: /pedestrian/detections is not published "
                                      "(markers on /pedestrian/markers still are)")
        return PedestrianOutputs(self.create_publisher(MarkerArray, camera.output("pedestrian/markers"), OUTPUT_QOS),
                                 detections)

    def build_core(self, path: str, params: dict[str, Any], memory_budget_mb: float | None) -> Detector:
        return make_detector(path, params, memory_budget_mb, swappable=True, concurrent_runs=engine_runs(params))

    def infer(self, frames: list[FrameInfo], rgbs: list[np.ndarray], core: Detector) -> Publish:
        # thresholds are read per batch: a change takes effect without reloading the model
        core.score_threshold = float(self.params["score_threshold"])
        core.nms_iou = float(self.params["nms_iou"])
        core.max_detections = int(self.params["max_detections"])
        messages: list[tuple[Any, Any]] = []
        for frame, detections in zip(frames, core.batch(rgbs)):
            self._last_count = len(detections)
            k = self.intrinsics_for(frame)
            if k is None:
                k = camera_matrix(frame.width, frame.height)
            outputs: PedestrianOutputs = self.outputs[frame.source]
            messages.append((outputs.markers, markers(frame, detections, k)))
            if outputs.detections is not None:
                messages.append((outputs.detections, detection_array(frame, detections)))
        return publish_all(messages)

    def extra_diagnostics(self) -> dict:
        core = self.core
        names = getattr(core, "names", None)
        return {"detections": self._last_count, "score_threshold": self.params["score_threshold"],
                "nms_iou": self.params["nms_iou"], "max_detections": self.params["max_detections"],
                "classes": ",".join(class_list(self.params["classes"])) or "(every class)",
                "class_count": len(names) if names else 0,
                "vision_msgs": "published" if HAVE_VISION_MSGS else "not importable: markers only"}


def label(name: str, class_id: int, score: float) -> str:
    """A box's label: its class (the name, else the id) and score."""
    return f"{name or class_id} {score:.2f}"


def markers(frame: FrameInfo, detections: Detections, k: np.ndarray) -> MarkerArray:
    """DELETEALL, then per detection its box and its class-and-score label (see module doc)."""
    array = MarkerArray()
    array.markers.append(Marker(header=frame.header, action=Marker.DELETEALL))
    fx, fy, cx, cy = k[0, 0], k[1, 1], k[0, 2], k[1, 2]

    def at(u: float, v: float) -> Point:  # pixel -> point on the z = 1 m plane
        return Point(x=float((u - cx) / fx), y=float((v - cy) / fy), z=1.0)

    rows = zip(detections.boxes_xyxy.tolist(), detections.scores.tolist(), detections.class_ids.tolist(),
               detections.class_names)
    for i, ((x1, y1, x2, y2), score, class_id, name) in enumerate(rows):
        box = Marker(header=frame.header, ns=BOX_NS, id=i, type=Marker.LINE_STRIP, action=Marker.ADD)
        box.points = [at(x1, y1), at(x2, y1), at(x2, y2), at(x1, y2), at(x1, y1)]
        box.scale.x = 0.005
        box.color.r, box.color.g, box.color.b, box.color.a = 1.0, 0.2, 0.2, 1.0
        box.pose.orientation.w = 1.0
        text = Marker(header=frame.header, ns=LABEL_NS, id=i, type=Marker.TEXT_VIEW_FACING, action=Marker.ADD)
        text.pose.position = at(x1, y1)
        text.pose.orientation.w = 1.0
        text.scale.z = 0.03
        text.color.r = text.color.g = text.color.b = text.color.a = 1.0
        text.text = label(name, class_id, score)
        array.markers.extend([box, text])
    return array


def detection_array(frame: FrameInfo, detections: Detections):  # pragma: no cover - needs vision_msgs
    """vision_msgs/Detection2DArray in camera pixels; class_id is the class name (or id)."""
    array = Detection2DArray(header=frame.header)
    rows = zip(detections.boxes_xyxy.tolist(), detections.scores.tolist(), detections.class_ids.tolist(),
               detections.class_names)
    for i, ((x1, y1, x2, y2), score, class_id, name) in enumerate(rows):
        det = Detection2D(header=frame.header, id=str(i))
        det.bbox = BoundingBox2D()
        det.bbox.center.position.x = (x1 + x2) / 2.0
        det.bbox.center.position.y = (y1 + y2) / 2.0
        det.bbox.size_x = float(x2 - x1)
        det.bbox.size_y = float(y2 - y1)
        hyp = ObjectHypothesisWithPose()
        hyp.hypothesis.class_id = name or str(class_id)
        hyp.hypothesis.score = float(score)
        det.results = [hyp]
        array.detections.append(det)
    return array


def main(args: list[str] | None = None) -> int:
    return run_node(PedestrianNode, args)


if __name__ == "__main__":
    sys.exit(main())
