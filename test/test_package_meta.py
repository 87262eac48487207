"""Package metadata: package.xml vs. the imports, setup.py and requirements.txt; setup.cfg, launch, colcon."""
from __future__ import annotations

import ast
import configparser
import importlib.metadata
import importlib.util
import os
import py_compile
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from catkin_pkg.package import parse_package

from dynnet_ros.graph_config import EXECUTABLES, ON_REQUEST, default_config_path, graph_processes, load_graph

pytestmark = pytest.mark.graph

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_FILE = ROOT / "launch" / "vehicle.launch.py"

# ROS packages the code imports: the import name is the rosdep key. The venv gets them from
# PyPI's ros-* wheels pinned in requirements.txt, except those with no wheel (NO_WHEEL).
ROS_PACKAGES = {"rclpy", "std_msgs", "sensor_msgs", "geometry_msgs", "diagnostic_msgs", "visualization_msgs",
                "rcl_interfaces", "rosgraph_msgs", "ament_index_python", "launch", "launch_ros", "vision_msgs",
                "composition_interfaces"}
# PyPI has no wheel for these: rosdep installs them on a robot; without them the venv degrades (README).
NO_WHEEL = {"launch", "launch_ros", "vision_msgs", "composition_interfaces"}
# requirements.txt pins with no import of their own: the venv's middleware, which a ROS install
# provides as its default, and std_msgs' message dependency pinned beside it.
VENV_ONLY_PINS = {"ros-rmw-fastrtps-cpp", "ros-builtin-interfaces"}


@dataclass(frozen=True)
class PythonDependency:
    """A non-ROS import: its rosdep key (package.xml) and PyPI distribution (setup.py, requirements.txt)."""

    key: str
    distribution: str


PYTHON_DEPENDENCIES = {
    "numpy": PythonDependency("python3-numpy", "numpy"),
    "yaml": PythonDependency("python3-yaml", "PyYAML"),
    "psutil": PythonDependency("python3-psutil", "psutil"),
    "onnx": PythonDependency("python3-onnx-pip", "onnx"),  # no key in rosdistro: rosdep/dynnet_ros.yaml
    "onnxruntime": PythonDependency("python3-onnxruntime-pip", "onnxruntime"),
    "rich": PythonDependency("python3-rich", "rich"),
    "matplotlib": PythonDependency("python3-matplotlib", "matplotlib"),
    "pymoo": PythonDependency("python3-pymoo-pip", "pymoo"),  # no key in rosdistro: rosdep/dynnet_ros.yaml
    "xgboost": PythonDependency("python3-xgboost-cpu-pip", "xgboost-cpu"),  # the same
    "rosbags": PythonDependency("python3-rosbags-pip", "rosbags"),
    "foxglove": PythonDependency("python3-foxglove-sdk-pip", "foxglove-sdk"),  # no key in rosdistro: ours
    "PIL": PythonDependency("python3-pil", "Pillow"),
    "simplejpeg": PythonDependency("python3-simplejpeg-pip", "simplejpeg"),  # rosdistro's pip rule
}
# Imported only by the tests: the rosdep key package.xml lists as a test_depend.
TEST_KEYS = {"pytest": "python3-pytest", "hypothesis": "python3-hypothesis", "catkin_pkg": "python3-catkin-pkg",
             "websockets": "python3-websockets", "sympy": "python3-sympy",
             # rosdistro's pip rule; mcap comes with it as mcap-ros2-support's dependency
             "mcap": "mcap-ros2-support", "mcap_ros2": "mcap-ros2-support"}
# ament_python's convention: install_requires=['setuptools'] for the entry-point shims; the
# ament_python build type itself brings setuptools, so package.xml does not list it.
BUILD_ONLY = {"setuptools"}
# GPU-only packages, imported lazily after an availability check (engine/backends/registry.py,
# swap/); JetPack or the CUDA install provides them, and rosdistro has no keys for them.
OPTIONAL_IMPORTS = {"tensorrt", "pycuda", "cuda"}


@pytest.fixture(scope="module")
def package():
    return parse_package(str(ROOT / "package.xml"))


def _exec_keys(package) -> set[str]:
    return {d.name for d in package.exec_depends} | {d.name for d in package.run_depends}


def _key(module: str) -> str | None:
    if module in ROS_PACKAGES:
        return module
    dependency = PYTHON_DEPENDENCIES.get(module)
    return dependency.key if dependency else None


def third_party_imports(files: list[Path], local: frozenset[str] = frozenset()) -> dict[str, set[str]]:
    """Top-level modules the files import (guarded ones too: they run where installed) -> files."""
    found: dict[str, set[str]] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in local or top in ("dynnet_ros", "__future__"):
                    continue
                found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def runtime_imports() -> dict[str, set[str]]:
    """What `ros2 launch`, the nodes and `dynnet up` import: the package and the launch files."""
    files = sorted((ROOT / "dynnet_ros").rglob("*.py")) + sorted((ROOT / "launch").glob("*.py"))
    return {m: f for m, f in third_party_imports(files).items() if m not in OPTIONAL_IMPORTS}


