"""sensor_msgs <-> numpy without cv_bridge.

cv_bridge needs OpenCV and a compiled ROS package; these few encodings are simple enough to
do with numpy views, and compressed images are decoded by ``dynnet_ros.compressed``. Every
malformed message raises ValueError with the reason, which the model nodes turn into an ERROR
diagnostic.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
from sensor_msgs.msg import CompressedImage, Image, PointCloud2, PointField

from dynnet_ros.compressed import decode_rgb8
from dynnet_ros.layouts import (
    HOST_BIG_ENDIAN,
    IMAGE_ENCODINGS,
    XYZI_DTYPE,
    XYZI_FIELDS,
    pack_image,
    pack_xyzi,
    xyzi_dense,
)


def _byte_view(data) -> np.ndarray:
    """uint8 view of a message's data field (array.array, bytes or a list of ints)."""
    try:
        return np.frombuffer(data, dtype=np.uint8)
    except TypeError:
        return np.asarray(data, dtype=np.uint8)


def image_to_array(msg: Image) -> np.ndarray:
    """HxW (one channel) or HxWxC array in host byte order; honours `step` row padding."""
    encoding = msg.encoding
    if encoding not in IMAGE_ENCODINGS:
        raise ValueError(f"unsupported image encoding '{encoding}'; supported: {sorted(IMAGE_ENCODINGS)}")
    dtype, channels = IMAGE_ENCODINGS[encoding]
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    if height <= 0 or width <= 0:
        raise ValueError(f"image has zero size ({width}x{height})")
    row_bytes = width * channels * dtype.itemsize
    if step < row_bytes:
        raise ValueError(f"image step {step} is shorter than one row ({width} px x {channels} ch x "
                         f"{dtype.itemsize} B = {row_bytes} B)")
    data = msg.data
    nbytes = len(data)
    if nbytes < step * (height - 1) + row_bytes:
        raise ValueError(f"image data has {nbytes} bytes, {width}x{height} with step {step} needs "
                         f"{step * height}")
    buf = _byte_view(data)
    rows = np.lib.stride_tricks.as_strided(buf, shape=(height, row_bytes), strides=(step, 1))
    typed = np.ascontiguousarray(rows).view(dtype.newbyteorder(">" if msg.is_bigendian else "<"))
    array = typed.astype(dtype, copy=False).reshape(height, width, channels)
    return array[:, :, 0] if channels == 1 else array


def array_to_image(array: np.ndarray, encoding: str, header=None) -> Image:
    """Pack an HxW / HxWxC array as an Image (host byte order, no row padding)."""
    array, step = pack_image(array, encoding)
    msg = Image()
    if header is not None:
        msg.header = header
    msg.height, msg.width = int(array.shape[0]), int(array.shape[1])
    msg.encoding = encoding
    msg.is_bigendian = int(HOST_BIG_ENDIAN)
    msg.step = step
    msg.data = array.tobytes()
    return msg


def image_to_rgb8(msg: Image) -> np.ndarray:
    """Any supported image -> HxWx3 uint8 RGB, the frame the perception cores take.

    rgb8 frames come back as a view over the message (no copy); the other encodings are
    converted once (channel order, alpha dropped, grey repeated, 16-bit and 0..1 float scaled).
    """
    array = image_to_array(msg)
    encoding = msg.encoding
    if encoding == "rgb8":
        return array
    if encoding in ("bgr8", "bgra8"):
        return np.ascontiguousarray(array[:, :, 2::-1])
    if encoding == "rgba8":
        return np.ascontiguousarray(array[:, :, :3])
    if encoding == "mono8":
        grey = array
    elif encoding in ("mono16", "16UC1"):
        grey = (array >> 8).astype(np.uint8)
    else:  # 32FC1: intensities expected in [0, 1]
        if not np.all(np.isfinite(array)):
            bad = int(np.count_nonzero(~np.isfinite(array)))
            raise ValueError(f"32FC1 image has {bad} NaN/inf pixel(s) of {array.size}")
        grey = np.rint(np.clip(array, 0.0, 1.0) * 255.0).astype(np.uint8)
    return np.repeat(grey[:, :, None], 3, axis=2)


