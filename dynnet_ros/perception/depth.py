"""DepthEstimator: an exported depth model as a function (frame, LiDAR) -> Depth in metres (source pixels)."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from dynnet_ros.perception.core import PerceptionCore, check_frames, check_positive_int
from dynnet_ros.perception.depth_fit import robust_affine_fit
from dynnet_ros.perception.formats.depth import DEPTH_FORMATS, LIDAR_INPUT, DepthFormat
from dynnet_ros.perception.letterbox import Letterbox
from dynnet_ros.perception.preprocess import PreprocessOptions
from dynnet_ros.perception.projection import check_points, project_depth, project_points, validate_intrinsics
from dynnet_ros.perception.results import Depth, DepthFit


def _positive(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not 0 < float(value) < np.inf:
        raise ValueError(f"{what} must be a finite positive number, got {value!r}")
    return float(value)


def _checked_lidar(lidar_points: np.ndarray | None,
                   camera_matrix: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    if (lidar_points is None) != (camera_matrix is None):
        raise ValueError("lidar_points and camera_matrix go together: the points are projected with the "
                         "camera matrix")
    k = None if camera_matrix is None else validate_intrinsics(camera_matrix)
    points = None if lidar_points is None else check_points(lidar_points)
    return points, k


def _pair(item: object) -> tuple[np.ndarray | None, np.ndarray | None]:
    if not isinstance(item, (list, tuple)) or len(item) != 2:
        raise ValueError(f"a frame's LiDAR must be (lidar_points, camera_matrix) or None, got {item!r:.80}")
    return item[0], item[1]


class DepthEstimator(PerceptionCore[DepthFormat]):
    """Run a depth export on HxWx3 uint8 RGB frames, with optional LiDAR.

    ``lidar_points``: (N, 3) points in the camera's optical frame (metres); ``camera_matrix``: the
    frame's 3x3 intrinsics. Metric models: metres = output x ``depth_scale``. Relative
    inverse-depth models: 1 / metres = scale x output + shift, fitted per frame to the LiDAR
    points that land on the frame (``depth_fit``); with fewer than ``min_fit_points`` the last
    good fit of the same ``source`` (the camera) is held, and before any fit the map is all 0
    (unknown). Zoo models take the
    LiDAR as an input channel. Depths are clipped to ``max_depth_m``; 0 means unknown.
    """

    task = "depth"

    def __init__(self, model_path: str | os.PathLike, model_format: str = "auto", *, depth_scale: float = 1.0,
                 max_depth_m: float = 100.0, min_fit_points: int = 20, backend: str = "cpu",
                 memory_budget_mb: float | None = None, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, channel_order: str | None = None, scale: float | None = None,
                 layout: str | None = None, input_size: int | Sequence[int] | None = None,
                 input_multiple: int | None = None, resize: str | None = None, pad_value: float | None = None,
                 pad_position: str | None = None, threads: int | None = None,
                 swappable: bool = False, concurrent_runs: int = 1) -> None:
        self.depth_scale = _positive(depth_scale, "depth_scale")
        self.max_depth_m = _positive(max_depth_m, "max_depth_m")
        self.min_fit_points = check_positive_int(min_fit_points, "min_fit_points")
        if self.min_fit_points < 3:
            raise ValueError(f"min_fit_points must be >= 3 (a line and a check), got {min_fit_points}")
        options = PreprocessOptions(channel_order=channel_order, scale=scale, mean=mean, std=std, layout=layout,
                                    input_size=input_size, input_multiple=input_multiple, resize=resize,
                                    pad_value=pad_value, pad_position=pad_position)
        super().__init__(model_path, model_format, DEPTH_FORMATS, preprocess=options, backend=backend,
                         memory_budget_mb=memory_budget_mb, threads=threads, swappable=swappable,
                         concurrent_runs=concurrent_runs)
        if self.format.relative and depth_scale != 1.0:
            self.close()
            raise ValueError("depth_scale applies to metric outputs; a relative model is scaled by the LiDAR fit")
        self.output_name = self.format.output(self.info).name
        self._last_fit: DepthFit | None = None
        self._fits: dict[str, DepthFit] = {}   # the last good fit per source (camera)

    def __call__(self, frame: np.ndarray, lidar_points: np.ndarray | None = None,
                 camera_matrix: np.ndarray | None = None, *, source: str = "") -> Depth:
        """``source``: the camera the frame comes from (a relative model holds a fit per camera)."""
        points, k = _checked_lidar(lidar_points, camera_matrix)
        tensor, box = self._prepare(frame)
        feeds = {self.preprocess.input_name: tensor}
        in_view = 0
        if self.format.lidar_input:
            feeds[LIDAR_INPUT] = np.zeros((1, 1, box.pad_h, box.pad_w), dtype=np.float32)
            in_view = self._fill_lidar(feeds[LIDAR_INPUT][0, 0], points, k, box)
        value = self._run(feeds)[self.output_name]
        return self._finish(value, box, points, k, in_view, source)

    def batch(self, frames: Sequence[np.ndarray],
              lidars: Sequence[tuple[np.ndarray, np.ndarray] | None] | None = None,
              sources: Sequence[str] | None = None) -> list[Depth]:
        """``self(frame, points, camera_matrix, source=source)`` for each frame, in one engine run
        per ``max_batch`` frames. ``lidars``: per frame, ``(lidar_points, camera_matrix)`` or None
        (no LiDAR for that frame); None = none for any. ``sources``: per frame, its camera (None:
        all one camera). Frames of different sizes share the largest padded input size; maps come
        back at each frame's size. A relative model's fits are made and held in the batch's order,
        as one-by-one calls make them."""
        frames = check_frames(frames)
        if lidars is None:
            lidars = [None] * len(frames)
        if not isinstance(lidars, (list, tuple)) or len(lidars) != len(frames):
            raise ValueError(f"lidars must be a list with one (points, camera_matrix) or None per frame "
                             f"({len(frames)}), got {lidars!r:.80}")
        if sources is None:
            sources = [""] * len(frames)
        if not isinstance(sources, (list, tuple)) or len(sources) != len(frames) \
                or not all(isinstance(name, str) for name in sources):
            raise ValueError(f"sources must be a list with one camera name per frame ({len(frames)}), "
                             f"got {sources!r:.80}")
        checked = [(None, None) if item is None else _checked_lidar(*_pair(item)) for item in lidars]
        def alone(i: int) -> Depth:
            points, k = checked[i]
            return self(frames[i], points, k, source=sources[i])

        def together(chunk: Sequence[int]) -> list[Depth]:
            tensor, boxes = self._prepare_batch([frames[i] for i in chunk])
            feeds = {self.preprocess.input_name: tensor}
            seen = [0] * len(chunk)
            if self.format.lidar_input:
                lidar = np.zeros((len(chunk), 1, boxes[0].pad_h, boxes[0].pad_w), dtype=np.float32)
                seen = [self._fill_lidar(lidar[row, 0], *checked[i], boxes[row]) for row, i in enumerate(chunk)]
                feeds[LIDAR_INPUT] = lidar
            value = self._run(feeds)[self.output_name]
            return [self._finish(value[row: row + 1], boxes[row], *checked[i], seen[row], sources[i])
                    for row, i in enumerate(chunk)]

        return self._in_runs(len(frames), alone, together)

    def _finish(self, value: np.ndarray, box: Letterbox, points: np.ndarray | None, k: np.ndarray | None,
                in_view: int, source: str) -> Depth:
        """One frame's output (batch axis 1) as metres in the frame's pixels."""
        plane = np.asarray(value, dtype=np.float32)
        if plane.size != plane.shape[-1] * plane.shape[-2]:
            raise ValueError(f"depth output {self.output_name} has shape {list(plane.shape)}, expected one map")
        values = box.to_source(plane.reshape(plane.shape[-2:]))   # the model's map in the frame's pixels
        values = _finite(values)
        if not self.format.relative:
            # finite values times a finite scale are finite or overflow to +-inf, which clip bounds
            metres = np.multiply(values, np.float32(self.depth_scale), dtype=np.float32)
            np.clip(metres, 0.0, self.max_depth_m, out=metres)
            if not self.format.lidar_input and points is not None and k is not None:
                in_view = len(project_points(points, k, box.src_h, box.src_w)[0])
            return Depth(metres, None, in_view)
        return self._metric_from_relative(values, points, k, source)

    def _fill_lidar(self, plane: np.ndarray, points: np.ndarray | None, k: np.ndarray | None,
                    box: Letterbox) -> int:
        """Write the projected LiDAR into ``plane`` (the model input's HxW LiDAR channel, zeros:
        no return, also in the padding); returns how many of its pixels got a return."""
        if points is None or k is None:
            return 0
        sparse = project_depth(points, box.scale_intrinsics(k), box.pad_h, box.pad_w)
        inner = plane[box.top: box.top + box.new_h, box.left: box.left + box.new_w]
        inner[...] = sparse[box.top: box.top + box.new_h, box.left: box.left + box.new_w]
        return int(np.count_nonzero(inner))

    def _metric_from_relative(self, relative: np.ndarray, points: np.ndarray | None, k: np.ndarray | None,
                              source: str) -> Depth:
        height, width = relative.shape
        u = v = z = np.zeros(0)
        if points is not None and k is not None:
            u, v, z = project_points(points, k, height, width)
        fitted = robust_affine_fit(relative[v, u], 1.0 / z, min_points=self.min_fit_points) \
            if len(z) >= self.min_fit_points else None
        if fitted is not None:
            fit = DepthFit(fitted.scale, fitted.shift, fitted.residual, int(len(z)), fitted.inliers, held=False)
            self._last_fit = self._fits[source] = fit
        elif source in self._fits:
            fit = replace(self._fits[source], points=int(len(z)), held=True)
        else:
            return Depth(np.zeros((height, width), dtype=np.float32), None, int(len(z)), relative)
        inverse = relative * np.float32(fit.scale) + np.float32(fit.shift)
        metres = np.float32(1.0) / np.maximum(inverse, np.float32(1.0 / self.max_depth_m))
        return Depth(metres.astype(np.float32, copy=False), fit, int(len(z)), relative)

    @property
    def last_fit(self) -> DepthFit | None:
        return self._last_fit

    def describe(self) -> dict:
        return {**super().describe(), "output": self.output_name, "depth_scale": self.depth_scale,
                "max_depth_m": self.max_depth_m, "min_fit_points": self.min_fit_points}


def _finite(values: np.ndarray) -> np.ndarray:
    """``values`` with NaN and +-inf as 0 (no depth). Checked in one pass first: a model's map is
    almost always all finite, and replacing takes three passes and a copy of a whole frame."""
    if np.isfinite(values).all():
        return values
    return np.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
