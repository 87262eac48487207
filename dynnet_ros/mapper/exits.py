"""Exits of a multi-exit model and the criteria that decide whether an exit is confident enough.

Why a module of its own: the stage graph (which outputs end a stage), the runtime (when to stop)
and the zoo's models (which declare their exits in metadata) must agree on one description.

A model declares its exits, in order, in the metadata entry ``dynnet_exits`` (JSON)::

    [{"outputs": ["lane_prob_coarse"], "criterion": "mean_confidence"},
     {"outputs": ["lane_prob"]}]

The last entry is the final exit (the model's answer). An early exit's ``answer`` says what taking
it returns in place of the final outputs: ``"outputs"`` (default) — its outputs stand for the final
ones, position by position; ``"empty"`` — the final outputs are empty along their first axis (a
detector's "nothing here" exit); ``"none"`` — it never answers: a plain cut at internal tensors
(a partition may name any tensor the graph computes as such an exit). Without the entry every
graph output is an exit of its own.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dynnet_ros.engine.modelio.onnx_proto import ModelProto

METADATA_KEY = "dynnet_exits"
ANSWERS: tuple[str, ...] = ("outputs", "empty", "none")


def _softmax(logits: np.ndarray) -> np.ndarray:
    flat = logits.reshape(logits.shape[0], -1).astype(np.float64)
    flat = flat - flat.max(axis=1, keepdims=True)
    e = np.exp(flat)
    return e / e.sum(axis=1, keepdims=True)


def max_softmax(values: Sequence[np.ndarray]) -> float:
    """Classifier: the largest softmax probability of the first output (logits)."""
    return float(_softmax(values[0]).max(axis=1).min())


def margin(values: Sequence[np.ndarray]) -> float:
    """Classifier: the gap between the two largest softmax probabilities."""
    p = np.sort(_softmax(values[0]), axis=1)
    return float((p[:, -1] - p[:, -2]).min()) if p.shape[1] > 1 else 1.0


def mean_confidence(values: Sequence[np.ndarray]) -> float:
    """Segmentation (probabilities in [0, 1]): the mean over pixels of max(p, 1 - p); a one-element
    output is taken as the confidence itself."""
    p = np.asarray(values[0], dtype=np.float64)
    if p.size == 1:
        return float(p.reshape(-1)[0])
    return float(np.maximum(p, 1.0 - p).mean())


def no_object(values: Sequence[np.ndarray]) -> float:
    """Detection: 1 - the largest objectness, so "nothing here" is the confident answer."""
    p = np.asarray(values[0], dtype=np.float64)
    return 1.0 - float(p.max()) if p.size else 1.0


def never(values: Sequence[np.ndarray]) -> float:
    """No criterion: the exit is never confident (only the deadline takes it)."""
    return float("-inf")


CRITERIA: dict[str, Callable[[Sequence[np.ndarray]], float]] = {
    "max_softmax": max_softmax, "margin": margin, "mean_confidence": mean_confidence,
    "max_objectness": no_object, "none": never,
}


@dataclass(frozen=True)
class ExitSpec:
    """One exit: the tensors it outputs, how its confidence is judged, what taking it returns."""

    outputs: tuple[str, ...]
    criterion: str = "none"
    answer: str = "outputs"
    confidence_tensor: str | None = None   # the tensor the criterion reads (default: the outputs)

    def __post_init__(self) -> None:
        if not self.outputs:
            raise ValueError("an exit needs at least one output")
        if self.criterion not in CRITERIA:
            raise ValueError(f"unknown exit criterion {self.criterion!r}; choose one of {', '.join(CRITERIA)}")
        if self.answer not in ANSWERS:
            raise ValueError(f"unknown exit answer {self.answer!r}; choose one of {', '.join(ANSWERS)}")

    @property
    def tensors(self) -> tuple[str, ...]:
        """What the exit's stage must output: its outputs and, when separate, its confidence tensor."""
        extra = () if self.confidence_tensor in (None, *self.outputs) else (str(self.confidence_tensor),)
        return self.outputs + extra

    def confidence(self, values: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> float:
        """The exit's confidence: from its stage's outputs by name, or from its outputs' values in
        order (an exit without a separate confidence tensor)."""
        if isinstance(values, Mapping):
            names = [self.confidence_tensor] if self.confidence_tensor else list(self.outputs)
            return CRITERIA[self.criterion]([values[name] for name in names])
        if self.confidence_tensor:
            raise ValueError(f"exit {self.outputs[0]} reads {self.confidence_tensor}: pass its values by name")
        return CRITERIA[self.criterion](values)

    def to_json(self) -> dict[str, Any]:
        out = {"outputs": list(self.outputs), "criterion": self.criterion, "answer": self.answer}
        return out | ({"confidence": self.confidence_tensor} if self.confidence_tensor else {})

    @classmethod
    def from_json(cls, item: Any, where: str = "exit") -> ExitSpec:
        if isinstance(item, str):
            return cls((item,))
        if not isinstance(item, Mapping) or set(item) - {"outputs", "criterion", "answer", "confidence"}:
            raise ValueError(f"{where}: expected an output name or a mapping with outputs, criterion, answer, "
                             "confidence")
        outputs = item.get("outputs")
        if isinstance(outputs, str):
            outputs = [outputs]
        if not isinstance(outputs, list) or not outputs or not all(isinstance(o, str) and o for o in outputs):
            raise ValueError(f"{where}: 'outputs' must be a non-empty list of output names")
        try:
            confidence = item.get("confidence")
            return cls(tuple(outputs), str(item.get("criterion", "none")), str(item.get("answer", "outputs")),
                       None if confidence is None else str(confidence))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


def guess_criterion(shape: Sequence[Any] | None) -> str:
    """A criterion from an output's declared shape: [N, K] logits -> max_softmax, else none."""
    if shape is not None and len(shape) == 2 and isinstance(shape[1], int) and shape[1] > 1:
        return "max_softmax"
    return "none"


def model_exits(model: ModelProto) -> list[ExitSpec]:
    """The model's exits in order: its ``dynnet_exits`` metadata, else one per graph output."""
    outputs = {o.name: o for o in model.graph.output}
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            try:
                raw = json.loads(prop.value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"model metadata {METADATA_KEY} is not valid JSON: {exc}") from None
            internal = {name for node in model.graph.node for name in node.output}
            return parse_exits(raw, outputs, internal, declared=True)
    found = []
    for name, value in outputs.items():
        dims = [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]
        found.append(ExitSpec((name,), guess_criterion(dims)))
    return found


def parse_exits(raw: Any, outputs: Mapping[str, Any] | Sequence[str],
                internal: set[str] | frozenset[str] = frozenset(), declared: bool = False) -> list[ExitSpec]:
    """Exits from their JSON/YAML list, each output checked against the model's ``outputs``; a
    name in ``internal`` (a tensor the graph computes) is an exit head the model declares in its
    metadata (``declared``: its nodes need not feed a graph output, so an unmapped run skips them)
    or, named by a partition, a cut that never answers."""
    if not isinstance(raw, list) or not raw:
        raise ValueError("exits must be a non-empty list")
    exits = [ExitSpec.from_json(item, f"exits[{i}]") for i, item in enumerate(raw)]
    for i, spec in enumerate(exits):
        if not declared and all(name not in outputs and name in internal for name in spec.outputs):
            exits[i] = ExitSpec(spec.outputs, "none", "none")
    seen: set[str] = set()
    for i, spec in enumerate(exits):
        tensor = spec.confidence_tensor
        if tensor is not None and tensor not in outputs and tensor not in internal:
            raise ValueError(f"exits[{i}]: confidence {tensor!r} is not a tensor of the model")
        for name in spec.outputs:
            if name not in outputs and name not in internal:
                raise ValueError(f"exits[{i}]: {name!r} is not an output of the model nor a tensor it computes; "
                                 f"its outputs: {', '.join(outputs)}")
            if name in seen:
                raise ValueError(f"exits[{i}]: output {name!r} belongs to two exits")
            seen.add(name)
    if exits[-1].answer != "outputs" or any(name not in outputs for name in exits[-1].outputs):
        raise ValueError("the last exit is the model's answer: its answer must be 'outputs'")
    return exits


def exits_metadata(exits: Sequence[ExitSpec]) -> str:
    """The ``dynnet_exits`` metadata value for ``exits``."""
    return json.dumps([e.to_json() for e in exits], separators=(",", ":"))
