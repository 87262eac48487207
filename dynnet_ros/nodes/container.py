"""A component container for our nodes: several nodes in one process, on one executor.

rclpy has no composition API; this is ours, shaped after rclcpp_components' ComponentManager.
Each hosted node is created with the container's rclpy context (one interpreter, one DDS
participant, one onnxruntime environment), its own ``cli_args`` (name, namespace, parameters
file, remappings: exactly the ROS arguments it would have in a process of its own) and
``use_global_arguments=False``, so the container's own arguments never leak into it.

Nodes come from two places:

* ``--components FILE`` (static composition, what `dynnet up` and vehicle.launch.py start from a
  graph config's ``containers``): a YAML list of ``{plugin, ros_args}``, loaded in order at start.
  A node that fails to start fails the container (exit 1, the node named), as it would fail
  its own process: the supervisor's or launch's respawn then applies to the whole container.
  ``--keep-values FILE`` (what vehicle.launch.py passes) keeps the values set on these nodes at
  run time in FILE and starts them with those values when the same command runs again (a
  launch respawn; kept_values.py says why).
* ``~/_container/load_node``, ``unload_node`` and ``list_nodes`` (dynamic composition), served
  where the real ``composition_interfaces`` is importable: launch_ros's
  ``ComposableNodeContainer``/``LoadComposableNodes`` and ``ros2 component`` load nodes by plugin
  name (``dynnet_ros::LaneNode``), resolved through the ``dynnet_ros.components`` entry points.

An exception a hosted node's callback raises is caught at the executor (it would otherwise end
the process), logged with its traceback and reported on /diagnostics as an ERROR status of that
node (``<node>: callback``); the node and its neighbours keep serving.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import yaml
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.context import Context
from rclpy.executors import Executor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.utilities import remove_ros_args

from dynnet_ros.graph_config import COMPONENTS, PACKAGE
from dynnet_ros.nodes import diagnostics as diag
from dynnet_ros.nodes.base import close_node, serve, steady_timer
from dynnet_ros.nodes.kept_values import KeptValues
from dynnet_ros.nodes.service_answers import answer_when_matched

#: entry-point group that maps plugin names (``package::Class``) to node classes
COMPONENTS_GROUP = "dynnet_ros.components"
#: the container node's name when the command line does not remap it
DEFAULT_NAME = "dynnet_container"
#: a node's callback status stays ERROR this long after its last exception
FAULT_HOLD_S = 10.0
#: how often the container publishes its status and its nodes' callback statuses
STATUS_PERIOD_S = 1.0
#: extra_arguments of a load request that rclcpp's container understands and this one ignores
#: (a Python node has no intra-process transport; its rosout and global arguments are fixed)
IGNORED_EXTRA_ARGUMENTS = {"use_intra_process_comms": bool, "forward_global_arguments": bool,
                           "enable_rosout": bool}


class ComponentError(Exception):
    """A node could not be loaded or unloaded; the message is what the service answers."""


def plugin_class(package: str, plugin: str) -> Callable[..., Node]:
    """The node class registered for ``plugin`` by ``package`` (entry points of
    ``COMPONENTS_GROUP`` named ``package::Class``); this package's own plugins resolve from
    graph_config.COMPONENTS where its install metadata is absent (a source checkout)."""
    registered = {ep.name: ep for ep in entry_points(group=COMPONENTS_GROUP)
                  if ep.name.partition("::")[0] == package}
    if not registered and package != PACKAGE:
        raise ComponentError("Could not find requested resource in ament index")
    try:
        if plugin in registered:
            return registered[plugin].load()
        if package == PACKAGE and plugin in COMPONENTS:
            module, _, name = COMPONENTS[plugin].partition(":")
            return getattr(import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ComponentError(f"Failed to load library: {exc}") from exc
    raise ComponentError("Failed to find class with the requested plugin name.")


def composition_services() -> tuple[Any, Any, Any] | None:
    """(LoadNode, UnloadNode, ListNodes) where the real composition_interfaces is importable,
    else None. A stand-in without type support (what some environments install so launch_ros
    imports) does not count."""
    try:
        # optional: composition_interfaces comes with a ROS install (no PyPI wheel)
        from composition_interfaces.srv import ListNodes, LoadNode, UnloadNode
    except ImportError:
        return None
    if not all(hasattr(srv, "__import_type_support__") for srv in (LoadNode, UnloadNode, ListNodes)):
        return None
    return LoadNode, UnloadNode, ListNodes


@dataclass
class Component:
    unique_id: int
    plugin: str
    node: Node


@dataclass
class Fault:
    """A hosted node's callback exceptions: how many, the last one and when (monotonic)."""

    count: int
    last: str
    at: float


