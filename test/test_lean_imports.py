"""A serving process imports what serving needs, and the CLI's help loads no command's machinery.

Memory is the product: every package a model node imports is resident in every model process
(or container). The mapper's search stack (pymoo, SciPy, xgboost, scikit-learn), plots
(matplotlib), the terminal UI (rich) and the CLI's commands load only where a feature that
needs them runs, so a plain model node's third-party packages are the list below.
"""
from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
import textwrap

import pytest

from dynnet_ros import cli, commands
from dynnet_ros.commands import parsers
from dynnet_ros.zoo import ensure_model

pytestmark = pytest.mark.graph

#: Every top-level package outside the standard library a model node holds once its model is loaded.
NODE_PACKAGES = {
    "dynnet_ros",
    # rclpy and the message packages our nodes use, with what rclpy itself loads
    "rclpy", "rpyutils", "ros_wheels_bootstrapper", "rosidl_parser", "ament_index_python", "yaml",
    "builtin_interfaces", "diagnostic_msgs", "rcl_interfaces", "rosgraph_msgs", "sensor_msgs",
    "service_msgs", "std_msgs", "type_description_interfaces", "unique_identifier_msgs", "geometry_msgs",
    "vision_msgs", "visualization_msgs", "typing_extensions",
    # the type support of rclpy's own /parameter_events publisher (every rclpy node, from PyPI's wheels)
    "rosidl_generator_py", "rosidl_pycommon", "em", "lark",
    # the engine: numpy, onnxruntime, and protobuf for onnx's generated classes (ONNX_PROTO_MODULE)
    "numpy", "onnxruntime", "google",
    # process and cgroup memory
    "psutil",
}
#: The one module of onnx's a model node holds: its generated protobuf classes (engine/modelio/
#: onnx_proto.py loads them without the package, whose C++ extension and ml_dtypes serving does not need).
ONNX_PROTO_MODULE = "onnx.onnx_ml_pb2"
#: Parts of this package a model node never loads: the CLI, bag I/O, the live view, the search.
NOT_IN_A_NODE = ("dynnet_ros.cli", "dynnet_ros.commands", "dynnet_ros.bags", "dynnet_ros.view",
                 "dynnet_ros.mapper.nsga", "dynnet_ros.mapper.plot")

NODE_CHILD = textwrap.dedent("""
    import json, os, sys
    import rclpy
    from dynnet_ros.nodes.depth_node import DepthNode
    from dynnet_ros.nodes.lane_node import LaneNode
    from dynnet_ros.nodes.pedestrian_node import PedestrianNode

    rclpy.init(args=["--ros-args", "-r", f"__ns:=/lean_imports_{os.getpid()}"])
    for node_class in (LaneNode, PedestrianNode, DepthNode):
        node = node_class()
        assert node.core is not None
        node.destroy_node()
    rclpy.shutdown()
    print(json.dumps(sorted(sys.modules)))
""")


