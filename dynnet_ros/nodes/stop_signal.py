"""SIGINT/SIGTERM for a node process: one stop request, honoured in every phase of the node's life.

Why not rclpy's own handlers: they shut the context down from the signal handler (so callbacks
still running fail on a dead context), SIGTERM raises nothing in Python (a node busy loading a
model ignores it until the load ends), and SIGINT raises KeyboardInterrupt wherever the main
thread happens to be, cleanup included. Here the node is built under ``starting()`` (a signal
aborts the build with ``StopRequested``), and afterwards a signal only completes ``future``: the
executor spinning on it returns and the node shuts down in order while its context is still valid.

The signal reaches a watcher thread through ``signal.set_wakeup_fd`` (written by the C-level
handler at once), because the Python-level handler runs only when the main thread returns to
bytecode, which it does not while blocked in the executor's wait. The watcher also arms a
deadline (faulthandler's watchdog, which runs without the GIL): a shutdown that hangs anyway
prints where every thread is and exits instead of waiting for SIGKILL.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rclpy.task import Future

SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: a shutdown still under way this long after the first signal is a hang: every thread's stack goes
#: to stderr and the process exits with status 1 (below launch's 5 s before it escalates to SIGTERM)
SHUTDOWN_DEADLINE_S = 4.0


class StopRequested(BaseException):
    """Raised in the main thread by a stop signal that arrives while the node is being built."""


class StopSignal:
    """Context manager: install the handlers and the watcher; restore the previous handlers on exit."""

    def __init__(self) -> None:
        self.future: Future = Future()  # done (with the signal number) once a stop is requested
        self.signum: int | None = None
        self._starting = False
        self._read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        os.set_blocking(self._read_fd, True)
        self._old_handlers: dict[int, Any] = {}  # what signal.signal returned
        self._old_wakeup_fd = -1
        self._watcher = threading.Thread(target=self._watch, name="stop-signal", daemon=True)

    def __enter__(self) -> StopSignal:
        for sig in SIGNALS:
            self._old_handlers[sig] = signal.signal(sig, self._handle)
        self._old_wakeup_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._watcher.start()
        return self

    def __exit__(self, *exc) -> None:
        signal.set_wakeup_fd(self._old_wakeup_fd)
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        os.close(self._write_fd)  # the watcher reads EOF and ends
        self._watcher.join(timeout=1.0)
        os.close(self._read_fd)

    @property
    def requested(self) -> bool:
        """Set by whichever path saw the signal first; spin loops poll it as a second path."""
        return self.signum is not None

    @contextmanager
    def starting(self) -> Iterator[None]:
        """While inside, a stop signal raises StopRequested in the main thread (or at once, if one came)."""
        self._starting = True
        try:
            if self.requested:
                raise StopRequested()
            yield
        finally:
            self._starting = False

    def _handle(self, signum: int, _frame) -> None:
        """Python-level handler (main thread, between bytecodes): it must not take locks the main
        thread may hold at that moment (the future's), so the watcher completes the future."""
        self._note(signum)
        if self._starting:
            self._starting = False  # one raise per build, even if more signals follow
            raise StopRequested()

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, 16)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in SIGNALS and not self.future.done():
                    self._note(signum)
                    self.future.set_result(signum)

    def _note(self, signum: int) -> None:
        """Record the first signal and arm the shutdown deadline (both paths call this)."""
        if self.signum is None:
            self.signum = signum
            faulthandler.dump_traceback_later(SHUTDOWN_DEADLINE_S, exit=True)
