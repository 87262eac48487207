"""Deterministic demo models (ONNX, random fixed-seed weights) built into a cache on first use.

    from dynnet_ros.zoo import MODEL_NAMES, ensure_model, build_all, zoo_dir
    path = ensure_model("lane")     # <zoo_dir()>/lane.onnx, (re)built when the builder changes

See docs/zoo.md for the models' inputs/outputs, sizes and compute.
"""
from .cache import BUILDER_VERSION, MODEL_NAMES, build_all, build_model, ensure_model, resolve_model_spec, zoo_dir
from .samples import example_inputs

__all__ = ["BUILDER_VERSION", "MODEL_NAMES", "build_all", "build_model", "ensure_model", "example_inputs",
           "resolve_model_spec", "zoo_dir"]
