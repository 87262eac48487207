"""`dynnet demo`: run the vehicle graph with the simulator, show a live table, write a report.

With ``--bag`` the simulator stays off and a recorded bag plays in a loop instead, the nodes on
the bag's time (``replay.BackgroundReplay``, as `dynnet replay --loop`). With ``--cameras N``
the simulator publishes N cameras and every model node serves all of them
(``graph_cameras.with_cameras``, the graph config/vehicle_4cam.yaml holds for N = 4); the
montage shows the first camera, as for a config whose simulator lists cameras itself.

The graph runs exactly as `dynnet up` starts it (node output goes to <report>/nodes.log); this
process subscribes to /diagnostics with rclpy and turns the nodes' own statuses into the
table and the time series of <report>/summary.json and <report>/demo.png; the camera frames,
clouds and model outputs it also receives become <report>/montage.png (``demo_frames``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
from matplotlib.figure import Figure
from rich.console import Console
from rich.live import Live
from rich.table import Table

from dynnet_ros.commands.demo_frames import FrameRecorder, render_montage
from dynnet_ros.commands.replay import BackgroundReplay, graph_cameras
from dynnet_ros.graph_cameras import with_cameras
from dynnet_ros.graph_transport import use_image_profile
from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.nodes.diagnostics import level_value, status_values
from dynnet_ros.sim.rig import demo_cameras
from dynnet_ros.sim.scene import lidar_to_camera_xyzrpy
from dynnet_ros.supervisor.runner import GraphRunner, StopRequest, load_config

MODEL_TASKS = ("lane", "pedestrian", "depth")
#: the run's --duration counts from when every model node has processed a frame; a graph that
#: gets there later than this (a model that never loads) ends the demo with status 1
STARTUP_TIMEOUT_S = 240.0


@dataclass
class Series:
    """Time series of one node's diagnostics (t relative to the demo start)."""
    task: str
    samples: list[dict[str, Any]] = field(default_factory=list)


class DiagnosticsRecorder:
    """Collects every node's statuses from /diagnostics (rclpy, spun in a thread)."""
    def __init__(self, t0: float, namespace: str = "", lidar_to_camera: list[float] | None = None,
                 camera: str | None = None) -> None:
        self._values = status_values
        self._level = level_value
        self.t0 = t0
        self.prefix = namespace + "/" if namespace else ""  # only statuses of this graph's nodes
        self.lock = threading.Lock()
        self.series: dict[str, Series] = {}
        self.latest: dict[str, dict[str, Any]] = {}
        self.memory: list[dict[str, Any]] = []
        self.camera: list[dict[str, Any]] = []  # the simulator's statuses (camera resolution over time)
        self.ros = BackgroundNode("dynnet_demo_monitor", handle_signals=False, period=0.1)  # demo handles signals
        self.ros.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 50)
        # camera frames, clouds and model outputs of this graph (of ``camera``, the first of
        # several), paired by stamp for the montage
        self.frames = FrameRecorder(self.ros.node, namespace, lidar_to_camera or lidar_to_camera_xyzrpy(), camera)
        self.ros.start()

    def _on_diag(self, msg) -> None:
        now = time.monotonic() - self.t0
        with self.lock:
            for status in msg.status:
                if self.prefix and not status.hardware_id.startswith(self.prefix):
                    continue
                node = status.name.split(":", 1)[0].strip()
                values = self._values(status)
                sample = {"t": now, "level": self._level(status.level), "message": status.message, **values}
                if values.get("task") in MODEL_TASKS:
                    self.series.setdefault(node, Series(values["task"])).samples.append(sample)
                elif status.name.endswith(": memory"):
                    self.memory.append(sample)
                elif status.name.endswith(": sensor simulator"):
                    self.camera.append(sample)
                # a model node serving several cameras also reports each camera on its own: a row each
                camera = values.get("camera") if "task" not in values else None
                self.latest[f"{node} {camera}" if isinstance(camera, str) and camera else node] = sample

    def serving(self, count: int) -> bool:
        """``count`` model nodes have each processed a frame."""
        with self.lock:
            return sum(any(isinstance(s.get("frames_processed"), int) and s["frames_processed"] > 0
                           for s in series.samples) for series in self.series.values()) >= count

    def close(self) -> None:
        self.ros.close()


