"""Soak: run the vehicle graph for a long time and look for leaks and stalls.

Starts `dynnet up` (simulator included; the camera cycles 320x240 -> 640x480 -> 1280x720) in a
namespace of its own, and while it runs:

* changes the budget manager's ``total_budget_mb`` every ``--budget-period-s`` (cycling through
  ``--budgets``), so the model nodes get new budgets and re-partition;
* starts a memory hog (a child process that allocates and touches ``--hog-mb``) for
  ``--hog-on-s`` every ``--hog-period-s``, so available memory drops and comes back;
* samples every ``--sample-s``, per node process (and `dynnet up` itself): RSS, open file
  descriptors, threads; per model node from its /diagnostics: plan-cache entries, latency p50
  and its memory budget; and records the arrival time of every camera frame and every model output.

At the end it writes ``soak.json`` and ``soak.png`` into ``--out`` and prints per node the RSS
slope in MB/hour over the samples after ``--warmup-min`` (least squares; a node that was
restarted is fitted over its last process), the fd/thread range, and the stalls.

A stall is a gap without output longer than ``STALL_S`` (2 s) while input kept arriving: camera
frames reached the observer at half the camera's median rate or more during the gap, or the
node's own ``frames_received`` (its /diagnostics, ~1 Hz) rose at that rate, and the node's
``frames_processed`` did not rise (if it did, the observer missed outputs: large messages over
best-effort transport get lost when the machine is busy, not a stall). On a loaded machine every
process of the graph waits for a CPU, the simulator included, so the 2 s are scaled by how far
the camera fell behind its rate: ``--rate-hz`` / the rate the model nodes received frames at
(their ``frames_received``), when that is above 1. Gaps over the unscaled 2 s are listed apart
(``long_gaps``). The 1-minute load average per CPU is recorded beside it.

Usage: python bench/soak.py --minutes N [--out DIR] [--warmup-min W] [--sample-s S] [--rate-hz R]
       [--hog-mb MB] [--hog-period-s P] [--hog-on-s S] [--budget-period-s P] [--budgets 0,300,200]
Runs with its own ROS_DOMAIN_ID (unless set) and ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image
from std_msgs.msg import String
from visualization_msgs.msg import MarkerArray

from dynnet_ros.graph_config import EXECUTABLES, default_config_path, parse_graph, separate_processes
from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.nodes.diagnostics import status_values
from dynnet_ros.supervisor.runner import stop_process_group

REPO = Path(__file__).resolve().parents[1]
MODELS = ("lane_node", "pedestrian_node", "depth_node")
OUTPUTS = {"lane/mask": "lane_node", "pedestrian/markers": "pedestrian_node", "depth/image": "depth_node"}
STALL_S = 2.0
HOG_CODE = ("import sys, time\n"
            "b = bytearray(int(sys.argv[1]) * 1048576)\n"
            "for i in range(0, len(b), 4096): b[i] = 1\n"
            "time.sleep(float(sys.argv[2]))\n")


# --------------------------------------------------------------------------- analysis (pure)

def rss_slope_mb_per_h(times_s: list[float], rss_mb: list[float]) -> float | None:
    """Least-squares slope of RSS over time in MB/hour (None with fewer than 3 samples)."""
    if len(times_s) < 3 or max(times_s) - min(times_s) <= 0:
        return None
    slope_per_s = float(np.polyfit(np.asarray(times_s, float), np.asarray(rss_mb, float), 1)[0])
    return slope_per_s * 3600.0


def median_gap(times: list[float]) -> float | None:
    gaps = np.diff(np.asarray(sorted(times), float))
    return float(np.median(gaps)) if gaps.size else None


def _counter_delta(counters: list[tuple[float, int, int]], a: float, b: float, column: int) -> tuple[int, float]:
    """Increase of a node's diagnostics counter (1 = frames received, 2 = processed) over the
    samples inside (a, b), and the time those samples span."""
    inside = [row for row in counters if a < row[0] < b]
    if len(inside) < 2:
        return 0, 0.0
    return inside[-1][column] - inside[0][column], inside[-1][0] - inside[0][0]


def find_gaps(outputs: list[float], inputs: list[float], start: float, end: float,
              counters: Sequence[tuple[float, int, int]] = (), stall_s: float = STALL_S,
              slowdown: float = 1.0) -> tuple[list[dict], list[dict]]:
    """(stalls, long_gaps) of one output stream between ``start`` and ``end`` (module docstring).

    A gap runs between consecutive outputs the observer received, or from the last one to
    ``end``; only gaps over ``stall_s`` in which input kept coming and the node processed nothing
    are listed: stalls when they are also over ``stall_s * slowdown``, else long gaps.
    ``counters``: the node's diagnostics rows (time, frames_received, frames_processed). Each
    entry: start/end (s from ``start``), gap_s, inputs, input_expected, node_received/processed,
    node_reports (the node's diagnostics in the gap: none means the node itself was silent, some
    with nothing received means its frames were lost on the way).
    """
    outs = sorted(t for t in outputs if start <= t <= end)
    ins = np.asarray(sorted(inputs), float)
    in_gap = median_gap(list(ins[(ins >= start) & (ins <= end)])) if ins.size else None
    stalls: list[dict] = []
    long_gaps: list[dict] = []
    if not outs:
        return stalls, long_gaps
    for a, b in zip(outs, outs[1:] + [end]):
        gap = b - a
        if gap <= stall_s:
            continue
        arrived = int(((ins > a) & (ins < b)).sum()) if ins.size else 0
        expected = 0.5 * gap / in_gap if in_gap else float("inf")
        received, span = _counter_delta(list(counters), a, b, 1)
        processed, _ = _counter_delta(list(counters), a, b, 2)
        reports = sum(1 for row in counters if a < row[0] < b)
        node_fed = bool(in_gap) and span > 0 and received >= 0.5 * span / in_gap
        if processed > 0 or not (arrived >= expected or node_fed):
            continue
        entry = {"start_s": round(a - start, 2), "end_s": round(b - start, 2), "gap_s": round(gap, 2),
                 "inputs": arrived, "input_expected": round(expected, 1), "node_received": received,
                 "node_processed": processed, "node_reports": reports, "open": b == end}
        (stalls if gap > stall_s * max(1.0, slowdown) else long_gaps).append(entry)
    return stalls, long_gaps


def counter_rate(rows: Sequence[tuple[float, int, int]], start: float, end: float) -> float | None:
    """Frames per second a node received between ``start`` and ``end`` (its diagnostics rows)."""
    inside = [row for row in rows if start <= row[0] <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def range_stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"first": None, "last": None, "min": None, "max": None, "growth": None}
    third = max(1, len(values) // 3)
    return {"first": values[0], "last": values[-1], "min": min(values), "max": max(values),
            # the last third's peak over the first third's: a leak grows, a plateau does not
            "growth": max(values[-third:]) - max(values[:third])}


# --------------------------------------------------------------------------- the run

@dataclass
class Recorder:
    """Everything the observer node hears, with monotonic arrival times."""

    ns: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    inputs: list[float] = field(default_factory=list)
    outputs: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in OUTPUTS})
    e2e_ms: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: {t: [] for t in OUTPUTS})
    diag: dict[str, dict[str, Any]] = field(default_factory=dict)
    counters: dict[str, list[tuple[float, int, int]]] = field(default_factory=lambda: {n: [] for n in MODELS})
    budgets: list[tuple[float, dict[str, float | None]]] = field(default_factory=list)

    def on_input(self, _msg) -> None:
        with self.lock:
            self.inputs.append(time.monotonic())

    def on_output(self, topic: str):
        def record(msg) -> None:
            now = time.monotonic()
            header = getattr(msg, "header", None)
            if header is None and getattr(msg, "markers", None):
                header = msg.markers[0].header
            with self.lock:
                self.outputs[topic].append(now)
                if header is not None and header.stamp.sec:
                    self.e2e_ms[topic].append((now, (time.time() - header.stamp.sec - header.stamp.nanosec * 1e-9)
                                               * 1e3))
        return record

    def on_diagnostics(self, msg) -> None:
        for status in msg.status:
            if not status.hardware_id.startswith(self.ns + "/"):
                continue
            node = status.hardware_id[len(self.ns) + 1:]
            if node in MODELS and status.name.endswith("model"):
                values = status_values(status)
                with self.lock:
                    self.diag[node] = values
                    received, processed = values.get("frames_received"), values.get("frames_processed")
                    if isinstance(received, int) and isinstance(processed, int):
                        self.counters[node].append((time.monotonic(), received, processed))

    def on_budgets(self, msg) -> None:
        report = json.loads(msg.data)
        budgets = {name[len(self.ns) + 1:]: entry.get("budget_mb") for name, entry in report["nodes"].items()}
        with self.lock:
            if not self.budgets or self.budgets[-1][1] != budgets:
                self.budgets.append((time.monotonic(), budgets))


def plan_cache_entries(values: dict[str, Any]) -> int | None:
    try:
        return int(json.loads(values["engine.plan"])["cache"]["entries"])
    except (KeyError, TypeError, ValueError):
        return None


def node_pids(up: psutil.Process, executables: dict[str, str]) -> dict[str, int]:
    """name -> pid of the live node processes `dynnet up` started (module in the command line)."""
    pids: dict[str, int] = {}
    for child in up.children():
        try:
            cmd = child.cmdline()
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        for name, module in executables.items():
            if module in cmd and "-r" in cmd and f"__node:={name}" in cmd:
                pids[name] = child.pid
    return pids


def process_sample(pid: int) -> tuple[float, int, int] | None:
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            return proc.memory_info().rss / 1048576, proc.num_fds(), proc.num_threads()
    except psutil.Error:
        return None


def graph_config(args: argparse.Namespace) -> dict:
    """The vehicle graph with each node in a process of its own (the soak samples each node's process)."""
    data = separate_processes(yaml.safe_load(default_config_path().read_text()))
    for node in data["nodes"]:
        params = node.setdefault("parameters", {})
        if node["name"] == "sensor_sim":
            params.update(rate_hz=args.rate_hz)
        elif node["name"] == "budget_manager":
            params.update(total_budget_mb=float(args.budgets[0]))
    return data


def set_parameter(node, client_cache: dict, target: str, name: str, value: float) -> None:
    client = client_cache.get(target)
    if client is None:
        client = client_cache[target] = AsyncParameterClient(node, target)
    if client.services_are_ready():
        client.set_parameters([Parameter(name, Parameter.Type.DOUBLE, float(value))])


def run(args: argparse.Namespace) -> dict:
    ns = f"/soak_{os.getpid()}"
    data = graph_config(args)
    graph = parse_graph(data, "soak graph")
    executables = {n.name: EXECUTABLES[n.executable] for n in graph.nodes}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rec = Recorder(ns)
    ros = BackgroundNode("soak_observer", handle_signals=False)
    ros.node.create_subscription(Image, f"{ns}/camera/image_raw", rec.on_input, qos_profile_sensor_data)
    kinds = {"lane/mask": Image, "pedestrian/markers": MarkerArray, "depth/image": Image}
    for topic, kind in kinds.items():
        ros.node.create_subscription(kind, f"{ns}/{topic}", rec.on_output(topic), qos_profile_sensor_data)
    ros.node.create_subscription(DiagnosticArray, "/diagnostics", rec.on_diagnostics, 50)
    ros.node.create_subscription(String, f"{ns}/dynnet/budgets", rec.on_budgets, 10)
    ros.start()
    clients: dict = {}
    samples: dict[str, list[list]] = {name: [] for name in [*executables, "dynnet_up"]}
    load: list[tuple[float, float]] = []  # (t, 1-minute load average / CPUs)
    hog_events: list[dict] = []
    budget_sets: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "soak.yaml"
        cfg.write_text(yaml.safe_dump(data, sort_keys=False))
        log_path = out / "graph.log"
        with open(log_path, "w") as log:  # the child holds its own descriptor
            up = subprocess.Popen([sys.executable, "-m", "dynnet_ros.cli", "up", "--config", str(cfg),
                                   "--namespace", ns],
                                  cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        up_ps = psutil.Process(up.pid)
        hog: subprocess.Popen | None = None
        try:
            deadline = time.monotonic() + args.startup_timeout_s
            while not all(rec.outputs[t] for t in OUTPUTS):
                if up.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"graph did not produce every output (see {log_path})")
                time.sleep(0.5)
            t0 = time.monotonic()
            end = t0 + args.minutes * 60.0
            next_sample = next_hog = t0
            next_budget = t0 + args.budget_period_s
            budget_index = 0
            while time.monotonic() < end:
                now = time.monotonic()
                if up.poll() is not None:
                    raise RuntimeError(f"dynnet up exited with {up.returncode} (see {log_path})")
                if hog is not None and hog.poll() is not None:
                    hog_events[-1]["end_s"] = round(now - t0, 2)
                    hog = None
                if args.hog_mb > 0 and hog is None and now >= next_hog:
                    hog = subprocess.Popen([sys.executable, "-c", HOG_CODE, str(args.hog_mb), str(args.hog_on_s)])
                    hog_events.append({"start_s": round(now - t0, 2), "end_s": None, "mb": args.hog_mb})
                    next_hog = now + args.hog_period_s
                if now >= next_budget:
                    budget_index = (budget_index + 1) % len(args.budgets)
                    set_parameter(ros.node, clients, f"{ns}/budget_manager", "total_budget_mb",
                                  args.budgets[budget_index])
                    budget_sets.append({"t_s": round(now - t0, 2), "total_budget_mb": args.budgets[budget_index]})
                    next_budget = now + args.budget_period_s
                if now >= next_sample:
                    load.append((round(now - t0, 2), os.getloadavg()[0] / (os.cpu_count() or 1)))
                    pids = node_pids(up_ps, executables)
                    pids["dynnet_up"] = up.pid
                    with rec.lock:
                        diag = {k: dict(v) for k, v in rec.diag.items()}
                    for name, pid in pids.items():
                        sample = process_sample(pid)
                        if sample is None:
                            continue
                        values = diag.get(name, {})
                        samples[name].append([round(now - t0, 2), pid, round(sample[0], 2), sample[1], sample[2],
                                              plan_cache_entries(values), values.get("latency_p50_ms"),
                                              values.get("memory_budget_mb")])
                    next_sample = now + args.sample_s
                time.sleep(0.2)
            t_end = time.monotonic()
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
            code = stop_process_group(up, timeout=60.0)
            ros.close()
    return summarize(args, rec, samples, hog_events, budget_sets, load, t0, t_end, code, ns)


def summarize(args, rec: Recorder, samples: dict[str, list[list]], hog_events: list[dict],
              budget_sets: list[dict], load: list[tuple[float, float]], t0: float, t_end: float, exit_code: int,
              ns: str) -> dict:
    warm = args.warmup_min * 60.0
    nodes: dict[str, dict] = {}
    for name, rows in samples.items():
        after = [r for r in rows if r[0] >= warm]
        last_pid = after[-1][1] if after else None
        fit = [r for r in after if r[1] == last_pid]
        nodes[name] = {
            "samples": rows,
            "restarts": max(0, len({r[1] for r in rows}) - 1),
            "rss_slope_mb_per_h": rss_slope_mb_per_h([r[0] for r in fit], [r[2] for r in fit]),
            "rss_mb": range_stats([r[2] for r in after]),
            "fds": range_stats([r[3] for r in after]),
            "threads": range_stats([r[4] for r in after]),
            "plan_cache_entries": range_stats([r[5] for r in after if r[5] is not None]),
        }
    outputs = {}
    with rec.lock:
        inputs = list(rec.inputs)
        received_hz = {node: counter_rate(rows, t0, t_end) for node, rows in rec.counters.items()}
        fed = [hz for hz in received_hz.values() if hz]
        camera_hz = max(fed) if fed else len([t for t in inputs if t0 <= t <= t_end]) / max(1e-9, t_end - t0)
        slowdown = max(1.0, args.rate_hz / camera_hz) if camera_hz > 0 else 1.0
        for topic, times in rec.outputs.items():
            node = OUTPUTS[topic]
            stalls, long_gaps = find_gaps(times, inputs, t0, t_end, rec.counters[node], slowdown=slowdown)
            window = [t for t in times if t0 <= t <= t_end]
            e2e = [ms for t, ms in rec.e2e_ms[topic] if t0 + warm <= t <= t_end]
            outputs[topic] = {"node": node, "count": len(window), "node_received_hz": received_hz[node],
                              "rate_hz": len(window) / max(1e-9, t_end - t0),
                              "median_gap_s": median_gap(window),
                              "latency_ms": {"p50": float(np.percentile(e2e, 50)) if e2e else None,
                                             "p95": float(np.percentile(e2e, 95)) if e2e else None},
                              "stalls": stalls, "long_gaps": long_gaps,
                              "latency_series": [[round(t - t0, 2), round(ms, 1)] for t, ms in rec.e2e_ms[topic]
                                                 if t0 <= t <= t_end]}
        budgets = [{"t_s": round(t - t0, 2), "budgets_mb": b} for t, b in rec.budgets if t >= t0]
    window_in = [t for t in inputs if t0 <= t <= t_end]
    return {
        "namespace": ns, "minutes": args.minutes, "measured_s": round(t_end - t0, 1), "warmup_min": args.warmup_min,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "stall_rule": {"gap_s": STALL_S, "input_rate_fraction": 0.5, "camera_hz": camera_hz,
                       "slowdown": slowdown, "threshold_s": STALL_S * slowdown},
        "load_per_cpu": load,
        "input": {"count": len(window_in), "rate_hz": len(window_in) / max(1e-9, t_end - t0),
                  "median_gap_s": median_gap(window_in)},
        "nodes": nodes, "outputs": outputs, "hog_events": hog_events, "budget_sets": budget_sets,
        "budget_changes": budgets, "dynnet_up_exit_code": exit_code,
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(5, 1, figsize=(11, 14), sharex=True)
    colours = {name: f"C{i}" for i, name in enumerate(result["nodes"])}
    panels = [(2, "RSS (MB)"), (3, "open fds"), (4, "threads"), (5, "plan-cache entries")]
    for ax, (col, label) in zip(axes, panels):
        for name, entry in result["nodes"].items():
            rows = [r for r in entry["samples"] if r[col] is not None]
            if rows:
                slope = entry["rss_slope_mb_per_h"]
                tag = f"{name} ({slope:+.1f} MB/h)" if col == 2 and slope is not None else name
                ax.plot([r[0] / 60 for r in rows], [r[col] for r in rows], label=tag, lw=1, color=colours[name])
        ax.set_ylabel(label)
    for topic, entry in result["outputs"].items():
        series = entry["latency_series"]
        if series:
            axes[4].plot([t / 60 for t, _ in series], [ms for _, ms in series], ".", ms=1.5, label=topic,
                         color=colours.get(entry["node"]))
    axes[4].set_ylabel("frame latency (ms,\ncamera stamp to output)")
    axes[4].set_yscale("log")
    axes[4].set_xlabel("minutes since every output first arrived")
    for ax in axes:
        for hog in result["hog_events"]:
            if hog["end_s"] is not None:
                ax.axvspan(hog["start_s"] / 60, hog["end_s"] / 60, color="orange", alpha=0.12, lw=0)
        for change in result["budget_sets"]:
            ax.axvline(change["t_s"] / 60, color="grey", lw=0.5, ls=":")
        ax.axvline(result["warmup_min"], color="black", lw=0.8, ls="--")
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"soak: {result['measured_s'] / 60:.1f} min (orange: memory hog {result['settings']['hog_mb']} MB; "
                 f"dotted: total_budget_mb changes; dashed: end of warm-up)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report(result: dict) -> str:
    rule = result["stall_rule"]
    lines = [f"soak {result['measured_s'] / 60:.1f} min, camera {result['input']['rate_hz']:.1f} Hz at the observer, "
             f"warm-up {result['warmup_min']:g} min, camera {rule['camera_hz']:.2f} Hz at the nodes for "
             f"{result['settings']['rate_hz']:g} Hz asked (stall threshold {rule['threshold_s']:.1f} s)"]
    lines.append(f"{'node':<16} {'RSS MB first/last':>18} {'slope MB/h':>11} {'fds min-max':>12} "
                 f"{'threads min-max':>16} {'plan cache':>11} {'restarts':>8}")
    for name, e in result["nodes"].items():
        rss, fds, thr, cache = e["rss_mb"], e["fds"], e["threads"], e["plan_cache_entries"]
        if rss["first"] is None:
            continue
        slope = "-" if e["rss_slope_mb_per_h"] is None else f"{e['rss_slope_mb_per_h']:+.1f}"
        cache_text = "-" if cache["max"] is None else f"{cache['min']}-{cache['max']}"
        lines.append(f"{name:<16} {rss['first']:>8.1f} / {rss['last']:<7.1f} {slope:>11} "
                     f"{fds['min']:>5}-{fds['max']:<6} {thr['min']:>8}-{thr['max']:<7} {cache_text:>11} "
                     f"{e['restarts']:>8}")
    for topic, o in result["outputs"].items():
        p50 = o["latency_ms"]["p50"]
        lines.append(f"{topic:<20} {o['count']:>6} outputs, {o['rate_hz']:.2f} Hz, latency p50 "
                     f"{'-' if p50 is None else f'{p50:.0f} ms'}, stalls {len(o['stalls'])}, "
                     f"other gaps > {STALL_S:g} s while input arrived {len(o['long_gaps'])}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="measured time after every output first arrived")
    parser.add_argument("--out", default="soak-report", help="folder for soak.json, soak.png, graph.log")
    parser.add_argument("--warmup-min", type=float, default=None,
                        help="samples before this are left out of slopes and ranges (default: 20%% of --minutes, "
                             "at most 5)")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--rate-hz", type=float, default=5.0, help="camera rate")
    parser.add_argument("--hog-mb", type=int, default=256)
    parser.add_argument("--hog-period-s", type=float, default=60.0)
    parser.add_argument("--hog-on-s", type=float, default=20.0)
    parser.add_argument("--budget-period-s", type=float, default=45.0)
    parser.add_argument("--budgets", default="0,300,200",
                        help="total_budget_mb values the manager cycles through (0 = from available memory)")
    parser.add_argument("--startup-timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.sample_s <= 0:
        parser.error("--minutes and --sample-s must be positive")
    try:
        args.budgets = [float(v) for v in args.budgets.split(",")]
    except ValueError:
        parser.error(f"--budgets must be comma-separated numbers, got {args.budgets!r}")
    if args.warmup_min is None:
        args.warmup_min = min(5.0, 0.2 * args.minutes)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    os.environ.setdefault("ROS_DOMAIN_ID", str(10 + os.getpid() % 90))
    result = run(args)
    out = Path(args.out)
    (out / "soak.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "soak.png")
    print(report(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
