"""Read and validate config/vehicle.yaml: the one description of the vehicle graph.

Both `launch/vehicle.launch.py` (robots with ROS 2 installed) and `dynnet up` (anywhere) build
their processes from `graph_processes()`, so the two can never disagree on nodes, parameters,
remappings, namespace or respawn settings (test/test_launch.py compares the processes each one
starts and kills one under launch to see it respawned). No ROS imports here.
"""
from __future__ import annotations

import math
import re
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

PACKAGE = "dynnet_ros"
# executable (as in setup.py entry points / `ros2 run`) -> module with main()
EXECUTABLES: dict[str, str] = {
    "sensor_sim": "dynnet_ros.nodes.sensor_sim",
    "lane_node": "dynnet_ros.nodes.lane_node",
    "pedestrian_node": "dynnet_ros.nodes.pedestrian_node",
    "depth_node": "dynnet_ros.nodes.depth_node",
    "budget_manager": "dynnet_ros.nodes.budget_manager",
}
#: node class per executable, as a component container loads it: the plugin name (``ros2 component
#: load dynnet_ros <plugin>``) -> "module:Class"; setup.py registers the same pairs as entry points
#: in the ``dynnet_ros.components`` group
COMPONENTS: dict[str, str] = {
    "dynnet_ros::SensorSim": "dynnet_ros.nodes.sensor_sim:SensorSim",
    "dynnet_ros::LaneNode": "dynnet_ros.nodes.lane_node:LaneNode",
    "dynnet_ros::PedestrianNode": "dynnet_ros.nodes.pedestrian_node:PedestrianNode",
    "dynnet_ros::DepthNode": "dynnet_ros.nodes.depth_node:DepthNode",
    "dynnet_ros::BudgetManager": "dynnet_ros.nodes.budget_manager:BudgetManager",
}
#: the plugin a container loads for each executable of a graph config
PLUGINS: dict[str, str] = {module.rpartition(".")[2].partition(":")[0]: plugin
                           for plugin, module in COMPONENTS.items()}
#: the component container's executable (`ros2 run dynnet_ros container`) and module
CONTAINER = "container"
CONTAINER_MODULE = "dynnet_ros.nodes.container"
#: executables a launcher adds on request (`dynnet up --foxglove`), never listed in a graph config
ON_REQUEST: dict[str, str] = {
    "foxglove_view": "dynnet_ros.nodes.foxglove_view",
    "recorder": "dynnet_ros.nodes.recorder",
}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: a flat QoS override parameter, e.g. ``qos_overrides./camera/image_raw.subscription.reliability``
#: (a ROS 2 parameter file takes it as well as the nested mapping)
_QOS_OVERRIDE_NAME = re.compile(r"^qos_overrides\.(/[A-Za-z_~{][A-Za-z0-9_/{}~]*)\.[a-z_]+\.[a-z_]+$")
_TOPIC = re.compile(r"^~?/?[A-Za-z_~{][A-Za-z0-9_/{}~]*$")
_RESPAWN_KEYS = {"respawn", "respawn_delay_s", "respawn_max_retries", "respawn_window_s"}
_NODE_KEYS = {"name", "executable", "sim", "parameters", "remappings", "container"} | _RESPAWN_KEYS
_CONTAINER_KEYS = {"threads"} | _RESPAWN_KEYS
#: most executor threads a container may be given
MAX_CONTAINER_THREADS = 64


@dataclass(frozen=True)
class RespawnPolicy:
    """What a launcher does when a node's process dies without being asked to stop.

    ``dynnet up`` restarts the node after ``delay_s``, doubling the delay for each further crash
    within ``window_s`` (a crash loop backs off instead of spinning), and leaves the node down
    when a crash would be restart number ``max_retries + 1`` within the window: a node that keeps
    dying is reported rather than restarted forever. Crashes older than the window are
    forgotten. ``ros2 launch`` maps this onto launch's own respawn (see launch/vehicle.launch.py).
    """

    enabled: bool = True
    delay_s: float = 1.0
    max_retries: int = 5
    window_s: float = 120.0

    def delay_after(self, crashes_in_window: int) -> float:
        """Delay before the restart that follows the ``crashes_in_window``-th crash (1 = first)."""
        return self.delay_s * 2.0 ** (crashes_in_window - 1)

    def gives_up(self, crashes_in_window: int) -> bool:
        return not self.enabled or crashes_in_window > self.max_retries


