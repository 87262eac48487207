"""Synthetic road scene for the sensor simulator — plain numpy, no ROS imports.

One 3D scene per frame (flat road, lane markings, pedestrians as boxes) is both rendered into
the camera image and ray-cast by the LiDAR, so the two sensors agree on depth by construction.

Frames: the vehicle frame has x forward, y left, z up, origin on the ground below the camera.
The camera optical frame has z forward, x right, y down (REP 103). The LiDAR frame is the
vehicle frame shifted to the LiDAR's mount point. Several cameras share the mount point and
differ by their yaw (degrees, counter-clockwise seen from above: 90 looks left), so every
camera sees the same scene and the one LiDAR agrees with each of them.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dynnet_ros.geometry import matrix_to_rpy

CAMERA_HEIGHT = 1.5               # metres above the road
LIDAR_POSITION = (0.2, 0.0, 1.8)  # in the vehicle frame
HFOV_DEG = 70.0
LANE_HALF_WIDTH = 1.75            # lane markings at y = +-1.75 m ...
ROAD_HALF_WIDTH = 5.25            # ... and road edges at +-5.25 m
MARK_WIDTH = 0.15
DASH_LENGTH, DASH_PERIOD = 3.0, 9.0
SPEED = 8.0                       # m/s: the dashes move toward the camera
GOLDEN_ANGLE = 2.399963229728653  # radians: per-seed phase step, so no two small seeds share a walk

# rotation taking vehicle-frame vectors to camera-optical vectors
R_OPT_FROM_VEH = np.array([[0.0, -1.0, 0.0], [0.0, 0.0, -1.0], [1.0, 0.0, 0.0]])


def camera_matrix(width: int, height: int, hfov_deg: float = HFOV_DEG) -> np.ndarray:
    """Pinhole K for a width x height image with the given horizontal field of view."""
    fx = (width / 2.0) / math.tan(math.radians(hfov_deg) / 2.0)
    return np.array([[fx, 0.0, (width - 1) / 2.0], [0.0, fx, (height - 1) / 2.0], [0.0, 0.0, 1.0]])


def yaw_rotation(yaw_deg: float) -> np.ndarray:
    """3x3 rotation taking vectors of a camera yawed by ``yaw_deg`` (x its forward, y its left)
    to the vehicle frame; the identity at 0."""
    c, s = math.cos(math.radians(yaw_deg)), math.sin(math.radians(yaw_deg))
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def lidar_to_camera(yaw_deg: float = 0.0) -> np.ndarray:
    """4x4 transform mapping LiDAR-frame points into the optical frame of the camera yawed by
    ``yaw_deg`` (ground truth)."""
    t = np.eye(4)
    rotation = R_OPT_FROM_VEH @ yaw_rotation(yaw_deg).T
    t[:3, :3] = rotation
    offset = np.array(LIDAR_POSITION) - np.array([0.0, 0.0, CAMERA_HEIGHT])
    t[:3, 3] = rotation @ offset
    return t


def lidar_to_camera_xyzrpy(yaw_deg: float = 0.0) -> list[float]:
    """The same transform as [x, y, z, roll, pitch, yaw] (the depth node's parameter form, one
    per camera: ``<name>.lidar_to_camera``)."""
    t = lidar_to_camera(yaw_deg)
    return [float(v) for v in t[:3, 3]] + [float(v) for v in matrix_to_rpy(t[:3, :3])]


@dataclass(frozen=True)
class Pedestrian:
    x: float        # distance of the box's front face from the camera (m, forward)
    y: float        # lateral centre (m, left positive)
    width: float
    height: float
    color: tuple[float, float, float]


@dataclass
class Scene:
    """Everything both sensors need to agree on for one instant."""

    t: float
    pedestrians: list[Pedestrian] = field(default_factory=list)

    @property
    def dash_phase(self) -> float:
        return (SPEED * self.t) % DASH_PERIOD


_COLORS = [(0.85, 0.25, 0.2), (0.2, 0.45, 0.85), (0.9, 0.75, 0.15), (0.6, 0.3, 0.7), (0.2, 0.7, 0.4)]


def make_scene(t: float, count: int = 4, seed: int = 0) -> Scene:
    """Deterministic function of time and seed: pedestrians pace across the road at fixed
    distances; the seed shifts where along their walk they are."""
    peds = []
    for i in range(count):
        x = 8.0 + 6.0 * i
        y = 4.0 * math.sin(0.35 * t + 1.7 * i + GOLDEN_ANGLE * seed)
        peds.append(Pedestrian(x=x, y=y, width=0.6, height=1.75 - 0.05 * i, color=_COLORS[i % len(_COLORS)]))
    return Scene(t=t, pedestrians=peds)


def _ground_material(x: np.ndarray, y: np.ndarray, phase: float) -> np.ndarray:
    """0 grass, 1 asphalt, 2 paint — per ground point (vehicle-frame x forward, y left)."""
    ay = np.abs(y)
    mat = np.where(ay <= ROAD_HALF_WIDTH, 1, 0).astype(np.uint8)
    edge = np.abs(ay - ROAD_HALF_WIDTH) <= MARK_WIDTH / 2
    dashed = (np.abs(ay - LANE_HALF_WIDTH) <= MARK_WIDTH / 2) & (((x + phase) % DASH_PERIOD) < DASH_LENGTH)
    mat[edge | dashed] = 2
    return mat


def _cast(origin: np.ndarray, dirs: np.ndarray, scene: Scene, max_range: float):
    """Ray-cast vehicle-frame rays; returns (range along ray, hit kind, pedestrian index).

    kind: 0 none, 1 ground, 2 pedestrian. `dirs` need not be unit length: the returned range
    is in units of the direction vector.
    """
    n = dirs.shape[0]
    best = np.full(n, np.inf)
    kind = np.zeros(n, dtype=np.uint8)
    ped_index = np.full(n, -1, dtype=np.int16)
    dz = dirs[:, 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        t_ground = np.where(dz < -1e-9, -origin[2] / dz, np.inf)
    hit = t_ground < best
    best[hit], kind[hit] = t_ground[hit], 1
    dx = dirs[:, 0]
    for i, ped in enumerate(scene.pedestrians):
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(dx > 1e-9, (ped.x - origin[0]) / dx, np.inf)
        y = origin[1] + t * dirs[:, 1]
        z = origin[2] + t * dz
        on = (np.abs(y - ped.y) <= ped.width / 2) & (z >= 0) & (z <= ped.height) & (t < best)
        best[on], kind[on], ped_index[on] = t[on], 2, i
    far = best * np.linalg.norm(dirs, axis=1) > max_range
    best[far], kind[far] = np.inf, 0
    return best, kind, ped_index


#: rows rendered at a time: the float32 working set stays a few hundred KiB at any frame size
BAND_ROWS = 32
_NOISE_CACHE: dict[tuple[int, int], np.ndarray] = {}


def _noise_pattern(height: int, width: int) -> np.ndarray:
    """Sensor noise for one frame size: a fixed Gaussian pattern, shifted per frame by whole rows
    (fresh Gaussian noise per 1280x720 frame would cost more than rendering it). Kept as whole
    int8 levels: the frame it is added to is 8-bit, and float32 would hold four times the memory
    for the simulator's whole run."""
    key = (height, width)
    if key not in _NOISE_CACHE:
        rng = np.random.default_rng(height * 10007 + width)
        pattern = np.empty((height, width, 3), dtype=np.int8)
        for top in range(0, height, BAND_ROWS):  # drawn in sequence: the values of one full draw
            band = pattern[top:top + BAND_ROWS]
            band[:] = np.clip(np.rint(rng.normal(0.0, 4.0, band.shape)), -127, 127)
        _NOISE_CACHE[key] = pattern
    return _NOISE_CACHE[key]