class ComponentHost:
    """The nodes one process hosts, on one executor and one context (see module docstring).

    Thread-safe: the load/unload services run on executor threads while the main thread reads
    the node list at shutdown.
    """

    def __init__(self, executor: Executor, context: Context) -> None:
        self.executor = executor
        self.context = context
        self._components: dict[int, Component] = {}
        self._next_id = 1  # like rclcpp's: ids start at 1 and are never reused
        #: nodes unloaded while the container runs: a callback of theirs still in flight at the
        #: unload may fail on the destroyed node, which is no fault of the node
        self.unloaded: weakref.WeakKeyDictionary[Node, str] = weakref.WeakKeyDictionary()  # -> its full name
        self._lock = threading.Lock()

    def load(self, factory: Callable[..., Node], plugin: str, cli_args: Sequence[str],
             parameter_overrides: Sequence[Parameter] = ()) -> Component:
        """Create a node of ``factory`` with its own ``cli_args`` and add it to the executor.
        The constructor's exceptions propagate (the caller decides what a failed start means);
        its unique id is taken all the same, as rclcpp's container takes it."""
        with self._lock:
            unique_id = self._next_id
            self._next_id += 1
        try:
            node = factory(context=self.context, cli_args=list(cli_args), use_global_arguments=False,
                           parameter_overrides=list(parameter_overrides))
        except BaseException:  # any exit, interrupts included; re-raised
            gc.collect()  # the half-built node's rcl handle goes with it, so it leaves the ROS graph
            raise
        component = Component(unique_id, plugin, node)
        with self._lock:
            self._components[unique_id] = component
        self.executor.add_node(node)
        return component

    def unload(self, unique_id: int) -> Component:
        """Remove the node from the executor, close and destroy it; KeyError for an unknown id."""
        with self._lock:
            component = self._components.pop(unique_id)
        self.executor.remove_node(component.node)
        self.unloaded[component.node] = component.node.get_fully_qualified_name()
        unfinished = close_node(component.node)
        if unfinished:  # its own threads keep their references; nothing else of it runs
            print(f"container: {self.unloaded[component.node]} unloaded with threads still running: "
                  f"{', '.join(unfinished)}", file=sys.stderr, flush=True)
        return component

    def components(self) -> list[Component]:
        with self._lock:
            return list(self._components.values())

    def nodes(self) -> list[Node]:
        return [c.node for c in self.components()]

    def owner(self, exc: BaseException) -> Node | None:
        """The hosted (or unloaded) node whose code raised ``exc``: the innermost frame of its
        traceback whose ``self`` is such a node, or an object holding one (``node`` / ``_node``)."""
        hosted = {id(node): node for node in [*self.nodes(), *self.unloaded.keys()]}
        frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
        for frame in reversed(frames):
            owner = frame.f_locals.get("self")
            for candidate in (owner, getattr(owner, "node", None), getattr(owner, "_node", None)):
                if candidate is not None and id(candidate) in hosted:
                    return hosted[id(candidate)]
        return None


