"""Many cameras, one model: a multi-camera model node against one node per camera.

For each model and camera count N, two layouts serve the same N camera streams (640x480 rgb8,
``--rate`` Hz each, all cameras triggered together like a hardware-synchronised rig, or spread
over the period with ``--stagger``):

- ``multi``: one model node with ``cameras: [cam0, ..., camN-1]`` (one engine, batches across
  cameras within ``batch_window_ms``);
- ``separate``: N model nodes, one per camera namespace, each with its own engine.

The camera streams come from a publisher process of their own (simulator frames rendered once,
so the publisher's CPU is not the model's), and a probe in this process subscribes to every
camera's output. Measured over ``--window`` seconds after ``--warmup``: per-camera output rate,
p50/p95 latency (output received minus the input frame's stamp, which the output carries),
total PSS of the model processes (/proc/PID/smaps_rollup) and CPU (user + system) per frame
served. Layouts alternate and swap order each round (``--rounds``) so load drift falls on both.
``--executor`` sets ``DYNNET_EXECUTOR`` for the model nodes of both layouts. Each layout's engine
threads (the node parameter ``threads``: ``--multi-threads``, ``--separate-threads``; 0 = the
node's default, one per CPU the process may run on) and the multi node's ``batches_in_flight``
(``--in-flight``) are stated with its results.

Transport: every process of a run (publisher, model nodes, probe) uses the Fast DDS profile
``--fastdds-profile`` (default ``config/fastdds_cameras.xml``: a shared-memory segment that holds
several 640x480 frames), unless ``--fastdds-profile default``. With Fast DDS's default 512 KiB
segment a 900 KiB frame goes over fragmented UDP, and best-effort readers lose most frames of
several cameras sent at once: the loss would be the transport's, not the layout's (docs/ros.md).

Usage: python bench/cameras_bench.py [--models lane,pedestrian,depth,yolov8n] [--cameras 1,2,4,6]
       [--rate 10] [--warmup 15] [--window 20] [--rounds 1] [--stagger] [--fastdds-profile FILE|default]
       [--executor threads|events] [--multi-threads N] [--separate-threads N] [--in-flight N]
       [--multi-param NAME=VALUE ...] [--json out.json] [--png out.png] [--from-json run.json ...]
``--from-json`` summarises (and plots) the runs saved by earlier ``--json`` runs instead of running,
so layouts measured in separate runs (e.g. each at its own ``--separate-threads``) share one table.
Runs with its own ROS_DOMAIN_ID unless one is set, and ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import psutil
import rclpy
import yaml
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, Image, PointCloud2
from std_msgs.msg import Header

from dynnet_ros.engine.plan.options import default_threads
from dynnet_ros.nodes.convert import array_to_image, xyzi_to_cloud
from dynnet_ros.nodes.message_types import message_class
from dynnet_ros.perception.serving import batches_in_flight
from dynnet_ros.sim.frames import SimSettings, camera_info_fields, render_frame
from dynnet_ros.supervisor.runner import stop_process_group

REPO = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT = 640, 480
#: how long a layout may take until every camera has had an output (first loads size the model)
UP_TIMEOUT_S = 300.0
#: frames the publisher renders once and then cycles through
RENDERED_FRAMES = 8


@dataclass(frozen=True)
class ModelSpec:
    """A model the bench serves: its node module, output topic (relative to the camera
    namespace) and type, and the node parameters."""

    name: str
    module: str
    output: str
    output_type: str
    params: dict


def corpus_detector() -> str | None:
    """The YOLOv8n export nudenet ships in its wheel (test/_corpus.py), if installed."""
    spec = importlib.util.find_spec("nudenet")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "320n.onnx"
    return str(path) if path.is_file() else None


def model_specs() -> dict[str, ModelSpec]:
    specs = {
        "lane": ModelSpec("lane", "dynnet_ros.nodes.lane_node", "lane/mask", "sensor_msgs/msg/Image", {}),
        "pedestrian": ModelSpec("pedestrian", "dynnet_ros.nodes.pedestrian_node", "pedestrian/markers",
                                "visualization_msgs/msg/MarkerArray", {}),
        "depth": ModelSpec("depth", "dynnet_ros.nodes.depth_node", "depth/image", "sensor_msgs/msg/Image", {}),
    }
    yolo = corpus_detector()
    if yolo is not None:
        specs["yolov8n"] = ModelSpec("yolov8n", "dynnet_ros.nodes.pedestrian_node", "pedestrian/markers",
                                     "visualization_msgs/msg/MarkerArray",
                                     {"model_path": yolo, "model_format": "yolov8", "max_input_side": 320})
    return specs


# ---------------------------------------------------------------------------------------- publisher
def publish_cameras(namespace: str, cameras: int, rate_hz: float, stagger: bool) -> None:
    """The camera publisher (its own process, ``--publish``): every camera's image and CameraInfo,
    and one LiDAR cloud, at ``rate_hz``; frames rendered once by the simulator."""
    settings = SimSettings(rate_hz=rate_hz, resolutions=(f"{WIDTH}x{HEIGHT}",))
    frames = [render_frame(settings, i, i / rate_hz) for i in range(RENDERED_FRAMES)]
    rclpy.init()
    node = Node("camera_rig", namespace=namespace)
    names = [f"cam{i}" for i in range(cameras)]
    images = [node.create_publisher(Image, f"{name}/image_raw", qos_profile_sensor_data) for name in names]
    infos = [node.create_publisher(CameraInfo, f"{name}/camera_info", qos_profile_sensor_data) for name in names]
    cloud = node.create_publisher(PointCloud2, "lidar/points", qos_profile_sensor_data)
    count = [0]

    def tick(index: int) -> None:
        frame = frames[count[0] % len(frames)]
        stamp = node.get_clock().now().to_msg()
        header = Header(stamp=stamp, frame_id=f"{names[index]}_optical_frame")
        infos[index].publish(CameraInfo(header=header, width=WIDTH, height=HEIGHT,
                                        **camera_info_fields(frame.camera_matrix)))
        images[index].publish(array_to_image(frame.image, "rgb8", header))
        if index == 0:
            cloud.publish(xyzi_to_cloud(frame.points, Header(stamp=stamp, frame_id="lidar")))
            count[0] += 1

    def rig_tick() -> None:
        for index in range(cameras):
            tick(index)

    if stagger:  # one tick per camera, round robin: the cameras' frames spread evenly over the period
        def staggered_tick() -> None:
            tick(turn[0] % cameras)
            turn[0] += 1
        turn = [0]
        node.create_timer(1.0 / (rate_hz * cameras), staggered_tick)
    else:
        node.create_timer(1.0 / rate_hz, rig_tick)
    with contextlib.suppress(KeyboardInterrupt, ExternalShutdownException):
        rclpy.spin(node)


# ---------------------------------------------------------------------------------------- probe
class OutputProbe:
    """Every camera's output: arrival counts and latencies (receive time minus the frame stamp)."""

    def __init__(self, namespace: str, spec: ModelSpec, cameras: int) -> None:
        self.node = Node("cameras_bench_probe", namespace=namespace)
        self.lock = threading.Lock()
        self.latency_ms: dict[str, list[float]] = {f"cam{i}": [] for i in range(cameras)}
        self.counting = False
        message = message_class(spec.output_type)
        if message is None:
            raise SystemExit(f"{spec.output_type} is not importable here")
        for name in self.latency_ms:
            self.node.create_subscription(message, f"{name}/{spec.output}", self._on_output(name),
                                          qos_profile_sensor_data)
        self.seen: set[str] = set()
        self.executor = SingleThreadedExecutor()
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _on_output(self, camera: str):
        def on_message(msg) -> None:
            header = msg.markers[0].header if hasattr(msg, "markers") else msg.header
            stamp = header.stamp.sec + header.stamp.nanosec * 1e-9
            with self.lock:
                self.seen.add(camera)
                if self.counting:
                    self.latency_ms[camera].append((time.time() - stamp) * 1e3)
        return on_message

    def all_seen(self) -> bool:
        with self.lock:
            return len(self.seen) == len(self.latency_ms)

    def start(self) -> None:
        with self.lock:
            for values in self.latency_ms.values():
                values.clear()
            self.counting = True

    def stop(self) -> dict[str, list[float]]:
        with self.lock:
            self.counting = False
            return {name: list(values) for name, values in self.latency_ms.items()}

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()