def _add_shifted_rows(band: np.ndarray, pattern: np.ndarray, first_row: int, shift: int) -> None:
    """``band += np.roll(pattern, shift, axis=0)[first_row:first_row + len(band)]`` without the
    rolled copy: the band's rows are ``pattern``'s rows ``first_row - shift`` on, wrapping."""
    height = len(pattern)
    start = (first_row - shift) % height
    head = min(len(band), height - start)
    band[:head] += pattern[start:start + head]
    if head < len(band):
        band[head:] += pattern[:len(band) - head]


#: metres: a pedestrian's face is clipped where it comes closer to a camera's plane than this
NEAR_CLIP = 0.1


@dataclass(frozen=True)
class _Face:
    """A pedestrian's front face (the plane x = ``x`` of the vehicle frame) as one camera sees it:
    columns ``u1``..``u2``, and per column the optical depth and the first and last row."""

    x: float
    height: float
    color: np.ndarray      # RGB 0..255, float32
    u1: int
    depth: np.ndarray      # per column, float64
    v1: np.ndarray         # per column, int
    v2: np.ndarray


def _faces(scene: Scene, k: np.ndarray, width: int, height: int, yaw_deg: float) -> list[_Face]:
    """The pedestrians' faces in the image of the camera yawed by ``yaw_deg``, far to near.

    A face is the segment x = ped.x, |y - ped.y| <= width/2 of the vehicle frame, stood up from
    the road to the pedestrian's height (what the LiDAR ray-caster intersects). A column's ray
    meets that plane at one optical depth, so each column of a face is a run of rows; at yaw 0
    every column has the same depth and the face is a rectangle.
    """
    fx, fy, cx, cy = k[0, 0], k[1, 1], k[0, 2], k[1, 2]
    rotation = yaw_rotation(yaw_deg)
    c, s = rotation[0, 0], rotation[1, 0]
    faces = []
    for ped in sorted(scene.pedestrians, key=lambda p: -p.x):
        # the face's left and right edge in the camera's frame (x forward, y left)
        ends = [(c * ped.x + s * y, -s * ped.x + c * y) for y in (ped.y + ped.width / 2, ped.y - ped.width / 2)]
        if ends[0][0] < NEAR_CLIP and ends[1][0] < NEAR_CLIP:
            continue
        for i in (0, 1):
            (x1, y1), (x2, y2) = ends[i], ends[1 - i]
            if x1 < NEAR_CLIP:
                a = (NEAR_CLIP - x1) / (x2 - x1)
                ends[i] = (NEAR_CLIP, y1 + a * (y2 - y1))
        columns = [fx * (-y / x) + cx for x, y in ends]
        u1 = max(int(math.ceil(min(columns))), 0)
        u2 = min(int(math.floor(max(columns))), width - 1)
        if u1 > u2:
            continue
        xn = (np.arange(u1, u2 + 1, dtype=np.float64) - cx) / fx
        depth = ped.x / (c + s * xn)
        v1 = np.maximum(np.ceil(fy * (CAMERA_HEIGHT - ped.height) / depth + cy), 0).astype(np.int64)
        v2 = np.minimum(np.floor(fy * CAMERA_HEIGHT / depth + cy), height - 1).astype(np.int64)
        if not (v1 <= v2).any():
            continue
        faces.append(_Face(ped.x, ped.height, np.array(ped.color, dtype=np.float32) * 255.0, u1, depth, v1, v2))
    return faces


