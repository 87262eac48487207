"""Service answers that reach a client the serving process has not fully discovered yet.

Why: a ROS 2 service is two DDS topics, requests one way and answers the other. A client sends
as soon as *its* side has matched the server's endpoints (``wait_for_service``), so the server can
take a request before its own answer writer has matched that client's answer reader. Fast DDS
(rmw_fastrtps) then waits up to its writer's blocking time (100 ms) for the match and, failing
it, drops the answer: rclpy only warns "failed to send response (timeout): client will not
receive response". The request ran; its client — launch_ros's ``LoadComposableNodes``,
``ros2 component``, a test — waits for the answer forever. A process that has just started
meets this on its first requests: it discovers every client waiting for it at once, and on a
busy machine the two halves of a client are matched more than 100 ms apart.

``answer_when_matched(service)`` makes the executor offer such an answer again until the
middleware takes it (the client's reader is matched) or tells that the client is gone (it then
returns at once), for up to ``ANSWER_PATIENCE_S``. rclpy reports the refusal only as that
warning, so a ``warnings.showwarning`` hook notes it for the thread that is sending; other
warnings go on to the hook it replaced.
"""
from __future__ import annotations

import re
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from rclpy.node import Node
from rclpy.service import Service

#: how rclpy's warning begins when the middleware refused an answer (its client's reader not matched)
REFUSED = "failed to send response (timeout)"
#: how long an answer is offered again before it is given up (and reported)
ANSWER_PATIENCE_S = 30.0

_REFUSED_PATTERN = re.escape(REFUSED)
_sending = threading.local()   # .active: this thread sends an answer; .refused: the middleware refused it
_hook_lock = threading.Lock()


class _RefusalHook:
    """``warnings.showwarning`` that notes a refusal of the answer this thread is sending and
    passes every other warning to the hook it replaced."""

    def __init__(self, previous: Callable[..., Any]) -> None:
        self.previous = previous

    def __call__(self, message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                 line: str | None = None) -> None:
        if getattr(_sending, "active", False) and issubclass(category, RuntimeWarning) and \
                str(message).startswith(REFUSED):
            _sending.refused = True
            return
        self.previous(message, category, filename, lineno, file, line)


def _ensure_hook() -> None:
    """Our hook in place, and every refusal reaching it: the default action shows a warning text
    once per location, which would hide the second refusal. Checked at each answer, since
    ``warnings.catch_warnings`` and ``logging.captureWarnings`` swap the hook and the filters
    while a process runs."""
    with _hook_lock:
        if not isinstance(warnings.showwarning, _RefusalHook):
            warnings.showwarning = _RefusalHook(warnings.showwarning)
        if not any(action == "always" and pattern is not None and pattern.pattern == _REFUSED_PATTERN
                   for action, pattern, *_ in warnings.filters):
            warnings.filterwarnings("always", message=_REFUSED_PATTERN, category=RuntimeWarning)


def _taken(send: Callable[[Any, Any], None], response: Any, header: Any) -> bool:
    """Send once; whether the middleware took the answer."""
    _ensure_hook()
    _sending.active, _sending.refused = True, False
    try:
        send(response, header)
    finally:
        _sending.active = False
    return not _sending.refused


def answer_when_matched(node: Node, service: Service, patience_s: float = ANSWER_PATIENCE_S) -> None:
    """Make the executor's answers on ``node``'s ``service`` wait for their client's reader to be
    matched (module docstring), logged on ``node``: an answer that waited (INFO), one given up
    after ``patience_s`` (ERROR). Each refused try has waited in the middleware for the match, so
    the tries need no pause."""
    send = service.send_response

    def send_response(response: Any, header: Any) -> None:
        start = time.monotonic()
        tries = 1
        while not _taken(send, response, header):
            if time.monotonic() - start >= patience_s:
                node.get_logger().error(f"an answer on {service.service_name} did not reach its client in "
                                        f"{patience_s:g} s: the client's answer reader was never matched")
                return
            tries += 1
        if tries > 1:
            node.get_logger().info(f"an answer on {service.service_name} reached its client after {tries} tries "
                                   f"({time.monotonic() - start:.2f} s): its answer reader was matched late")

    service.send_response = send_response  # type: ignore[method-assign]  # the executor answers through it
