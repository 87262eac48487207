"""RSS growth of each model node vs its memory budget, under `dynnet up` with fixed budgets.

Starts the vehicle graph (budget manager with ``allocate: false``, so the budgets stay as
configured), reads each model node's budget baseline from its profile on
dynnet/model_profiles (RSS before the model loaded = rss_mb - held_mb), samples the node's
VmRSS from /proc at 20 Hz for ``--seconds`` after ``--warmup`` seconds, and prints per node:
budget, max / mean RSS growth since before the model loaded, and the ratio to the budget, with
the breakdown the node reports in /diagnostics: its RSS before the model loaded, the growth
right after loading, the frame buffers it charges to its budget, the engine's share of the
budget and the engine's predicted peak.
``--disabled`` runs the same graph with ``enabled: false`` (models loaded, no frames processed).
``--manager-total MB`` lets the budget manager split MB among the nodes instead (``allocate:
true``, ``total_budget_mb``), and each sample is compared with the budget in force when it was
taken (the node's latest profile); ``--resolution`` may list several sizes, cycled every
``--period`` seconds as the simulator does.

Usage: python bench/node_memory_bench.py [--budgets lane=45,pedestrian=42,depth=90]
       [--resolution 640x480[,1280x720,...]] [--period 5] [--seconds 30] [--warmup 25] [--disabled]
       [--manager-total MB]
Runs with its own ROS_DOMAIN_ID and ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from dynnet_ros.bytesize import MB
from dynnet_ros.procmem import status_bytes

REPO = Path(__file__).resolve().parents[1]
MODELS = ("lane", "pedestrian", "depth")


def vm_rss_mb(pid: int) -> float | None:
    try:
        return status_bytes("VmRSS", pid) / MB
    except (OSError, KeyError):  # the node exited, or is a zombie without memory lines
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="lane=45,pedestrian=42,depth=90")
    parser.add_argument("--resolution", default="640x480")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=25.0)
    parser.add_argument("--disabled", action="store_true")
    parser.add_argument("--manager-total", type=float, default=0.0)
    parser.add_argument("--period", type=float, default=5.0)
    args = parser.parse_args()
    managed = args.manager_total > 0
    budgets = {k: float(v) for k, v in (item.split("=") for item in args.budgets.split(","))}
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    os.environ.setdefault("ROS_DOMAIN_ID", str(100 + os.getpid() % 100))
    from dynnet_ros.graph_config import default_config_path, separate_processes
    from dynnet_ros.supervisor.runner import stop_process_group

    # each node in a process of its own: the bench measures each model node's process
    data = separate_processes(yaml.safe_load(default_config_path().read_text()))
    for node in data["nodes"]:
        p = node.setdefault("parameters", {})
        if node["name"] == "sensor_sim":
            p.update(resolutions=args.resolution.split(","), rate_hz=5.0, resolution_period_s=args.period)
        elif node["name"] == "budget_manager":
            p.update(allocate=managed)
            if managed:
                p.update(total_budget_mb=args.manager_total, reserve_mb=0.0)
        elif node["name"].removesuffix("_node") in MODELS:
            p.update(memory_budget_mb=0.0 if managed else budgets[node["name"].removesuffix("_node")],
                     enabled=not args.disabled)
    ns = f"/nodemem_{os.getpid()}"
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "graph.yaml"
        cfg.write_text(yaml.safe_dump(data, sort_keys=False))
        with open(Path(tmp) / "graph.log", "w") as log:  # the child holds its own descriptor
            proc = subprocess.Popen([sys.executable, "-m", "dynnet_ros.cli", "up", "--config", str(cfg),
                                     "--namespace", ns],
                                    cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from std_msgs.msg import String

        rclpy.init()
        node = rclpy.create_node("node_memory_bench")
        profiles: dict[str, dict] = {}
        pids: dict[str, int] = {}
        diag_values: dict[str, dict] = {}
        node.create_subscription(String, f"{ns}/dynnet/model_profiles",
                                 lambda m: profiles.__setitem__(json.loads(m.data)["node"], json.loads(m.data)), 20)

        def on_diag(msg):
            for st in msg.status:
                if st.hardware_id.startswith(ns + "/"):
                    values = {kv.key: kv.value for kv in st.values}
                    if "pid" in values and "task" in values:
                        pids[values["task"]] = int(values["pid"])
                        diag_values[values["task"]] = values
        node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 50)
        try:
            end = time.monotonic() + args.warmup
            while time.monotonic() < end:
                rclpy.spin_once(node, timeout_sec=0.1)
            samples: dict[str, list[float]] = {m: [] for m in MODELS}
            stamps: dict[str, list[float]] = {m: [] for m in MODELS}
            in_force: dict[str, list[float]] = {m: [] for m in MODELS}  # budget when sampled
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                rclpy.spin_once(node, timeout_sec=0.05)
                for m in MODELS:
                    prof = profiles.get(f"{ns}/{m}_node")
                    if m in pids and prof and prof.get("held_mb") is not None:
                        rss = vm_rss_mb(pids[m])
                        budget = prof.get("budget_mb") if managed else budgets[m]
                        if rss is not None and budget:
                            samples[m].append(rss - (prof["rss_mb"] - prof["held_mb"]))
                            stamps[m].append(time.monotonic())
                            in_force[m].append(float(budget))
            for m in MODELS:
                prof = profiles.get(f"{ns}/{m}_node", {})
                s = samples[m]
                out = {"node": m, "enabled": not args.disabled,
                       "budget_mb": (sorted(set(in_force[m])) if managed else budgets[m]),
                       "min_mb": prof.get("min_mb"), "samples": len(s)}
                if s:
                    ratios = [v / b for v, b in zip(s, in_force[m])]
                    out.update(growth_max_mb=round(max(s), 1), growth_mean_mb=round(sum(s) / len(s), 1),
                               growth_min_mb=round(min(s), 1), max_over_budget=round(max(ratios), 3),
                               over_1_05=round(sum(r > 1.05 for r in ratios) / len(ratios), 3),
                               anon_held_mb=prof.get("anon_held_mb"))
                if prof.get("rss_mb") is not None and prof.get("held_mb") is not None:
                    out["rss_before_model_mb"] = round(prof["rss_mb"] - prof["held_mb"], 1)
                values = diag_values.get(m, {})
                for key, name in (("held_after_load_mb", "after_load_mb"), ("frame_buffers_mb", "frame_buffers_mb"),
                                  ("engine.model_budget_mb", "engine_budget_mb"),
                                  ("engine.predicted_peak_mb", "engine_predicted_peak_mb"),
                                  ("engine.blocks", "blocks"), ("frames_processed", "frames_processed")):
                    try:
                        out[name] = round(float(values[key]), 1)
                    except (KeyError, TypeError, ValueError):
                        out[name] = None
                if s and os.environ.get("NODEMEM_TRACE"):
                    t0 = stamps[m][0]
                    out["spikes"] = [(round(t - t0, 2), round(v, 1), b) for t, v, b in zip(stamps[m], s, in_force[m])
                                     if v > 1.05 * b][:40]
                print(json.dumps(out), flush=True)
        finally:
            node.destroy_node()
            rclpy.shutdown()
            stop_process_group(proc)
            errors = [line for line in (Path(tmp) / "graph.log").read_text().splitlines()
                      if "ERROR" in line or "WARN" in line]
            print(json.dumps({"log_warnings_errors": len(errors), "first": errors[:5]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
