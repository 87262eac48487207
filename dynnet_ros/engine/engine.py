"""The Engine facade: the one object nodes, tools and tests run models through.

Its contract (DESIGN.md) stays fixed while the insides change: RDP plans, block swapping and
kernel versions plug in as executors without touching callers.
"""
from __future__ import annotations

import threading
import time
from typing import Mapping

import numpy as np
import onnxruntime as ort

from dynnet_ros.engine.backends import create_executor, load_for_backend
from dynnet_ros.engine.feeds import shape_signature, validate_feeds
from dynnet_ros.engine.model_io import InputSpec, ModelLike, input_specs, output_names, weight_bytes


def validate_budget_mb(mb: float | int | None) -> float | None:
    """None means unlimited; otherwise a finite positive number of MiB."""
    if mb is None:
        return None
    if isinstance(mb, bool) or not isinstance(mb, (int, float, np.integer, np.floating)):
        raise ValueError(f"memory budget must be a number of MB or None, got {mb!r}")
    value = float(mb)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"memory budget must be a finite positive number of MB, got {mb!r}")
    return value


class Engine:
    """Run one ONNX model: validated inputs in, onnxruntime-compatible outputs out."""

    def __init__(self, model: ModelLike, backend: str = "cpu", *, threads: int | None = None,
                 memory_budget_mb: float | None = None, swappable: bool = False) -> None:
        """``swappable``: start on the executor that takes budgets later without a rebuild (the
        planned engine with streamed weights, all resident while there is no budget) — for
        callers whose budget will change, like the model nodes. Switching executors later
        would leave the first one's freed heap and code pages in the process."""
        from dynnet_ros.engine.procmem import status_bytes

        self.baseline_rss = status_bytes("VmRSS")  # budgets bound the RSS growth from here
        #: bytes the caller allocated since and charges to itself (a node's frame buffers)
        self.external_bytes = 0
        self.model_path = None if not isinstance(model, (str, bytes)) and not hasattr(model, "__fspath__") \
            else str(model)
        self.proto = load_for_backend(backend, model)  # planned cpu: weightless graph, weights stay in the file
        self.backend = backend
        self.threads = threads
        self.inputs: list[InputSpec] = input_specs(self.proto)
        self.outputs: list[str] = output_names(self.proto)
        self.weight_bytes = weight_bytes(self.proto)
        # With a budget the swap policy picks the executor (no full in-memory session first).
        self.swappable = swappable
        self._executor = None if memory_budget_mb is not None or swappable else \
            create_executor(backend, self.proto, threads=threads)
        self._lock = threading.Lock()
        self._budget_mb: float | None = None
        self._last_latency_ms: float | None = None
        self._last_signature = None
        self._runs = 0
        self._signatures: set = set()
        from dynnet_ros.swap.control import SwapControl  # budget policy: in memory or swapped blocks

        self._swap = SwapControl(self, create_executor)
        try:
            self.set_memory_budget(memory_budget_mb)
        except ValueError:
            self.close()  # an executor built for the refused budget would outlive this engine
            raise

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Same semantics as ``InferenceSession.run(None, feeds)`` but keyed by output name."""
        checked = validate_feeds(self.inputs, feeds)
        signature = shape_signature(checked)
        with self._lock:
            start = time.perf_counter()
            outputs = self._executor.run(checked)
            self._last_latency_ms = (time.perf_counter() - start) * 1e3
            self._last_signature = signature
            self._swap.observe_run(self._last_latency_ms)  # calibrates the in-memory table level
            self._signatures.add(signature)
            self._runs += 1
        return outputs

    def set_memory_budget(self, mb: float | int | None) -> None:
        """Bound the engine's footprint for this model (None = unlimited).

        Raises ValueError (and keeps the previous budget) for values that are not a positive MB
        count.
        """
        value = validate_budget_mb(mb)
        with self._lock:
            self._executor = self._swap.apply(value, self._executor)  # ValueError: nothing changed
            self._budget_mb = value

    def set_external_bytes(self, nbytes: int) -> None:
        """Declare memory the caller allocated after creating this engine and accounts for itself
        (a node's frame buffers, which it takes off the budget it hands the engine). Engines that
        measure their footprint as RSS growth leave it out."""
        self.external_bytes = max(0, int(nbytes))

    def min_budget_mb(self) -> float:
        """Smallest budget this model can run in (largest block + activations + overhead)."""
        with self._lock:
            return self._swap.min_budget_mb()

    def latency_table(self) -> list[tuple[float, float]]:
        """(budget MB, predicted latency ms) per precomputed budget level, increasing budget."""
        with self._lock:
            return self._swap.latency_table()

    @property
    def memory_budget_mb(self) -> float | None:
        return self._budget_mb

    def stats(self) -> dict:
        return {
            "backend": self.backend,
            "executor": self._executor.name,
            "last_latency_ms": self._last_latency_ms,
            "shape_signature": None if self._last_signature is None
            else {name: list(shape) for name, shape in self._last_signature},
            "runs": self._runs,
            "versions": {"onnxruntime": ort.__version__, "shape_signatures_seen": len(self._signatures)},
            "arena_bytes": None,
            "weight_bytes": self.weight_bytes,
            "blocks": 1,
            "memory_budget_mb": self._budget_mb,
            **(self._executor.engine_stats() if hasattr(self._executor, "engine_stats") else {}),  # planned: arena, plans
            **self._swap.stats(),
        }

    def close(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.close()
            self._swap.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