@dataclass(frozen=True)
class NodeConfig:
    name: str
    executable: str
    parameters: dict[str, Any] = field(default_factory=dict)
    remappings: dict[str, str] = field(default_factory=dict)
    sim: bool = False  # part of the simulator: skipped by `--no-sim` / `use_sim:=false`
    respawn: RespawnPolicy = field(default_factory=RespawnPolicy)
    container: str | None = None  # the container it shares a process with; None = its own process


@dataclass(frozen=True)
class ContainerConfig:
    """A process hosting several of the graph's nodes (``containers:`` in the config): its
    executor's thread count (0 = one per node, plus one) and what happens when it crashes."""

    name: str
    threads: int = 0
    respawn: RespawnPolicy = field(default_factory=RespawnPolicy)


@dataclass(frozen=True)
class GraphConfig:
    nodes: list[NodeConfig]
    source: str = "<memory>"
    containers: dict[str, ContainerConfig] = field(default_factory=dict)

    def selected(self, use_sim: bool = True) -> list[NodeConfig]:
        return [n for n in self.nodes if use_sim or not n.sim]

    def node(self, name: str) -> NodeConfig:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


def _param_value_ok(value: Any) -> bool:
    """A ROS parameter value, or a nested mapping of them (a params file's nested keys name
    dotted parameters, e.g. ``qos_overrides: {/camera/image_raw: {subscription: {depth: 1}}}``)."""
    if isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, dict) and value:
        return all(isinstance(k, str) and k and _param_value_ok(v) for k, v in value.items())
    if isinstance(value, list) and value:
        kinds = {bool if isinstance(v, bool) else float if isinstance(v, (int, float)) else type(v) for v in value}
        return len(kinds) == 1 and kinds <= {bool, float, str}
    return False