# ---------------------------------------------------------------------------------------- one run
@dataclass(frozen=True)
class RunResult:
    model: str
    cameras: int
    layout: str
    per_camera_hz: list[float]
    latency_p50_ms: float
    latency_p95_ms: float
    total_pss_mb: float
    cpu_ms_per_frame: float
    load_average: float
    threads: int        # each model process's engine threads
    in_flight: int      # batches each model process serves at once
    settings: dict = field(default_factory=dict)   # the multi node's --multi-param parameters

    @property
    def aggregate_hz(self) -> float:
        return sum(self.per_camera_hz)


def pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    raise KeyError("Pss")


def params_file(directory: Path, name: str, params: dict) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": params}}))
    return path


def node_param(text: str) -> tuple[str, object]:
    """``--multi-param NAME=VALUE``: the name and the value read as YAML."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, yaml.safe_load(value)


def layout_settings(layout: str, cameras: int, args: argparse.Namespace) -> tuple[dict, int, int]:
    """The node parameters ``layout`` sets besides the model's, and the engine threads and batches
    in flight each of its processes runs with (a 0 parameter resolved as the node resolves it)."""
    threads = args.multi_threads if layout == "multi" else args.separate_threads
    params: dict = {"threads": threads}
    if layout == "multi":
        params.update(cameras=[f"cam{i}" for i in range(cameras)], batches_in_flight=args.in_flight)
        params.update(args.multi_param)
    in_flight = batches_in_flight(params, cameras) if layout == "multi" else 1
    # a node's engine shares the CPUs between its runs in flight (Engine's concurrent_runs)
    return params, threads or max(1, default_threads() // in_flight), in_flight


def start_nodes(spec: ModelSpec, layout: str, cameras: int, namespace: str, directory: Path,
                logs: list, params: dict) -> list[subprocess.Popen]:
    """The model process(es) of ``layout`` for ``cameras`` cameras, with ``params`` besides the model's."""
    base = [sys.executable, "-m", spec.module, "--ros-args"]
    names = [f"cam{i}" for i in range(cameras)]
    if layout == "multi":
        command_sets = [base + ["-r", f"__ns:={namespace}", "--params-file",
                                str(params_file(directory, "multi", {**spec.params, **params}))]]
    else:
        single = params_file(directory, "single", {**spec.params, **params})
        command_sets = [base + ["-r", f"__ns:={namespace}/{name}", "-r", "camera/image_raw:=image_raw",
                                "-r", "camera/camera_info:=camera_info",
                                "-r", f"lidar/points:={namespace}/lidar/points", "--params-file", str(single)]
                        for name in names]
    procs = []
    for index, command in enumerate(command_sets):
        log = (directory / f"{layout}-{index}.log").open("w")
        logs.append(log)
        procs.append(subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True))
    return procs


