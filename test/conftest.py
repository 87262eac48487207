"""Shared test setup: loopback-only ROS and a ROS_DOMAIN_ID of this run's own."""
from __future__ import annotations

import os
import random

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


def pytest_configure(config):
    # `make test-subset` / .ci/run select these on every supported Python (README, Supported platforms)
    config.addinivalue_line("markers", "subset: the platform subset run on every supported interpreter")