def _number(raw: dict, key: str, default: float, label: str, *, minimum: float, strict: bool) -> float:
    value = raw.get(key, default)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < minimum or (strict and value == minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise ValueError(f"{label}: '{key}' must be a number {bound}, got {value!r}")
    return float(value)


def _parse_respawn(raw: dict, label: str) -> RespawnPolicy:
    """The node's respawn keys, each defaulting to RespawnPolicy's value."""
    default = RespawnPolicy()
    enabled = raw.get("respawn", default.enabled)
    if not isinstance(enabled, bool):
        raise ValueError(f"{label}: 'respawn' must be true or false, got {enabled!r}")
    retries = raw.get("respawn_max_retries", default.max_retries)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise ValueError(f"{label}: 'respawn_max_retries' must be an integer >= 0, got {retries!r}")
    return RespawnPolicy(enabled=enabled,
                         delay_s=_number(raw, "respawn_delay_s", default.delay_s, label, minimum=0.0, strict=False),
                         max_retries=retries,
                         window_s=_number(raw, "respawn_window_s", default.window_s, label, minimum=0.0, strict=True))


def _parse_containers(raw: Any, where: str) -> dict[str, ContainerConfig]:
    """The ``containers:`` mapping: container name -> its threads and respawn keys."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: 'containers' must be a mapping from container name to its settings")
    containers = {}
    for name, settings in raw.items():
        label = f"{where}: container '{name}'"
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"{where}: container name must be a ROS node name (letters, digits, _), got {name!r}")
        settings = {} if settings is None else settings
        if not isinstance(settings, dict):
            raise ValueError(f"{label}: expected a mapping of {sorted(_CONTAINER_KEYS)}")
        unknown = set(settings) - _CONTAINER_KEYS
        if unknown:
            raise ValueError(f"{label}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_CONTAINER_KEYS)}")
        threads = settings.get("threads", 0)
        if not isinstance(threads, int) or isinstance(threads, bool) or not 0 <= threads <= MAX_CONTAINER_THREADS:
            raise ValueError(f"{label}: 'threads' must be an integer in [0, {MAX_CONTAINER_THREADS}] "
                             f"(0 = one per node, plus one), got {threads!r}")
        containers[name] = ContainerConfig(name=name, threads=threads, respawn=_parse_respawn(settings, label))
    return containers


def _node_container(raw: dict, label: str, containers: dict[str, ContainerConfig]) -> str | None:
    """The node's ``container`` key: a name from ``containers``, or false/absent (its own process)."""
    container = raw.get("container", False)
    if container is False:
        return None
    if not isinstance(container, str) or container not in containers:
        known = ", ".join(sorted(containers)) or "none are defined"
        raise ValueError(f"{label}: 'container' must be false or a container from 'containers' ({known}), "
                         f"got {container!r}")
    respawn = sorted(_RESPAWN_KEYS & set(raw))
    if respawn:
        raise ValueError(f"{label}: {respawn} apply to a process and this node runs in container "
                         f"'{container}': set them under containers.{container}")
    return container


def parse_graph(data: Any, source: str = "<memory>") -> GraphConfig:
    """Validate parsed YAML; raise ValueError naming the file, node and field at fault."""
    where = source
    if not isinstance(data, dict) or "nodes" not in data:
        raise ValueError(f"{where}: expected a mapping with a 'nodes' list at the top level")
    extra = set(data) - {"nodes", "containers"}
    if extra:
        raise ValueError(f"{where}: unknown top-level key(s) {sorted(extra)}; only 'nodes' and 'containers' "
                         "are allowed")
    containers = _parse_containers(data.get("containers"), where)
    raw_nodes = data["nodes"]
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ValueError(f"{where}: 'nodes' must be a non-empty list")
    nodes: list[NodeConfig] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_nodes):
        label = f"{where}: nodes[{index}]"
        if not isinstance(raw, dict):
            raise ValueError(f"{label} must be a mapping with name/executable/parameters/remappings")
        unknown = set(raw) - _NODE_KEYS
        if unknown:
            raise ValueError(f"{label}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_NODE_KEYS)}")
        name = raw.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"{label}: 'name' must be a ROS node name (letters, digits, _), got {name!r}")
        label = f"{where}: node '{name}'"
        if name in seen:
            raise ValueError(f"{label} appears twice")
        if name in containers:
            raise ValueError(f"{label}: a container has the same name (every node in the graph needs its own)")
        seen.add(name)
        executable = raw.get("executable")
        if executable not in EXECUTABLES:
            raise ValueError(f"{label}: unknown executable {executable!r}; choose one of {sorted(EXECUTABLES)}")
        params = raw.get("parameters") or {}
        if not isinstance(params, dict):
            raise ValueError(f"{label}: 'parameters' must be a mapping")
        for key, value in params.items():
            if not isinstance(key, str) or not (_NAME.match(key.replace(".", "_")) or _QOS_OVERRIDE_NAME.match(key)):
                raise ValueError(f"{label}: bad parameter name {key!r}")
            if not _param_value_ok(value):
                raise ValueError(f"{label}: parameter '{key}' must be a bool, number, string, a non-empty "
                                 f"list of one of those or a mapping of such values, got {value!r}")
        remaps = raw.get("remappings") or {}
        if not isinstance(remaps, dict):
            raise ValueError(f"{label}: 'remappings' must be a mapping from topic to topic")
        for src, dst in remaps.items():
            if not (isinstance(src, str) and isinstance(dst, str) and _TOPIC.match(src) and _TOPIC.match(dst)):
                raise ValueError(f"{label}: bad remapping {src!r} -> {dst!r}")
        sim = raw.get("sim", False)
        if not isinstance(sim, bool):
            raise ValueError(f"{label}: 'sim' must be true or false, got {sim!r}")
        container = _node_container(raw, label, containers)
        nodes.append(NodeConfig(name=name, executable=executable, parameters=dict(params),
                                remappings=dict(remaps), sim=sim, container=container,
                                respawn=_parse_respawn(raw, label) if container is None
                                else containers[container].respawn))
    empty = sorted(set(containers) - {n.container for n in nodes})
    if empty:
        raise ValueError(f"{where}: container(s) {empty} hold no node (give nodes 'container: NAME')")
    return GraphConfig(nodes=nodes, source=source, containers=containers)


