"""Depth node: camera image + LiDAR -> /depth/image (32FC1 metres, camera resolution).

An adapter over ``perception.DepthEstimator``. The newest /lidar/points cloud (if younger than
`lidar_max_age_s`) is moved into the camera frame with the `lidar_to_camera` extrinsic and
handed to the core with the /camera/camera_info intrinsics. What the core does with it depends
on the model's format: the zoo's RGB+LiDAR model takes it as a sparse depth channel; a relative
inverse-depth model (MiDaS / Depth Anything style) is made metric by a robust fit to it (held
from the last good fit when too few points land on the frame; fit residual and point count in
/diagnostics); a metric model's output is scaled by `depth_scale`. Without a cloud or
CameraInfo the core runs on the image alone. With several ``cameras`` the one cloud is moved
into each camera's frame with that camera's ``<name>.lidar_to_camera``.
"""
from __future__ import annotations

import dataclasses
import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from rclpy.publisher import Publisher
from rclpy.qos import qos_profile_sensor_data
from rclpy.time import Time
from sensor_msgs.msg import Image, PointCloud2

from dynnet_ros.geometry import extrinsic_matrix, transform_points
from dynnet_ros.graph_transport import use_image_profile
from dynnet_ros.nodes.base import SENSOR_QOS_OVERRIDES, ParamSpec, run_node
from dynnet_ros.nodes.camera_inputs import CameraInput
from dynnet_ros.nodes.convert import array_to_image, cloud_to_xyzi
from dynnet_ros.nodes.model_node import OUTPUT_QOS, ModelNode, publish_all
from dynnet_ros.nodes.model_params import common_specs, format_spec, input_size
from dynnet_ros.perception import DepthEstimator
from dynnet_ros.perception.formats.depth import DEPTH_FORMATS
from dynnet_ros.perception.results import DepthFit
from dynnet_ros.perception.serving import FrameInfo, Publish, engine_runs
from dynnet_ros.sim.scene import lidar_to_camera_xyzrpy


def _check_extrinsic(values: list[float]) -> str | None:
    try:
        extrinsic_matrix(values)
    except ValueError as exc:
        return f"lidar_to_camera: {exc}"
    return None


EXTRINSIC_HELP = ("Transform mapping LiDAR points into the camera frame: [x, y, z, roll, pitch, yaw] (m, rad; "
                  "R = Rz(yaw) Ry(pitch) Rx(roll)) or 16 values of a row-major 4x4.")

TASK_PARAMETERS = [
    format_spec("Depth", DEPTH_FORMATS, "signature and metadata"),
    ParamSpec("depth_scale", 1.0, "Metric models: multiplier from model output to metres (relative models are "
              "scaled by the LiDAR fit and need 1.0).", low=1e-3, high=1e3),
    ParamSpec("max_depth_m", 100.0, "Output depths are clipped to [0, max_depth_m].", low=0.1, high=1e4),
    ParamSpec("lidar_to_camera", lidar_to_camera_xyzrpy(), f"{EXTRINSIC_HELP} Default: the sensor simulator's "
              "mount.", kind="double_array", check=_check_extrinsic),
    ParamSpec("lidar_max_age_s", 0.5, "Ignore clouds older than this relative to the image stamp.",
              low=0.0, high=60.0),
]
#: every parameter depth_node declares (also what `dynnet up` and the launch file check)
PARAMETERS = common_specs("depth") + TASK_PARAMETERS
#: declared once per named camera as ``<camera name>.lidar_to_camera``
CAMERA_PARAMETERS = [
    ParamSpec("lidar_to_camera", lidar_to_camera_xyzrpy(), f"That camera's extrinsic. {EXTRINSIC_HELP} Default: "
              "the node's lidar_to_camera at start.", kind="double_array", check=_check_extrinsic),
]


@dataclass(frozen=True)
class DepthOutputs:
    """One camera's depth output, and the name of its extrinsic parameter."""

    image: Publisher
    extrinsic: str


def make_depth_estimator(path: str, params: dict[str, Any], memory_budget_mb: float | None,
                         **engine: Any) -> DepthEstimator:
    """The node's DepthEstimator for ``params`` (also what `dynnet up` measures footprints with)."""
    return DepthEstimator(path, model_format=params["model_format"], depth_scale=float(params["depth_scale"]),
                          max_depth_m=float(params["max_depth_m"]), backend=params["backend"],
                          memory_budget_mb=memory_budget_mb, threads=int(params["threads"]) or None,
                          input_size=input_size(path, params), **engine)