def _draw_face(face: _Face, rgb: np.ndarray, band_depth: np.ndarray, top: int, k: np.ndarray) -> None:
    """Draw the rows ``top``.. of ``face`` that are nearer than what the band holds: colour into
    ``rgb``, optical depth into ``band_depth`` (both the band's)."""
    bottom = top + len(band_depth) - 1
    r1, r2 = max(int(face.v1.min()), top), min(int(face.v2.max()), bottom)
    if r1 > r2:
        return
    fy, cy = k[1, 1], k[1, 2]
    u2 = face.u1 + len(face.depth) - 1
    rows = np.arange(r1, r2 + 1)
    region = band_depth[r1 - top:r2 - top + 1, face.u1:u2 + 1]
    front = (rows[:, None] >= face.v1[None, :]) & (rows[:, None] <= face.v2[None, :]) & (region > face.depth[None, :])
    if not front.any():
        return
    height_above_road = CAMERA_HEIGHT - ((rows.astype(np.float32) - cy) / fy)[:, None] * face.depth[None, :]
    shade = 0.65 + 0.35 * (height_above_road / face.height)
    region[front] = np.broadcast_to(face.depth[None, :], region.shape)[front]
    rgb[r1 - top:r2 - top + 1, face.u1:u2 + 1][front] = face.color[None, :] * shade[front][:, None]