def separate_processes(data: dict) -> dict:
    """Parsed config YAML with every node in a process of its own: the container groups dissolved,
    each container's respawn keys moved to its nodes (benchmarks and tests that measure or kill
    one node's process)."""
    containers = data.pop("containers", None) or {}
    for node in data["nodes"]:
        group = node.pop("container", False)
        if group:
            node.update({k: v for k, v in (containers.get(group) or {}).items() if k in _RESPAWN_KEYS})
    return data


def load_graph(path: str | Path) -> GraphConfig:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"graph config not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from exc
    return parse_graph(data, str(path))


def default_config_path() -> Path:
    """The vehicle graph's config, ``vehicle.yaml`` (``config_file``)."""
    return config_file("vehicle.yaml")


def config_file(name: str) -> Path:
    """The package's config file ``name``: the source checkout's copy, else the installed
    share/dynnet_ros/config one (the checkout's path when neither is found)."""
    checkout = Path(__file__).resolve().parents[1] / "config" / name
    if checkout.is_file():
        return checkout
    try:
        # optional: ament_index_python exists only where ROS is installed or its wheel was added
        from ament_index_python.packages import PackageNotFoundError, get_package_share_directory

        try:
            return Path(get_package_share_directory(PACKAGE)) / "config" / name
        except PackageNotFoundError:
            pass
    except ImportError:
        pass
    return checkout
    try:
        # optional: ament_index_python exists only where ROS is installed or its wheel was added
        from ament_index_python.packages import PackageNotFoundError, get_package_share_directory

        try:
            return Path(get_package_share_directory(PACKAGE)) / "config" / "vehicle.yaml"
        except PackageNotFoundError:
            pass
    except ImportError:
        pass
    return checkout


_NAMESPACE = re.compile(r"^(/[A-Za-z_][A-Za-z0-9_]*)+$")


def validate_namespace(namespace: str) -> str:
    """'' (none) or an absolute ROS namespace like /robot1; a missing leading slash is added."""
    if not namespace:
        return ""
    namespace = namespace if namespace.startswith("/") else "/" + namespace
    if not _NAMESPACE.match(namespace):
        raise ValueError(f"bad ROS namespace {namespace!r} (letters, digits, _ separated by /)")
    return namespace


@dataclass(frozen=True)
class ProcessSpec:
    """One process as both launchers start it: what `ros2 run dynnet_ros <executable>` runs,
    under ``name`` in ``namespace`` ('' = none), with these parameters and remappings.

    A component container (executable ``container``) is named after its config entry and hosts
    ``components``: one spec per node, each started with exactly the ROS arguments it would have
    in a process of its own (``ros_arguments``), on ``threads`` executor threads.
    """

    name: str
    executable: str
    namespace: str
    parameters: dict[str, Any]
    remappings: tuple[tuple[str, str], ...]
    respawn: RespawnPolicy = field(default_factory=RespawnPolicy)
    components: tuple[ProcessSpec, ...] = ()
    threads: int = 0

    @property
    def module(self) -> str:
        if self.executable == CONTAINER:
            return CONTAINER_MODULE
        return EXECUTABLES.get(self.executable) or ON_REQUEST[self.executable]

    @property
    def hosted(self) -> tuple[ProcessSpec, ...]:
        """The nodes this process runs: its components, or itself."""
        return self.components or (self,)

    def executor_threads(self) -> int:
        """A container's executor threads: the configured count, else one per node plus one (a
        node's slow parameter change, such as a model load, then leaves the others' callbacks a
        thread)."""
        return self.threads or len(self.components) + 1

    def params_file_data(self) -> dict:
        """Content of this node's own ROS 2 --params-file.

        Keyed "/**" (any node): the file is passed to this node only, whatever its namespace.
        """
        return {"/**": {"ros__parameters": dict(self.parameters)}}


