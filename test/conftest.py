"""Shared test setup: loopback-only ROS and a ROS_DOMAIN_ID of this run's own; the colcon-built
package (``install``) for the tests that launch it."""
from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

# Before anything imports rclpy: never let Fast DDS discover beyond this machine.
os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
if "DYNNET_TEST_DOMAIN_ID" not in os.environ:
    # Valid ids 0..101 (with LOCALHOST participants); pick one per pytest run.
    os.environ["DYNNET_TEST_DOMAIN_ID"] = str(random.Random(os.getpid()).randint(10, 100))
os.environ["ROS_DOMAIN_ID"] = os.environ["DYNNET_TEST_DOMAIN_ID"]
# The planner's untimed profile: the default "auto" profile times each model's cut set against a
# plain session once per machine, and a verdict taken on a loaded machine may differ from one
# taken idle, so tests that check plans, arenas and budgets would depend on the load. The timed
# choice has tests of its own (test_cut_timing.py), which set the profile themselves.
os.environ.setdefault("DYNNET_PLAN_PROFILE", "memory")
# RDP's strict mode: a transfer function that fails on its own raises instead of leaving nac, so a
# bug in one fails the test that reaches it (serving processes keep the lenient nac and a warning).
os.environ.setdefault("DYNNET_RDP_STRICT", "1")
# The zoo models of this checkout: checkouts whose zoo builders differ (branches, worktrees) would
# otherwise rebuild one another's models in the shared ~/.cache directory while their tests read them.
os.environ.setdefault("DYNNET_ZOO_DIR", str(Path(__file__).resolve().parents[1] / ".dynnet-cache" / "zoo"))


def pytest_configure(config):
    # `make test-subset` / .ci/run select these on every supported Python (README, Supported platforms)
    config.addinivalue_line("markers", "subset: the platform subset run on every supported interpreter")
    # `make check` (the fast loop) leaves these out; `make test` runs everything
    config.addinivalue_line("markers", "graph: starts processes, a ROS graph or a launch service")
    config.addinivalue_line("markers", "slow: tens of CPU-seconds on its own (whole operator suites, banded stems)")
    # `make test` runs these one at a time, after the parallel part: a neighbour on the same core would skew them
    config.addinivalue_line("markers", "serial: compares timings measured in the test")


def pytest_sessionfinish(session, exitstatus):
    # Tests kill nodes on purpose; an image publisher killed leaves its 8 MiB shared-memory segment
    # in /dev/shm, where it would lower MemAvailable for the budget tests of later runs.
    from dynnet_ros.supervisor.shm_orphans import remove_orphans  # after the environment above is set

    remove_orphans()


ROOT = Path(__file__).resolve().parents[1]
LAUNCH_KIT = ROOT.parent / "shared" / "vendor" / "ros2-launch"


@pytest.fixture(scope="module")
def install(tmp_path_factory) -> dict[str, str]:
    """colcon-built package; returns the environment `source install/local_setup.bash` gives."""
    from dynnet_ros.zoo import ensure_model  # after the environment above is set

    assert importlib.util.find_spec("launch_ros") is not None, (
        f"{LAUNCH_KIT} is present but launch_ros is not installed here: run `make test` (it runs the kit's "
        f"install.sh) or {LAUNCH_KIT}/install.sh {Path(sys.executable).parents[1]}")
    for task in ("lane", "pedestrian", "depth"):
        ensure_model(task)
    tmp = tmp_path_factory.mktemp("colcon")
    colcon = Path(sys.executable).with_name("colcon")
    result = subprocess.run([str(colcon), "--log-base", str(tmp / "log"), "build", "--base-paths", str(ROOT),
                             "--build-base", str(tmp / "build"), "--install-base", str(tmp / "install")],
                            cwd=tmp, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    base = {k: v for k, v in os.environ.items() if k not in ("AMENT_PREFIX_PATH", "PYTHONPATH")}
    out = subprocess.run(["bash", "-c", f"source {tmp}/install/local_setup.bash && env -0"],
                         capture_output=True, env=base, cwd=tmp, timeout=60, check=True).stdout
    env = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    env["PYTHONUNBUFFERED"] = "1"
    env["INSTALL_PREFIX"] = str(tmp / "install" / "dynnet_ros")
    return env