class ContainerNode(Node):
    """The container's own node: the composition services and the fault reports."""

    def __init__(self, host: ComponentHost) -> None:
        super().__init__(DEFAULT_NAME, context=host.context)
        self.host = host
        self.faults: dict[str, Fault] = {}  # fully qualified node name -> its callback exceptions
        self._names: dict[str, str] = {}  # fully qualified node name -> node name, for the status name
        self._reported: deque[BaseException] = deque(maxlen=64)  # the latest exceptions reported
        self._lock = threading.Lock()
        self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        services = composition_services()
        if services is None:
            self.get_logger().info("composition_interfaces is not available: ~/_container services are not served "
                                   "(the nodes given at start run all the same)")
        else:
            load, unload, listing = services
            for kind, name, callback in ((load, "load_node", self._on_load), (unload, "unload_node", self._on_unload),
                                         (listing, "list_nodes", self._on_list)):
                answer_when_matched(self, self.create_service(kind, f"~/_container/{name}", callback))
        steady_timer(self, STATUS_PERIOD_S, self.publish_status)

    # ------------------------------------------------------------------ composition services
    def _on_load(self, request, response):
        try:
            factory = plugin_class(request.package_name, request.plugin_name)
            args = ["--ros-args"]
            for rule in request.remap_rules:
                args += ["-r", rule]
            if request.node_name:
                args += ["-r", f"__node:={request.node_name}"]
            if request.node_namespace:
                args += ["-r", f"__ns:={request.node_namespace}"]
            self._check_extra_arguments(request.extra_arguments)
            parameters = [Parameter.from_parameter_msg(p) for p in request.parameters]
            try:
                component = self.host.load(factory, request.plugin_name, args, parameters)
            except Exception as exc:  # any constructor failure is the caller's answer
                raise ComponentError(f"Component constructor threw an exception: {exc}") from exc
        except ComponentError as exc:
            self.get_logger().error(str(exc) if "plugin name" not in str(exc) else
                                    f"Failed to find class with the requested plugin name "
                                    f"'{request.plugin_name}' in the loaded library")
            response.success = False
            response.error_message = str(exc)
            return response
        response.success = True
        response.unique_id = component.unique_id
        response.full_node_name = component.node.get_fully_qualified_name()
        self.get_logger().info(f"loaded {request.plugin_name} as {response.full_node_name} "
                               f"(unique id {component.unique_id})")
        return response

    def _check_extra_arguments(self, extra: Sequence[Any]) -> None:
        for message in extra:
            argument = Parameter.from_parameter_msg(message)
            expected = IGNORED_EXTRA_ARGUMENTS.get(argument.name)
            if expected is not None and not isinstance(argument.value, expected):
                raise ComponentError(f"Extra component argument '{argument.name}' must be a boolean")
            self.get_logger().warning(f"extra argument '{argument.name}' ignored: it has no meaning for a "
                                      "Python node in this container")

    def _on_unload(self, request, response):
        try:
            component = self.host.unload(request.unique_id)
        except KeyError:
            response.success = False
            response.error_message = f"No node found with unique_id: {request.unique_id}"
            self.get_logger().warning(response.error_message)
            return response
        response.success = True
        self.get_logger().info(f"unloaded {component.plugin} (unique id {component.unique_id})")
        return response

    def _on_list(self, _request, response):
        components = self.host.components()
        response.unique_ids = [c.unique_id for c in components]
        response.full_node_names = [c.node.get_fully_qualified_name() for c in components]
        return response

    # ------------------------------------------------------------------ faults and status
    def on_callback_error(self, exc: Exception) -> None:
        """An exception out of a callback on the executor: report it against its node, keep serving.

        rclpy's executor raises a failed callback's exception from more than one place (the task
        and its future), so an exception already reported is ignored."""
        if any(seen is exc for seen in self._reported):
            return
        self._reported.append(exc)
        node = self.host.owner(exc)
        trace = "".join(traceback.format_exception(exc))
        unloaded = None if node is None else self.host.unloaded.get(node)
        if unloaded is not None:
            self.get_logger().info(f"a callback of {unloaded} in flight when it was unloaded ended with "
                                   f"{type(exc).__name__}: {exc}")
            return
        if node is None:
            self.get_logger().error(f"exception in a callback of no hosted node:\n{trace}")
            key, name = self.get_fully_qualified_name(), self.get_name()
        else:
            key, name = node.get_fully_qualified_name(), node.get_name()
            self.get_logger().error(f"exception in a callback of {key} (its other callbacks and the other "
                                    f"nodes keep running):\n{trace}")
        with self._lock:
            fault = self.faults.get(key)
            self.faults[key] = Fault((fault.count if fault else 0) + 1, f"{type(exc).__name__}: {exc}",
                                     time.monotonic())
            self._names[key] = name
        self.publish_status()

    def publish_status(self) -> None:
        """The container's status (pid, hosted nodes) and one callback status per node that raised."""
        components = self.host.components()
        values: dict[str, Any] = {"pid": os.getpid(), "nodes": len(components)}
        values.update({f"node.{c.unique_id}": c.node.get_fully_qualified_name() for c in components})
        statuses = [diag.node_status(self, "container", diag.OK,
                                     f"{len(components)} node(s) in process {os.getpid()}", values)]
        now = time.monotonic()
        with self._lock:
            faults = [(key, self._names[key], fault) for key, fault in self.faults.items()]
        for key, name, fault in faults:
            recent = now - fault.at < FAULT_HOLD_S
            message = (f"exception in a callback: {fault.last}" if recent else
                       f"no callback exception for {FAULT_HOLD_S:g} s (last: {fault.last})")
            statuses.append(diag.make_status(f"{name}: callback", key, diag.ERROR if recent else diag.OK, message,
                                             {"pid": os.getpid(), "container": self.get_fully_qualified_name(),
                                              "exceptions": fault.count, "last_exception": fault.last,
                                              "seconds_since": now - fault.at}))
        diag.publish(self, self.diag_pub, statuses)


