"""Is the TensorRT backend usable here? (tensorrt + pycuda import, and a CUDA device exists.)

The registry asks this once per process; the answer is None (usable) or the reason it is not,
which ``Engine(..., backend="tensorrt")`` raises as a ValueError and model nodes report.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable


def probe(find_spec: Callable = importlib.util.find_spec,
          import_module: Callable = importlib.import_module) -> str | None:
    """None when TensorRT can run here, else one line saying why not (injectable for tests)."""
    missing = [name for name in ("tensorrt", "pycuda") if find_spec(name) is None]
    if missing:
        return f"needs the Python package(s) {', '.join(missing)}, not importable here"
    try:
        trt = import_module("tensorrt")
        cuda = import_module("pycuda.driver")
    except Exception as exc:  # noqa: BLE001 - a broken install raises anything: wrong CUDA libs, ABI mismatch
        return f"tensorrt/pycuda are installed but fail to import: {type(exc).__name__}: {exc}"
    major = str(getattr(trt, "__version__", "0")).split(".")[0]
    if not major.isdigit() or int(major) < 10:
        return f"needs TensorRT >= 10 (the name-based I/O API), found {getattr(trt, '__version__', '?')}"
    try:
        cuda.init()
        count = cuda.Device.count()
    except Exception as exc:  # noqa: BLE001 - pycuda's own types: no driver, no device nodes in a container
        return f"the CUDA driver is not usable: {type(exc).__name__}: {exc}"
    if count < 1:
        return "no CUDA device is present"
    return None


@functools.lru_cache(maxsize=1)
def tensorrt_unavailable_reason() -> str | None:
    """``probe()`` once per process (importing TensorRT takes seconds)."""
    return probe()
