"""Sub-commands of the `dynnet` CLI (see dynnet_ros.cli)."""


class CommandError(Exception):
    """A user-facing failure: printed as one line by the CLI, exit status 2."""


#: Every sub-command's name and help line: ``dynnet --help`` lists them without importing any
#: command (each module's own ``HELP`` says the same; test_lean_imports keeps the two equal).
SUMMARIES: dict[str, str] = {
    "analyze": "symbolic rank/dimension propagation (RDP) of an ONNX model",
    "bench": "benchmark the planned engine against plain onnxruntime (fresh process each)",
    "demo": "run the vehicle graph with the simulator (or on a bag) for a while; live table + demo-report/ (JSON, PNG)",
    "infer": "run a detector, segmenter or depth model on image files: annotated PNGs + JSON",
    "map": "Map-and-Conquer: multi-exit stages on several compute units (stages, run, profile, search, show)",
    "plan": "show the planned engine's simplification, partitions, order and memory plan for a model",
    "replay": "play a rosbag2 (sqlite3/MCAP) or ROS 1 bag into the vehicle graph on the bag's time (/clock)",
    "sim": "write the sensor simulator's camera, camera_info and LiDAR frames into a bag (--record OUT)",
    "swap": "weights streamed under a memory budget: prepare a weight file, benchmark budgets",
    "up": "start the vehicle graph (config/vehicle.yaml): its processes and containers; Ctrl-C stops it",
    "zoo": "build the deterministic demo models (lane, pedestrian, depth, gated, multiexit) and show their size",
}
