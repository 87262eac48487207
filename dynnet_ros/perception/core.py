"""What the three perception cores share: model info, format choice, preprocessing and the Engine.

Every core runs its model through ``Engine`` so budgets, plans and streamed weights apply to
user models exactly as to the zoo's; the core only adds the task's pre- and post-processing.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cached_property
from typing import Any, Generic, TypeVar

import numpy as np

from dynnet_ros.engine.engine import Engine
from dynnet_ros.perception.batch_capacity import batch_capacity
from dynnet_ros.perception.formats.base import F, choose
from dynnet_ros.perception.labels import names_from_metadata, read_labels_file
from dynnet_ros.perception.letterbox import Letterbox
from dynnet_ros.perception.model_info import ModelInfo, read_model_info
from dynnet_ros.perception.preprocess import Preprocess, PreprocessOptions, build_preprocess, check_frame

#: camera size the engine's budgets refer to until the first frame (the package's reference camera)
REFERENCE_FRAME = (480, 640)

T = TypeVar("T")
R = TypeVar("R")


class PerceptionCore(Generic[F]):
    """Model file -> chosen format, decided preprocessing, an Engine; subclasses add the task."""

    task = ""

    def __init__(self, model_path: str | os.PathLike, model_format: str, formats: Mapping[str, F], *,
                 preprocess: PreprocessOptions, labels_file: str | os.PathLike | None = None,
                 backend: str = "cpu", memory_budget_mb: float | None = None, threads: int | None = None,
                 swappable: bool = False, concurrent_runs: int = 1) -> None:
        """``swappable``: start the engine on the executor that takes budgets later without a
        rebuild (what a node whose budget changes wants; see ``Engine``). ``concurrent_runs``:
        how many threads may run the engine at once (a node serving several batches at once)."""
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
        #: held around each run of mapped stages, and of an engine that runs one frame at a time;
        #: letterboxing and post-processing run outside it, so a second thread can prepare its
        #: frames while the engine runs another's
        self._lock = threading.Lock()
        #: per thread, ``tensor``: the float32 input tensor kept between runs (a batch of n frames
        #: uses its first n rows, a lone frame the first), one per thread as each fills its own
        #: while another's may be in the engine
        self._buffers = threading.local()
        self.engine = Engine(self.model_path, backend=backend, threads=threads, memory_budget_mb=memory_budget_mb,
                             swappable=swappable, input_shapes=self.input_shapes(*REFERENCE_FRAME),
                             concurrent_runs=concurrent_runs)
        #: what runs frames instead of ``engine.run`` when set (a node's mapped stages, dynnet_ros.mapper)
        self.runner: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None

    @property
    def format_name(self) -> str:
        return self.choice.name

    @property
    def format_reason(self) -> str:
        return self.choice.reason

    @cached_property
    def max_batch(self) -> int:
        """The most frames one engine run takes: 1 unless the image input's batch axis is
        symbolic and every output leads with it (``batch_capacity``; decided on first use)."""
        return batch_capacity(self.info, self.format.image_input(self.info), self.preprocess.layout)

    def input_shapes(self, height: int, width: int, batch: int = 1) -> dict[str, tuple[int, ...]]:
        """Shapes of the inputs for ``batch`` frames of ``height x width`` (budgets per size class
        and batch size): the image-sized ones, and the fixed-shape others (the zoo detector's
        thresholds), so the engine's footprint measured ahead is keyed by the same shapes as its
        frames' runs. ValueError for a batch above ``max_batch``."""
        batch = check_positive_int(batch, "batch")
        if batch > 1 and batch > self.max_batch:
            raise ValueError(f"{self.info.path} takes at most {self.max_batch} frame(s) per run, not {batch}")
        box = self.preprocess.plan(height, width)
        shapes: dict[str, tuple[int, ...]] = {}
        for spec in self.info.inputs:
            if spec.name == self.preprocess.input_name:
                shapes[spec.name] = self.preprocess.tensor_shape(box, batch)
            elif spec.rank == 4:  # a companion plane at the image's size (the zoo depth model's LiDAR channel)
                channels = spec.dims[1] if isinstance(spec.dims[1], int) else 1
                shapes[spec.name] = (batch, channels, box.pad_h, box.pad_w)
            elif all(isinstance(d, int) for d in spec.dims):
                shapes[spec.name] = tuple(d for d in spec.dims if isinstance(d, int))
        return shapes

    def min_budget_mb_at(self, height: int, width: int, batch: int = 1) -> float:
        """The engine's minimum budget (``Engine.min_budget_mb``) for batches of ``batch`` frames
        of ``height x width``: what a node announces before forming batches that large."""
        return self.engine.min_budget_mb(self.input_shapes(height, width, batch))

    def _prepare(self, frame: np.ndarray) -> tuple[np.ndarray, Letterbox]:
        kept = getattr(self._buffers, "tensor", None)
        tensor, box = self.preprocess(frame, None if kept is None else kept[:1])
        if tensor.dtype == np.float32 and (kept is None or not np.may_share_memory(tensor, kept)):
            self._buffers.tensor = tensor   # another size: this thread's buffer from now on
        return tensor, box

    def _prepare_batch(self, frames: Sequence[np.ndarray]) -> tuple[np.ndarray, list[Letterbox]]:
        """One input tensor for ``frames``: each letterboxed as it would be alone, then padded to
        the largest padded size among them, so every frame keeps its own scale. ``frames``:
        checked by ``check_frames``."""
        alone = [self.preprocess.plan(frame.shape[0], frame.shape[1]) for frame in frames]
        pad_h, pad_w = max(box.pad_h for box in alone), max(box.pad_w for box in alone)
        boxes = [box.padded_to(pad_h, pad_w, self.preprocess.center) for box in alone]
        shape = self.preprocess.tensor_shape(boxes[0], len(frames))
        kept = getattr(self._buffers, "tensor", None)
        if kept is None or kept.shape[1:] != shape[1:] or kept.shape[0] < shape[0]:
            kept = self._buffers.tensor = np.empty(shape, dtype=np.float32)
        tensor = kept[: len(frames)]
        for i, (frame, box) in enumerate(zip(frames, boxes)):
            self.preprocess.fill(frame, box, tensor[i: i + 1])
        return self.preprocess.cast(tensor), boxes

    @property
    def frames_per_run(self) -> int:
        """The most frames ``batch`` gives one run now: ``max_batch``, or 1 while mapped stages
        run the frames (``runner``: their early exits decide per frame)."""
        return 1 if self.runner is not None else self.max_batch

    def _chunks(self, items: Sequence[T]) -> Iterator[Sequence[T]]:
        """``items`` in runs of ``frames_per_run``."""
        size = self.frames_per_run
        for start in range(0, len(items), size):
            yield items[start: start + size]

    def _in_runs(self, count: int, alone: Callable[[int], R],
                 together: Callable[[Sequence[int]], list[R]]) -> list[R]:
        """Results for items ``0..count-1`` in runs of ``frames_per_run``: ``alone(i)`` for a run
        of one (the one-frame path and its buffers), ``together(indices)`` for a run of several
        (one engine run), in order."""
        out: list[R] = []
        for chunk in self._chunks(range(count)):
            out.extend([alone(chunk[0])] if len(chunk) == 1 else together(chunk))
        return out

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One engine run (or mapped stages' run) on ``feeds``: runs overlap only where the
        engine was built for them (``concurrent_runs``), which then takes its own turns."""
        runner = self.runner
        if runner is None and self.engine.concurrent_runs > 1:
            return self.engine.run(feeds)
        with self._lock:
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


def check_frames(frames: Sequence[np.ndarray]) -> list[np.ndarray]:
    """A batch's frames as a list (ValueError for anything but a list or tuple of frames)."""
    if not isinstance(frames, (list, tuple)):
        raise ValueError(f"a batch must be a list of frames, got {type(frames).__name__}")
    for frame in frames:
        check_frame(frame)
    return list(frames)


def frame_of(outputs: Mapping[str, np.ndarray], index: int) -> dict[str, np.ndarray]:
    """Frame ``index``'s outputs of a batched run, each with a batch axis of 1 (as a one-frame run gives)."""
    return {name: value[index: index + 1] for name, value in outputs.items()}


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