def graph_processes(graph: GraphConfig, use_sim: bool = True, namespace: str = "") -> list[ProcessSpec]:
    """The processes of the graph, in config order: one per selected node, except that the
    selected nodes of one container share a process (a container process, where its first node
    is); a container left with one node (the others are sim nodes under ``use_sim=False``) runs
    it as a plain process, with the container's respawn keys.

    A namespace moves the nodes and their relative topics (camera/image_raw, lane/mask, ...)
    under it; /diagnostics stays global, as diagnostic aggregators expect.
    """
    namespace = validate_namespace(namespace)
    selected = graph.selected(use_sim)
    members: dict[str, list[ProcessSpec]] = {}
    order: list[str | ProcessSpec] = []
    for node in selected:
        spec = ProcessSpec(name=node.name, executable=node.executable, namespace=namespace,
                           parameters=dict(node.parameters), remappings=tuple(node.remappings.items()),
                           respawn=node.respawn)
        if node.container is None:
            order.append(spec)
            continue
        if node.container not in members:
            members[node.container] = []
            order.append(node.container)
        members[node.container].append(spec)
    processes = []
    for entry in order:
        if isinstance(entry, ProcessSpec):
            processes.append(entry)
            continue
        group, config = members[entry], graph.containers[entry]
        processes.append(group[0] if len(group) == 1 else
                         ProcessSpec(name=entry, executable=CONTAINER, namespace=namespace, parameters={},
                                     remappings=(), respawn=config.respawn, components=tuple(group),
                                     threads=config.threads))
    return processes


def view_process(namespace: str, port: int) -> ProcessSpec:
    """The Foxglove live view (`dynnet up --foxglove`): its own process in the graph's namespace,
    serving on 127.0.0.1:port, restarted like the config's nodes when it crashes."""
    return ProcessSpec(name="foxglove_view", executable="foxglove_view", namespace=validate_namespace(namespace),
                       parameters={"port": port}, remappings=())


def recorder_process(namespace: str, output: str | Path, storage: str, nodes: list[str],
                     sim_time: bool = False) -> ProcessSpec:
    """The bag recorder (`dynnet up|replay --record OUT`): records the topics ``nodes`` (fully
    qualified names) publish or subscribe to. Not restarted: a second recorder could not write to
    the same OUT."""
    parameters: dict[str, Any] = {"output": str(output), "storage": storage, "nodes": list(nodes) or [""]}
    if sim_time:
        parameters["use_sim_time"] = True
    return ProcessSpec(name="recorder", executable="recorder", namespace=validate_namespace(namespace),
                       parameters=parameters, remappings=(), respawn=RespawnPolicy(enabled=False))


def ros_arguments(process: ProcessSpec, params_file: str | Path) -> list[str]:
    """The node's ROS arguments: ``--ros-args``, its name, namespace, parameters file and
    remappings; a container gets its name and namespace only."""
    args = ["--ros-args", "-r", f"__node:={process.name}"]
    if process.namespace:
        args += ["-r", f"__ns:={process.namespace}"]
    if process.parameters:
        args += ["--params-file", str(params_file)]
    for src, dst in process.remappings:
        args += ["-r", f"{src}:={dst}"]
    return args


def process_arguments(process: ProcessSpec, params_file: str | Path) -> list[str]:
    """The arguments before ``--ros-args``: a container's components file and thread count."""
    if process.executable != CONTAINER:
        return []
    return ["--components", str(params_file), "--threads", str(process.executor_threads())]


def node_command(process: ProcessSpec, params_file: str | Path, python: str = sys.executable) -> list[str]:
    """argv that runs one process (what `dynnet up` starts); ``params_file``: the node's parameters
    file, or a container's components file (``write_process_files``)."""
    return [python, "-m", process.module, *process_arguments(process, params_file),
            *ros_arguments(process, params_file)]


