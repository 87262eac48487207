"""Execution backends behind the Engine facade (layer 5).

A backend turns a checked ModelProto into an *executor*: ``run(feeds) -> {name: array}`` and
``close()`` (the ``Executor`` protocol, ``engine/runtime/base.py``). ``registry.py`` picks one by
name (``create_executor``, ``available_backends``); backends that need optional packages
(TensorRT, pycuda) report why they are unavailable instead of failing at import time. This
``__init__`` imports nothing, so a first import of one backend loads only what that backend needs
(and the CLI's argument definitions read ``BACKEND_NAMES`` without importing any backend).
"""

#: Every backend ``registry.create_executor`` knows, available here or not.
BACKEND_NAMES: tuple[str, ...] = ("cpu", "ort", "tensorrt")