class DepthNode(ModelNode[DepthEstimator]):
    task = "depth"
    extra_input_channels = 1  # the zoo model's LiDAR depth channel
    # float32 maps at camera size (the output mapped back, the metric map: 8 B/px) and the
    # output message's two copies (8 B/px)
    output_bytes_per_pixel = 16.0

    def __init__(self, **options: Any) -> None:
        self._cloud_lock = threading.Lock()
        self._cloud: tuple[Time, np.ndarray] | None = None
        self._lidar_in_view = 0
        self._fit: DepthFit | None = None
        super().__init__("depth_node", TASK_PARAMETERS, **options)

    def create_outputs(self, camera: CameraInput) -> DepthOutputs:
        extrinsic = f"{camera.name}.lidar_to_camera" if camera.namespace else "lidar_to_camera"
        return DepthOutputs(self.create_publisher(Image, camera.output("depth/image"), OUTPUT_QOS), extrinsic)

    def camera_specs(self, camera: CameraInput, params: dict[str, Any]) -> list[ParamSpec]:
        return [dataclasses.replace(spec, name=f"{camera.name}.{spec.name}", default=params[spec.name])
                for spec in CAMERA_PARAMETERS]

    def create_sensor_inputs(self) -> None:
        self.create_subscription(PointCloud2, "lidar/points", self._on_cloud, qos_profile_sensor_data,
                                 callback_group=self.io_group, qos_overriding_options=SENSOR_QOS_OVERRIDES)
        super().create_sensor_inputs()

    def build_core(self, path: str, params: dict[str, Any], memory_budget_mb: float | None) -> DepthEstimator:
        return make_depth_estimator(path, params, memory_budget_mb, swappable=True,
                                    concurrent_runs=engine_runs(params))

    def validate_task_params(self, merged: dict[str, Any], updates: dict[str, Any]) -> None:
        # a model change is checked by the new core itself
        if "depth_scale" in updates and merged["depth_scale"] != 1.0 and self.core.format.relative \
                and not {"model_path", "model_format"} & set(updates):
            raise ValueError("depth_scale applies to metric outputs; this relative model is scaled by the LiDAR fit")

    def _on_cloud(self, msg: PointCloud2) -> None:
        """Parse on arrival: a malformed cloud is reported and dropped, the last good one stays."""
        try:
            points = cloud_to_xyzi(msg)
        except ValueError as exc:
            self.stats.failed += 1
            self.report_error(f"bad point cloud: {exc}")
            return
        with self._cloud_lock:
            self._cloud = (Time.from_msg(msg.header.stamp), points)

    def _camera_points(self, frame: FrameInfo) -> np.ndarray | None:
        """The newest cloud in the frame's camera's optical frame, or None when it is missing or stale."""
        with self._cloud_lock:
            cloud = self._cloud
        if cloud is None:
            return None
        stamp, points = cloud
        age = abs((Time.from_msg(frame.header.stamp) - stamp).nanoseconds) * 1e-9
        if age > self.params["lidar_max_age_s"]:
            return None
        outputs: DepthOutputs = self.outputs[frame.source]
        return transform_points(extrinsic_matrix(self.params[outputs.extrinsic]), points[:, :3])

    def infer(self, frames: list[FrameInfo], rgbs: list[np.ndarray], core: DepthEstimator) -> Publish:
        if not core.format.relative:  # read per batch: a change takes effect without reloading the model
            core.depth_scale = float(self.params["depth_scale"])
        core.max_depth_m = float(self.params["max_depth_m"])
        lidars: list[tuple[np.ndarray, np.ndarray] | None] = []
        for frame in frames:
            k = self.intrinsics_for(frame)
            points = self._camera_points(frame) if k is not None else None
            lidars.append((points, k) if points is not None and k is not None else None)
        # a relative model's LiDAR fit is held per camera: one camera's fit never scales another's map
        messages: list[tuple[Any, Any]] = []
        for frame, depth in zip(frames, core.batch(rgbs, lidars, [frame.source for frame in frames])):
            self._lidar_in_view = depth.lidar_points
            self._fit = depth.fit
            outputs: DepthOutputs = self.outputs[frame.source]
            messages.append((outputs.image, array_to_image(depth.metres, "32FC1", frame.header)))
        return publish_all(messages)

    def extra_diagnostics(self) -> dict:
        values: dict[str, Any] = {"lidar_pixels_in_view": self._lidar_in_view,
                                  "depth_scale": self.params["depth_scale"]}
        if self.core.format.relative:
            fit = self._fit
            values.update({"fit_points": fit.points if fit else 0, "fit_inliers": fit.inliers if fit else 0,
                           "fit_residual_inv_m": fit.residual if fit else None,
                           "fit_held": fit.held if fit else False,
                           "fit_scale": fit.scale if fit else None, "fit_shift": fit.shift if fit else None})
        return values


def main(args: list[str] | None = None) -> int:
    use_image_profile()  # it publishes images: the transport profile they need (graph_transport)
    return run_node(DepthNode, args)


if __name__ == "__main__":
    sys.exit(main())
