"""What the three perception cores share: model info, format choice, preprocessing and the Engine.

Every core runs its model through ``Engine`` so budgets, plans and streamed weights apply to
user models exactly as to the zoo's; the core only adds the task's pre- and post-processing.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic

import numpy as np

from dynnet_ros.engine.engine import Engine
from dynnet_ros.perception.formats.base import F, choose
from dynnet_ros.perception.labels import names_from_metadata, read_labels_file
from dynnet_ros.perception.letterbox import Letterbox
from dynnet_ros.perception.model_info import ModelInfo, read_model_info
from dynnet_ros.perception.preprocess import Preprocess, PreprocessOptions, build_preprocess

#: camera size the engine's budgets refer to until the first frame (the package's reference camera)
REFERENCE_FRAME = (480, 640)


class PerceptionCore(Generic[F]):
    """Model file -> chosen format, decided preprocessing, an Engine; subclasses add the task."""

    task = ""

    def __init__(self, model_path: str | os.PathLike, model_format: str, formats: Mapping[str, F], *,
                 preprocess: PreprocessOptions, labels_file: str | os.PathLike | None = None,
                 backend: str = "cpu", memory_budget_mb: float | None = None, threads: int | None = None,
                 swappable: bool = False) -> None:
        """``swappable``: start the engine on the executor that takes budgets later without a
        rebuild (what a node whose budget changes wants; see ``Engine``)."""
        self.info: ModelInfo = read_model_info(model_path)
        self.names: list[str] | None = read_labels_file(labels_file) if labels_file else \
            names_from_metadata(self.info.metadata)
        self.format, self.choice = choose(self.task, model_format, formats, self.info, self.names)
        image = self.format.image_input(self.info)
        try:
            self.preprocess: Preprocess = build_preprocess(image, self.info.metadata, self.format.defaults(),
                                                           preprocess)
        except ValueError as exc:
            raise ValueError(f"{self.info.path} ({self.choice.name}): {exc}") from None
        self.model_path = self.info.path
        self._lock = threading.Lock()
        self._buffer: np.ndarray | None = None
        self.engine = Engine(self.model_path, backend=backend, threads=threads, memory_budget_mb=memory_budget_mb,
                             swappable=swappable, input_shapes=self.input_shapes(*REFERENCE_FRAME))
        #: what runs frames instead of ``engine.run`` when set (a node's mapped stages, dynnet_ros.mapper)
        self.runner: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None

    @property
    def format_name(self) -> str:
        return self.choice.name

    @property
    def format_reason(self) -> str:
        return self.choice.reason

    def input_shapes(self, height: int, width: int) -> dict[str, tuple[int, ...]]:
        """Shapes of the inputs for a ``height x width`` frame (budgets per size class): the
        image-sized ones, and the fixed-shape others (the zoo detector's thresholds), so the
        engine's footprint measured ahead is keyed by the same shapes as its frames' runs."""
        box = self.preprocess.plan(height, width)
        shapes: dict[str, tuple[int, ...]] = {}
        for spec in self.info.inputs:
            if spec.name == self.preprocess.input_name:
                shapes[spec.name] = self.preprocess.tensor_shape(box)
            elif spec.rank == 4:  # a companion plane at the image's size (the zoo depth model's LiDAR channel)
                channels = spec.dims[1] if isinstance(spec.dims[1], int) else 1
                shapes[spec.name] = (1, channels, box.pad_h, box.pad_w)
            elif all(isinstance(d, int) for d in spec.dims):
                shapes[spec.name] = tuple(d for d in spec.dims if isinstance(d, int))
        return shapes

    def _prepare(self, frame: np.ndarray) -> tuple[np.ndarray, Letterbox]:
        tensor, box = self.preprocess(frame, self._buffer)
        if tensor.dtype == np.float32:
            self._buffer = tensor
        return tensor, box

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        runner = self.runner
        return runner(feeds) if runner is not None else self.engine.run(feeds)

    def describe(self) -> dict[str, Any]:
        """The decisions made at construction (logged by nodes, written by `dynnet infer`)."""
        return {"model": self.model_path, "task": self.task, "format": self.choice.name,
                "format_reason": self.choice.reason, "preprocess": self.preprocess.describe(),
                "classes": len(self.names) if self.names else None}

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> PerceptionCore[F]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_unit_interval(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{what} must be a number in [0, 1], got {value!r}")
    return float(value)


def check_positive_int(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} must be an int >= 1, got {value!r}")
    return int(value)


def as_sequence(value: Sequence[int | str] | None, what: str) -> tuple[int | str, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
        raise ValueError(f"{what} must be a list of class names or ids, got {value!r}")
    return tuple(value)
