"""The running graph's own memory: RSS and PSS per process, every model output's rate, a node's imports.

Starts the graph (`dynnet up`, config/vehicle.yaml by default) in a namespace of its own, lets it
run ``--seconds`` once every model node is on the graph, counts every message each model node
publishes for ``--window`` seconds (its publishers found on the ROS graph, subscribed with
sensor-data QoS), then reads RSS and PSS of
the supervisor and every process below it from /proc/PID/smaps_rollup. PSS divides each shared
page among the processes that map it, so the PSS column adds up to what the graph costs the
machine; RSS counts shared libraries once per process. ``--layout processes`` runs every node in
a process of its own (``container: false``); ``--layout config`` (default) starts what the
config says (its component containers included). Also measured, in fresh interpreters (the
median of three): the import time and peak RSS of a model node's module, of what any model node
needs at least (rclpy, numpy, onnxruntime) and of the CLI's module (what `dynnet --help` loads).

``--alternate N`` runs both layouts N times each instead, alternating and swapping which goes
first each round, and reports each output's median rate per layout and their ratio: on a
machine shared with other jobs one run of each says more about the others' load than about the
layout.

Usage: python bench/graph_memory.py [--config FILE] [--layout config|processes] [--seconds 60]
       [--window 20] [--alternate N] [--json]
Runs with its own ROS_DOMAIN_ID unless one is set, and ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import rclpy
import yaml
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data

from dynnet_ros.graph_config import default_config_path
from dynnet_ros.nodes.message_types import message_class
from dynnet_ros.supervisor.runner import stop_process_group

REPO = Path(__file__).resolve().parents[1]
MODEL_NODES = ("lane_node", "pedestrian_node", "depth_node")
#: topics every node has, or that carry the graph's bookkeeping rather than a model's output
NOT_OUTPUTS = ("/rosout", "/parameter_events", "/diagnostics", "/dynnet/")
#: how long a run waits for every model node to join the graph before its clock starts
UP_TIMEOUT_S = 600.0
IMPORT_PROBE = ("import resource, time; t = time.perf_counter(); import {module}; "
                "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")


@dataclass(frozen=True)
class ProcessMemory:
    name: str
    pid: int
    rss_mb: float
    pss_mb: float


def smaps_rollup_mb(pid: int) -> tuple[float, float]:
    """(RSS, PSS) of ``pid`` in MiB from /proc/PID/smaps_rollup."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            fields[key] = int(rest.split()[0]) / 1024
    return fields["Rss"], fields["Pss"]


def process_name(proc: psutil.Process, supervisor: int) -> str:
    """The ROS node name a process was started as (``__node:=``), else its module."""
    if proc.pid == supervisor:
        return "dynnet up (supervisor)"
    argv = proc.cmdline()
    for arg in argv:
        if arg.startswith("__node:="):
            return arg.split(":=", 1)[1]
    module = next((argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "-m"), None)
    return module or " ".join(argv[:3])


def graph_memory(supervisor: int) -> list[ProcessMemory]:
    root = psutil.Process(supervisor)
    rows = []
    for proc in [root, *root.children(recursive=True)]:
        try:
            rss, pss = smaps_rollup_mb(proc.pid)
            rows.append(ProcessMemory(process_name(proc, supervisor), proc.pid, round(rss, 1), round(pss, 1)))
        except (OSError, psutil.Error, KeyError):  # a short-lived helper process that has gone
            continue
    return rows


