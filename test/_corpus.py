"""Real-model corpus: pretrained ONNX models and photographs shipped inside PyPI wheels.

The zoo's models were built for this project; these were not. They come from exporters the
engine was not developed against (paddle2onnx, Ultralytics/torch.onnx, spox), so they exercise
what real graphs contain: ``-1`` and unnamed dims, rank-0 inputs, ``If`` around recurrent
cells, attention MatMuls over a sequence length. The packages are dev dependencies pinned in
``requirements-corpus.txt`` and installed with ``--no-deps`` (the Makefile does it): the tests
read their files only and never import their code, so nothing is downloaded at run time.

Models (file inside the package; inputs -> outputs as the graph declares them):

- ``yolov8n-detector`` — ``nudenet==3.4.2``, ``nudenet/320n.onnx`` (12 MB). An Ultralytics
  YOLOv8n export (torch 2.3, opset 17, dynamic axes). CNN detector with SiLU, C2f blocks and a
  DFL head: ``images`` float32 [batch, 3, height, width] (RGB in 0..1, sides multiples of 32)
  -> ``output0`` [batch, 22, anchors] (4 box coordinates + 18 class scores per anchor).
- ``ppocr-text-detector`` — ``rapidocr-onnxruntime==1.4.4``,
  ``rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx`` (4.7 MB). PP-OCRv4 DB text
  detector, paddle2onnx export (opset 12): a segmentation network (FPN, ConvTranspose
  upsampling) giving a per-pixel text probability map. ``x`` float32
  [N, 3, H, W] (ImageNet-normalised, sides multiples of 32) -> ``sigmoid_0.tmp_0`` [N, 1, H, W].
- ``ppocr-text-recogniser`` — same package, ``ch_PP-OCRv4_rec_infer.onnx`` (10.9 MB).
  PP-OCRv4 SVTR-LCNet recogniser, paddle2onnx (opset 12): a CNN backbone then transformer
  blocks whose attention MatMuls run over the text line's width. ``x`` float32
  [N, 3, 48, W] (normalised to -1..1; the height dim has neither value nor name)
  -> ``softmax_11.tmp_0`` [N, W/8, 6625] (per-column character probabilities).
- ``ppocr-direction-classifier`` — same package, ``ch_ppocr_mobile_v2.0_cls_infer.onnx``
  (0.6 MB). PaddlePaddle's own exporter (opset 11), MobileNetV3 text-direction classifier whose
  batch dim is written as ``-1``: ``x`` float32 [-1, 3, ?, ?] -> [-1, 2] (0° / 180°).
- ``silero-vad`` — ``silero-vad==6.2.3``, ``silero_vad/data/silero_vad.onnx`` (2.3 MB).
  Voice-activity detector built with spox (opset 16): the whole network sits in an ``If`` on
  the sample rate, each branch an STFT-like Conv front end and an LSTM cell. ``input`` float32
  [batch, samples] (576 at 16 kHz, 288 at 8 kHz: a 512/256-sample window plus its context),
  ``state`` float32 [2, batch, 128], ``sr`` int64 scalar (rank 0) -> ``output`` [batch, 1]
  speech probability, ``stateN`` [2, batch, 128].
- ``silero-vad-op15`` — same package, ``silero_vad_16k_op15.onnx`` (1.3 MB). The same network
  exported by torch.onnx at opset 15: three nested ``If`` nodes inside the graph instead of one
  around it; same inputs and outputs.

Photographs: ``photos()`` reads the colour photographs scikit-image bundles inside its wheel
(``skimage/data/*.png``, public-domain or CC0 per scikit-image's data README; no pooch download),
and ``text_page()`` its scanned page of text for the recogniser. The audio for the voice-activity
models is synthetic (a chirp in noise from the caller's rng): no package ships speech.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image as mpimg

Feeds = list[dict[str, np.ndarray]]

PHOTO_FILES = ("astronaut.png", "coffee.png", "chelsea.png", "motorcycle_left.png")


def package_dir(package: str) -> Path | None:
    """The installed package's folder, found without importing it (its code is never run)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _read_rgb(path: Path) -> np.ndarray:
    img = mpimg.imread(path)
    if img.dtype != np.uint8:  # matplotlib reads PNGs as floats in 0..1
        img = np.round(np.asarray(img) * 255.0).astype(np.uint8)
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    return np.ascontiguousarray(img[:, :, :3])


