"""Pedestrian detector node: /camera/image_raw -> /pedestrian/markers (+ /pedestrian/detections).

/pedestrian/markers (visualization_msgs/MarkerArray) is always published: a DELETEALL marker,
then per detection a LINE_STRIP box and a score label. Boxes are drawn on the plane 1 m in
front of the camera (pixel corners back-projected with the CameraInfo K; without a CameraInfo
the camera is assumed to have a 70 degree horizontal field of view), so they overlay the
image in RViz. /pedestrian/detections (vision_msgs/Detection2DArray, boxes in camera pixels)
is published only when vision_msgs is importable; otherwise the node says so once at startup
and in its diagnostics.
"""
from __future__ import annotations

import sys

import numpy as np
from geometry_msgs.msg import Point
from visualization_msgs.msg import Marker, MarkerArray

from dynnet_ros.engine import Engine
from dynnet_ros.nodes.base import ParamSpec, run_node
from dynnet_ros.nodes.geometry import Letterbox
from dynnet_ros.nodes.model_node import OUTPUT_QOS, FrameInfo, ModelInterface, ModelNode, common_specs
from dynnet_ros.nodes.scene import camera_matrix

try:  # optional: not on PyPI as a wheel; present on robots with a system ROS 2
    from vision_msgs.msg import BoundingBox2D, Detection2D, Detection2DArray, ObjectHypothesisWithPose
    HAVE_VISION_MSGS = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_VISION_MSGS = False

BOX_NS = "pedestrian_boxes"
LABEL_NS = "pedestrian_scores"
REQUIRED_INPUTS = {"image", "score_threshold", "iou_threshold", "max_detections"}


TASK_PARAMETERS = [
    ParamSpec("score_threshold", 0.3, "Minimum detection score.", low=0.0, high=1.0),
    ParamSpec("nms_iou", 0.45, "IoU above which NonMaxSuppression suppresses the weaker box.", low=0.0, high=1.0),
    ParamSpec("max_detections", 50, "Most detections kept per frame.", low=1, high=1000),
]
#: every parameter pedestrian_node declares (also what `dynnet up` and the launch file check)
PARAMETERS = common_specs("pedestrian") + TASK_PARAMETERS


class PedestrianNode(ModelNode):
    task = "pedestrian"
    pad_value = 0.5

    def __init__(self) -> None:
        super().__init__("pedestrian_node", TASK_PARAMETERS)
        self.marker_pub = self.create_publisher(MarkerArray, "pedestrian/markers", OUTPUT_QOS)
        self.detection_pub = None
        if HAVE_VISION_MSGS:
            self.detection_pub = self.create_publisher(Detection2DArray, "pedestrian/detections", OUTPUT_QOS)
        else:
            self.get_logger().warning("vision_msgs is not importable: /pedestrian/detections is not published "
                                   "(markers on /pedestrian/markers still are)")
        self._last_count = 0

    def check_model(self, engine: ModelInterface | Engine) -> None:
        names = {s.name for s in engine.inputs}
        if not REQUIRED_INPUTS <= names:
            raise ValueError(f"model has inputs {sorted(names)}; a pedestrian model needs {sorted(REQUIRED_INPUTS)}")
        if not {"boxes", "scores"} <= set(engine.outputs):
            raise ValueError(f"model has outputs {engine.outputs}; a pedestrian model needs 'boxes' and 'scores'")

    def infer(self, msg: FrameInfo, image: np.ndarray, letterbox: Letterbox, engine: Engine) -> None:
        threshold = float(self.params["score_threshold"])
        limit = int(self.params["max_detections"])
        out = engine.run({
            "image": image,
            "score_threshold": np.array([threshold], dtype=np.float32),
            "iou_threshold": np.array([self.params["nms_iou"]], dtype=np.float32),
            "max_detections": np.array([limit], dtype=np.int64),
        })
        boxes = letterbox.boxes_to_source(out["boxes"])
        scores = np.asarray(out["scores"], dtype=np.float32).reshape(-1)
        if len(scores) != len(boxes):
            raise ValueError(f"pedestrian model returned {len(boxes)} boxes but {len(scores)} scores")
        keep = np.argsort(-scores, kind="stable")[:limit]
        keep = keep[scores[keep] >= threshold]
        boxes, scores = boxes[keep], scores[keep]
        self._last_count = len(scores)
        k = self.intrinsics_for(int(msg.width), int(msg.height))
        if k is None:
            k = camera_matrix(int(msg.width), int(msg.height))
        self.marker_pub.publish(self._markers(msg, boxes, scores, k))
        if self.detection_pub is not None:
            self.detection_pub.publish(self._detections(msg, boxes, scores))

    @staticmethod
    def _markers(msg: FrameInfo, boxes: np.ndarray, scores: np.ndarray, k: np.ndarray) -> MarkerArray:
        array = MarkerArray()
        clear = Marker(header=msg.header, action=Marker.DELETEALL)
        array.markers.append(clear)
        fx, fy, cx, cy = k[0, 0], k[1, 1], k[0, 2], k[1, 2]

        def at(u: float, v: float) -> Point:  # pixel -> point on the z = 1 m plane
            return Point(x=float((u - cx) / fx), y=float((v - cy) / fy), z=1.0)

        for i, ((x1, y1, x2, y2), score) in enumerate(zip(boxes.tolist(), scores.tolist())):
            box = Marker(header=msg.header, ns=BOX_NS, id=i, type=Marker.LINE_STRIP, action=Marker.ADD)
            box.points = [at(x1, y1), at(x2, y1), at(x2, y2), at(x1, y2), at(x1, y1)]
            box.scale.x = 0.005
            box.color.r, box.color.g, box.color.b, box.color.a = 1.0, 0.2, 0.2, 1.0
            box.pose.orientation.w = 1.0
            label = Marker(header=msg.header, ns=LABEL_NS, id=i, type=Marker.TEXT_VIEW_FACING, action=Marker.ADD)
            label.pose.position = at(x1, y1)
            label.pose.orientation.w = 1.0
            label.scale.z = 0.03
            label.color.r = label.color.g = label.color.b = label.color.a = 1.0
            label.text = f"pedestrian {score:.2f}"
            array.markers.extend([box, label])
        return array

    @staticmethod
    def _detections(msg: FrameInfo, boxes: np.ndarray, scores: np.ndarray):  # pragma: no cover - needs vision_msgs
        array = Detection2DArray(header=msg.header)
        for i, ((x1, y1, x2, y2), score) in enumerate(zip(boxes.tolist(), scores.tolist())):
            det = Detection2D(header=msg.header, id=str(i))
            det.bbox = BoundingBox2D()
            det.bbox.center.position.x = (x1 + x2) / 2.0
            det.bbox.center.position.y = (y1 + y2) / 2.0
            det.bbox.size_x = float(x2 - x1)
            det.bbox.size_y = float(y2 - y1)
            hyp = ObjectHypothesisWithPose()
            hyp.hypothesis.class_id = "pedestrian"
            hyp.hypothesis.score = float(score)
            det.results = [hyp]
            array.detections.append(det)
        return array

    def extra_diagnostics(self) -> dict:
        return {"detections": self._last_count, "score_threshold": self.params["score_threshold"],
                "nms_iou": self.params["nms_iou"], "max_detections": self.params["max_detections"],
                "vision_msgs": "published" if HAVE_VISION_MSGS else "not importable: markers only"}


def main(args: list[str] | None = None) -> int:
    return run_node(PedestrianNode, args)


if __name__ == "__main__":
    sys.exit(main())