def run_layout(spec: ModelSpec, layout: str, cameras: int, args: argparse.Namespace) -> RunResult:
    namespace = f"/cameras_bench_{os.getpid()}_{time.monotonic_ns()}"
    with tempfile.TemporaryDirectory(prefix="cameras-bench-") as tmp:
        directory = Path(tmp)
        logs: list = []
        publisher = subprocess.Popen([sys.executable, __file__, "--publish", str(cameras), "--namespace", namespace,
                                      "--rate", str(args.rate)] + (["--stagger"] if args.stagger else []),
                                     cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        params, threads, in_flight = layout_settings(layout, cameras, args)
        nodes = start_nodes(spec, layout, cameras, namespace, directory, logs, params)
        probe = OutputProbe(namespace, spec, cameras)
        try:
            deadline = time.monotonic() + UP_TIMEOUT_S
            while not probe.all_seen():
                if time.monotonic() > deadline or any(p.poll() is not None for p in nodes):
                    tails = "\n".join(path.read_text()[-2000:] for path in sorted(directory.glob(f"{layout}-*.log")))
                    raise SystemExit(f"{spec.name} {layout} x{cameras}: not every camera answered:\n{tails}")
                time.sleep(0.5)
            time.sleep(args.warmup)
            procs = [psutil.Process(p.pid) for p in nodes]
            cpu_start = sum(sum(p.cpu_times()[:2]) for p in procs)
            probe.start()
            time.sleep(args.window)
            latencies = probe.stop()
            cpu = sum(sum(p.cpu_times()[:2]) for p in procs) - cpu_start
            total_pss = sum(pss_mb(p.pid) for p in nodes)
        finally:
            probe.close()
            for proc in [*nodes, publisher]:
                stop_process_group(proc, timeout=30.0)
            for log in logs:
                log.close()
    every = [v for values in latencies.values() for v in values]
    frames = len(every)
    return RunResult(spec.name, cameras, layout, [round(len(v) / args.window, 2) for v in latencies.values()],
                     round(float(np.percentile(every, 50)), 1) if every else float("nan"),
                     round(float(np.percentile(every, 95)), 1) if every else float("nan"),
                     round(total_pss, 1), round(cpu * 1e3 / frames, 1) if frames else float("nan"),
                     round(os.getloadavg()[0], 1), threads, in_flight,
                     dict(args.multi_param) if layout == "multi" else {})


# ---------------------------------------------------------------------------------------- report
def summarise(runs: list[RunResult]) -> list[dict]:
    """Per model and camera count: each layout's medians over rounds, and multi / separate ratios."""
    rows = []
    keys = sorted({(r.model, r.cameras) for r in runs}, key=lambda k: (k[0], k[1]))
    for model, cameras in keys:
        row: dict = {"model": model, "cameras": cameras}
        for layout in ("multi", "separate"):
            mine = [r for r in runs if (r.model, r.cameras, r.layout) == (model, cameras, layout)]
            if not mine:
                continue
            row[layout] = {
                "min_camera_hz": statistics.median(min(r.per_camera_hz) for r in mine),
                "aggregate_hz": round(statistics.median(r.aggregate_hz for r in mine), 2),
                "latency_p50_ms": statistics.median(r.latency_p50_ms for r in mine),
                "latency_p95_ms": statistics.median(r.latency_p95_ms for r in mine),
                "total_pss_mb": statistics.median(r.total_pss_mb for r in mine),
                "cpu_ms_per_frame": statistics.median(r.cpu_ms_per_frame for r in mine),
                "threads": mine[0].threads,
                "in_flight": mine[0].in_flight,
                "settings": mine[0].settings,
                "load_average": [r.load_average for r in mine],
            }
        if "multi" in row and "separate" in row:
            multi, separate = row["multi"], row["separate"]
            row["pss_ratio"] = round(multi["total_pss_mb"] / separate["total_pss_mb"], 2)
            row["throughput_ratio"] = round(multi["aggregate_hz"] / separate["aggregate_hz"], 2) \
                if separate["aggregate_hz"] else None
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    print("| model | cameras | layout | threads x in flight | min camera Hz | total Hz | p50 / p95 ms | total PSS MiB "
          "| CPU ms/frame | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        for layout in ("multi", "separate"):
            if layout in row:
                m = row[layout]
                settings = "".join(f", {k} {v}" for k, v in m["settings"].items())
                print(f"| {row['model']} | {row['cameras']} | {layout} | {m['threads']} x {m['in_flight']}{settings} | "
                      f"{m['min_camera_hz']:.2f} | {m['aggregate_hz']:.2f} | {m['latency_p50_ms']:.0f} / "
                      f"{m['latency_p95_ms']:.0f} | {m['total_pss_mb']:.0f} | {m['cpu_ms_per_frame']:.1f} | "
                      f"{'/'.join(f'{v:g}' for v in m['load_average'])} |")
    print("\n| model | cameras | PSS multi / separate | throughput multi / separate |\n|---|---|---|---|")
    for row in rows:
        if "pss_ratio" in row:
            print(f"| {row['model']} | {row['cameras']} | {row['pss_ratio']:.2f} | {row['throughput_ratio']} |")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib  # plotting only when asked for (--png)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({row["model"] for row in rows})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for index, model in enumerate(models):
        mine = [row for row in rows if row["model"] == model and "pss_ratio" in row]
        counts = [row["cameras"] for row in mine]
        for layout, style in (("multi", "-o"), ("separate", "--x")):
            label, colour = f"{model} {layout}", f"C{index}"
            axes[0].plot(counts, [row[layout]["aggregate_hz"] for row in mine], style, color=colour, label=label)
            axes[1].plot(counts, [row[layout]["total_pss_mb"] for row in mine], style, color=colour, label=label)
    axes[0].set(xlabel="cameras (solid: one node for all, dashed: one node per camera)",
                ylabel="outputs per second (all cameras)", title="throughput")
    axes[1].set(xlabel="cameras", ylabel="MiB", title="total PSS of the model processes")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="lane,pedestrian,depth,yolov8n")
    parser.add_argument("--cameras", default="1,2,4,6")
    parser.add_argument("--layouts", default="multi,separate")
    parser.add_argument("--rate", type=float, default=10.0, help="frames per second per camera")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds after every camera's first output")
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--stagger", action="store_true", help="spread the cameras' frames over the period")
    parser.add_argument("--fastdds-profile", default=str(REPO / "config" / "fastdds_cameras.xml"),
                        help="Fast DDS XML profile for every process of a run ('default': Fast DDS's own settings)")
    parser.add_argument("--executor", choices=("threads", "events"),
                        help="DYNNET_EXECUTOR for every model node of both layouts (default: as set, else threads)")
    parser.add_argument("--multi-threads", type=int, default=0,
                        help="engine threads of the multi-camera node (0: the node's default)")
    parser.add_argument("--separate-threads", type=int, default=0,
                        help="engine threads of each single-camera node (0: the node's default)")
    parser.add_argument("--in-flight", type=int, default=1, help="batches_in_flight of the multi-camera node")
    parser.add_argument("--multi-param", action="append", default=[], metavar="NAME=VALUE", type=node_param,
                        help="a parameter of the multi-camera node (VALUE as YAML), e.g. max_batch=2; repeatable")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--from-json", type=Path, nargs="+", help="summarise these runs' --json files instead")
    parser.add_argument("--png", type=Path)
    parser.add_argument("--publish", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("ROS_DOMAIN_ID", str(50 + os.getpid() % 40))
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    if args.fastdds_profile != "default" and args.publish is None:
        os.environ["FASTDDS_DEFAULT_PROFILES_FILE"] = str(Path(args.fastdds_profile).resolve())
    if args.executor:
        os.environ["DYNNET_EXECUTOR"] = args.executor
    if args.publish is not None:
        publish_cameras(args.namespace, args.publish, args.rate, args.stagger)
        return 0

    if args.from_json:
        report([RunResult(**run) for path in args.from_json for run in json.loads(path.read_text())["runs"]], args)
        return 0
    specs = model_specs()
    wanted = [name for name in args.models.split(",") if name]
    missing = [name for name in wanted if name not in specs]
    if missing:
        parser.error(f"unknown or unavailable models {missing}; available: {sorted(specs)}")
    counts = [int(c) for c in args.cameras.split(",")]
    layouts = [layout for layout in args.layouts.split(",") if layout]
    runs: list[RunResult] = []
    rclpy.init()
    try:
        for model in wanted:
            for cameras in counts:
                for round_ in range(args.rounds):
                    for layout in (layouts if round_ % 2 == 0 else layouts[::-1]):
                        result = run_layout(specs[model], layout, cameras, args)
                        runs.append(result)
                        print(f"{model} x{cameras} {layout}: {result.aggregate_hz:.2f} Hz "
                              f"(per camera {result.per_camera_hz}), p50 {result.latency_p50_ms} ms, "
                              f"PSS {result.total_pss_mb} MiB, CPU {result.cpu_ms_per_frame} ms/frame, "
                              f"threads {result.threads} x {result.in_flight} in flight, "
                              f"load {result.load_average}", file=sys.stderr, flush=True)
    finally:
        rclpy.shutdown()
    report(runs, args)
    return 0


def report(runs: list[RunResult], args: argparse.Namespace) -> None:
    """The table of ``runs``, and the ``--json`` and ``--png`` files where asked for."""
    rows = summarise(runs)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps({"runs": [asdict(r) for r in runs], "summary": rows,
                                         "settings": {k: str(v) for k, v in vars(args).items()}}, indent=2))
    if args.png:
        plot(rows, args.png)


if __name__ == "__main__":
    sys.exit(main())