def camera_to_rgb8(msg: Image | CompressedImage) -> np.ndarray:
    """A camera message, raw or image_transport-compressed (JPEG/PNG), as HxWx3 uint8 RGB."""
    if isinstance(msg, CompressedImage):
        return decode_rgb8(_byte_view(msg.data), msg.format)
    return image_to_rgb8(msg)


# --------------------------------------------------------------------------- PointCloud2

_FIELD_DTYPES = {
    PointField.INT8: np.int8, PointField.UINT8: np.uint8, PointField.INT16: np.int16,
    PointField.UINT16: np.uint16, PointField.INT32: np.int32, PointField.UINT32: np.uint32,
    PointField.FLOAT32: np.float32, PointField.FLOAT64: np.float64,
}


def cloud_dtype(msg: PointCloud2) -> np.dtype:
    """numpy structured dtype of one point, from the message's fields."""
    order: Literal["<", ">"] = ">" if msg.is_bigendian else "<"
    names, formats, offsets = [], [], []
    for f in msg.fields:
        if f.datatype not in _FIELD_DTYPES:
            raise ValueError(f"point field '{f.name}' has unknown datatype {f.datatype}")
        base = np.dtype(_FIELD_DTYPES[f.datatype]).newbyteorder(order)
        count = max(1, int(f.count))
        if f.offset + base.itemsize * count > msg.point_step:
            raise ValueError(f"point field '{f.name}' (offset {f.offset}) overruns point_step {msg.point_step}")
        names.append(f.name)
        formats.append(base if count == 1 else (base, (count,)))
        offsets.append(int(f.offset))
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": int(msg.point_step)})


def cloud_to_xyzi(msg: PointCloud2, *, drop_invalid: bool = True) -> np.ndarray:
    """(N, 4) float32 x, y, z, intensity (0 when the cloud has no intensity field)."""
    if msg.point_step <= 0:
        raise ValueError(f"point cloud point_step must be positive, got {msg.point_step}")
    names = {f.name for f in msg.fields}
    missing = {"x", "y", "z"} - names
    if missing:
        raise ValueError(f"point cloud lacks field(s) {sorted(missing)}; has {sorted(names)}")
    dtype = cloud_dtype(msg)
    height, width = int(msg.height), int(msg.width)
    if width * msg.point_step > msg.row_step:
        raise ValueError(f"point cloud row_step {msg.row_step} < width {width} x point_step {msg.point_step}")
    if len(msg.data) < msg.row_step * height:
        raise ValueError(f"point cloud data has {len(msg.data)} bytes, needs {msg.row_step * height}")
    if height * width == 0:
        return np.zeros((0, 4), dtype=np.float32)
    buf = _byte_view(msg.data)
    rows = [buf[r * msg.row_step: r * msg.row_step + width * msg.point_step] for r in range(height)]
    points = np.frombuffer(b"".join(r.tobytes() for r in rows) if height > 1 else rows[0].tobytes(), dtype=dtype)
    out: np.ndarray = np.zeros((len(points), 4), dtype=np.float32)
    for i, name in enumerate(("x", "y", "z", "intensity")):
        if name in names:
            out[:, i] = points[name]
    if drop_invalid:
        out = out[np.isfinite(out[:, :3]).all(axis=1)]
    return out


def xyzi_to_cloud(points: np.ndarray, header=None) -> PointCloud2:
    """Pack (N, 4) x, y, z, intensity as an unorganised PointCloud2 (height 1)."""
    packed = pack_xyzi(points)
    msg = PointCloud2()
    if header is not None:
        msg.header = header
    msg.height, msg.width = 1, len(packed)
    msg.fields = [PointField(name=name, offset=4 * i, datatype=PointField.FLOAT32, count=1)
                  for i, name in enumerate(XYZI_FIELDS)]
    msg.is_bigendian = HOST_BIG_ENDIAN
    msg.point_step = XYZI_DTYPE.itemsize
    msg.row_step = msg.point_step * len(packed)
    msg.data = packed.tobytes()
    msg.is_dense = xyzi_dense(packed)
    return msg
