"""Package metadata: package.xml vs. what the code imports, setup.cfg, the launch file, colcon."""
from __future__ import annotations

import ast
import configparser
import importlib.metadata
import importlib.util
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest
from catkin_pkg.package import parse_package

from dynnet_ros.graph_config import EXECUTABLES, default_config_path, load_graph

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_FILE = ROOT / "launch" / "vehicle.launch.py"

# import name -> rosdep key package.xml must list
ROSDEP_KEYS = {
    "rclpy": "rclpy", "std_msgs": "std_msgs", "sensor_msgs": "sensor_msgs", "geometry_msgs": "geometry_msgs",
    "diagnostic_msgs": "diagnostic_msgs", "visualization_msgs": "visualization_msgs",
    "rcl_interfaces": "rcl_interfaces", "builtin_interfaces": "builtin_interfaces",
    "ament_index_python": "ament_index_python", "launch": "launch", "launch_ros": "launch_ros",
    "vision_msgs": "vision_msgs", "numpy": "python3-numpy", "yaml": "python3-yaml", "psutil": "python3-psutil",
    "onnx": "python3-onnx-pip", "onnxruntime": "python3-onnxruntime-pip", "rich": "python3-rich-pip",
    "matplotlib": "python3-matplotlib",
}
# install_requires distribution -> import name
DISTRIBUTIONS = {"numpy": "numpy", "onnx": "onnx", "onnxruntime": "onnxruntime", "PyYAML": "yaml",
                 "psutil": "psutil", "rich": "rich", "matplotlib": "matplotlib"}
# ament_python's convention: install_requires=['setuptools'] for the entry-point shims; the
# ament_python build type itself brings setuptools, so package.xml does not list it.
BUILD_ONLY = {"setuptools"}
# GPU-only packages, imported lazily after an availability check (engine/backends/registry.py,
# swap/): optional on a robot, like vision_msgs, so not exec_depends.
OPTIONAL_IMPORTS = {"tensorrt", "pycuda", "cuda"}


@pytest.fixture(scope="module")
def package():
    return parse_package(str(ROOT / "package.xml"))


def _exec_keys(package) -> set[str]:
    return {d.name for d in package.exec_depends} | {d.name for d in package.run_depends}