def _modules_after(script: str, *args: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _third_party(modules: list[str]) -> set[str]:
    tops = {name.split(".")[0] for name in modules}
    return {top for top in tops if top not in sys.stdlib_module_names and not top.startswith("_")
            and top not in ("cython_runtime", "__editable___dynnet_ros_0_1_0_finder")}


def test_a_model_node_imports_only_what_serving_needs():
    for name in ("lane", "pedestrian", "depth"):
        ensure_model(name)
    modules = _modules_after(NODE_CHILD)
    extra = _third_party([m for m in modules if m != ONNX_PROTO_MODULE]) - NODE_PACKAGES
    assert extra == set(), f"a model node imported packages serving does not need: {sorted(extra)}"
    ours = [m for m in modules if m.startswith(NOT_IN_A_NODE)]
    assert ours == [], f"a model node imported {ours}"
    onnx_modules = [m for m in modules if m.split(".")[0] == "onnx"]
    assert onnx_modules == [ONNX_PROTO_MODULE], f"a model node imported the onnx package: {onnx_modules}"
    assert {"rclpy", "onnxruntime", "numpy"} <= _third_party(modules)  # the child really built the nodes


HELP_CHILD = textwrap.dedent("""
    import contextlib, io, json, sys
    from dynnet_ros import cli
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        cli.main(sys.argv[1:])
    print(json.dumps(sorted(sys.modules)))
""")


def _help_modules(*argv: str) -> list[str]:
    return _modules_after(HELP_CHILD, *argv)


def test_dynnet_help_loads_no_command():
    modules = _help_modules("--help")
    commands = [m for m in modules if m.startswith("dynnet_ros.commands.") and m != parsers.__name__]
    assert commands == [], commands
    heavy = _third_party(modules) & {"onnx", "onnxruntime", "rclpy", "numpy", "pymoo", "xgboost", "rich",
                                     "matplotlib", "scipy", "sklearn"}
    assert heavy == set()


def test_the_help_lines_are_the_commands_own():
    found = {}
    for info in pkgutil.iter_modules(parsers.__path__):
        module = cli.parser_module(info.name)
        if hasattr(module, "NAME"):
            found[module.NAME] = module.HELP
            assert callable(cli.command_module(info.name).run)  # every parser has its implementation
    assert found == commands.SUMMARIES


#: What no sub-command's ``--help`` loads: the engine's runtimes and model libraries, the
#: mapper's search and cost model, plots, the terminal UI, ROS, the bag and live-view libraries.
HELP_HEAVY = {"onnx", "onnxruntime", "ml_dtypes", "pymoo", "xgboost", "sklearn", "scipy", "matplotlib", "rich",
              "rclpy", "rosbags", "foxglove", "PIL"}
#: The CLI's own modules a command's ``--help`` may load: its parsers and argument types.
HELP_MODULES = ("dynnet_ros.commands.parsers", "dynnet_ros.commands.arguments", "dynnet_ros.commands.basic_arguments",
                "dynnet_ros.commands._map_arguments")


@pytest.mark.parametrize("command", sorted(commands.SUMMARIES))
def test_a_commands_help_loads_none_of_its_machinery(command):
    """`dynnet CMD --help` builds CMD's parser (nested actions included) and imports no implementation."""
    modules = _help_modules(command, "--help")
    heavy = _third_party([m for m in modules if m != ONNX_PROTO_MODULE]) & HELP_HEAVY
    assert heavy == set(), f"dynnet {command} --help imported {sorted(heavy)}"
    implementations = [m for m in modules if m.startswith("dynnet_ros.commands.") and not m.startswith(HELP_MODULES)]
    assert implementations == [], f"dynnet {command} --help imported {implementations}"


SUPERVISOR_COMMANDS = {"dynnet_ros.commands.up", "dynnet_ros.commands.basic_arguments",
                       "dynnet_ros.commands.parsers", "dynnet_ros.commands.parsers.up"}


def test_the_supervisor_loads_no_engine_mapper_or_other_command():
    """`dynnet up` watches its children for as long as the graph runs: it checks and measures in a
    child (``preflight``) and holds rclpy, not the engine, the mapper or the other commands."""
    modules = _help_modules("up", "--help")
    engine = [m for m in modules if m.startswith(("dynnet_ros.engine.", "dynnet_ros.mapper", "dynnet_ros.swap",
                                                  "dynnet_ros.perception", "dynnet_ros.zoo"))
              and m not in ("dynnet_ros.procmem",)]
    assert engine == [], engine
    commands_loaded = {m for m in modules if m.startswith("dynnet_ros.commands.")}
    assert commands_loaded <= SUPERVISOR_COMMANDS, sorted(commands_loaded - SUPERVISOR_COMMANDS)
    heavy = _third_party(modules) & {"onnx", "onnxruntime", "foxglove", "rosbags", "pymoo", "xgboost", "rich",
                                     "matplotlib", "scipy"}
    assert heavy == set(), sorted(heavy)
