"""image_transport's ``compressed`` images (sensor_msgs/CompressedImage) to and from RGB arrays.

Most recorded camera topics are ``<camera>/image_raw/compressed``: JPEG or PNG bytes and a
``format`` string saying what was compressed, as image_transport's compressed plugin writes it:
``"<encoding>; <jpeg|png> compressed <target>"``, e.g. ``"rgb8; jpeg compressed bgr8"`` (a colour
image is compressed from BGR, so the file holds the true colours), ``"mono8; jpeg compressed "``,
``"mono16; png compressed "``; older publishers write just ``"jpeg"`` or ``"png"``. A target of
``rgb…`` means the publisher handed RGB pixels to a BGR encoder, so the file's red and blue are
swapped and are swapped back here, as the plugin's subscriber does.

JPEG is simplejpeg's (libjpeg-turbo's TurboJPEG API in a 0.4 MB wheel for x86_64 and aarch64,
strict: a truncated or corrupt stream is an error, never a grey-filled frame), PNG Pillow's
(already installed with matplotlib); the payload's signature decides, as OpenCV's ``imdecode``
does for the plugin. Both load with the first frame that needs them, so a node on a raw camera
never holds them. The comparison with Pillow's and OpenCV's JPEG decoders is in docs/ros.md
("Compressed camera input"). No ROS imports: the model nodes decode with it, ``dynnet sim
--record`` encodes with it.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

CODECS = ("jpeg", "png")
#: what Pillow may open: PNG only (JPEG is simplejpeg's)
_PIL_FORMATS = ["PNG"]
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SIGNATURE = b"\xff\xd8\xff"  # start of image, then the first marker
#: the suffix image_transport gives a compressed topic: ``<image topic>/compressed``
TOPIC_SUFFIX = "compressed"
#: the model nodes' choice of camera transport
TRANSPORTS = ("raw", "compressed")


@dataclass(frozen=True)
class CompressedFormat:
    """A ``format`` string, parsed: the codec, the original image encoding ('' when not given)
    and whether the stored colour channels are RGB passed as BGR (red and blue swapped)."""

    codec: str
    encoding: str = ""
    swapped: bool = False

    def text(self) -> str:
        """The ``format`` string image_transport's compressed plugin writes for this."""
        if not self.encoding:
            return self.codec
        mono = self.encoding.startswith("mono") or self.encoding in ("8UC1", "16UC1")
        depth = "16" if self.encoding.endswith("16") else "8"
        target = "" if mono else ("rgb" if self.swapped else "bgr") + (depth if self.codec == "png" else "8")
        return f"{self.encoding}; {self.codec} compressed {target}"


def parse_format(text: str) -> CompressedFormat:
    """``format`` -> CompressedFormat; ValueError naming what is wrong."""
    encoding, sep, rest = text.partition(";")
    if not sep:  # an older publisher: only the codec
        codec = text.strip().lower()
        if codec not in CODECS:
            raise ValueError(f"compressed image format {text!r}: expected 'jpeg', 'png' or "
                             "'<encoding>; <jpeg|png> compressed <target>'")
        return CompressedFormat(codec)
    words = rest.split()
    if len(words) < 2 or words[0].lower() not in CODECS or words[1] != "compressed":
        if rest.strip().startswith("compressedDepth"):
            raise ValueError(f"compressed image format {text!r} is compressed_depth_image_transport's "
                             "(depth images), not a camera's")
        raise ValueError(f"compressed image format {text!r}: expected '<encoding>; <jpeg|png> compressed <target>'")
    target = words[2].lower() if len(words) > 2 else ""
    return CompressedFormat(words[0].lower(), encoding.strip(), target.startswith("rgb"))


def decode_rgb8(data: bytes | memoryview | np.ndarray, format_text: str) -> np.ndarray:
    """JPEG/PNG bytes -> HxWx3 uint8 RGB (grey repeated, alpha dropped, 16-bit scaled to 8).
    ValueError with the reason for a bad format string or a payload that is not a whole image."""
    fmt = parse_format(format_text)
    what = f"compressed image ({format_text!r}, {len(data)} bytes)"
    if bytes(data[:3]) == _JPEG_SIGNATURE:
        import simplejpeg  # loaded by the first compressed frame: a raw camera's node never holds it
        try:
            array = simplejpeg.decode_jpeg(data, colorspace="RGB")
        except ValueError as exc:  # truncated or corrupt: strict decoding refuses what libjpeg would patch
            raise ValueError(f"{what} does not decode as JPEG: {exc}") from None
    elif bytes(data[:8]) == _PNG_SIGNATURE:
        from PIL import Image, UnidentifiedImageError  # loaded by the first PNG frame (Pillow: ~3 MiB resident)
        try:
            with Image.open(io.BytesIO(bytes(data)), formats=_PIL_FORMATS) as image:
                image.load()
                array = _rgb8(image)
        except (OSError, SyntaxError, UnidentifiedImageError) as exc:  # Pillow's errors for a broken stream
            raise ValueError(f"{what} does not decode as PNG: {exc}") from None
    else:
        raise ValueError(f"{what} is neither JPEG nor PNG (starts with {bytes(data[:4])!r})")
    return np.ascontiguousarray(array[:, :, ::-1]) if fmt.swapped else array


def _rgb8(image) -> np.ndarray:
    """A decoded Pillow image as HxWx3 uint8 RGB."""
    if image.mode == "RGB":
        return np.asarray(image)
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):  # 16-bit grey (mono16, 16UC1 PNGs): the high byte
        grey = (np.asarray(image).astype(np.uint32) >> 8).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2)
    return np.asarray(image.convert("RGB"))


def encode_rgb8(rgb: np.ndarray, codec: str = "jpeg", quality: int = 90, encoding: str = "rgb8") -> tuple[bytes, str]:
    """HxWx3 uint8 RGB -> (compressed bytes, ``format``) as image_transport's compressed plugin
    publishes a colour image of ``encoding`` (rgb8, bgr8): ``"rgb8; jpeg compressed bgr8"``,
    true colours in the file."""
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"expected an HxWx3 uint8 RGB image, got {rgb.dtype} {rgb.shape}")
    if codec == "jpeg":
        import simplejpeg  # an encoder's import, loaded when a recording compresses
        data = simplejpeg.encode_jpeg(np.ascontiguousarray(rgb), quality=quality, colorspace="RGB")
    else:
        from PIL import Image  # an encoder's import, loaded when a recording compresses
        out = io.BytesIO()
        Image.fromarray(rgb, "RGB").save(out, format="PNG", compress_level=3)
        data = out.getvalue()
    return data, CompressedFormat(codec, encoding).text()


def compressed_topic(image_topic: str) -> str:
    """The topic image_transport's compressed plugin publishes beside ``image_topic``."""
    return f"{image_topic.rstrip('/')}/{TOPIC_SUFFIX}"
