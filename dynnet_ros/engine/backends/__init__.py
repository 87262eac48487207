"""Execution backends behind the Engine facade.

A backend turns a checked ModelProto into an *executor*: ``run(feeds) -> {name: array}`` and
``close()`` (the ``Executor`` protocol, ``base.py``). ``registry.py`` picks one by name
(``create_executor``, ``available_backends``); backends that need optional packages (TensorRT,
pycuda) report why they are unavailable instead of failing at import time. This ``__init__``
imports nothing: the runtime (layer 4) imports ``base`` through it, and the registry sits above
the runtime.
"""
