"""What every dynnet node shares: typed parameter specs, validation, and the main() wrapper.

Parameters are declared from `ParamSpec`s so each has a descriptor (type, range, description
for `ros2 param describe`) and one validator used both at startup and in the on-set callback.
"""
from __future__ import annotations

import gc
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import rclpy
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, ParameterType, SetParametersResult
from rcl_interfaces.srv import SetParameters
from rclpy.callback_groups import CallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.exceptions import ParameterNotDeclaredException
from rclpy.executors import Executor, MultiThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.parameter_service import ParameterService
from rclpy.qos import QoSPolicyKind
from rclpy.qos_overriding_options import QoSOverridingOptions
from rclpy.signals import SignalHandlerOptions
from rclpy.timer import Timer

try:  # optional: rclpy's C++ EventsExecutor (Kilted); an rclpy without it spins on threads
    from rclpy.experimental import EventsExecutor
except ImportError:  # pragma: no cover - depends on the rclpy release
    EventsExecutor = None  # type: ignore[assignment]

from dynnet_ros.nodes.stop_signal import StopRequested, StopSignal
from dynnet_ros.settings import settings

#: how long a callback still running at a stop signal (a model load, a re-plan) may take to finish
CALLBACK_GRACE_S = 1.0
#: the spin loop also checks for a stop request this often
STOP_POLL_S = 0.5
#: sensor publishers and subscriptions take ROS 2's standard QoS overrides (read-only parameters
#: ``qos_overrides.<resolved topic>.<publisher|subscription>.<history|depth|reliability|durability>``),
#: so a deployment can make a camera link reliable, e.g. to evaluate on a bag without losing a frame,
#: and transient-local, so a subscription matched after a frame was sent still gets it
SENSOR_QOS_OVERRIDES = QoSOverridingOptions(policy_kinds=(
    QoSPolicyKind.HISTORY, QoSPolicyKind.DEPTH, QoSPolicyKind.RELIABILITY, QoSPolicyKind.DURABILITY))