def photos() -> list[tuple[str, np.ndarray]]:
    """(name, H×W×3 uint8 RGB) for each bundled colour photograph; empty without scikit-image."""
    root = package_dir("skimage")
    if root is None:
        return []
    return [(name.removesuffix(".png"), _read_rgb(root / "data" / name)) for name in PHOTO_FILES]


def text_page() -> np.ndarray | None:
    """scikit-image's scanned page of printed text as H×W×3 uint8, or None without the package."""
    root = package_dir("skimage")
    return None if root is None else _read_rgb(root / "data" / "page.png")


def resize(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """Nearest-neighbour resize of an H×W×C image: test inputs need real content, not fidelity."""
    rows = (np.arange(height) * img.shape[0] // height).clip(0, img.shape[0] - 1)
    cols = (np.arange(width) * img.shape[1] // width).clip(0, img.shape[1] - 1)
    return img[rows][:, cols]


def _photo_or_noise(index: int, rng: np.random.Generator) -> np.ndarray:
    shots = photos()
    if shots:
        return shots[index % len(shots)][1]
    return rng.integers(0, 256, size=(480, 640, 3), dtype=np.uint8)


def _nchw(images: list[np.ndarray], height: int, width: int, mean: float | np.ndarray,
          std: float | np.ndarray) -> np.ndarray:
    batch = np.stack([resize(img, height, width) for img in images]).astype(np.float32) / 255.0
    batch = (batch - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(batch.transpose(0, 3, 1, 2), dtype=np.float32)


IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


def _detector_feeds(rng: np.random.Generator) -> Feeds:
    shapes = [(1, 320, 320), (1, 256, 416), (2, 192, 320)]
    return [{"images": _nchw([_photo_or_noise(i + k, rng) for k in range(n)], h, w, 0.0, 1.0)}
            for i, (n, h, w) in enumerate(shapes)]


def _text_detector_feeds(rng: np.random.Generator) -> Feeds:
    page = text_page()
    shapes = [(1, 320, 320), (1, 256, 480), (2, 160, 224)]
    feeds = []
    for i, (n, h, w) in enumerate(shapes):
        images = [page if page is not None and k == 0 else _photo_or_noise(i + k, rng) for k in range(n)]
        feeds.append({"x": _nchw(images, h, w, IMAGENET_MEAN, IMAGENET_STD)})
    return feeds


def _text_lines(rng: np.random.Generator, count: int) -> list[np.ndarray]:
    """Horizontal strips of the text page (or noise without it): what the recogniser reads."""
    page = text_page()
    if page is None:
        return [rng.integers(0, 256, size=(48, 320, 3), dtype=np.uint8) for _ in range(count)]
    strip = page.shape[0] // 8
    return [page[k * strip:(k + 1) * strip] for k in range(count)]


def _recogniser_feeds(rng: np.random.Generator) -> Feeds:
    shapes = [(1, 320), (2, 160), (1, 96)]
    return [{"x": _nchw(_text_lines(rng, n), 48, w, 0.5, 0.5)} for n, w in shapes]


def _classifier_feeds(rng: np.random.Generator) -> Feeds:
    shapes = [(1, 48, 192), (4, 48, 192), (2, 48, 100)]  # PaddleOCR feeds it 48-pixel-high line crops
    return [{"x": _nchw(_text_lines(rng, n), h, w, 0.5, 0.5)} for n, h, w in shapes]


def _audio(rng: np.random.Generator, batch: int, samples: int, rate: int) -> np.ndarray:
    t = np.arange(samples, dtype=np.float64) / rate
    freq = rng.uniform(150.0, 400.0, size=(batch, 1))
    wave = 0.3 * np.sin(2 * np.pi * freq * t * (1.0 + 2.0 * t)) + 0.02 * rng.standard_normal((batch, samples))
    return wave.astype(np.float32)


def _vad_feeds(rng: np.random.Generator) -> Feeds:
    cases = [(1, 576, 16000), (2, 576, 16000), (1, 288, 8000)]
    return [{"input": _audio(rng, batch, samples, rate),
             "state": (0.1 * rng.standard_normal((2, batch, 128))).astype(np.float32),
             "sr": np.array(rate, dtype=np.int64)}
            for batch, samples, rate in cases]


@dataclass(frozen=True)
class CorpusModel:
    """One pretrained model a PyPI package ships, and how to feed it."""

    name: str
    kind: str            # detector | segmenter | text-recogniser | classifier | recurrent
    package: str         # import name of the package that ships the file
    distribution: str    # the PyPI name pinned in requirements-corpus.txt
    resource: str        # the file's path inside the package folder
    exporter: str        # which tool wrote the ONNX file
    feeds: Callable[[np.random.Generator], Feeds]  # ≥ 3 valid feeds, each a different input shape
    #: the size an application feeds (``Engine(input_shapes=…)``, what a node passes); None: the
    #: planner's default (dynamic sides at 640, a page for the text detector)
    input_shapes: dict[str, tuple[int, ...]] | None = None

    def path(self) -> Path | None:
        """The model file, or None when its package is not installed."""
        root = package_dir(self.package)
        if root is None or not (root / self.resource).is_file():
            return None
        return root / self.resource

    def available(self) -> bool:
        return self.path() is not None

    @property
    def skip_reason(self) -> str:
        return (f"{self.distribution} is not installed (real-model corpus: "
                f"pip install --no-deps -r requirements-corpus.txt)")


_OCR = "rapidocr_onnxruntime"

CORPUS: tuple[CorpusModel, ...] = (
    CorpusModel("yolov8n-detector", "detector", "nudenet", "nudenet==3.4.2", "320n.onnx",
                "Ultralytics YOLOv8 via torch.onnx", _detector_feeds, {"images": (1, 3, 320, 320)}),
    CorpusModel("ppocr-text-detector", "segmenter", _OCR, "rapidocr-onnxruntime==1.4.4",
                "models/ch_PP-OCRv4_det_infer.onnx", "paddle2onnx", _text_detector_feeds),
    CorpusModel("ppocr-text-recogniser", "text-recogniser", _OCR, "rapidocr-onnxruntime==1.4.4",
                "models/ch_PP-OCRv4_rec_infer.onnx", "paddle2onnx", _recogniser_feeds, {"x": (1, 3, 48, 320)}),
    CorpusModel("ppocr-direction-classifier", "classifier", _OCR, "rapidocr-onnxruntime==1.4.4",
                "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "PaddlePaddle", _classifier_feeds,
                {"x": (1, 3, 48, 192)}),
    CorpusModel("silero-vad", "recurrent", "silero_vad", "silero-vad==6.2.3",
                "data/silero_vad.onnx", "spox", _vad_feeds),
    CorpusModel("silero-vad-op15", "recurrent", "silero_vad", "silero-vad==6.2.3",
                "data/silero_vad_16k_op15.onnx", "torch.onnx", _vad_feeds),
)


def available_models() -> list[CorpusModel]:
    """The corpus models whose package is installed."""
    return [m for m in CORPUS if m.available()]


def by_name(name: str) -> CorpusModel:
    for model in CORPUS:
        if model.name == name:
            return model
    raise KeyError(f"no corpus model {name!r}; known: {[m.name for m in CORPUS]}")


def pytest_params() -> list:
    """One ``pytest.param`` per corpus model (id = its name), skipped with the reason when absent."""
    return [pytest.param(m, id=m.name, marks=pytest.mark.skipif(not m.available(), reason=m.skip_reason))
            for m in CORPUS]
