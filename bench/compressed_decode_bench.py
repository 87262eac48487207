"""Decode time of a compressed camera frame (JPEG, PNG) per library, at 640x480 and 1920x1080.

The frame is a real photograph (scikit-image's ``astronaut``, bundled in its wheel) resized
with Pillow, compressed as image_transport's compressed plugin does by default (JPEG quality
90; PNG with zlib level 3 here). Each installed candidate decodes it to an HxWx3 uint8 RGB
array ``--repeat`` times, the candidates taking turns frame by frame so that a busy machine
slows them alike; the median and the 10th-90th percentiles are printed as a Markdown table.
Candidates: ``dynnet_ros.compressed.decode_rgb8`` (what the model nodes run: simplejpeg for
JPEG, Pillow for PNG), Pillow, simplejpeg (JPEG only) and OpenCV (``cv2.imdecode`` +
BGR->RGB); one that is not installed is left out. Each library's import cost (RSS growth) is
measured in a fresh interpreter.

Usage: python bench/compressed_decode_bench.py [--repeat 50]
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import io
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
from PIL import Image

from dynnet_ros.compressed import decode_rgb8, encode_rgb8

SIZES = ((640, 480), (1920, 1080))
IMPORT_COST = ("import psutil, numpy; p = psutil.Process(); a = p.memory_info().rss; import {module}; "
               "print((p.memory_info().rss - a) / 2**20)")


def photo(width: int, height: int) -> np.ndarray:
    spec = importlib.util.find_spec("skimage")  # the tests' corpus package, read, never imported
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("scikit-image is not installed (requirements-corpus.txt): no photograph to compress")
    path = next(iter(spec.submodule_search_locations)) + "/data/astronaut.png"
    return np.asarray(Image.open(path).convert("RGB").resize((width, height), Image.Resampling.BILINEAR))


def pillow_rgb8(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def decoders() -> dict[str, Callable[[bytes, str, str], np.ndarray | None]]:
    found: dict[str, Callable[[bytes, str, str], np.ndarray | None]] = {
        "dynnet_ros.compressed": lambda data, fmt, codec: decode_rgb8(data, fmt),
        "Pillow": lambda data, fmt, codec: pillow_rgb8(data)}
    try:
        import simplejpeg  # bench-only candidate
        found["simplejpeg"] = lambda data, fmt, codec: simplejpeg.decode_jpeg(data, colorspace="RGB") \
            if codec == "jpeg" else None
    except ImportError:
        pass
    try:
        import cv2  # bench-only candidate
        found["opencv-python-headless"] = lambda data, fmt, codec: cv2.cvtColor(
            cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    except ImportError:
        pass
    return found


def timed(fns: dict[str, Callable[[], np.ndarray | None]], repeat: int) -> dict[str, list[float]]:
    """Milliseconds per call of each function that decodes, taking turns."""
    fns = {name: fn for name, fn in fns.items() if fn() is not None}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def import_cost(module: str) -> float | None:
    result = subprocess.run([sys.executable, "-c", IMPORT_COST.format(module=module)], capture_output=True, text=True)
    return float(result.stdout) if result.returncode == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    rows = []
    for width, height in SIZES:
        rgb = photo(width, height)
        for codec in ("jpeg", "png"):
            data, fmt = encode_rgb8(rgb, codec)
            calls = {name: functools.partial(decode, data, fmt, codec) for name, decode in decoders().items()}
            for name, times in timed(calls, args.repeat).items():
                p10, p50, p90 = np.percentile(times, [10, 50, 90])
                rows.append(f"| {width}x{height} | {codec} ({len(data) / 1024:.0f} KiB) | {name} | {p50:.2f} | "
                            f"{p10:.2f}-{p90:.2f} |")
    print("| frame | payload | library | median ms | p10-p90 ms |\n|---|---|---|---|---|")
    print("\n".join(rows))
    print("\n| library | import RSS growth (MiB) |\n|---|---|")
    for name, module in (("Pillow", "PIL.Image, PIL.JpegImagePlugin, PIL.PngImagePlugin"),
                         ("simplejpeg", "simplejpeg"), ("opencv-python-headless", "cv2")):
        cost = import_cost(module)
        if cost is not None:
            print(f"| {name} | {cost:.1f} |")


if __name__ == "__main__":
    main()
