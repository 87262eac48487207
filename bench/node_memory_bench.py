"""RSS growth of each model node vs its memory budget, under `dynnet up` with fixed budgets.

Starts the vehicle graph (budget manager with ``allocate: false``, so the budgets stay as
configured), reads each model node's budget baseline from its profile on
dynnet/model_profiles (RSS before the model loaded = rss_mb - held_mb), samples the node's
VmRSS from /proc at 20 Hz for ``--seconds`` after ``--warmup`` seconds, and prints per node:
budget, max / mean RSS growth since before the model loaded, and the ratio to the budget.
``--disabled`` runs the same graph with ``enabled: false`` (models loaded, no frames processed).

Usage: python bench/node_memory_bench.py [--budgets lane=40,pedestrian=38,depth=80]
       [--resolution 640x480] [--seconds 30] [--warmup 25] [--disabled]
Runs with its own ROS_DOMAIN_ID and ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
MODELS = ("lane", "pedestrian", "depth")


def vm_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="lane=40,pedestrian=38,depth=80")
    parser.add_argument("--resolution", default="640x480")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=25.0)
    parser.add_argument("--disabled", action="store_true")
    args = parser.parse_args()
    budgets = {k: float(v) for k, v in (item.split("=") for item in args.budgets.split(","))}
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    os.environ.setdefault("ROS_DOMAIN_ID", str(100 + os.getpid() % 100))
    from dynnet_ros.graph_config import default_config_path

    data = yaml.safe_load(default_config_path().read_text())
    for node in data["nodes"]:
        p = node.setdefault("parameters", {})
        if node["name"] == "sensor_sim":
            p.update(resolutions=[args.resolution], rate_hz=5.0)
        elif node["name"] == "budget_manager":
            p.update(allocate=False)
        elif node["name"].removesuffix("_node") in MODELS:
            p.update(memory_budget_mb=budgets[node["name"].removesuffix("_node")], enabled=not args.disabled)
    ns = f"/nodemem_{os.getpid()}"
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "graph.yaml"
        cfg.write_text(yaml.safe_dump(data, sort_keys=False))
        log = open(Path(tmp) / "graph.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "dynnet_ros.cli", "up", "--config", str(cfg), "--namespace", ns],
                                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from std_msgs.msg import String

        rclpy.init()
        node = rclpy.create_node("node_memory_bench")
        profiles: dict[str, dict] = {}
        pids: dict[str, int] = {}
        node.create_subscription(String, f"{ns}/dynnet/model_profiles",
                                 lambda m: profiles.__setitem__(json.loads(m.data)["node"], json.loads(m.data)), 20)

        def on_diag(msg):
            for st in msg.status:
                if st.hardware_id.startswith(ns + "/"):
                    values = {kv.key: kv.value for kv in st.values}
                    if "pid" in values and "task" in values:
                        pids[values["task"]] = int(values["pid"])
        node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 50)
        try:
            end = time.monotonic() + args.warmup
            while time.monotonic() < end:
                rclpy.spin_once(node, timeout_sec=0.1)
            samples: dict[str, list[float]] = {m: [] for m in MODELS}
            stamps: dict[str, list[float]] = {m: [] for m in MODELS}
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                rclpy.spin_once(node, timeout_sec=0.05)
                for m in MODELS:
                    prof = profiles.get(f"{ns}/{m}_node")
                    if m in pids and prof and prof.get("held_mb") is not None:
                        rss = vm_rss_mb(pids[m])
                        if rss is not None:
                            samples[m].append(rss - (prof["rss_mb"] - prof["held_mb"]))
                            stamps[m].append(time.monotonic())
            for m in MODELS:
                prof = profiles.get(f"{ns}/{m}_node", {})
                s = samples[m]
                out = {"node": m, "enabled": not args.disabled, "budget_mb": budgets[m],
                       "min_mb": prof.get("min_mb"), "samples": len(s)}
                if s:
                    out.update(growth_max_mb=round(max(s), 1), growth_mean_mb=round(sum(s) / len(s), 1),
                               max_over_budget=round(max(s) / budgets[m], 3),
                               anon_held_mb=prof.get("anon_held_mb"))
                if s and os.environ.get("NODEMEM_TRACE"):
                    t0 = stamps[m][0]
                    out["spikes"] = [(round(t - t0, 2), round(v, 1)) for t, v in zip(stamps[m], s)
                                     if v > 1.1 * budgets[m]][:40]
                print(json.dumps(out), flush=True)
        finally:
            node.destroy_node()
            rclpy.shutdown()
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            log.close()
            errors = [line for line in (Path(tmp) / "graph.log").read_text().splitlines()
                      if "ERROR" in line or "WARN" in line]
            print(json.dumps({"log_warnings_errors": len(errors), "first": errors[:5]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