def components_file_data(process: ProcessSpec, params_files: Mapping[str, str | Path]) -> dict:
    """A container's components file: each node's plugin and the ROS arguments it would have in
    a process of its own (``params_files``: node name -> its parameters file)."""
    return {"components": [{"plugin": PLUGINS[node.executable],
                            "ros_args": ros_arguments(node, params_files[node.name])}
                           for node in process.components]}


def write_process_files(process: ProcessSpec, directory: str | Path, suffix: str = "") -> Path:
    """Write what ``process`` reads at start into ``directory``: its parameters file, or a
    container's components file and its nodes' parameters files. Returns the file its command
    line names (``node_command``). ``suffix`` keeps a restart's files apart from the first start's."""
    directory = Path(directory)

    def params_file(node: ProcessSpec) -> Path:
        path = directory / f"{node.name}{suffix}.yaml"
        path.write_text(yaml.safe_dump(node.params_file_data(), sort_keys=False))
        return path

    if process.executable != CONTAINER:
        return params_file(process)
    files = {node.name: params_file(node) for node in process.components}
    path = directory / f"{process.name}{suffix}.components.yaml"
    path.write_text(yaml.safe_dump(components_file_data(process, files), sort_keys=False))
    return path


class RuntimeParameters:
    """Parameter values set on the graph's nodes while it runs, kept for their restarts.

    Why: a restarted process starts from its command line, i.e. the config's values, so a
    user's ``ros2 param set`` (a threshold, a model_path) or the budget manager's last budget
    would silently revert. The supervisor records each change its node sees on
    /parameter_events (fully qualified node names) and restarts a node with them on top of the
    config's parameters (``restart_spec``). Thread-safe: the ROS thread records, the supervisor reads.
    """

    def __init__(self) -> None:
        self._values: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def record(self, node: str, name: str, value: Any) -> bool:
        """Keep ``value`` for ``node``'s parameter ``name``; True when it differs from what was kept."""
        value = list(value) if isinstance(value, (list, tuple)) else value
        with self._lock:
            kept = self._values.setdefault(node, {})
            changed = name not in kept or kept[name] != value
            kept[name] = value
            return changed

    def for_node(self, node: str) -> dict[str, Any]:
        with self._lock:
            return dict(self._values.get(node, {}))


def fq_node_name(process: ProcessSpec) -> str:
    """The node's fully qualified ROS name (what /parameter_events and profiles carry)."""
    return f"{process.namespace}/{process.name}"


def restart_spec(process: ProcessSpec, overrides: dict[str, Any]) -> ProcessSpec:
    """``process`` with ``overrides`` (values set at run time) on top of its config's parameters."""
    return replace(process, parameters={**process.parameters, **overrides})


def map_hosted(process: ProcessSpec, change: Callable[[ProcessSpec], ProcessSpec]) -> ProcessSpec:
    """``process`` with ``change`` applied to each node it hosts (a container's components, or itself)."""
    if process.components:
        return replace(process, components=tuple(change(n) for n in process.components))
    return change(process)


def with_parameters(process: ProcessSpec, values: dict[str, Any]) -> ProcessSpec:
    """``process`` with ``values`` over the parameters of every node it hosts."""
    if process.components:
        return replace(process, components=tuple(with_parameters(n, values) for n in process.components))
    return replace(process, parameters={**process.parameters, **values})


def restart_process(process: ProcessSpec, overrides: dict[str, dict[str, Any]]) -> ProcessSpec:
    """``process`` with each hosted node's ``overrides`` (fully qualified node name -> values set
    at run time) over its config's parameters: a container's nodes each get their own."""
    if process.executable != CONTAINER:
        return restart_spec(process, overrides.get(fq_node_name(process), {}))
    return replace(process, components=tuple(restart_spec(node, overrides.get(fq_node_name(node), {}))
                                             for node in process.components))
