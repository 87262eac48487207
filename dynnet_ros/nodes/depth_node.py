"""Depth node: camera image + projected LiDAR -> /depth/image (32FC1 metres, camera resolution).

The newest /lidar/points cloud (if younger than `lidar_max_age_s`) is moved into the camera
frame with the `lidar_to_camera` extrinsic, projected with the /camera/camera_info intrinsics
(rescaled to the model's input size) into a sparse depth channel, and fed to the model next to
the image. Without a cloud or CameraInfo the channel is all zeros ("no return").
"""
from __future__ import annotations

import sys
import threading

import numpy as np
from rclpy.qos import qos_profile_sensor_data
from rclpy.time import Time
from sensor_msgs.msg import Image, PointCloud2

from dynnet_ros.engine import Engine
from dynnet_ros.nodes.base import ParamSpec, run_node
from dynnet_ros.nodes.convert import array_to_image, cloud_to_xyzi
from dynnet_ros.nodes.frame_memory import InputBuffer, to_source_lean
from dynnet_ros.nodes.geometry import Letterbox, extrinsic_matrix, project_depth, transform_points
from dynnet_ros.nodes.model_node import OUTPUT_QOS, FrameInfo, ModelInterface, ModelNode, common_specs
from dynnet_ros.nodes.scene import lidar_to_camera_xyzrpy


def _check_extrinsic(values: list[float]) -> str | None:
    try:
        extrinsic_matrix(values)
    except ValueError as exc:
        return f"lidar_to_camera: {exc}"
    return None


TASK_PARAMETERS = [
    ParamSpec("depth_scale", 1.0, "Multiplier from model output to metres.", low=1e-3, high=1e3),
    ParamSpec("max_depth_m", 100.0, "Output depths are clipped to [0, max_depth_m].", low=0.1, high=1e4),
    ParamSpec("lidar_to_camera", lidar_to_camera_xyzrpy(),
              "Transform mapping LiDAR points into the camera frame: [x, y, z, roll, pitch, yaw] "
              "(m, rad; R = Rz(yaw) Ry(pitch) Rx(roll)) or 16 values of a row-major 4x4. "
              "Default: the sensor simulator's mount.", kind="double_array", check=_check_extrinsic),
    ParamSpec("lidar_max_age_s", 0.5, "Ignore clouds older than this relative to the image stamp.",
              low=0.0, high=60.0),
]
#: every parameter depth_node declares (also what `dynnet up` and the launch file check)
PARAMETERS = common_specs("depth") + TASK_PARAMETERS


class DepthNode(ModelNode):
    task = "depth"
    extra_input_channels = 1  # the LiDAR depth channel
    # the float32 depth map at camera size (4 B/px) and its two message copies (8 B/px)
    output_bytes_per_pixel = 12.0

    def __init__(self) -> None:
        self._lidar_buffer = InputBuffer(1)
        super().__init__("depth_node", TASK_PARAMETERS)
        self._cloud_lock = threading.Lock()
        self._cloud: tuple[Time, np.ndarray] | None = None
        self._lidar_in_view = 0
        self.depth_pub = self.create_publisher(Image, "depth/image", OUTPUT_QOS)
        self.create_subscription(PointCloud2, "lidar/points", self._on_cloud, qos_profile_sensor_data,
                                 callback_group=self.io_group)

    def check_model(self, engine: ModelInterface | Engine) -> None:
        names = {s.name for s in engine.inputs}
        if names != {"image", "lidar_depth"}:
            raise ValueError(f"model has inputs {sorted(names)}; a depth model needs ['image', 'lidar_depth']")

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

    def _lidar_channel(self, msg: FrameInfo, letterbox: Letterbox) -> np.ndarray:
        """The sparse LiDAR depth in the reused 1x1xHxW input tensor (returns its HxW plane)."""
        with self._cloud_lock:
            cloud = self._cloud
        channel = self._lidar_buffer.get(letterbox.pad_h, letterbox.pad_w)[0, 0]
        channel.fill(0.0)
        self._lidar_in_view = 0
        k = self.intrinsics_for(int(msg.width), int(msg.height))
        if cloud is None or k is None:
            return channel
        stamp, points = cloud
        age = abs((Time.from_msg(msg.header.stamp) - stamp).nanoseconds) * 1e-9
        if age > self.params["lidar_max_age_s"]:
            return channel
        cam = transform_points(extrinsic_matrix(self.params["lidar_to_camera"]), points[:, :3])
        sparse = project_depth(cam, letterbox.scale_intrinsics(k), letterbox.new_h, letterbox.new_w)
        channel[: letterbox.new_h, : letterbox.new_w] = sparse
        self._lidar_in_view = int(np.count_nonzero(sparse))
        return channel

    def infer(self, msg: FrameInfo, image: np.ndarray, letterbox: Letterbox, engine: Engine) -> None:
        lidar = self._lidar_channel(msg, letterbox)
        lidar_input = self._lidar_buffer.array
        if lidar_input is None:  # _lidar_channel() has sized the buffer for this frame
            raise RuntimeError("LiDAR input buffer was not allocated")
        out = engine.run({"image": image, "lidar_depth": lidar_input})
        depth = out.pop("depth")
        del out
        if depth.ndim != 4 or depth.shape[2:] != lidar.shape:
            raise ValueError(f"depth model returned shape {list(depth.shape)}, expected [1, 1, {lidar.shape[0]}, "
                             f"{lidar.shape[1]}]")
        full = to_source_lean(letterbox, depth[0, 0])
        scale = np.float32(self.params["depth_scale"])
        # one camera-size float32 array, edited in place (the output map itself when rescaled)
        full = np.multiply(full, scale) if np.may_share_memory(full, depth) else np.multiply(full, scale, out=full)
        del depth
        np.nan_to_num(full, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
        np.clip(full, 0.0, self.params["max_depth_m"], out=full)
        self.depth_pub.publish(array_to_image(full, "32FC1", msg.header))

    def extra_diagnostics(self) -> dict:
        return {"lidar_pixels_in_view": self._lidar_in_view, "depth_scale": self.params["depth_scale"]}


def main(args: list[str] | None = None) -> int:
    return run_node(DepthNode, args)


if __name__ == "__main__":
    sys.exit(main())