_TYPES = {
    bool: ParameterType.PARAMETER_BOOL,
    int: ParameterType.PARAMETER_INTEGER,
    float: ParameterType.PARAMETER_DOUBLE,
    str: ParameterType.PARAMETER_STRING,
    "double_array": ParameterType.PARAMETER_DOUBLE_ARRAY,
    "string_array": ParameterType.PARAMETER_STRING_ARRAY,
}


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: default, meaning, allowed range and an optional extra check.

    `check(value)` returns None when the value is fine, else the reason it is not.
    """

    name: str
    default: Any
    description: str
    kind: Any = None  # bool/int/float/str/"double_array"/"string_array"; inferred from default
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    check: Callable[[Any], str | None] | None = None
    read_only: bool = False  # set at start only (rclpy refuses a change at run time)

    @property
    def type_key(self):
        return self.kind if self.kind is not None else type(self.default)

    def descriptor(self) -> ParameterDescriptor:
        desc = ParameterDescriptor(name=self.name, type=_TYPES[self.type_key], description=self.description)
        constraints = []
        if self.type_key is float and self.low is not None and self.high is not None:
            desc.floating_point_range = [FloatingPointRange(from_value=float(self.low), to_value=float(self.high),
                                                            step=0.0)]
            constraints.append(f"{self.low} <= value <= {self.high}")
        if self.type_key is int and self.low is not None and self.high is not None:
            desc.integer_range = [IntegerRange(from_value=int(self.low), to_value=int(self.high), step=1)]
            constraints.append(f"{int(self.low)} <= value <= {int(self.high)}")
        if self.choices:
            constraints.append("one of " + ", ".join(self.choices))
        desc.additional_constraints = "; ".join(constraints)
        desc.read_only = self.read_only
        # rclpy declares an empty list as a byte array and would then refuse the strings or doubles
        # a parameters file gives: such a parameter takes any type, and ``validate`` checks it
        desc.dynamic_typing = self._empty_array()
        return desc

    def _empty_array(self) -> bool:
        return self.type_key in ("double_array", "string_array") and not self.default

    def check_file_value(self, value: Any) -> str | None:
        """Reason a value from a parameter file is unacceptable, or None: the type as rclpy
        enforces it when the node declares the parameter (an integer is not a double), then
        ``validate``."""
        expected = {bool: "a bool", int: "an integer", float: "a double (write 2.0, not 2)", str: "a string",
                    "double_array": "a list of doubles", "string_array": "a list of strings"}[self.type_key]
        if not _has_ros_type(value, self.type_key):
            return f"{self.name} must be {expected}, got {value!r}"
        return self.validate(list(value) if isinstance(value, (list, tuple)) else value)

    def validate(self, value: Any) -> str | None:
        """Reason the value is unacceptable, or None."""
        if self._empty_array() and not _has_ros_type(value, self.type_key):
            return f"{self.name} must be a list of {'doubles' if self.type_key == 'double_array' else 'strings'}, " \
                   f"got {value!r}"
        if self.type_key in (int, float) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                return f"{self.name} must be finite, got {value}"
            if self.low is not None and value < self.low or self.high is not None and value > self.high:
                return f"{self.name} must be in [{self.low}, {self.high}], got {value}"
        if self.choices and value not in self.choices:
            return f"{self.name} must be one of {list(self.choices)}, got {value!r}"
        if self.check is not None:
            return self.check(value)
        return None


def _has_ros_type(value: Any, type_key: Any) -> bool:
    """Whether a YAML value has the ROS parameter type rclpy would accept for ``type_key``."""
    if type_key is bool:
        return isinstance(value, bool)
    if type_key in (int, float):
        return isinstance(value, type_key) and not isinstance(value, bool)
    if type_key is str:
        return isinstance(value, str)
    item = float if type_key == "double_array" else str
    return isinstance(value, (list, tuple)) and all(isinstance(v, item) and not isinstance(v, bool) for v in value)


class AtomicParameterService(ParameterService):
    """rclpy's parameter services, except that one ``set_parameters`` request is applied all at once.

    ROS 2's ``set_parameters`` sets a request's parameters one by one, each judged alone: a model
    switch sent as ``model_path`` + ``classes`` could apply ``classes`` and refuse ``model_path``
    (the old classes do not fit the new model), leaving a mix nobody asked for. Here the node's
    on-set callback sees the whole request (as with ``set_parameters_atomically``), and every
    parameter of it gets the same result: all applied, or none with the reason. A node built
    with ``start_parameter_services=False`` creates this instead of rclpy's."""

    def _set_parameters_callback(self, request: SetParameters.Request,
                                 response: SetParameters.Response) -> SetParameters.Response:
        parameters = [Parameter.from_parameter_msg(p) for p in request.parameters]
        if not parameters:
            return response
        try:
            result = self._get_node().set_parameters_atomically(parameters)
        except ParameterNotDeclaredException as exc:
            result = SetParametersResult(successful=False, reason=str(exc))
        response.results = [SetParametersResult(successful=result.successful, reason=result.reason)
                            for _ in parameters]
        return response


def declare(node: Node, specs: Iterable[ParamSpec]) -> dict[str, Any]:
    """Declare the parameters (overrides from --params-file / -p apply) and return their values.

    Raises ValueError naming the first parameter whose starting value fails validation.
    """
    values: dict[str, Any] = {}
    for spec in specs:
        param = node.declare_parameter(spec.name, spec.default, spec.descriptor())
        value = param.value
        if spec.type_key in ("double_array", "string_array"):
            value = list(value) if value is not None else []   # a parameter file's [] arrives unset
        reason = spec.validate(value)
        if reason:
            raise ValueError(f"parameter {reason}")
        values[spec.name] = value
    return values


def steady_timer(node: Node, period_s: float, callback: Callable[[], None],
                 callback_group: CallbackGroup | None = None) -> Timer:
    """A timer of ``node`` on the steady clock: for periods that mean real seconds (liveness,
    diagnostics, budget profiles and readings, retries).

    A timer on the node's default clock follows /clock under ``use_sim_time``: during a replay it
    stands still before the player starts and while it waits, and slows with ``--rate``, and
    the budget manager, which times profiles out in wall seconds, would drop the nodes. Stamps
    on what the callback publishes stay on the node's ROS clock (the bag's time).
    """
    return node.create_timer(period_s, callback, callback_group=callback_group,
                             clock=Clock(clock_type=ClockType.STEADY_TIME))


def _busy_threads(grace_s: float) -> list[str]:
    """Names of non-daemon threads (a callback still running on an executor worker) that do not
    end within ``grace_s``."""
    deadline = time.monotonic() + grace_s
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    for thread in others:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    return [t.name for t in others if t.is_alive()]