@dataclass(frozen=True)
class StaticComponent:
    """One entry of a components file."""

    plugin: str
    ros_args: tuple[str, ...]


def read_components(path: Path) -> list[StaticComponent]:
    """A components file (``{components: [{plugin, ros_args}]}``); ValueError naming what is wrong."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: cannot read the components file: {exc}") from exc
    entries = data.get("components") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a mapping with a 'components' list")
    out = []
    for index, entry in enumerate(entries):
        args = entry.get("ros_args") if isinstance(entry, dict) else None
        ok = isinstance(entry.get("plugin"), str) and isinstance(args, list) and all(isinstance(a, str) for a in args)
        if not ok:
            raise ValueError(f"{path}: components[{index}] must be {{plugin: PACKAGE::Class, ros_args: [strings]}}")
        out.append(StaticComponent(entry["plugin"], tuple(entry["ros_args"])))
    return out


class Container:
    """What ``main`` serves: the container node, then the components file's nodes in order."""

    def __init__(self, components: list[StaticComponent], kept: KeptValues | None = None) -> None:
        self.static = components
        self.kept = kept
        self.node: ContainerNode | None = None
        self.host: ComponentHost | None = None

    def build(self, executor: Executor) -> Callable[[], list[Node]]:
        self.host = ComponentHost(executor, executor.context)
        own = self.node = ContainerNode(self.host)
        executor.add_node(own)
        try:
            for index, component in enumerate(self.static):
                factory = plugin_class(component.plugin.partition("::")[0], component.plugin)
                overrides = self.kept.overrides(index, component.plugin) if self.kept is not None else []
                try:
                    loaded = self.host.load(factory, component.plugin, component.ros_args, overrides)
                except ValueError as exc:
                    raise ValueError(f"{component.plugin} ({' '.join(component.ros_args)}): {exc}") from exc
                if self.kept is not None:
                    if overrides:
                        own.get_logger().info(
                            f"{loaded.node.get_fully_qualified_name()} started with the values set at run time "
                            f"before this process restarted: {self.kept.describe(index, component.plugin)}")
                    self.kept.watch(index, component.plugin, loaded.node)
        except ComponentError as exc:
            self._close()
            raise ValueError(str(exc)) from exc
        except BaseException:  # any exit, interrupts included: hosted nodes close; re-raised
            self._close()
            raise
        return self.hosted

    def _close(self) -> None:
        for node in reversed(self.hosted()):
            close_node(node)
        self.node, self.host = None, None

    def hosted(self) -> list[Node]:
        """The nodes to close at shutdown: the hosted ones (last loaded first), then the container's."""
        nodes = self.host.nodes() if self.host is not None else []
        return ([self.node] if self.node is not None else []) + nodes

    def on_callback_error(self, exc: Exception) -> None:
        if self.node is None:
            raise exc
        self.node.on_callback_error(exc)


def parse_arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="container", description="dynnet_ros component container: several "
                                     "nodes in one process (docs/ros.md, 'Processes or containers')")
    parser.add_argument("--components", type=Path, default=None, metavar="FILE",
                        help="nodes to load at start: a YAML list of {plugin, ros_args}")
    parser.add_argument("--keep-values", type=Path, default=None, metavar="FILE",
                        help="keep the values set at run time on the --components nodes in FILE, and start "
                             "them with the values FILE holds (a respawn running the same command again)")
    parser.add_argument("--threads", type=int, default=0, metavar="N",
                        help="executor threads (default: one per node given at start, plus one; at least 2)")
    options = parser.parse_args(list(argv))
    if options.threads < 0:
        parser.error(f"--threads must be >= 0, got {options.threads}")
    return options


def main(args: list[str] | None = None) -> int:
    argv = list(sys.argv if args is None else args)
    options = parse_arguments(remove_ros_args(argv)[1:])
    try:
        static = read_components(options.components) if options.components is not None else []
    except ValueError as exc:
        print(f"container: error: {exc}", file=sys.stderr, flush=True)
        return 1
    container = Container(static, KeptValues(options.keep_values) if options.keep_values is not None else None)
    threads = options.threads or max(2, len(static) + 1)
    return serve("container", container.build, argv, threads=threads,
                 on_callback_error=container.on_callback_error)


if __name__ == "__main__":
    sys.exit(main())