def render_camera(scene: Scene, width: int, height: int, *, frame: int = 0,
                  yaw_deg: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """RGB uint8 image and ground-truth optical depth (metres, 0 for sky) of the scene, seen by
    the camera yawed by ``yaw_deg``.

    The camera has no roll or pitch, so the ground depth of a pixel depends on its row only,
    and each pedestrian's front face is a run of rows per column at one depth (``_faces``): both
    are drawn analytically (the same geometry the LiDAR ray-caster intersects). Every pixel is
    computed on its own, so the image is drawn ``BAND_ROWS`` rows at a time: a 1280x720 frame
    needs the output arrays and a band's float32 colours, not full-frame float temporaries.
    """
    k = camera_matrix(width, height)
    xn = ((np.arange(width, dtype=np.float32) - k[0, 2]) / k[0, 0])[None, :]
    yn = ((np.arange(height, dtype=np.float32) - k[1, 2]) / k[1, 1])[:, None]
    with np.errstate(divide="ignore"):
        row_depth = np.where(yn > 1e-6, CAMERA_HEIGHT / np.maximum(yn, 1e-6), np.inf).astype(np.float32)
    row_depth[row_depth > 150.0] = np.inf
    # a ground point's vehicle-frame x and y per unit of optical depth, per column
    rotation = yaw_rotation(yaw_deg)
    forward = (rotation[0, 0] - rotation[0, 1] * xn).astype(np.float32)
    lateral = (rotation[1, 0] - rotation[1, 1] * xn).astype(np.float32)
    depth = np.broadcast_to(row_depth, (height, width)).copy()
    image = np.empty((height, width, 3), dtype=np.uint8)
    palette = np.array([[64, 140, 51], [77, 77, 82], [242, 242, 235]], dtype=np.float32)
    elevation = np.clip(-yn, 0, 1)
    sky = np.concatenate([140 - 50 * elevation, 178 - 38 * elevation, np.full_like(elevation, 242)], axis=1)
    faces = _faces(scene, k, width, height, yaw_deg)
    pattern, shift = _noise_pattern(height, width), (frame * 7) % height
    for top in range(0, height, BAND_ROWS):
        bottom = min(top + BAND_ROWS, height)
        band_depth = depth[top:bottom]
        band_rows = np.broadcast_to(row_depth[top:bottom], band_depth.shape)
        ground = np.isfinite(band_depth)
        with np.errstate(invalid="ignore"):  # sky rows (inf) are masked out below
            gx, gy = band_rows * forward, band_rows * lateral
        mat = _ground_material(gx[ground], gy[ground], scene.dash_phase)
        rgb = np.empty((bottom - top, width, 3), dtype=np.float32)
        rgb[:] = sky[top:bottom, None, :]
        shade = np.clip(1.0 - band_rows[ground] / 200.0, 0.7, 1.0)[:, None]
        rgb[ground] = palette[mat] * shade
        for face in faces:
            _draw_face(face, rgb, band_depth, top, k)
        _add_shifted_rows(rgb, pattern, top, shift)
        np.clip(rgb, 0, 255, out=rgb)
        image[top:bottom] = rgb
        band_depth[~np.isfinite(band_depth)] = 0.0
    return image, depth


def scan_lidar(scene: Scene, *, beams: int = 16, azimuth_steps: int = 512, max_range: float = 60.0,
               seed: int | Sequence[int] = 0, yaws_deg: Sequence[float] = (0.0,)) -> np.ndarray:
    """LiDAR returns as an (N, 4) float32 array x, y, z, intensity in the LiDAR frame.

    The scan covers each camera's field of view (and 10 degrees beyond each side): one sector
    of `azimuth_steps` per yaw in `yaws_deg`, so every camera has LiDAR returns to fit its depth
    to. The point count varies frame to frame: rays into the sky or past `max_range` give no
    return, and `azimuth_steps` is the scan's horizontal resolution. `seed` (numpy's: an int or
    a sequence of ints) draws the range noise.
    """
    if not yaws_deg:
        raise ValueError("scan_lidar needs at least one camera yaw to cover")
    elevation = np.radians(np.linspace(-24.0, 2.0, beams))
    half = math.radians(HFOV_DEG / 2.0 + 10.0)
    sector = np.linspace(-half, half, azimuth_steps)
    azimuth = np.concatenate([sector + math.radians(yaw) for yaw in yaws_deg])
    el, az = np.meshgrid(elevation, azimuth, indexing="ij")
    dirs = np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], axis=-1).reshape(-1, 3)
    origin = np.array(LIDAR_POSITION)
    t, kind, _ = _cast(origin, dirs, scene, max_range=max_range)
    hit = kind > 0
    rng = np.random.default_rng(seed)
    r = t[hit] + rng.normal(0.0, 0.01, hit.sum())
    xyz = dirs[hit] * r[:, None]
    intensity = np.full(hit.sum(), 0.5, dtype=np.float32)
    ground = kind[hit] == 1
    world = xyz[ground] + origin
    mat = _ground_material(world[:, 0], world[:, 1], scene.dash_phase)
    intensity[ground] = np.array([0.3, 0.1, 0.9], dtype=np.float32)[mat]
    return np.column_stack([xyz, intensity]).astype(np.float32)