def run_node(factory: Callable[[], Node], args: list[str] | None = None) -> int:
    """One node in its own process: ``serve`` with the node ``factory`` builds, on two threads.

    Two threads: a slow parameter change (loading a model, re-planning a budget) does not stall
    the sensor callbacks that ModelNode puts in their own group.
    """
    def build(_executor: Executor) -> Callable[[], list[Node]]:
        node = factory()
        _executor.add_node(node)
        return lambda: [node]
    return serve(getattr(factory, "__name__", "node"), build, args, threads=2)


def make_executor(threads: int) -> Executor:
    """The process's executor (``DYNNET_EXECUTOR``): ``threads``, a MultiThreadedExecutor of
    ``threads`` threads, so a slow parameter change (a model load) runs beside the sensor
    callbacks; or ``events``, rclpy's EventsExecutor, one thread whose wait loop is C++. The
    MultiThreadedExecutor builds its wait set in Python for every callback, holding the GIL
    that a model node's worker needs between engine runs: with several cameras' frames and
    CameraInfo arriving, that loop takes most of a core, and the worker waits for it."""
    if settings().executor == "events":
        if EventsExecutor is not None:
            return EventsExecutor()
        warnings.warn("this rclpy has no EventsExecutor: the node spins on threads", stacklevel=2)
    return MultiThreadedExecutor(num_threads=threads)


def serve(name: str, build: Callable[[Executor], Callable[[], list[Node]]], args: list[str] | None = None, *,
          threads: int = 2, on_callback_error: Callable[[Exception], None] | None = None) -> int:
    """rclpy.init, spin until SIGINT/SIGTERM, then shut down in order; exit code 0 on a stop signal.

    ``build(executor)`` creates the process's nodes, adds them to the executor and returns what
    lists the nodes hosted at the time of the call (a container loads and unloads nodes while it
    runs). ``on_callback_error``: an exception a callback raised, handed over instead of ending
    the process (a component container reports it and keeps its other nodes serving).

    Startup errors (bad parameters, a model that does not load) print one line and exit 1.
    Shutdown order (stop_signal.py says why rclpy's signal handlers are not used): stop taking
    work, tell every node's own threads to stop (``stop_work()``, where a node has it), close
    each node (its worker threads and engine), destroy it, shut the context down, give a callback
    still running CALLBACK_GRACE_S to end, then exit without it — and without any thread a
    node's ``unfinished_work()`` names (a frame its ``close`` could not wait out).
    """
    unfinished: list[str] = []  # the nodes' own threads their close() left running
    with StopSignal() as stop:
        try:
            with rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO):
                executor = make_executor(threads)
                hosted: Callable[[], list[Node]] = list
                try:
                    with stop.starting():
                        hosted = build(executor)
                    while not stop.requested:  # the future wakes it at once; the poll is a fallback
                        try:
                            executor.spin_until_future_complete(stop.future, timeout_sec=STOP_POLL_S)
                        except Exception as exc:  # handed to the host, which reports it
                            if on_callback_error is None:
                                raise
                            on_callback_error(exc)
                    if isinstance(executor, MultiThreadedExecutor):
                        executor.shutdown(timeout_sec=0, wait_for_threads=False)  # idle workers end
                    else:
                        executor.shutdown(timeout_sec=0)
                finally:
                    nodes = list(reversed(hosted()))
                    for node in nodes:  # every node's threads stop together ...
                        getattr(node, "stop_work", lambda: None)()
                    for node in nodes:  # ... then each is closed
                        unfinished += close_node(node)
        except StopRequested:
            return 0
        except ValueError as exc:
            print(f"{name}: error: {exc}", file=sys.stderr, flush=True)
            return 1
    busy = _busy_threads(CALLBACK_GRACE_S) + unfinished
    if busy:
        # the executor's workers are not daemons (a normal exit would wait for them); the node's own
        # threads still run a model, which the interpreter's teardown must not free under them
        print(f"{name}: still running after the stop signal: {', '.join(busy)}; exiting without them",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(0)
    # Everything is closed: skip the interpreter's final garbage collection over the model's
    # Python objects, which is most of a model node's exit time.
    gc.freeze()
    return 0


def close_node(node: Node) -> list[str]:
    """Close ``node`` (its ``close()``, where it has one) and destroy it; the threads its close
    could not stop (``unfinished_work()``)."""
    unfinished: list[str] = []
    close = getattr(node, "close", None)
    if close is not None:
        close()
        unfinished = list(getattr(node, "unfinished_work", list)())
    node.destroy_node()
    return unfinished