class RateCounter:
    """Counts every message on the model nodes' output topics (found on the graph)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.node = Node("graph_memory_probe", namespace=namespace)
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        self.executor = SingleThreadedExecutor()
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def nodes_up(self) -> list[str]:
        """The model nodes on the graph in this namespace."""
        found = self.node.get_node_names_and_namespaces()
        return [name for name in MODEL_NODES if (name, self.namespace) in found]

    def outputs(self) -> dict[str, str]:
        """topic -> type of what the model nodes publish, less the bookkeeping topics."""
        found = {}
        for name in MODEL_NODES:
            try:
                published = self.node.get_publisher_names_and_types_by_node(name, self.namespace)
            except Exception:  # noqa: BLE001 — a node not (yet) on the graph has no publishers to count
                continue
            for topic, types in published:
                if not any(topic == skip or topic.startswith(skip) or topic.startswith(f"{self.namespace}{skip}")
                           for skip in NOT_OUTPUTS):
                    found[topic] = types[0]
        return found

    def count(self, outputs: dict[str, str]) -> None:
        for topic, type_name in outputs.items():
            message = message_class(type_name)
            if message is None:  # a type this interpreter cannot import is not counted
                continue
            self.counts[topic] = 0
            self.node.create_subscription(message, topic, self._counter(topic), qos_profile_sensor_data)

    def _counter(self, topic: str):
        def on_message(_msg) -> None:
            with self.lock:
                self.counts[topic] += 1
        return on_message

    def rates(self, seconds: float) -> dict[str, float]:
        with self.lock:
            start = dict(self.counts)
        time.sleep(seconds)
        with self.lock:
            return {topic: round((self.counts[topic] - start[topic]) / seconds, 2) for topic in sorted(start)}

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()


def import_cost(module: str, repeats: int = 3) -> tuple[float, float]:
    """(seconds, peak RSS MiB) to import ``module`` in a fresh interpreter: the median of ``repeats``."""
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", IMPORT_PROBE.format(module=module)], capture_output=True,
                             text=True, check=True, cwd=REPO).stdout.split()
        runs.append((float(out[0]), float(out[1])))
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def config_for(layout: str, config: Path, directory: Path) -> Path:
    """``config`` as is, or with every node in a process of its own (``--layout processes``)."""
    if layout == "config":
        return config
    data = yaml.safe_load(config.read_text())
    for node in data["nodes"]:
        node["container"] = False
    data.pop("containers", None)
    path = directory / "processes.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_graph(config: Path, layout: str, seconds: float, window: float) -> tuple[list[ProcessMemory], dict[str, float]]:
    """Start ``config`` in ``layout`` under `dynnet up` in a namespace of its own, let it run
    ``seconds``, count its outputs for ``window`` seconds, read its memory, stop it.
    (memory per process, Hz per output topic without the namespace); SystemExit if it died."""
    namespace = f"/graph_memory_{os.getpid()}_{time.monotonic_ns()}"
    with tempfile.TemporaryDirectory(prefix="graph-memory-") as tmp:
        layout_config = config_for(layout, config, Path(tmp))
        log = (Path(tmp) / "up.log").open("w")
        up = subprocess.Popen([sys.executable, "-m", "dynnet_ros.cli", "up", "--config", str(layout_config),
                               "--namespace", namespace], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, start_new_session=True)
        counter = RateCounter(namespace)
        try:
            # the clock starts once every model node is on the graph: on a cold cache `dynnet up`
            # first sizes each model in a child process, for minutes on a loaded machine
            deadline = time.monotonic() + UP_TIMEOUT_S
            while len(counter.nodes_up()) < len(MODEL_NODES) and up.poll() is None and time.monotonic() < deadline:
                time.sleep(1.0)
            time.sleep(seconds)
            if up.poll() is not None or len(counter.nodes_up()) < len(MODEL_NODES):
                print(f"the model nodes are not all up (on the graph: {counter.nodes_up()}); dynnet up says:\n"
                      + (Path(tmp) / "up.log").read_text()[-4000:], file=sys.stderr)
                raise SystemExit(1)
            counter.count(counter.outputs())
            rates = counter.rates(window)
            memory = graph_memory(up.pid)
        finally:
            counter.close()
            stop_process_group(up, timeout=60.0)
    return memory, {topic.removeprefix(namespace): hz for topic, hz in rates.items()}


def alternate(config: Path, rounds: int, seconds: float, window: float) -> dict:
    """Both layouts ``rounds`` times each, alternating and swapping which goes first every round
    (config, processes, processes, config, ...), so that a load that drifts over the runs falls
    on both alike: each output's median rate per layout and their ratio, and the median total PSS."""
    runs: dict[str, list[tuple[list[ProcessMemory], dict[str, float]]]] = {"config": [], "processes": []}
    for round_ in range(rounds):
        for layout in (("config", "processes") if round_ % 2 == 0 else ("processes", "config")):
            memory, rates = run_graph(config, layout, seconds, window)
            runs[layout].append((memory, rates))
            print(f"[round {round_ + 1}/{rounds}] {layout}: total PSS {sum(r.pss_mb for r in memory):.0f} MiB, "
                  + ", ".join(f"{t} {hz:.2f} Hz" for t, hz in rates.items())
                  + f" (load average {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    topics = sorted({topic for layout_runs in runs.values() for _, rates in layout_runs for topic in rates})
    medians = {layout: {topic: statistics.median(rates.get(topic, 0.0) for _, rates in layout_runs)
                        for topic in topics} for layout, layout_runs in runs.items()}
    return {
        "rounds": rounds, "seconds": seconds, "window_s": window,
        "rates_hz": {layout: {topic: [rates.get(topic, 0.0) for _, rates in layout_runs] for topic in topics}
                     for layout, layout_runs in runs.items()},
        "median_rates_hz": medians,
        "ratio_container_to_processes": {topic: (round(medians["config"][topic] / medians["processes"][topic], 3)
                                                 if medians["processes"][topic] else None) for topic in topics},
        "median_total_pss_mb": {layout: round(statistics.median(sum(r.pss_mb for r in memory)
                                                                for memory, _ in layout_runs), 1)
                                for layout, layout_runs in runs.items()},
    }


def print_alternate(result: dict) -> None:
    print(f"both layouts {result['rounds']} times each, alternating; rates over {result['window_s']:.0f} s "
          f"after {result['seconds']:.0f} s\n")
    print("| output | container Hz (median) | processes Hz (median) | container / processes | "
          "container runs | processes runs |\n|---|---|---|---|---|---|")
    medians, ratios, runs = result["median_rates_hz"], result["ratio_container_to_processes"], result["rates_hz"]
    for topic in medians["config"]:
        ratio = "—" if ratios[topic] is None else f"{ratios[topic]:.2f}"
        print(f"| {topic} | {medians['config'][topic]:.2f} | {medians['processes'][topic]:.2f} | {ratio} | "
              f"{' / '.join(f'{hz:.2f}' for hz in runs['config'][topic])} | "
              f"{' / '.join(f'{hz:.2f}' for hz in runs['processes'][topic])} |")
    pss = result["median_total_pss_mb"]
    print(f"\nmedian total PSS: container {pss['config']:.0f} MiB, processes {pss['processes']:.0f} MiB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=default_config_path())
    parser.add_argument("--layout", choices=("config", "processes"), default="config")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="run time before measuring, from when every model node is on the graph")
    parser.add_argument("--window", type=float, default=20.0, help="seconds over which output rates are counted")
    parser.add_argument("--alternate", type=int, default=0, metavar="N",
                        help="run both layouts N times each, alternating, and report each output's median "
                             "rate per layout and their ratio (instead of one run of --layout)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    if args.alternate < 0:
        parser.error(f"--alternate must be >= 0, got {args.alternate}")
    os.environ.setdefault("ROS_DOMAIN_ID", str(50 + os.getpid() % 40))
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")

    if args.alternate:
        rclpy.init()
        try:
            result = alternate(args.config, args.alternate, args.seconds, args.window)
        finally:
            rclpy.shutdown()
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print_alternate(result)
        return 0

    floor_import = import_cost("rclpy, numpy, onnxruntime")
    node_import = import_cost("dynnet_ros.nodes.lane_node")
    help_import = import_cost("dynnet_ros.cli")
    rclpy.init()
    try:
        memory, rates = run_graph(args.config, args.layout, args.seconds, args.window)
    finally:
        rclpy.shutdown()
    result = {
        "layout": args.layout, "seconds": args.seconds, "window_s": args.window,
        "processes": [asdict(row) for row in memory],
        "total_rss_mb": round(sum(row.rss_mb for row in memory), 1),
        "total_pss_mb": round(sum(row.pss_mb for row in memory), 1),
        "rates_hz": rates,
        "floor_import": {"module": "rclpy, numpy, onnxruntime", "seconds": round(floor_import[0], 2),
                         "peak_rss_mb": round(floor_import[1], 1)},
        "node_import": {"module": "dynnet_ros.nodes.lane_node", "seconds": round(node_import[0], 2),
                        "peak_rss_mb": round(node_import[1], 1)},
        "cli_import": {"module": "dynnet_ros.cli", "seconds": round(help_import[0], 2),
                       "peak_rss_mb": round(help_import[1], 1)},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"layout: {args.layout}, measured after {args.seconds:.0f} s\n")
    print("| process | RSS MiB | PSS MiB |\n|---|---|---|")
    for row in memory:
        print(f"| {row.name} | {row.rss_mb:.0f} | {row.pss_mb:.0f} |")
    print(f"| **total** | **{result['total_rss_mb']:.0f}** | **{result['total_pss_mb']:.0f}** |\n")
    print(f"| output | Hz (over {args.window:.0f} s) |\n|---|---|")
    for topic, hz in rates.items():
        print(f"| {topic} | {hz:.1f} |")
    print(f"\nimport rclpy, numpy, onnxruntime: {floor_import[0]:.2f} s, peak RSS {floor_import[1]:.0f} MiB")
    print(f"import dynnet_ros.nodes.lane_node: {node_import[0]:.2f} s, peak RSS {node_import[1]:.0f} MiB")
    print(f"import dynnet_ros.cli: {help_import[0]:.2f} s, peak RSS {help_import[1]:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