def setup_install_requires() -> set[str]:
    """setup.py's install_requires, read from its source (not from a possibly stale installed copy)."""
    for node in ast.walk(ast.parse((ROOT / "setup.py").read_text())):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            return {re.split(r"[=<>~!\[; ]", r)[0] for r in ast.literal_eval(node.value)}
    raise AssertionError("setup.py has no literal install_requires")


def requirement_pins() -> dict[str, str]:
    """requirements.txt: normalised distribution name -> the line; every line pins one version."""
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"requirements.txt: {line!r} is not pinned with =="
            pins[_normalise(name)] = line
    return pins


def _normalise(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def test_package_xml_is_format_3_ament_python_with_the_ros_dependencies(package):
    assert package.package_format == 3
    assert package.name == "dynnet_ros"
    assert package.get_build_type() == "ament_python"
    required = {"rclpy", "sensor_msgs", "std_msgs", "geometry_msgs", "diagnostic_msgs", "visualization_msgs",
                "launch", "launch_ros"}
    assert required <= _exec_keys(package), sorted(required - _exec_keys(package))


def test_package_xml_lists_every_runtime_import(package):
    imports = runtime_imports()
    unmapped = {m: sorted(f) for m, f in imports.items() if _key(m) is None}
    assert not unmapped, f"imports with no rosdep key (map them here and list them in package.xml): {unmapped}"
    missing = {m: _key(m) for m in imports if _key(m) not in _exec_keys(package)}
    assert not missing, f"package.xml lacks exec_depends for imports: {missing}"


def test_package_xml_lists_nothing_the_code_does_not_import(package):
    used = {_key(m) for m in runtime_imports()}
    unused = _exec_keys(package) - used
    assert not unused, f"package.xml exec_depends nothing in dynnet_ros/ or launch/ imports: {sorted(unused)}"


def test_test_depends_are_what_the_tests_import(package):
    local = frozenset(p.stem for p in (ROOT / "test").glob("*.py"))
    imports = third_party_imports(sorted((ROOT / "test").glob("*.py")), local)
    exec_keys = _exec_keys(package)
    test_only = {m: f for m, f in imports.items() if _key(m) not in exec_keys and m not in OPTIONAL_IMPORTS}
    unmapped = {m: sorted(f) for m, f in test_only.items() if m not in TEST_KEYS}
    assert not unmapped, f"test imports with no rosdep key (map them in TEST_KEYS): {unmapped}"
    assert {d.name for d in package.test_depends} == {TEST_KEYS[m] for m in test_only}


def test_setup_py_install_requires_matches_package_xml(package):
    keys = _exec_keys(package)
    listed = {d.distribution for d in PYTHON_DEPENDENCIES.values() if d.key in keys}
    requires = setup_install_requires() - BUILD_ONLY
    assert requires == listed, f"install_requires only: {sorted(requires - listed)}, package.xml only: " \
                               f"{sorted(listed - requires)}"


def test_requirements_txt_pins_what_package_xml_lists(package):
    keys = _exec_keys(package)
    pins = requirement_pins()
    python = {_normalise(d.distribution) for d in PYTHON_DEPENDENCIES.values() if d.key in keys}
    assert python <= set(pins), f"requirements.txt does not pin {sorted(python - set(pins))}"
    ros_wheels = {name for name in pins if name.startswith("ros-")}
    wanted = {_normalise(f"ros-{k}") for k in keys & ROS_PACKAGES - NO_WHEEL}
    assert wanted <= ros_wheels, f"requirements.txt does not pin {sorted(wanted - ros_wheels)}"
    stray = set(pins) - python - {_normalise(f"ros-{k}") for k in keys & ROS_PACKAGES} - VENV_ONLY_PINS
    assert not stray, f"requirements.txt pins what package.xml does not list: {sorted(stray)}"


def test_setup_cfg_puts_scripts_under_lib_package():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["develop"]["script_dir"] == "$base/lib/dynnet_ros"
    assert cfg["install"]["install_scripts"] == "$base/lib/dynnet_ros"
    assert (ROOT / "resource" / "dynnet_ros").is_file()


def test_every_graph_executable_is_a_console_script():
    scripts = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")
               if ep.value.startswith("dynnet_ros")}
    for executable, module in {**EXECUTABLES, **ON_REQUEST}.items():
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
        processes = graph_processes(graph, use_sim == "true")
        assert len(nodes) == len(processes)
        assert sum(len(p.hosted) for p in processes) == len(expected)


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
    assert (share / "config" / "vehicle.yaml").is_file() and (share / "config" / "vehicle_4cam.yaml").is_file()
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