def _guarded(node: ast.AST, parents: dict) -> bool:
    """True when an import sits in `try: ... except ImportError` (an optional dependency)."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                names = []
                if isinstance(handler.type, ast.Name):
                    names = [handler.type.id]
                elif isinstance(handler.type, ast.Tuple):
                    names = [e.id for e in handler.type.elts if isinstance(e, ast.Name)]
                if {"ImportError", "ModuleNotFoundError"} & set(names):
                    return True
    return False


def third_party_imports() -> dict[str, set[str]]:
    """Top-level modules imported (unguarded) by the package and the launch file -> files."""
    found: dict[str, set[str]] = {}
    files = sorted((ROOT / "dynnet_ros").rglob("*.py")) + [LAUNCH_FILE]
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            if _guarded(node, parents):
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in OPTIONAL_IMPORTS or top in ("dynnet_ros", "__future__"):
                    continue
                found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_package_xml_is_format_3_ament_python_with_the_ros_dependencies(package):
    assert package.package_format == 3
    assert package.name == "dynnet_ros"
    assert package.get_build_type() == "ament_python"
    required = {"rclpy", "sensor_msgs", "std_msgs", "geometry_msgs", "diagnostic_msgs", "visualization_msgs",
                "launch", "launch_ros"}
    assert required <= _exec_keys(package), sorted(required - _exec_keys(package))


def test_package_xml_lists_every_import_and_install_requires(package):
    keys = _exec_keys(package)
    imports = third_party_imports()
    unknown = {m: sorted(f) for m, f in imports.items() if m not in ROSDEP_KEYS}
    assert not unknown, f"imports with no rosdep key mapped (add to package.xml and ROSDEP_KEYS): {unknown}"
    missing = {m: ROSDEP_KEYS[m] for m in imports if ROSDEP_KEYS[m] not in keys}
    assert not missing, f"package.xml lacks exec_depends for imports: {missing}"
    requires = importlib.metadata.requires("dynnet_ros") or []
    for requirement in requires:
        dist = requirement.split(";")[0].split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip()
        if dist in BUILD_ONLY:
            continue
        assert dist in DISTRIBUTIONS, f"install_requires has {dist!r}: map it to its import name here"
        assert ROSDEP_KEYS[DISTRIBUTIONS[dist]] in keys, f"package.xml lacks the rosdep key for {dist}"


def test_setup_cfg_puts_scripts_under_lib_package():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["develop"]["script_dir"] == "$base/lib/dynnet_ros"
    assert cfg["install"]["install_scripts"] == "$base/lib/dynnet_ros"
    assert (ROOT / "resource" / "dynnet_ros").is_file()


def test_every_graph_executable_is_a_console_script():
    scripts = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")
               if ep.value.startswith("dynnet_ros")}
    for executable, module in EXECUTABLES.items():
        assert scripts.get(executable) == f"{module}:main"
        assert callable(importlib.import_module(module).main)


def test_launch_file_compiles(tmp_path):
    py_compile.compile(str(LAUNCH_FILE), cfile=str(tmp_path / "launch.pyc"), doraise=True)


def _launch_missing() -> str | None:
    for name in ("launch_ros", "launch.actions"):
        try:
            if importlib.util.find_spec(name) is None:
                raise ImportError(name)
        except ImportError:
            return (f"'{name}' is not importable here (launch/launch_ros have no PyPI wheels; a system ROS 2 "
                    f"install provides them) — only the py_compile check ran")
    return None


@pytest.mark.skipif(_launch_missing() is not None, reason=str(_launch_missing()))
def test_launch_description_builds_from_the_config():
    from launch import LaunchContext, LaunchDescription
    from launch.actions import DeclareLaunchArgument, OpaqueFunction

    spec = importlib.util.spec_from_file_location("vehicle_launch", LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    description = module.generate_launch_description()
    assert isinstance(description, LaunchDescription)
    graph = load_graph(default_config_path())
    for use_sim, expected in (("true", graph.selected(True)), ("false", graph.selected(False))):
        context = LaunchContext()
        context.launch_configurations["use_sim"] = use_sim
        context.launch_configurations["config"] = str(default_config_path())
        nodes = []
        for entity in description.entities:
            if isinstance(entity, OpaqueFunction):
                nodes += entity.execute(context) or []
            elif isinstance(entity, DeclareLaunchArgument):
                assert entity.name in ("use_sim", "config", "namespace")
                entity.execute(context)  # fills in defaults for arguments not set above
        assert len(nodes) == len(expected)


def test_colcon_build_installs_a_working_package(tmp_path):
    colcon = Path(sys.executable).with_name("colcon")
    assert colcon.exists(), "colcon is a dev dependency (requirements-dev.txt); run `make venv`"
    build, install = tmp_path / "build", tmp_path / "install"
    result = subprocess.run([str(colcon), "--log-base", str(tmp_path / "log"), "build", "--base-paths", str(ROOT),
                             "--build-base", str(build), "--install-base", str(install)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    prefix = install / "dynnet_ros"
    for exe in EXECUTABLES:
        script = prefix / "lib" / "dynnet_ros" / exe
        assert script.is_file() and os.access(script, os.X_OK), f"{script} missing"
        assert f"'console_scripts', '{exe}'" in script.read_text()
    share = prefix / "share" / "dynnet_ros"
    assert (share / "launch" / "vehicle.launch.py").is_file()
    assert (share / "config" / "vehicle.yaml").is_file()
    check = ("from ament_index_python.packages import get_package_share_directory as g; import dynnet_ros, "
             "importlib; print(g('dynnet_ros')); print(dynnet_ros.__file__); "
             "print(callable(importlib.import_module('dynnet_ros.nodes.sensor_sim').main))")
    env = {k: v for k, v in os.environ.items() if k not in ("AMENT_PREFIX_PATH", "PYTHONPATH")}
    out = subprocess.run(["bash", "-c", f"source {install}/local_setup.bash && {sys.executable} -c \"{check}\""],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    share_dir, module_file, main_ok = out.stdout.strip().splitlines()[-3:]
    assert Path(share_dir) == share
    assert Path(module_file).is_relative_to(install), "the installed copy, not the source tree, must be imported"
    assert main_ok == "True"