def _fmt(value: Any, spec: str = ".1f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def build_table(recorder: DiagnosticsRecorder, elapsed: float, duration: float):
    table = Table(title=f"dynnet demo — {elapsed:4.0f} / {duration:.0f} s   (node output: nodes.log)")
    for column in ("node", "status", "Hz", "p50 ms", "p95 ms", "input", "camera", "done", "drop", "fail",
                   "RSS MB"):
        table.add_column(column, justify="right" if column not in ("node", "status", "input", "camera") else "left")
    with recorder.lock:
        latest = dict(recorder.latest)
    for node, s in sorted(latest.items()):
        level = {0: "[green]OK", 1: "[yellow]WARN", 2: "[red]ERROR"}.get(s["level"], "STALE")
        if "camera" in s and "task" not in s:  # one camera of a multi-camera model node
            table.add_row(node, level, _fmt(s.get("hz")), _fmt(s.get("latency_p50_ms")), _fmt(s.get("latency_p95_ms")),
                          "", "", _fmt(s.get("processed"), "d"), _fmt(s.get("dropped"), "d"),
                          _fmt(s.get("failed"), "d"), "")
        elif s.get("task") in MODEL_TASKS:
            shape = str(s.get("input_shape", "")).split("x")[2:]  # 1x3xHxW -> WxH like the camera column
            table.add_row(node, level, _fmt(s.get("hz")), _fmt(s.get("latency_p50_ms")), _fmt(s.get("latency_p95_ms")),
                          "x".join(reversed(shape)), str(s.get("camera_resolution", "")),
                          _fmt(s.get("frames_processed"), "d"), _fmt(s.get("frames_dropped"), "d"),
                          _fmt(s.get("frames_failed"), "d"), _fmt(s.get("rss_mb")))
        else:
            table.add_row(node, level, "", "", "", "", str(s.get("camera_resolution", "")), "", "", "",
                          _fmt(s.get("rss_mb", s.get(f"rss_mb.{node}"))))
    return table


def summarize(recorder: DiagnosticsRecorder, duration: float, codes: dict[str, int]) -> dict[str, Any]:
    models: dict[str, Any] = {}
    with recorder.lock:
        series = {name: list(s.samples) for name, s in recorder.series.items()}
        memory = list(recorder.memory)
    for node, samples in sorted(series.items()):
        done = [s for s in samples if isinstance(s.get("frames_processed"), int)]
        if not done:
            continue
        first, last = done[0], done[-1]
        span = last["t"] - first["t"]
        hz = (last["frames_processed"] - first["frames_processed"]) / span if span > 0 else 0.0
        by_res: dict[str, list[float]] = defaultdict(list)
        for s in done:
            if isinstance(s.get("latency_last_ms"), float) and s.get("camera_resolution"):
                by_res[s["camera_resolution"]].append(s["latency_last_ms"])
        models[node] = {
            "task": samples[0]["task"],
            "mean_hz": hz,
            "latency_p50_ms": last.get("latency_p50_ms"),
            "latency_p95_ms": last.get("latency_p95_ms"),
            "latency_median_ms_by_camera_resolution": {k: sorted(v)[len(v) // 2] for k, v in sorted(by_res.items())},
            "input_shapes_seen": sorted({s["input_shape"] for s in done if s.get("input_shape")}),
            "frames_received": last.get("frames_received"),
            "frames_processed": last.get("frames_processed"),
            "frames_dropped": last.get("frames_dropped"),
            "frames_failed": last.get("frames_failed"),
            "rss_mb_max": max((s["rss_mb"] for s in done if isinstance(s.get("rss_mb"), float)), default=None),
            "memory_budget_mb_last": last.get("memory_budget_mb"),  # 0 = unlimited; set by budget_manager
            "model_path": last.get("model_path"),
            "backend": last.get("backend"),
            "cameras": _camera_counts(last),
        }
    return {
        "wall_s": duration,
        "ros_domain_id": int(os.environ.get("ROS_DOMAIN_ID", "0") or 0),
        "models": models,
        "memory_samples": len(memory),
        "system_available_mb_min": min((m["available_mb"] for m in memory if isinstance(m.get("available_mb"), float)),
                                       default=None),
        "exit_codes": codes,
    }


def _camera_counts(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per camera of a multi-camera model node, its counters from the node's status values
    (``camera.<name>.<counter>``); {} for a single-camera node."""
    cameras: dict[str, dict[str, Any]] = defaultdict(dict)
    for key, value in values.items():
        prefix, _, counter = key.rpartition(".")
        if prefix.startswith("camera.") and counter:
            cameras[prefix.removeprefix("camera.")][counter] = value
    return dict(sorted(cameras.items()))


def plot(recorder: DiagnosticsRecorder, path: Path) -> None:
    with recorder.lock:
        series = {name: list(s.samples) for name, s in recorder.series.items()}
        memory = list(recorder.memory)
        camera = [s for s in recorder.camera if s.get("camera_resolution")]
    fig = Figure(figsize=(12, 10))
    axes = fig.subplots(3, 1, sharex=True)
    for node, samples in sorted(series.items()):
        pts = [s for s in samples if isinstance(s.get("latency_last_ms"), float)]
        line, = axes[0].plot([s["t"] for s in pts], [s["latency_last_ms"] for s in pts], marker=".",
                             label=f"{node} last frame")
        p95 = [s for s in pts if isinstance(s.get("latency_p95_ms"), float)]
        axes[0].plot([s["t"] for s in p95], [s["latency_p95_ms"] for s in p95], linestyle="--",
                     color=line.get_color(), label=f"{node} p95")
        shaped = [s for s in samples if s.get("input_shape")]
        axes[1].step([s["t"] for s in shaped], [_pixels(s["input_shape"]) / 1e3 for s in shaped], where="post",
                     color=line.get_color(), linestyle=":", label=f"{node} model input")
        rss = [s for s in samples if isinstance(s.get("rss_mb"), float)]
        axes[2].plot([s["t"] for s in rss], [s["rss_mb"] for s in rss], color=line.get_color(), label=node)
    if camera:
        axes[1].step([s["t"] for s in camera], [_pixels(s["camera_resolution"]) / 1e3 for s in camera], where="post",
                     color="black", label="camera (sensor_sim)")
    for name, color in (("sensor_sim", "grey"), ("budget_manager", "purple")):
        key = f"rss_mb.{name}"
        pts = [m for m in memory if isinstance(m.get(key), float)]
        if pts:
            axes[2].plot([m["t"] for m in pts], [m[key] for m in pts], label=name, linestyle="-.", color=color)
    axes[0].set_ylabel("frame latency (ms)")
    axes[0].set_title("frame latency: latest frame at each 1 Hz diagnostics sample (solid), p95 of the last "
                      "50 frames (dashed)", fontsize=10)
    axes[1].set_ylabel("kilopixels")
    axes[1].set_title("camera resolution (black, sampled at 1 Hz) and each model's last input after letterbox "
                      "(dotted)", fontsize=10)
    axes[2].set_ylabel("RSS (MiB)")
    axes[2].set_title("memory per node")
    axes[2].set_xlabel("time since start (s)")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: never hides data
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _pixels(text: str) -> float:
    """'640x480' or '1x3x480x640' -> pixel count."""
    dims = [int(d) for d in str(text).split("x")]
    return float(dims[-1] * dims[-2])


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    config = load_config(args.config)
    cameras = demo_cameras(args.cameras) if args.cameras > 1 else []
    if cameras:  # the simulator's N cameras, every model node serving them all
        config = with_cameras(config, cameras)
    else:  # a config with several cameras of its own (config/vehicle_4cam.yaml): the montage shows the first
        cameras = next((list(n.parameters["cameras"]) for n in config.nodes
                        if n.executable == "sensor_sim" and n.parameters.get("cameras")), [])
    if args.bag is not None:  # this process plays the bag's camera frames: before its first participant
        use_image_profile()
    bag_replay = None if args.bag is None else \
        BackgroundReplay(args.bag, args.namespace, graph_cameras(config))  # checked before any work
    report = Path(args.report)
    report.mkdir(parents=True, exist_ok=True)
    log = (report / "nodes.log").open("w")
    log_lock = threading.Lock()

    def sink(name: str, line: str) -> None:
        with log_lock:
            log.write(f"[{name}] {line}\n")
            log.flush()

    console = Console() if sys.stdout.isatty() else Console(width=120)  # logs: keep the table readable
    runner = GraphRunner(config, use_sim=bag_replay is None, sink=sink, namespace=args.namespace,
                         sim_time=bag_replay is not None)
    console.print(f"dynnet demo: building/loading the zoo models, then {len(runner.hosted_nodes())} nodes for "
                  f"{args.duration:.0f} s (ROS_DOMAIN_ID={os.environ.get('ROS_DOMAIN_ID', '0')})")
    status = 0
    t0 = time.monotonic()
    depth = [n.parameters for n in config.nodes if n.executable == "depth_node"]
    extrinsic = f"{cameras[0]}.lidar_to_camera" if cameras else "lidar_to_camera"
    recorder = DiagnosticsRecorder(t0, runner.namespace, depth[0].get(extrinsic) if depth else None,
                                   cameras[0] if cameras else None)
    models = sum(1 for n in runner.hosted_nodes() if n.executable.removesuffix("_node") in MODEL_TASKS)
    with StopRequest() as stop:
        try:
            runner.start()
            if bag_replay is not None:
                bag_replay.start(runner)
            started = time.monotonic()
            serving: float | None = None  # when every model node had processed a frame
            with Live(build_table(recorder, 0.0, args.duration), console=console, refresh_per_second=2,
                      transient=False, auto_refresh=not args.no_live) as live:
                while not stop.event.is_set():
                    now = time.monotonic()
                    if serving is None and recorder.serving(models):
                        serving = now
                    if serving is not None and now >= serving + args.duration:
                        break
                    if serving is None and now - started > STARTUP_TIMEOUT_S:
                        console.print(f"[red]the model nodes did not all serve within {STARTUP_TIMEOUT_S:.0f} s; "
                                      f"see {report / 'nodes.log'}")
                        status = 1
                        break
                    dead = runner.dead()
                    if dead:
                        console.print(f"[red]node(s) exited unexpectedly: {dead}; see {report / 'nodes.log'}")
                        status = 1
                        break
                    stop.event.wait(0.5)
                    live.update(build_table(recorder, 0.0 if serving is None else time.monotonic() - serving,
                                            args.duration))
        finally:
            if bag_replay is not None:
                bag_replay.close()
            codes = runner.stop()
            elapsed = time.monotonic() - t0
            recorder.close()
            log.close()
    console.print()
    if bag_replay is not None and bag_replay.error is not None:
        console.print(f"[red]the bag stopped playing: {bag_replay.error}")
        status = 1
    summary = summarize(recorder, elapsed, codes)
    summary["requested_duration_s"] = args.duration
    summary["cameras"] = cameras or ["camera"]
    (report / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    plot(recorder, report / "demo.png")
    task_nodes = {n.executable.removesuffix("_node"): n.name for n in config.nodes}
    montage = render_montage(recorder.frames.snapshot(), recorder.frames.lidar_to_camera, report / "montage.png",
                             task_nodes)
    for node, m in summary["models"].items():
        console.print(f"{node:16s} {m['mean_hz']:5.2f} Hz  p50 {_fmt(m['latency_p50_ms'])} ms  "
                      f"p95 {_fmt(m['latency_p95_ms'])} ms  dropped {m['frames_dropped']}  "
                      f"RSS max {_fmt(m['rss_mb_max'])} MiB")
    shown = f", {report / 'montage.png'}" if montage else " (no model output paired with a camera frame: no montage)"
    console.print(f"report: {report / 'summary.json'}, {report / 'demo.png'}{shown}, {report / 'nodes.log'}")
    if not summary["models"]:
        console.print("[red]no model diagnostics were received")
        return 1
    return status
