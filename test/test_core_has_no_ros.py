"""The core (engine, swap, budget, zoo) must stay usable outside ROS: no rclpy or message imports."""
from __future__ import annotations

import pkgutil
import subprocess
import sys

import dynnet_ros

CORE_PACKAGES = ("dynnet_ros.engine", "dynnet_ros.swap", "dynnet_ros.budget", "dynnet_ros.zoo")


def _core_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(dynnet_ros.__path__, prefix="dynnet_ros."):
        if info.name.startswith(CORE_PACKAGES):
            names.append(info.name)
    return names


def test_core_modules_import_without_pulling_in_ros():
    modules = _core_modules()
    assert len(modules) > 20  # the walk really found the core
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "ros = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('rclpy', 'std_msgs', 'sensor_msgs', 'diagnostic_msgs', 'visualization_msgs', 'rcl_interfaces'))\n"
        "print(','.join(ros))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"core modules imported ROS packages: {result.stdout.strip()}"
