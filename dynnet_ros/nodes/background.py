"""An rclpy node in its own context, spun on a daemon thread: for tools and tests that observe
the graph from outside it (``dynnet demo``'s monitor, the graph tests' observer)."""
from __future__ import annotations

import threading

import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.signals import SignalHandlerOptions


class BackgroundNode:
    """``node`` is spun every ``period`` seconds until ``close()``; callbacks run on that thread."""

    def __init__(self, name: str, *, handle_signals: bool = True, period: float = 0.05,
                 namespace: str | None = None) -> None:
        self.context = rclpy.Context()
        options = SignalHandlerOptions.ALL if handle_signals else SignalHandlerOptions.NO
        rclpy.init(context=self.context, signal_handler_options=options)
        self.node = rclpy.create_node(name, context=self.context, namespace=namespace)
        self._period = period
        self._executor = SingleThreadedExecutor(context=self.context)
        self._executor.add_node(self.node)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start spinning (after the caller created its subscriptions and publishers)."""
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            while self.context.ok():
                self._executor.spin_once(timeout_sec=self._period)
        except Exception:  # noqa: BLE001 - the context was shut down while spinning
            pass

    def close(self) -> None:
        try:
            self._executor.shutdown(timeout_sec=1.0)
            self.node.destroy_node()
        finally:
            if self.context.ok():
                rclpy.shutdown(context=self.context)
        if self._thread is not None:
            self._thread.join(timeout=2.0)
