"""Deterministic demo models (ONNX, random fixed-seed weights) built into a cache on first use.

    from dynnet_ros.zoo import MODEL_NAMES, ensure_model, build_all, zoo_dir
    path = ensure_model("lane")     # <zoo_dir()>/lane.onnx, (re)built when the builder changes

See docs/zoo.md for the models' inputs/outputs, sizes and compute.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .cache import BUILDER_VERSION, MODEL_NAMES, build_all, build_model, ensure_model, resolve_model_spec, zoo_dir

if TYPE_CHECKING:
    from .samples import example_inputs

__all__ = ["BUILDER_VERSION", "MODEL_NAMES", "build_all", "build_model", "ensure_model", "example_inputs",
           "resolve_model_spec", "zoo_dir"]


def __getattr__(name: str) -> object:
    if name == "example_inputs":
        # lazy re-export: the samples run the models with onnxruntime, which the CLI's argument
        # checks (zoo names) and a serving node (ensure_model) never need
        from .samples import example_inputs
        return example_inputs
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
