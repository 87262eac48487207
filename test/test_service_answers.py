"""An answer the middleware refuses because its client's reader is not matched yet is offered
again until it is taken (nodes/service_answers.py); a refusal that lasts is given up and logged;
other warnings raised while answering are shown as before.

The service here stands in for rclpy's: its ``send_response`` warns as rclpy's binding does when
Fast DDS refuses the answer (test_container.py serves the real composition services).
"""
from __future__ import annotations

import warnings

from dynnet_ros.nodes.service_answers import REFUSED, answer_when_matched

REFUSAL = f"{REFUSED}: client will not receive response, at rmw_response.cpp:164, at rcl/service.c:401"


class Logger:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, message: str) -> None:
        self.lines.append(("info", message))

    def error(self, message: str) -> None:
        self.lines.append(("error", message))


class Node:
    def __init__(self) -> None:
        self.logger = Logger()

    def get_logger(self) -> Logger:
        return self.logger


class Service:
    """Refuses the first ``refusals`` answers (None: every one) with rclpy's warning."""

    service_name = "/ns/comp/_container/list_nodes"

    def __init__(self, refusals: int | None, other_warning: str | None = None) -> None:
        self.refusals = refusals
        self.other_warning = other_warning
        self.tries = 0
        self.sent: list[tuple[object, object]] = []

    def send_response(self, response, header) -> None:
        self.tries += 1
        if self.other_warning is not None:
            warnings.warn(self.other_warning, RuntimeWarning, stacklevel=1)
        if self.refusals is None or self.refusals > 0:
            if self.refusals is not None:
                self.refusals -= 1
            warnings.warn(REFUSAL, RuntimeWarning, stacklevel=1)
            return
        self.sent.append((response, header))


def test_a_refused_answer_is_sent_again_until_the_middleware_takes_it():
    node, service = Node(), Service(refusals=2)
    answer_when_matched(node, service)
    with warnings.catch_warnings(record=True) as shown:
        service.send_response("answer", "header")
    assert service.sent == [("answer", "header")] and service.tries == 3
    assert not shown  # the refusals were the hook's, not the user's
    [(level, message)] = node.logger.lines
    assert level == "info" and "reached its client after 3 tries" in message and service.service_name in message


def test_an_answer_taken_at_once_is_sent_once_and_logs_nothing():
    node, service = Node(), Service(refusals=0)
    answer_when_matched(node, service)
    service.send_response("answer", "header")
    assert service.sent == [("answer", "header")] and service.tries == 1 and node.logger.lines == []


def test_an_answer_refused_past_the_patience_is_given_up_with_an_error():
    node, service = Node(), Service(refusals=None)
    answer_when_matched(node, service, patience_s=0.2)
    service.send_response("answer", "header")
    assert service.sent == [] and service.tries > 1
    [(level, message)] = node.logger.lines
    assert level == "error" and "did not reach its client in 0.2 s" in message


def test_other_warnings_while_answering_and_refusals_outside_an_answer_are_shown():
    node, service = Node(), Service(refusals=1, other_warning="something else")
    answer_when_matched(node, service)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        service.send_response("answer", "header")
        warnings.warn(REFUSAL, RuntimeWarning, stacklevel=1)  # an rclpy service of no answer_when_matched
    assert [str(w.message) for w in shown] == ["something else", "something else", REFUSAL]
    assert service.sent == [("answer", "header")]
